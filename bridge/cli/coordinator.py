"""``bridge coordinator`` and ``bridge health``: run the coordinator (with its metrics and health
endpoint on ``--metrics-port``; ``--processes N`` runs N coordinator processes under one
command, see :mod:`bridge.coordinator.processes`), ask whether it runs."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from typing import Final

import click

from bridge.cli.common import (
    COMMAND_CONFIG_KEY,
    bootstrap_option,
    client_config,
    console,
    stop_on_signals,
)
from bridge.cli.console import require_flask
from bridge.cli.console.security import AUDIT_LOGGER, MIN_TOKEN_LENGTH, TOKEN_ENV, new_token
from bridge.cli.output import emit_json, json_option
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import (
    CoordinatorEndpoint,
    coordinator_health,
    serve_coordinator_metrics,
)
from bridge.coordinator.processes import (
    ENV_PROCESSES,
    MAX_PROCESSES,
    CoordinatorProcesses,
    child_specs,
    current_environment,
    parse_processes,
)
from bridge.kafka.admin import TopicAdmin
from bridge.observability import DEFAULT_METRICS_HOST, ENV_METRICS_HOST, ENV_METRICS_PORT
from bridge.observability.server import WsgiApp, parse_port
from topics.client_security import ENV_COMMAND_CONFIG

ENV_CONSOLE: Final = "BRIDGE_COORDINATOR_CONSOLE"
"""``1``: ``bridge coordinator --console``."""
ENV_CONSOLE_WRITE: Final = "BRIDGE_COORDINATOR_CONSOLE_WRITE"
"""``1``: ``bridge coordinator --console-write``."""
ENV_CONSOLE_ALLOWED_HOSTS: Final = "BRIDGE_COORDINATOR_CONSOLE_ALLOWED_HOSTS"
"""``bridge coordinator --console-allowed-host``, names separated by spaces."""


def _port(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return parse_port(value, f"--metrics-port ({ENV_METRICS_PORT})")
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        raise click.BadParameter(str(exc)) from exc


def _processes(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    try:
        return parse_processes(value)
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        raise click.BadParameter(str(exc)) from exc


def _console_app(
    config: CoordinatorConfig,
    metrics_port: int | None,
    host: str,
    allowed_hosts: tuple[str, ...],
    *,
    allow_writes: bool,
) -> WsgiApp:
    """The operator console for ``--console``: read-only unless ``allow_writes``, whose
    operator token must come from the environment (several processes, one token)."""
    if metrics_port is None:
        raise click.UsageError("--console is served on --metrics-port: give one")
    require_flask()
    from bridge.cli.console.app import ConsoleSettings, create_app  # noqa: PLC0415 - the extra

    token = os.environ.get(TOKEN_ENV) or ""
    if allow_writes and len(token) < MIN_TOKEN_LENGTH:
        raise click.UsageError(
            f"--console-write needs the operator token in {TOKEN_ENV} "
            f"(at least {MIN_TOKEN_LENGTH} characters)"
        )
    # The audit trail (every write, done or refused) is logged whatever -v says.
    logging.getLogger(AUDIT_LOGGER).setLevel(logging.INFO)
    settings = ConsoleSettings(
        client=config.client,
        token=token or new_token(),  # read-only: a token nobody knows; writes are refused
        allow_writes=allow_writes,
        coordinator=config,
        allowed_hosts=frozenset({*allowed_hosts, host.strip("[]")}),
    )
    return create_app(settings)


def _run_processes(
    ctx: click.Context,
    config: CoordinatorConfig,
    count: int,
    metrics_port: int | None,
    console_env: dict[str, str],
) -> None:
    """Run ``count`` coordinator processes until SIGINT/SIGTERM or until one ends by itself
    (then raise why). Their settings are this command's: the environment, plus what the
    command line said (bootstrap servers, namespace, ``--command-config``, ``-v``, the log
    format)."""
    root = ctx.find_root()
    obj = ctx.obj or {}
    overrides = {
        "KAFKA_BOOTSTRAP_SERVERS": config.client.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.client.namespace,
        "BRIDGE_LOG_FORMAT": str(root.params.get("log_format") or "text"),
    }
    overrides.update(console_env)
    command_config = obj.get(COMMAND_CONFIG_KEY)
    if command_config:
        overrides[ENV_COMMAND_CONFIG] = os.path.abspath(command_config)
    verbose = int(root.params.get("verbose") or 0)
    specs = child_specs(
        count,
        config.coordinator_id,
        current_environment(),
        root_args=["-v"] * verbose,
        overrides=overrides,
        metrics_port=metrics_port,
    )
    # Once here rather than in each child at the same time: a broker out of reach fails the
    # command at once (exit 3), as with one process.
    TopicAdmin(config.client).ensure_system_topics(config.catalog)
    group = CoordinatorProcesses(specs)
    with stop_on_signals() as stop:
        group.start()
        ids = ", ".join(f"{c.spec.coordinator_id} (pid {c.process.pid})" for c in group.children)
        console.print(f"{count} coordinator processes running: {ids}; Ctrl-C stops all")
        if metrics_port:
            console.print(
                f"metrics and health of process i on port {metrics_port}+i-1 "
                f"({metrics_port}-{metrics_port + count - 1})"
            )
        try:
            group.run_until(stop)
        finally:
            group.stop()


@click.command()
@bootstrap_option("Kafka to coordinate.")
@click.option(
    "--metrics-port",
    envvar=ENV_METRICS_PORT,
    default=None,
    callback=_port,
    metavar="PORT",
    help=f"Serve /metrics, /healthz and /readyz over HTTP on this port (env {ENV_METRICS_PORT}; "
    f"address {DEFAULT_METRICS_HOST} unless {ENV_METRICS_HOST} says otherwise).",
)
@click.option(
    "--processes",
    envvar=ENV_PROCESSES,
    default=None,
    callback=_processes,
    metavar="N",
    help=f"Run N coordinator processes (1-{MAX_PROCESSES}; env {ENV_PROCESSES}; default 1), "
    "ids <coordinator id>-1 ... -N, sharing the system topics' partitions; they stop together "
    "on Ctrl-C or SIGTERM, and one that ends by itself stops the others (exit 1). With "
    "--metrics-port P, process i serves on P+i-1.",
)
@click.option(
    "--console",
    "with_console",
    is_flag=True,
    envvar=ENV_CONSOLE,
    help=f"Also serve the operator console (as bridge console) on --metrics-port's other paths, "
    f"read-only (env {ENV_CONSOLE}=1). Needs the 'console' extra.",
)
@click.option(
    "--console-write",
    is_flag=True,
    envvar=ENV_CONSOLE_WRITE,
    help=f"Let that console replay and drop, each with the operator token from {TOKEN_ENV} "
    f"(env {ENV_CONSOLE_WRITE}=1).",
)
@click.option(
    "--console-allowed-host",
    "console_hosts",
    multiple=True,
    envvar=ENV_CONSOLE_ALLOWED_HOSTS,
    help="A host name browsers may reach that console by besides loopback's and the metrics "
    f"address (repeatable; env {ENV_CONSOLE_ALLOWED_HOSTS}, separated by spaces).",
)
@click.pass_context
def coordinator(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    metrics_port: int | None,
    processes: int,
    with_console: bool,
    console_write: bool,
    console_hosts: tuple[str, ...],
) -> None:
    """Run only the coordinator (against configured Kafka) in the foreground, until Ctrl-C
    or SIGTERM. With --processes N, a process that ends by itself is named on stderr, the
    others are stopped and the exit status is 1."""
    config = CoordinatorConfig.from_env().with_client(client_config(ctx, bootstrap_servers))
    host = os.environ.get(ENV_METRICS_HOST) or DEFAULT_METRICS_HOST
    app = None
    if with_console or console_write:
        app = _console_app(config, metrics_port, host, console_hosts, allow_writes=console_write)
    if processes > 1:
        # Each process serves its own console: they learn it from the environment.
        console_env = {
            ENV_CONSOLE: "1" if app is not None else "0",
            ENV_CONSOLE_WRITE: "1" if console_write else "0",
            ENV_CONSOLE_ALLOWED_HOSTS: " ".join(console_hosts),
        }
        _run_processes(ctx, config, processes, metrics_port, console_env)
        return
    running = Coordinator(config)
    endpoint: CoordinatorEndpoint | None = None
    if metrics_port is not None:
        # Before start: the services' Kafka clients report their statistics from the outset.
        endpoint = serve_coordinator_metrics(running, metrics_port, host=host, app=app)
        console.print(f"metrics and health on {endpoint.url}/metrics, /healthz, /readyz")
        if app is not None:
            mode = "writes allowed with the operator token" if console_write else "read-only"
            console.print(f"console on {endpoint.url}/ ({mode})")
    try:
        with stop_on_signals() as stop, running:
            console.print(f"coordinator {running.config.coordinator_id} running; Ctrl-C stops")
            running.run_until(stop)
    finally:
        if endpoint is not None:
            endpoint.stop()


@click.command()
@bootstrap_option("Kafka to ask.")
@json_option
@click.pass_context
def health(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """Exit 0 if every coordinator service is running (a member of its consumer group), for
    health checks; --json: one object per service."""
    checks = coordinator_health(client_config(ctx, bootstrap_servers))
    for c in checks:
        if as_json:
            emit_json({**asdict(c), "healthy": c.healthy})
        else:
            console.print(f"{c.kind:<12} {c.state:<20} members={c.members}  {c.group}")
    if not all(c.healthy for c in checks):
        raise click.exceptions.Exit(1)
