"""The operators' commands: ``bridge transactions``, ``delays``, ``dlq`` and ``quarantine``
inspect what waits in the system topics and replay or drop it.

Every read command takes ``--json`` (one object per line), fails with exit status 3 when
Kafka cannot be reached within ``request_timeout_ms`` and with 4 when what it was asked about
does not exist (``bridge.cli_output``)."""

from __future__ import annotations

import base64
import dataclasses
import logging
import time
import uuid
from typing import Any

import click
from confluent_kafka import KafkaException, TopicPartition

from bridge.cli_common import bootstrap_option, client_config, console
from bridge.cli_output import (
    NotFoundError,
    emit_json,
    json_option,
    message_json,
    progress,
    require_broker,
    shown,
)
from bridge.codec import decode_envelope, decode_headers
from bridge.config import ClientConfig
from bridge.consumer.admin import (
    DeadLetterReplayError,
    ReplayFailure,
    dlq_groups,
    dlq_summary,
    prepare_replay,
    read_dead_letters,
    replay_dead_letters,
    write_back,
)
from bridge.consumer.send_back import ReplayTarget
from bridge.delay.admin import delay_status
from bridge.errors import BridgeError, SendError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_producer, new_reader, read_record_at
from bridge.kafka.quarantine import (
    QUARANTINE_SOURCE_TOPIC,
    ReplayedMessage,
    read_headers,
    read_quarantine,
    replay_quarantined,
)
from bridge.message import MessageConst, MessageExt, property_text
from bridge.property_values import parse_count
from bridge.transaction.admin import list_undecided, read_parked, resolve_parked
from bridge.transaction.model import OpAction
from bridge.transaction.targets import auto_create_allowed, partition_problem, topic_problem
from topics.catalog import SystemTopic, TopicCatalog
from topics.naming import to_kafka_topic


@click.group()
def transactions() -> None:
    """Inspect undecided and parked transactions; replay or drop parked ones."""


logger = logging.getLogger(__name__)


def _read_config(ctx: click.Context, bootstrap_servers: str | None) -> ClientConfig:
    """The command's client settings, once Kafka answered (exit 3 within
    ``request_timeout_ms`` if it does not)."""
    config = client_config(ctx, bootstrap_servers)
    require_broker(config)
    return config


@transactions.command("list")
@bootstrap_option("Kafka to inspect.")
@json_option
@click.pass_context
def transactions_list(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """Undecided transactions, oldest first: age, check count, group, real topic."""
    config = _read_config(ctx, bootstrap_servers)
    undecided = list_undecided(config)
    for t in undecided:
        if as_json:
            emit_json(t)
            continue
        console.print(
            f"{shown(t.transaction_id)} group={shown(t.producer_group)} "
            f"topic={shown(t.real_topic)} "
            f"age={t.age_ms / 1000:.1f}s checks={t.check_times} "
            f"half={t.half_partition}@{t.half_offset}"
        )
    if not as_json:
        console.print(f"{len(undecided)} undecided")


@transactions.command("show")
@bootstrap_option("Kafka to inspect.")
@click.argument("transaction_id")
@json_option
@click.pass_context
def transactions_show(
    ctx: click.Context, bootstrap_servers: str | None, transaction_id: str, as_json: bool
) -> None:
    """One transaction: undecided (with its checks) or parked; exit status 4 when it is
    neither (decided, or never seen). --json: one object with ``state``."""
    config = _read_config(ctx, bootstrap_servers)
    for t in list_undecided(config):
        if t.transaction_id == transaction_id:
            if as_json:
                emit_json({"state": "undecided", **dataclasses.asdict(t)})
                return
            console.print(
                f"undecided: group={shown(t.producer_group)} topic={shown(t.real_topic)} "
                f"age={t.age_ms / 1000:.1f}s checks={t.check_times}"
            )
            return
    for msg in read_parked(config, include_resolved=True):
        if (msg.transaction_id or msg.msg_id) == transaction_id:
            if as_json:
                emit_json({"state": "parked", "transaction_id": transaction_id, **_parked(msg)})
                return
            console.print(
                f"parked at check-max offset {msg.queue_offset} after "
                f"{msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} checks"
                f"{_delivery_failure(msg)}: {msg!r}",
                markup=False,
            )
            return
    raise NotFoundError(
        f"transaction {transaction_id}: not undecided nor parked (decided, or not found)"
    )


def _delivery_failure(msg: MessageExt) -> str:
    """`` delivery failed N times: reason`` for a message parked because its real topic refused
    it, else empty."""
    error = msg.get_property(MessageConst.DELIVERY_ERROR)
    if not error:
        return ""
    attempts = msg.get_property(MessageConst.DELIVERY_ATTEMPTS) or "?"
    return f" delivery failed {shown(attempts)} times: {shown(error)}"


def _parked(msg: MessageExt) -> dict[str, Any]:
    """A parked message as JSON: the message, its producer group, real topic, checks and
    delivery failures."""
    return {
        "producer_group": msg.get_property(MessageConst.PRODUCER_GROUP),
        "real_topic": msg.get_property(MessageConst.REAL_TOPIC),
        "check_times": msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES),
        "delivery_attempts": msg.get_property(MessageConst.DELIVERY_ATTEMPTS),
        "delivery_error": msg.get_property(MessageConst.DELIVERY_ERROR),
        "message": message_json(msg),
    }


