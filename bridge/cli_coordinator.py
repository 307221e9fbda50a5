"""``bridge coordinator`` and ``bridge health``: run the coordinator, ask whether it runs."""

from __future__ import annotations

import click

from bridge.cli_common import bootstrap_option, client_config, console, stop_on_signals
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import coordinator_health


@click.command()
@bootstrap_option("Kafka to coordinate.")
@click.pass_context
def coordinator(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Run only the coordinator (against configured Kafka) in the foreground."""
    config = CoordinatorConfig.from_env().with_client(client_config(ctx, bootstrap_servers))
    with stop_on_signals() as stop, Coordinator(config) as running:
        console.print(f"coordinator {running.config.coordinator_id} running; Ctrl-C stops")
        running.run_until(stop)


@click.command()
@bootstrap_option("Kafka to ask.")
@click.pass_context
def health(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Exit 0 if every coordinator service is running (a member of its consumer group)."""
    checks = coordinator_health(client_config(ctx, bootstrap_servers))
    for c in checks:
        console.print(f"{c.kind:<12} {c.state:<20} members={c.members}  {c.group}")
    if not all(c.healthy for c in checks):
        raise click.exceptions.Exit(1)
