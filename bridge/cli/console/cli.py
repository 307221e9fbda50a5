"""``bridge console``: serve the operator console for one namespace until Ctrl-C."""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import os
import sys
import threading
from typing import Final

import click

from bridge.cli.common import bootstrap_option, client_config, console, stop_on_signals
from bridge.cli.console import require_flask
from bridge.cli.console.security import AUDIT_LOGGER, MIN_TOKEN_LENGTH, TOKEN_ENV, new_token
from bridge.cli.output import require_broker

logger = logging.getLogger(__name__)

DEFAULT_PORT: Final = 8089
"""The console's port unless ``--port`` says otherwise."""


_M_ARENA_MAX: Final = -8
"""glibc's ``mallopt`` parameter for the most malloc arenas (``MALLOC_ARENA_MAX``)."""

MALLOC_ARENAS: Final = 2
"""Malloc arenas the console's threads share. Each page is served on a thread of its own with
a Kafka reader of its own (whose librdkafka threads allocate too); with glibc's default (8 per
core) each new thread could take an arena of its own and keep its memory for reuse. Paging
100,000 letters in pages of 500 (python -m bench console), the console's peak was 150 MiB with
the default and 91 MiB with 2, level from the 25th page on."""


def _share_malloc_arenas() -> None:
    """Cap glibc's malloc arenas at :data:`MALLOC_ARENAS` (nothing elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc (musl, say): its allocator has no arenas to cap
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command("console")
@bootstrap_option("Kafka to inspect (and, with --write, to write to).")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; anything but loopback is reachable from other machines.",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port to listen on (0: any free one; the address is printed).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A host name (or address) browsers may reach the console by, besides loopback's and "
    "--host (repeatable); requests naming another host are refused.",
)
@click.option(
    "--deserializer",
    "deserializer_spec",
    metavar="SPEC",
    help="Also show dead-letter bodies read by this deserializer: json, avro:<schema.avsc> "
    "(Avro binary of that writer schema) or <module>:<name> (a confluent-kafka Deserializer, "
    "as consumers take value_deserializer=); a body it cannot read shows why.",
)
@click.option(
    "--write",
    "allow_writes",
    is_flag=True,
    help="Allow replays and drops (each needs the operator token); read-only without it.",
)
@click.pass_context
def console_command(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    deserializer_spec: str | None,
    allow_writes: bool,
) -> None:
    """Serve the operator console: transactions, dead letters, delays and timers, quarantine
    and health of one namespace (--namespace), in the browser. Read-only unless --write;
    every write needs the operator token, from BRIDGE_CONSOLE_TOKEN (at least 16 characters)
    or generated and printed once at start. Needs the 'console' extra."""
    require_flask()
    from bridge.cli.console.decoding import DeserializerSpecError, parse_deserializer  # noqa: PLC0415

    try:
        deserializer = None if deserializer_spec is None else parse_deserializer(deserializer_spec)
    except DeserializerSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--deserializer") from exc
    # Before any thread starts (the broker check's Kafka client has threads of its own): glibc
    # fixes its limit on arenas once a thread first needs one.
    _share_malloc_arenas()
    from werkzeug.serving import make_server  # noqa: PLC0415 - the optional extra

    from bridge.cli.console.app import ConsoleSettings, create_app  # noqa: PLC0415
    from bridge.coordinator.coordinator import CoordinatorConfig  # noqa: PLC0415

    # The audit trail (every write, done or refused) is logged whatever -v says.
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)
    config = client_config(ctx, bootstrap_servers)
    require_broker(config)
    token = os.environ.get(TOKEN_ENV) or ""
    generated = not token
    if generated:
        token = new_token()
    elif len(token) < MIN_TOKEN_LENGTH:
        raise click.UsageError(f"{TOKEN_ENV} must have at least {MIN_TOKEN_LENGTH} characters")
    settings = ConsoleSettings(
        client=config,
        token=token,
        allow_writes=allow_writes,
        coordinator=CoordinatorConfig.from_env().with_client(config),
        allowed_hosts=frozenset({*allowed_hosts, host.strip("[]")}),
        deserializer=deserializer,
    )
    server = make_server(host, port, create_app(settings), threaded=True)
    if not _loopback(host):
        logger.warning("the console listens on %s: reachable from other machines", host)
    shown_host = f"[{host}]" if ":" in host else host
    mode = "writes allowed with the operator token" if allow_writes else "read-only"
    console.print(
        f"console on http://{shown_host}:{server.server_port}/ "
        f"(namespace {config.namespace}, {mode}); Ctrl-C stops"
    )
    if generated and allow_writes:
        console.print(f"operator token (shown once): {token}")
    with stop_on_signals() as stop:
        thread = threading.Thread(target=server.serve_forever, name="console", daemon=True)
        thread.start()
        stop.wait()
        server.shutdown()
        thread.join()
    console.print("stopped")