@transactions.command("parked")
@bootstrap_option("Kafka to inspect.")
@json_option
@click.pass_context
def transactions_parked(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """Messages parked in the check-max topic and not yet replayed or dropped, with why
    their delivery failed if it did."""
    config = _read_config(ctx, bootstrap_servers)
    parked = read_parked(config)
    for msg in parked:
        if as_json:
            emit_json({"msg_id": msg.msg_id, **_parked(msg)})
            continue
        console.print(
            f"{shown(msg.msg_id)} group={shown(msg.get_property(MessageConst.PRODUCER_GROUP))} "
            f"topic={shown(msg.get_property(MessageConst.REAL_TOPIC))} "
            f"checks={msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} "
            f"body={len(msg.body)} bytes" + _delivery_failure(msg),
            markup=False,
        )
    if not as_json:
        console.print(f"{len(parked)} parked")


def _require_parked(config: ClientConfig, msg_id: str) -> None:
    """Exit status 4 unless a parked, unresolved message has id ``msg_id``. Asked before
    :func:`resolve_parked`, whose :class:`~bridge.errors.InvalidArgumentError` for a missing
    message cannot be told from a refused setting."""
    if not any(m.msg_id == msg_id for m in read_parked(config)):
        raise NotFoundError(
            f"no parked, unresolved message with id {msg_id!r} "
            "(replayed or dropped already, or never parked)"
        )


@transactions.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_replay(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Commit a parked message: deliver it to its real topic, once. Exit status 4 when no
    parked, unresolved message has MSG_ID."""
    config = _read_config(ctx, bootstrap_servers)
    _require_parked(config, msg_id)
    msg = resolve_parked(config, msg_id, OpAction.COMMIT)
    console.print(
        f"replayed {shown(msg.msg_id)} to {shown(msg.get_property(MessageConst.REAL_TOPIC))}"
    )


@transactions.command("drop")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_drop(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Roll back a parked message for good. Exit status 4 when no parked, unresolved message
    has MSG_ID."""
    config = _read_config(ctx, bootstrap_servers)
    _require_parked(config, msg_id)
    msg = resolve_parked(config, msg_id, OpAction.ROLLBACK)
    console.print(f"dropped {shown(msg.msg_id)}")


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
    config = _read_config(ctx, bootstrap_servers)
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


@click.group()
def dlq() -> None:
    """Inspect consumer groups' dead-letter queues and replay dead letters."""


@dlq.command("status")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", default=None, help="One consumer group (default: every group).")
@json_option
@click.pass_context
def dlq_status(
    ctx: click.Context, bootstrap_servers: str | None, group: str | None, as_json: bool
) -> None:
    """Dead letters per group: count, origin topics and reconsume depth (exit status 4 for a
    --group without a dead-letter queue)."""
    config = _read_config(ctx, bootstrap_servers)
    if group is not None:
        _require_dlq(config, group)
    summaries = dlq_summary(config, group)
    for s in summaries:
        if as_json:
            emit_json(s)
            continue
        origins = ", ".join(f"{shown(t)}={n}" for t, n in sorted(s.origin_topics.items()))
        depth = ", ".join(f"{d}x={n}" for d, n in s.reconsume_depth.items())
        console.print(
            f"{s.group}: {s.count} dead letters; from {origins or '-'}; depth {depth or '-'}"
        )
    if not summaries and not as_json:
        console.print("no dead-letter queues")


def _require_dlq(config: ClientConfig, group: str) -> None:
    """Exit status 4 unless ``group`` has a dead-letter topic."""
    if group not in dlq_groups(config):
        raise NotFoundError(f"consumer group {group!r} has no dead-letter queue")


def _failure(msg: MessageExt) -> dict[str, str | None]:
    """The dead-letter metadata of ``msg`` (``docs/tracing.md``), as text."""
    out: dict[str, str | None] = {}
    for name in (
        MessageConst.CONSUMER_GROUP,
        MessageConst.CONSUME_FAILURE,
        MessageConst.CONSUME_EXCEPTION_CLASS,
        MessageConst.CONSUME_EXCEPTION_MESSAGE,
        MessageConst.ORIGIN_KAFKA_TOPIC,
        MessageConst.ORIGIN_QUEUE_ID,
        MessageConst.ORIGIN_QUEUE_OFFSET,
        MessageConst.ORIGIN_TIMESTAMP,
        MessageConst.TRACE_PARENT,
    ):
        value = msg.properties.get(name)
        out[name] = None if value is None else property_text(value)
    return out


@dlq.command("list")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", required=True, help="The consumer group.")
@json_option
@click.pass_context
def dlq_list(ctx: click.Context, bootstrap_servers: str | None, group: str, as_json: bool) -> None:
    """Every dead letter of a group: id, origin topic, failures, keys, tags, body size, how
    the listener failed it (exception class and message, or the status it returned) and
    where it was first read (topic[partition]@offset). Exit status 4 for a group without a
    dead-letter queue."""
    config = _read_config(ctx, bootstrap_servers)
    _require_dlq(config, group)
    letters = read_dead_letters(config, group)
    for m in letters:
        failure = _failure(m)
        if as_json:
            emit_json(
                {
                    "msg_id": m.msg_id,
                    "origin_topic": m.get_property(MessageConst.RETRY_TOPIC),
                    "origin_message_id": m.get_property(MessageConst.ORIGIN_MESSAGE_ID),
                    "failures": m.reconsume_times,
                    "failure": failure,
                    "message": message_json(m),
                }
            )
            continue
        why = failure[MessageConst.CONSUME_FAILURE] or "-"
        if failure[MessageConst.CONSUME_EXCEPTION_CLASS]:
            why = (
                f"{failure[MessageConst.CONSUME_EXCEPTION_CLASS]}: "
                f"{failure[MessageConst.CONSUME_EXCEPTION_MESSAGE] or ''}"
            )
        where = (
            f"{failure[MessageConst.ORIGIN_KAFKA_TOPIC]}[{failure[MessageConst.ORIGIN_QUEUE_ID]}]"
            f"@{failure[MessageConst.ORIGIN_QUEUE_OFFSET]}"
            if failure[MessageConst.ORIGIN_KAFKA_TOPIC]
            else "-"
        )
        console.print(
            f"{shown(m.msg_id)} from={shown(m.get_property(MessageConst.RETRY_TOPIC))} "
            f"failures={m.reconsume_times} keys={shown(' '.join(m.keys))} "
            f"tags={shown(m.tags or '')} "
            f"body={len(m.body)} bytes first-read={shown(where)} "
            f"at={shown(failure[MessageConst.ORIGIN_TIMESTAMP] or '-')} failed-with={why!r}",
            markup=False,
        )
    if not as_json:
        console.print(f"{len(letters)} dead letters")


class ReplayTargetError(SendError):
    """The topic a quarantined message or a dead letter is replayed to cannot take it (a Kafka
    internal topic, a partition the topic does not have, a topic that does not exist): nothing
    was written, and it stays where it was. The message names the topic and what is wrong."""


def _target_problem(config: ClientConfig, topic: str, partition: int) -> str | None:
    """Why ``topic`` / ``partition`` cannot take a replayed message, from the cluster's
    metadata, in the words of ``bridge transactions replay`` (a Kafka internal topic, a topic
    that does not exist, a partition it does not have), or None. Asked before the replay
    writes: Kafka would only say "topic authorization failed" (a transaction's write to an
    internal topic) or "Invalid topic" (a plain send's), and librdkafka ``_INCONSISTENT`` for
    a partition the topic does not have."""
    metadata = new_producer(config, "bridge-replay-metadata")
    # A topic being auto-created answers "unknown" for a moment, as the transaction admin's.
    confirm_s = 1.0 if auto_create_allowed(config) else 0.0
    try:
        problem, count = topic_problem(
            metadata, topic, config.request_timeout_ms / 1000, confirm_s=confirm_s
        )
    except KafkaException:
        return None  # no metadata now: the replay's write finds out
    return problem or partition_problem(topic, partition, count)


def _ids(letters: list[MessageExt]) -> set[str]:
    """The ids ``--id`` chooses ``letters`` by: each one's id and its origin message id."""
    out = {m.msg_id for m in letters}
    out.update(o for m in letters if (o := m.get_property(MessageConst.ORIGIN_MESSAGE_ID)))
    return out


def _require_replay_targets(
    config: ClientConfig, group: str, letters: list[MessageExt], target: ReplayTarget
) -> None:
    """:class:`ReplayTargetError` naming each topic that cannot take the letters bound for it
    (e.g. an origin topic that is one of Kafka's internal topics, which a send only calls an
    "Invalid topic"), before any letter is written. A letter whose record cannot be built (no
    topic at all) is left to :func:`write_back`, which reports it and replays the others."""
    bound: dict[str, list[str]] = {}
    for m, record in prepare_replay(letters, group, target, namespace=config.namespace)[0]:
        bound.setdefault(record.kafka_topic, []).append(m.msg_id)
    problems = [
        f"{problem} (dead letters {', '.join(ids)})"
        for topic, ids in bound.items()
        if (problem := _target_problem(config, topic, -1)) is not None
    ]
    if problems:
        raise ReplayTargetError(
            f"replaying dead letters of {group}: {'; '.join(problems)}; nothing replayed"
        )


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
@json_option
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
    as_json: bool,
) -> None:
    """Write dead letters back (all, or those the filters choose), with a progress bar on
    stderr when it is a terminal. Replaying twice writes twice. Exit status 4 for a group
    without a dead-letter queue, and for an --id that none of its dead letters has; a topic
    that cannot take the letters bound for it (e.g. a Kafka internal topic) is named before
    anything is written (ReplayTargetError). Either way nothing is replayed. A letter that
    cannot be replayed (its origin is no topic name, say, as another Kafka client may write)
    does not stop the others: each is listed with why ("error" with --json), it stays in the
    DLQ, and the exit status is 1, naming them (DeadLetterReplayError; --dry-run lists them
    too, and exits 1)."""
    config = _read_config(ctx, bootstrap_servers)
    _require_dlq(config, group)
    chosen = ReplayTarget(target)
    letters = replay_dead_letters(
        config, group, keys=keys, tags=tags, msg_ids=msg_ids, target=chosen, dry_run=True
    )
    if set(msg_ids) - _ids(letters):
        # Not chosen: filtered out by --key/--tag, or not a dead letter of the group at all.
        missing = set(msg_ids) - _ids(
            replay_dead_letters(config, group, msg_ids=msg_ids, dry_run=True)
        )
        if missing:
            raise NotFoundError(
                f"consumer group {group!r} has no dead letter with id "
                f"{', '.join(sorted(missing))}; nothing replayed"
            )
    failed: list[ReplayFailure] = []
    error: DeadLetterReplayError | None = None
    if dry_run:
        failed = prepare_replay(letters, group, chosen, namespace=config.namespace)[1]
    elif letters:
        _require_replay_targets(config, group, letters, chosen)
        with progress(f"replaying {len(letters)} dead letters", len(letters)) as bar:
            try:
                write_back(config, group, letters, chosen, on_progress=bar.advance)
            except DeadLetterReplayError as exc:
                failed, error = exc.failed, exc
    # Keyed by the letter itself: one message id may be dead-lettered more than once.
    why = {id(f.letter): f.reason for f in failed}
    for m in letters:
        reason = why.get(id(m))
        origin = m.get_property(MessageConst.RETRY_TOPIC)
        if as_json:
            line: dict[str, Any] = {
                "msg_id": m.msg_id,
                "origin_topic": origin,
                "target": chosen.value,
                "replayed": not dry_run and reason is None,
            }
            if reason is not None:
                line["error"] = reason
            emit_json(line)
        elif reason is None:
            console.print(f"{shown(m.msg_id)} -> {shown(origin)}", markup=False)
        else:
            not_done = "cannot be replayed" if dry_run else "NOT replayed"
            console.print(
                f"{shown(m.msg_id)} -> {shown(origin)} {not_done}: {shown(reason)}", markup=False
            )
    if not as_json:
        done = len(letters) - len(failed)
        summary = f"would replay {done}" if dry_run else f"replayed {done}"
        if failed:
            summary += f", {'cannot replay' if dry_run else 'not replayed'} {len(failed)}"
        console.print(summary)
    if error is None and failed:
        replayable = [m for m in letters if id(m) not in why]
        error = DeadLetterReplayError(group, replayable, failed, dry_run=True)
    if error is not None:
        raise error


@click.group("quarantine", invoke_without_command=True)
@bootstrap_option("Kafka to inspect.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Show at most N records.")
@json_option
@click.pass_context
def quarantine_list(
    ctx: click.Context, bootstrap_servers: str | None, count: int | None, as_json: bool
) -> None:
    """Print the quarantined records: origin, reason and size (``replay OFFSET`` re-drives
    one). They are undecodable records, and delayed messages their topic refused
    delivery_attempts times; a record whose full copy did not fit is kept without its value
    and headers, the reason giving their size."""
    if ctx.invoked_subcommand is not None:
        ctx.ensure_object(dict)["quarantine_bootstrap"] = bootstrap_servers
        return
    config = _read_config(ctx, bootstrap_servers)
    listed = 0
    for kept in read_quarantine(config, max_records=count):
        listed += 1
        if as_json:
            emit_json(_quarantined(kept))
            continue
        if kept.omitted_bytes:  # too large to keep whole: kept without its value
            size = f"{kept.omitted_bytes} bytes, value not kept"
        else:
            size = f"{len(kept.value) if kept.value is not None else 0} bytes"
        console.print(
            f"@{kept.offset} from {shown(kept.source_topic)}[{kept.source_partition}]@"
            f"{kept.source_offset} by {shown(kept.quarantined_by)} ({size}): "
            f"{shown(kept.reason)}",
            markup=False,
        )
    if not listed and not as_json:
        console.print("no quarantined records")


def _quarantined(kept: Any) -> dict[str, Any]:
    """A quarantined record as JSON (value and key in base64, binary headers too)."""
    out = dataclasses.asdict(kept)
    for name in ("value", "key"):
        raw = out.pop(name)
        out[f"{name}_base64"] = None if raw is None else base64.b64encode(raw).decode("ascii")
    headers = out.pop("headers")
    out["headers"] = {k: v for k, v in headers.items() if isinstance(v, str)}
    out["binary_headers"] = {
        k: base64.b64encode(v).decode("ascii") for k, v in headers.items() if isinstance(v, bytes)
    }
    return out


def _quarantined_record(config: ClientConfig, offset: int) -> Any:
    """The QUARANTINE record at ``offset``; :class:`NotFoundError` (exit status 4) when there
    is none (past the end, or the offset of a transaction's commit marker)."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.QUARANTINE)
    if topic not in TopicAdmin(config).list_topics():  # a reader would wait for it in vain
        raise NotFoundError(
            f"no quarantined record at offset {offset}: {topic} does not exist (nothing was "
            f"quarantined in namespace {config.namespace})"
        )
    reader = new_reader(
        config, f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}", "bridge-replay"
    )
    try:
        record = read_record_at(
            reader, TopicPartition(topic, 0, offset), config.request_timeout_ms / 1000
        )
    finally:
        reader.close()
    if record is None or record.offset() != offset:
        raise NotFoundError(f"no quarantined record at offset {offset} of {topic}")
    return record


def _real_target(record: Any, namespace: str) -> tuple[str, int] | None:
    """The Kafka topic and partition (-1: the key decides) a quarantined delayed message is
    delivered to, as the replay reads them (the ``REAL_TOPIC`` and ``REAL_QID`` headers, or
    the envelope's properties); None when they cannot be read (the replay then refuses the
    record with its own reason)."""
    raw, unreadable = read_headers(record)
    if unreadable is not None:
        return None
    props = decode_headers(raw)
    source = props.get(QUARANTINE_SOURCE_TOPIC)
    catalog = TopicCatalog(namespace=namespace)
    if source not in (catalog.topic(SystemTopic.SCHEDULE), catalog.topic(SystemTopic.TIMER)):
        return None  # not a delayed message: the replay says so
    try:
        if MessageConst.REAL_TOPIC not in props:  # an envelope record: routing in its value
            props = dict(decode_envelope(record.value()).properties)
        real_topic = props.get(MessageConst.REAL_TOPIC)
        if not isinstance(real_topic, str) or not real_topic:
            return None
        partition = parse_count(props.get(MessageConst.REAL_QUEUE_ID))
        return to_kafka_topic(real_topic, namespace), -1 if partition is None else partition
    except (BridgeError, ValueError):
        return None


def replay_quarantined_at(config: ClientConfig, offset: int) -> ReplayedMessage:
    """Deliver the delayed message quarantined at ``offset`` to its real topic, once:
    :class:`NotFoundError` when no quarantined record is there, :class:`ReplayTargetError`
    naming a real topic that cannot take it before anything is written (``quarantine
    replay`` and the console's Quarantine page)."""
    record = _quarantined_record(config, offset)
    target = _real_target(record, config.namespace)
    if target is not None:
        problem = _target_problem(config, *target)
        if problem is not None:
            raise ReplayTargetError(
                f"replaying QUARANTINE offset {offset}: {problem}; replay refuses it, "
                "it stays quarantined"
            )
    return replay_quarantined(config, offset)


@quarantine_list.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("offset", type=click.IntRange(min=0))
@click.pass_context
def quarantine_replay(ctx: click.Context, bootstrap_servers: str | None, offset: int) -> None:
    """Deliver the delayed message quarantined at OFFSET to its real topic, exactly once
    (after the cause, e.g. a missing topic or an ACL, was fixed). Exit status 4 when OFFSET
    holds no quarantined record (or the namespace has no QUARANTINE topic); a real topic that
    cannot take it (a Kafka internal topic, a partition it does not have) is named before
    anything is written (ReplayTargetError), and the record stays quarantined."""
    given = bootstrap_servers or (ctx.obj or {}).get("quarantine_bootstrap")
    done = replay_quarantined_at(_read_config(ctx, given), offset)
    console.print(
        f"replayed {shown(done.msg_id)} from quarantine offset {offset} to "
        f"{done.topic}[{done.partition}]@{done.offset}",
        markup=False,
    )
