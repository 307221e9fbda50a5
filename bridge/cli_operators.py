"""The operators' commands: ``bridge transactions``, ``delays``, ``dlq`` and ``quarantine``
inspect what waits in the system topics and replay or drop it."""

from __future__ import annotations

import time

import click

from bridge.cli_common import bootstrap_option, client_config, console
from bridge.consumer.admin import dlq_summary, read_dead_letters, replay_dead_letters
from bridge.consumer.send_back import ReplayTarget
from bridge.delay.admin import delay_status
from bridge.kafka.quarantine import read_quarantine, replay_quarantined
from bridge.message import MessageConst, MessageExt
from bridge.transaction.admin import list_undecided, read_parked, resolve_parked
from bridge.transaction.model import OpAction


@click.group()
def transactions() -> None:
    """Inspect undecided and parked transactions; replay or drop parked ones."""


@transactions.command("list")
@bootstrap_option("Kafka to inspect.")
@click.pass_context
def transactions_list(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Undecided transactions, oldest first: age, check count, group, real topic."""
    config = client_config(ctx, bootstrap_servers)
    undecided = list_undecided(config)
    for t in undecided:
        console.print(
            f"{t.transaction_id} group={t.producer_group} topic={t.real_topic} "
            f"age={t.age_ms / 1000:.1f}s checks={t.check_times} "
            f"half={t.half_partition}@{t.half_offset}"
        )
    console.print(f"{len(undecided)} undecided")


@transactions.command("show")
@bootstrap_option("Kafka to inspect.")
@click.argument("transaction_id")
@click.pass_context
def transactions_show(
    ctx: click.Context, bootstrap_servers: str | None, transaction_id: str
) -> None:
    """One transaction: undecided (with its checks), parked, or decided."""
    config = client_config(ctx, bootstrap_servers)
    for t in list_undecided(config):
        if t.transaction_id == transaction_id:
            console.print(
                f"undecided: group={t.producer_group} topic={t.real_topic} "
                f"age={t.age_ms / 1000:.1f}s checks={t.check_times}"
            )
            return
    for msg in read_parked(config, include_resolved=True):
        if (msg.transaction_id or msg.msg_id) == transaction_id:
            console.print(
                f"parked at check-max offset {msg.queue_offset} after "
                f"{msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} checks"
                f"{_delivery_failure(msg)}: {msg!r}",
                markup=False,
            )
            return
    console.print(f"{transaction_id}: decided, or not found")


def _delivery_failure(msg: MessageExt) -> str:
    """`` delivery failed N times: reason`` for a message parked because its real topic refused
    it, else empty."""
    error = msg.get_property(MessageConst.DELIVERY_ERROR)
    if not error:
        return ""
    attempts = msg.get_property(MessageConst.DELIVERY_ATTEMPTS) or "?"
    return f" delivery failed {attempts} times: {error}"


@transactions.command("parked")
@bootstrap_option("Kafka to inspect.")
@click.pass_context
def transactions_parked(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Messages parked in the check-max topic and not yet replayed or dropped."""
    config = client_config(ctx, bootstrap_servers)
    parked = read_parked(config)
    for msg in parked:
        console.print(
            f"{msg.msg_id} group={msg.get_property(MessageConst.PRODUCER_GROUP)} "
            f"topic={msg.get_property(MessageConst.REAL_TOPIC)} "
            f"checks={msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} body={msg.body!r}"
            + _delivery_failure(msg),
            markup=False,
        )
    console.print(f"{len(parked)} parked")


@transactions.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_replay(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Commit a parked message: deliver it to its real topic, once."""
    msg = resolve_parked(client_config(ctx, bootstrap_servers), msg_id, OpAction.COMMIT)
    console.print(f"replayed {msg.msg_id} to {msg.get_property(MessageConst.REAL_TOPIC)}")


@transactions.command("drop")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_drop(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Roll back a parked message for good."""
    msg = resolve_parked(client_config(ctx, bootstrap_servers), msg_id, OpAction.ROLLBACK)
    console.print(f"dropped {msg.msg_id}")


@click.group()
def delays() -> None:
    """Inspect delayed messages (delay levels and timers)."""


@delays.command("status")
@bootstrap_option("Kafka to inspect.")
@click.pass_context
def delays_status(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """How many messages wait in each delay level and timer tier, with a histogram, and when
    the next of each is due."""
    config = client_config(ctx, bootstrap_servers)
    queues = delay_status(config)
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


@click.group()
def dlq() -> None:
    """Inspect consumer groups' dead-letter queues and replay dead letters."""


@dlq.command("status")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", default=None, help="One consumer group (default: every group).")
@click.pass_context
def dlq_status(ctx: click.Context, bootstrap_servers: str | None, group: str | None) -> None:
    """Dead letters per group: count, origin topics and reconsume depth."""
    config = client_config(ctx, bootstrap_servers)
    summaries = dlq_summary(config, group)
    for s in summaries:
        origins = ", ".join(f"{t}={n}" for t, n in sorted(s.origin_topics.items()))
        depth = ", ".join(f"{d}x={n}" for d, n in s.reconsume_depth.items())
        console.print(
            f"{s.group}: {s.count} dead letters; from {origins or '-'}; depth {depth or '-'}"
        )
    if not summaries:
        console.print("no dead-letter queues")


@dlq.command("list")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", required=True, help="The consumer group.")
@click.pass_context
def dlq_list(ctx: click.Context, bootstrap_servers: str | None, group: str) -> None:
    """Every dead letter of a group: id, origin topic, failures, keys, tags, body size."""
    config = client_config(ctx, bootstrap_servers)
    letters = read_dead_letters(config, group)
    for m in letters:
        console.print(
            f"{m.msg_id} from={m.get_property(MessageConst.RETRY_TOPIC)} "
            f"failures={m.reconsume_times} keys={' '.join(m.keys)} tags={m.tags or ''} "
            f"body={len(m.body)} bytes"
        )
    console.print(f"{len(letters)} dead letters")


@dlq.command("replay")
@bootstrap_option("Kafka to write to.")
@click.option("--group", required=True, help="The consumer group.")
@click.option("--key", "keys", multiple=True, help="Only letters with this key (repeatable).")
@click.option("--tag", "tags", multiple=True, help="Only letters with this tag (repeatable).")
@click.option("--id", "msg_ids", multiple=True, help="Only this message id (repeatable).")
@click.option(
    "--to",
    "target",
    type=click.Choice([t.value for t in ReplayTarget]),
    default=ReplayTarget.ORIGIN.value,
    show_default=True,
    help="origin: the topic each was first sent to (every group sees it); "
    "retry: the group's retry topic (only this group does).",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be replayed.")
@click.pass_context
def dlq_replay(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    group: str,
    keys: tuple[str, ...],
    tags: tuple[str, ...],
    msg_ids: tuple[str, ...],
    target: str,
    dry_run: bool,
) -> None:
    """Write dead letters back (all, or those the filters choose). Replaying twice writes
    twice."""
    config = client_config(ctx, bootstrap_servers)
    letters = replay_dead_letters(
        config,
        group,
        keys=keys,
        tags=tags,
        msg_ids=msg_ids,
        target=ReplayTarget(target),
        dry_run=dry_run,
    )
    for m in letters:
        console.print(f"{m.msg_id} -> {m.get_property(MessageConst.RETRY_TOPIC)}")
    console.print(f"{'would replay' if dry_run else 'replayed'} {len(letters)}")


@click.group("quarantine", invoke_without_command=True)
@bootstrap_option("Kafka to inspect.")
@click.option("--count", type=int, default=None, help="Show at most N records.")
@click.pass_context
def quarantine_list(ctx: click.Context, bootstrap_servers: str | None, count: int | None) -> None:
    """Print the quarantined records: origin, reason and size (``replay OFFSET`` re-drives
    one)."""
    if ctx.invoked_subcommand is not None:
        ctx.ensure_object(dict)["quarantine_bootstrap"] = bootstrap_servers
        return
    config = client_config(ctx, bootstrap_servers)
    shown = 0
    for kept in read_quarantine(config, max_records=count):
        shown += 1
        if kept.omitted_bytes:  # too large to keep whole: kept without its value
            size = f"{kept.omitted_bytes} bytes, value not kept"
        else:
            size = f"{len(kept.value) if kept.value is not None else 0} bytes"
        console.print(
            f"@{kept.offset} from {kept.source_topic}[{kept.source_partition}]@"
            f"{kept.source_offset} by {kept.quarantined_by} ({size}): {kept.reason}",
            markup=False,
        )
    if not shown:
        console.print("no quarantined records")


@quarantine_list.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("offset", type=int)
@click.pass_context
def quarantine_replay(ctx: click.Context, bootstrap_servers: str | None, offset: int) -> None:
    """Deliver the delayed message quarantined at OFFSET to its real topic, once (after the
    cause, e.g. a missing topic or an ACL, was fixed)."""
    given = bootstrap_servers or (ctx.obj or {}).get("quarantine_bootstrap")
    done = replay_quarantined(client_config(ctx, given), offset)
    console.print(
        f"replayed {done.msg_id} from quarantine offset {offset} to "
        f"{done.topic}[{done.partition}]@{done.offset}",
        markup=False,
    )
