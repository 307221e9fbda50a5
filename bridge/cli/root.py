"""The ``bridge`` command line: bring the stack up, manage topics, send and consume.

This module holds the root group and the commands ``up`` and ``fetch``; ``bridge.cli.broker``
has ``broker``, ``bridge.cli.coordinator`` ``coordinator`` and ``health``,
``bridge.cli.topics`` ``topics``, ``send`` and ``consume``, ``bridge.cli.operators`` the
operators' views (``transactions``, ``delays``, ``dlq``, ``quarantine``), and
``bridge.cli.common`` what they share; ``bridge.cli.console.cli`` has ``console``.

Every option that has an environment variable says so in ``--help``; they are the same names
``ClientConfig.from_env`` and ``CoordinatorConfig.from_env`` read.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from confluent_kafka import KafkaException

from bridge import __version__
from bridge.cli.common import (
    DEFAULT_LOCAL_PORT,
    bootstrap_option,
    client_config,
    console,
    stop_on_signals,
)
from bridge.cli.output import LOG_FORMATS, UnreachableError, configure_logging, progress
from bridge.config import ClientConfig
from bridge.errors import BridgeError, BrokerUnreachableError, KafkaClientError
from bridge.kafka.clients import translate_error
from bridge.runtime.jars import ARTIFACT_SETS, ensure_jars

if TYPE_CHECKING:
    from bridge.coordinator import Coordinator
    from bridge.runtime.local_kafka import LocalKafka

logger = logging.getLogger("bridge.cli")

SELF_CHECK_TOPIC = "bridge-self-check"

_COMMANDS: dict[str, str] = {
    "acls": "bridge.cli.security:acls",
    "broker": "bridge.cli.broker:broker",
    "console": "bridge.cli.console.cli:console_command",
    "consume": "bridge.cli.topics:consume",
    "coordinator": "bridge.cli.coordinator:coordinator",
    "db": "bridge.cli.db:db",
    "delays": "bridge.cli.operators.delays:delays",
    "dlq": "bridge.cli.operators.dead_letters:dlq",
    "health": "bridge.cli.coordinator:health",
    "quarantine": "bridge.cli.operators.quarantine:quarantine_list",
    "send": "bridge.cli.topics:send",
    "topics": "bridge.cli.topics:topics",
    "transactions": "bridge.cli.operators.transactions:transactions",
}
"""The commands defined outside this module, as ``module:attribute``: each is imported when
it runs (or when help lists it), so a command's start-up loads its own code and not every
other command's (the clients, the coordinator, the local broker's runtime)."""


class _BridgeGroup(click.Group):
    """Turns the project's errors into one ``Error: <type>: <message>`` line on stderr and a
    non-zero exit status (the type is the documented error class, e.g.
    ``BrokerUnreachableError``): :data:`~bridge.cli.output.EXIT_UNREACHABLE` when Kafka could
    not be reached, :data:`~bridge.cli.output.EXIT_ERROR` for the others. A Kafka client error
    that escaped untyped gets its type here. The commands of :data:`_COMMANDS` are imported
    when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is not None and cmd_name not in self.commands:
            module, _, attribute = target.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{target} is not a click command")
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KafkaException as exc:
            typed = translate_error(exc, "Kafka", default=KafkaClientError)
            raise _click_error(typed) from exc
        except BridgeError as exc:
            raise _click_error(exc) from exc


def _click_error(exc: BridgeError) -> click.ClickException:
    message = " ".join(str(exc).split("\n")) or type(exc).__name__
    text = f"{type(exc).__name__}: {message}"
    if isinstance(exc, BrokerUnreachableError):
        return UnreachableError(text)
    return click.ClickException(text)


@click.group(cls=_BridgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="bridge")
@click.option(
    "--namespace",
    envvar="BRIDGE_NAMESPACE",
    default=None,
    help="Prefix of system, retry and DLQ topics [env BRIDGE_NAMESPACE; default rmq].",
)
@click.option(
    "-v", "--verbose", count=True, help="-v for info logs (and the Kafka client's), -vv for debug."
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    envvar="BRIDGE_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Logs on stderr as text, or one JSON object per line [env BRIDGE_LOG_FORMAT].",
)
@click.pass_context
def cli(ctx: click.Context, namespace: str | None, verbose: int, log_format: str) -> None:
    """RocketMQ's reliable-messaging semantics on Apache Kafka.

    Exit status: 0 done, 1 an error (one "Error:" line on stderr), 2 bad usage, 3 Kafka not
    reachable within the request timeout (BRIDGE_REQUEST_TIMEOUT_MS), 4 not found."""
    configure_logging(verbose, log_format)
    ctx.obj = {"namespace": namespace, "verbose": verbose}


_SELF_CHECK_SEND_TIMEOUT_MS = 30_000
"""The self-check's send timeout, ms (at least): its first send may wait for its topic's leader
on a broker that has just started, which takes more than the 3 s default on a busy machine."""


