"""``bridge coordinator`` and ``bridge health``: run the coordinator (with its metrics and health
endpoint on ``--metrics-port``), ask whether it runs."""

from __future__ import annotations

import os
from dataclasses import asdict

import click

from bridge.cli_common import bootstrap_option, client_config, console, stop_on_signals
from bridge.cli_output import emit_json, json_option
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import (
    CoordinatorEndpoint,
    coordinator_health,
    serve_coordinator_metrics,
)
from bridge.observability import DEFAULT_METRICS_HOST, ENV_METRICS_HOST, ENV_METRICS_PORT
from bridge.observability.server import parse_port


def _port(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return parse_port(value, f"--metrics-port ({ENV_METRICS_PORT})")
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        raise click.BadParameter(str(exc)) from exc


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
@click.pass_context
def coordinator(
    ctx: click.Context, bootstrap_servers: str | None, metrics_port: int | None
) -> None:
    """Run only the coordinator (against configured Kafka) in the foreground."""
    config = CoordinatorConfig.from_env().with_client(client_config(ctx, bootstrap_servers))
    running = Coordinator(config)
    endpoint: CoordinatorEndpoint | None = None
    if metrics_port is not None:
        # Before start: the services' Kafka clients report their statistics from the outset.
        host = os.environ.get(ENV_METRICS_HOST) or DEFAULT_METRICS_HOST
        endpoint = serve_coordinator_metrics(running, metrics_port, host=host)
        console.print(f"metrics and health on {endpoint.url}/metrics, /healthz, /readyz")
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
    """Exit 0 if every coordinator service is running (a member of its consumer group)."""
    checks = coordinator_health(client_config(ctx, bootstrap_servers))
    for c in checks:
        if as_json:
            emit_json({**asdict(c), "healthy": c.healthy})
        else:
            console.print(f"{c.kind:<12} {c.state:<20} members={c.members}  {c.group}")
    if not all(c.healthy for c in checks):
        raise click.exceptions.Exit(1)
