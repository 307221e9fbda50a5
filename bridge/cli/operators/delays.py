"""``bridge delays``: what waits in the delay levels and timer tiers, and when it is due."""

from __future__ import annotations

import time

import click

from bridge.cli.admin.delays import delay_status
from bridge.cli.common import bootstrap_option, console
from bridge.cli.operators.common import read_config
from bridge.cli.output import emit_json, json_option


@click.group()
def delays() -> None:
    """Inspect delayed messages (delay levels and timers)."""


@delays.command("status")
@bootstrap_option("Kafka to inspect.")
@json_option
@click.pass_context
def delays_status(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """How many messages wait in each delay level and timer tier, with a histogram, and when
    the next of each is due (--json: every level and tier, kind, index, delay_ms, pending,
    next_due_ms). Before anything was delayed, 0 wait everywhere."""
    config = read_config(ctx, bootstrap_servers)
    queues = delay_status(config)
    if as_json:
        for q in queues:
            emit_json(q)
        return
    widest = max((q.pending for q in queues), default=0) or 1
    now = time.time_ns() // 1_000_000
    for q in queues:
        if q.kind == "tier" and not q.pending:
            continue
        bar = "#" * max(round(30 * q.pending / widest), 1 if q.pending else 0)
        due = f"next in {(q.next_due_ms - now) / 1000:.1f}s" if q.next_due_ms else ""
        console.print(
            f"{q.kind} {q.index:>2} ({_human_ms(q.delay_ms):>6}) {q.pending:>9} {bar:<30} {due}"
        )
    console.print(f"{sum(q.pending for q in queues)} waiting")


def _human_ms(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:g}{unit}" if ms % size == 0 else f"{ms / size:.1f}{unit}"
    return f"{ms}ms"