def _self_check(config: ClientConfig) -> None:
    """Send one message and read it back, printing both."""
    # Imported here: only ``up`` needs the clients (see _COMMANDS).
    from bridge.client.producer import Producer  # noqa: PLC0415
    from bridge.client.reader import read_message_at  # noqa: PLC0415
    from bridge.kafka.admin import TopicAdmin  # noqa: PLC0415
    from bridge.message import Message  # noqa: PLC0415
    from topics.catalog import TopicSpec  # noqa: PLC0415
    from topics.naming import to_kafka_topic  # noqa: PLC0415

    started = time.monotonic()
    TopicAdmin(config).ensure_topics(
        [TopicSpec(to_kafka_topic(SELF_CHECK_TOPIC, config.namespace), 1)], strict=False
    )
    config = replace(
        config, send_msg_timeout_ms=max(config.send_msg_timeout_ms, _SELF_CHECK_SEND_TIMEOUT_MS)
    )
    with Producer("bridge-self-check", config=config) as producer:
        result = producer.send_sync(
            Message(SELF_CHECK_TOPIC, b"hello from the bridge", keys="self-check", tags="SelfCheck")
        )
    console.print(f"sent     {result.msg_id} to {result.topic}[{result.queue_id}]@{result.offset}")
    received = read_message_at(config, SELF_CHECK_TOPIC, result.queue_id, result.offset)
    elapsed_ms = (time.monotonic() - started) * 1000
    if received.msg_id != result.msg_id:
        raise click.ClickException(f"self-check read {received.msg_id}, expected {result.msg_id}")
    console.print(
        f"received {received.msg_id}: {received.body.decode()!r} tags={received.tags} "
        f"keys={received.keys} ({elapsed_ms:.0f} ms round trip)"
    )


@cli.command()
@bootstrap_option("Use this Kafka instead of starting the local broker.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="Local broker data directory.")
@click.option(
    "--port",
    type=int,
    default=DEFAULT_LOCAL_PORT,
    show_default=True,
    help="Local broker port (0: any free).",
)
@click.option(
    "--self-check/--no-self-check",
    default=None,
    help="Send and receive one message after start (default: on with the local broker).",
)
@click.option("--once", is_flag=True, help="Stop right after start-up (and the self-check).")
@click.pass_context
def up(
    ctx: click.Context,
    bootstrap_servers: str | None,
    data_dir: Path | None,
    port: int,
    self_check: bool | None,
    once: bool,
) -> None:
    """Start the stack in the foreground: the local Kafka broker (unless -b or
    KAFKA_BOOTSTRAP_SERVERS names a Kafka) and the coordinator; with the local broker, send
    one message and read it back; then run until Ctrl-C, which stops both cleanly."""
    # Imported here: only ``up`` starts a broker and a coordinator (see _COMMANDS).
    from bridge.cli.broker import local_broker  # noqa: PLC0415
    from bridge.coordinator import Coordinator, CoordinatorConfig  # noqa: PLC0415

    broker: LocalKafka | None = None
    coordinator: Coordinator | None = None
    with stop_on_signals() as stop:
        try:
            if bootstrap_servers is None:
                broker = local_broker(data_dir, port)
                console.print("starting the local Kafka broker (first run fetches its jars)...")
                broker.start()
                bootstrap_servers = broker.bootstrap_servers
                console.print(f"Kafka     {bootstrap_servers} (data in {broker.data_dir})")
            config = client_config(ctx, bootstrap_servers)
            coordinator = Coordinator(CoordinatorConfig.from_env().with_client(config))
            coordinator.start()
            console.print(
                f"coordinator {coordinator.config.coordinator_id} running "
                f"(namespace {config.namespace}, {len(coordinator.services)} services)"
            )
            if self_check if self_check is not None else broker is not None:
                _self_check(config)
            if not once:
                console.print("up; press Ctrl-C to stop")
                # Returns on Ctrl-C; raises if a service failed for good (another coordinator
                # with this id, say), so the command exits non-zero.
                coordinator.run_until(stop)
                console.print("stopping...")
        finally:
            if coordinator is not None:
                coordinator.stop()
            if broker is not None:
                broker.stop()
    console.print("stopped")


@cli.command()
@click.argument("sets", nargs=-1, type=click.Choice(sorted(ARTIFACT_SETS)))
def fetch(sets: tuple[str, ...]) -> None:
    """Fetch jars into the cache (default: every set), with a progress bar on stderr when it
    is a terminal: the broker's (kafka), Spark's Kafka source (spark), Delta Lake's (delta)
    and Apache RocketMQ's, for side-by-side runs (rocketmq)."""
    names = sets or tuple(sorted(ARTIFACT_SETS))
    with progress("fetching jars", len(names)) as bar:
        for name in names:
            bar.advance(0, f"fetching {name} jars")
            libs = ensure_jars(name)
            bar.advance()
            console.print(f"{name}: {len(list(libs.glob('*.jar')))} jars in {libs}")


def main() -> None:
    """Console-script entry point."""
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
