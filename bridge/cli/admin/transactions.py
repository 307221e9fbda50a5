"""Operator views of transactions: parked (check-max) messages and undecided ones."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from bridge.client.reader import read_to_end
from bridge.codec import ENVELOPE_SCHEMA, PreparedRecord, envelope_to_message
from bridge.config import ClientConfig
from bridge.coordinator.transaction.pending import (
    CheckPolicy,
    check_count,
    copy_due_ms,
    next_check_ms,
)
from bridge.coordinator.transaction.targets import (
    auto_create_allowed,
    delivery_problem,
    partition_problem,
    topic_problem,
)
from bridge.errors import InvalidArgumentError, ParkedReplayError, WireFormatError
from bridge.kafka.batch_writer import TransactionBatch, abort_quietly, kafka_error, write_batch
from bridge.kafka.clients import new_producer
from bridge.kafka.transactional import transactional_producer
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import (
    END_TRANSACTION_SCHEMA,
    CheckRequest,
    OpAction,
    OpEntry,
    committed_record,
)
from topics.avro import default_registry
from topics.catalog import SystemTopic, TopicCatalog
from topics.naming import operator_transactional_id

logger = logging.getLogger(__name__)

OPERATOR_PARTITION = -1
"""``half_partition`` of the OP records an operator writes when replaying or dropping a parked
message (``half_offset`` is then its offset in the check-max topic)."""


_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def _operator_resolutions(config: ClientConfig, timeout_ms: int) -> dict[int, OpEntry]:
    op_topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.OP)
    out = {}
    for record in read_to_end(config, op_topic, timeout_ms):
        try:
            entry = OpEntry.decode(record.value())
        except WireFormatError:
            continue
        if entry.half_partition == OPERATOR_PARTITION:
            out[entry.half_offset] = entry
    return out


def _resolved_meanwhile(config: ClientConfig, msg: MessageExt) -> bool:
    """True if an operator resolved this parked copy, or another copy of its transaction."""
    tid = msg.transaction_id or msg.msg_id
    return any(
        offset == msg.queue_offset or entry.transaction_id == tid
        for offset, entry in _operator_resolutions(config, config.request_timeout_ms).items()
    )


def read_parked(
    config: ClientConfig, timeout_ms: int = 10_000, include_resolved: bool = False
) -> list[MessageExt]:
    """Half messages parked in the check-max topic (``TRANS_CHECK_MAX_TIME_TOPIC``) that no
    operator replayed or dropped yet (all of them with ``include_resolved``);
    ``queue_offset`` is the offset in the check-max topic."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.CHECK_MAX)
    resolved = {} if include_resolved else _operator_resolutions(config, timeout_ms)
    # A transaction parked twice (a coordinator that lost its producer while parking it) is
    # one parked message: resolving either copy resolves it, and it is listed once (newest).
    resolved_ids = {entry.transaction_id for entry in resolved.values()}
    out: dict[str, MessageExt] = {}
    for record in read_to_end(config, topic, timeout_ms):
        if record.offset() in resolved:
            continue
        try:
            msg = envelope_to_message(default_registry().decode(ENVELOPE_SCHEMA, record.value()))
        except WireFormatError:
            continue
        msg.queue_offset = record.offset()
        tid = msg.transaction_id or msg.msg_id
        if include_resolved:
            out[f"{tid}@{record.offset()}"] = msg
        elif tid not in resolved_ids:
            out.pop(tid, None)
            out[tid] = msg
    return list(out.values())


@dataclass(frozen=True, slots=True)
class UndecidedTransaction:
    """A half message with no decision yet."""

    transaction_id: str
    producer_group: str
    real_topic: str
    half_partition: int
    half_offset: int
    check_times: int
    age_ms: int
    next_check_ms: int | None = None
    """When its next check is due (ms since the epoch), as its checker schedules it from the
    records it writes (:func:`~bridge.coordinator.transaction.pending.next_check_ms`); None when no
    :class:`CheckPolicy` was given. In the past: due, waiting for the checker's next round or
    for room in its group's window of unanswered checks."""
    last_check_request_ms: int | None = None
    """When the last request of its next check was written to its group's check topic (ms
    since the epoch; None: none, or not read)."""


def list_undecided(
    config: ClientConfig, timeout_ms: int = 30_000, policy: CheckPolicy | None = None
) -> list[UndecidedTransaction]:
    """Transactions whose half message has neither an OP record nor a decision yet.

    Reads HALF and OP from the beginning of their retention: an operator's view, not a
    hot path. With ``policy`` (the coordinators' check settings) each one's next check is
    worked out as the checker works it out: from its copies in HALF (:func:`copy_due_ms`) and
    the last request of its next check in its group's check topic (:func:`next_check_ms`),
    which is read too. Keeps a few numbers per undecided transaction, never a record.
    """
    catalog = TopicCatalog(namespace=config.namespace)
    decided: set[str] = set()
    for record in read_to_end(config, catalog.topic(SystemTopic.OP), timeout_ms):
        try:
            decided.add(OpEntry.decode(record.value()).transaction_id)
        except WireFormatError:
            continue
    latest: dict[str, UndecidedTransaction] = {}
    copies_due: dict[str, int] = {}
    now = time.time_ns() // 1_000_000
    for record in read_to_end(config, catalog.topic(SystemTopic.HALF), timeout_ms):
        try:
            name, fields = default_registry().decode_any(record.value())
        except WireFormatError:
            continue
        if name == END_TRANSACTION_SCHEMA:
            continue
        if name != ENVELOPE_SCHEMA:
            continue
        msg = envelope_to_message(fields)
        tid = msg.transaction_id or msg.msg_id
        if tid in decided:
            continue
        # Not plain ASCII digits (e.g. "²", which isdigit() accepts): none.
        check_times = check_count(msg)
        current = latest.get(tid)
        if current is not None and check_times < current.check_times:
            continue  # a send stored twice, read after a check copy: the checker drops it too
        if policy is not None:
            append_ms = record.timestamp()[1]
            # The checker reads a record as it is appended: its reading time is about then.
            due = copy_due_ms(policy, msg, append_ms, append_ms)
            copies_due[tid] = max(due, copies_due.get(tid, due))
        latest[tid] = UndecidedTransaction(
            transaction_id=tid,
            producer_group=msg.get_property(MessageConst.PRODUCER_GROUP) or "",
            real_topic=msg.get_property(MessageConst.REAL_TOPIC) or "",
            half_partition=record.partition(),
            half_offset=record.offset(),
            check_times=check_times,
            age_ms=now - msg.born_timestamp_ms,
        )
    if policy is not None and latest:
        asked = _last_check_requests(config, catalog, latest, timeout_ms)
        latest = {
            tid: dataclasses.replace(
                t,
                next_check_ms=next_check_ms(policy, copies_due[tid], asked.get(tid)),
                last_check_request_ms=asked.get(tid),
            )
            for tid, t in latest.items()
        }
    return sorted(latest.values(), key=lambda t: -t.age_ms)


def _last_check_requests(
    config: ClientConfig,
    catalog: TopicCatalog,
    undecided: dict[str, UndecidedTransaction],
    timeout_ms: int,
) -> dict[str, int]:
    """Transaction id -> when the last request of its next check (numbered its check count +
    1) was written, ms, from the check topics of the groups of ``undecided``."""
    out: dict[str, int] = {}
    for group in sorted({t.producer_group for t in undecided.values() if t.producer_group}):
        for record in read_to_end(config, catalog.check_topic(group), timeout_ms):
            try:
                request = CheckRequest.decode(record.value())
            except WireFormatError:
                continue
            pending = undecided.get(request.transaction_id)
            if pending is None or request.check_times != pending.check_times + 1:
                continue  # decided, or a check counted already
            asked_ms = record.timestamp()[1]
            out[request.transaction_id] = max(asked_ms, out.get(request.transaction_id, asked_ms))
    return out


def resolve_parked(config: ClientConfig, msg_id: str, action: OpAction) -> MessageExt:
    """Replay (``OpAction.COMMIT``: deliver to its real topic) or drop (``OpAction.ROLLBACK``)
    a parked message, in one Kafka transaction with an OP record that marks it resolved, so it
    is never replayed twice.

    The Kafka transactional id is derived from ``msg_id``: a second resolution of the same
    message running at the same time fences the first (whose transaction is aborted or was
    committed before), and reads its resolution after fencing it.

    Raises :class:`InvalidArgumentError` if no such message is parked (or it was resolved
    meanwhile), :class:`ParkedReplayError` naming the cause when it cannot be written (its
    topic or partition does not exist, it is too large, ...): it then stays parked.
    """
    if action is OpAction.DISCARD:
        raise InvalidArgumentError("a parked message is replayed (COMMIT) or dropped (ROLLBACK)")
    parked = [m for m in read_parked(config) if m.msg_id == msg_id]
    if not parked:
        raise InvalidArgumentError(f"no parked, unresolved message with id {msg_id!r}")
    msg = parked[-1]
    verb = "replaying" if action is OpAction.COMMIT else "dropping"
    omitted = msg.get_property(MessageConst.BODY_OMITTED_BYTES)
    if action is OpAction.COMMIT and omitted is not None:
        raise ParkedReplayError(
            f"replaying parked message {msg_id}: it was parked without its body of {omitted} "
            f"bytes ({msg.get_property(MessageConst.DELIVERY_ERROR) or 'too large to keep'}); "
            "delivering it would deliver an empty message. Drop it, or re-send it from its "
            "half message while HALF still holds it"
        )
    real = committed_record(msg, config.namespace) if action is OpAction.COMMIT else None
    timeout_s = config.request_timeout_ms / 1000
    try:
        producer = transactional_producer(
            config,
            "bridge-operator",
            operator_transactional_id(config.namespace, msg_id),
            timeout_s,
        )
    except KafkaException as exc:
        raise ParkedReplayError(f"{verb} parked message {msg_id}: {_text(exc)}") from exc
    # After init_transactions, a concurrent resolution of this message is either committed
    # (and visible now) or aborted: never both this one and that one.
    if _resolved_meanwhile(config, msg):
        raise InvalidArgumentError(
            f"no parked, unresolved message with id {msg_id!r} (resolved meanwhile)"
        )
    metadata = new_producer(config, "bridge-operator-metadata")
    if real is not None:
        problem = _target_problem(metadata, real, timeout_s, auto_create_allowed(config))
        if problem is not None:
            raise ParkedReplayError(f"{verb} parked message {msg_id}: {problem}; it stays parked")
    batch = _resolution(config, msg, action=action, real=real)
    if not write_batch(
        producer,
        batch,
        timeout_s=timeout_s,
        on_failure=lambda _: abort_quietly(producer, timeout_s, _log_abort),
        failures=(KafkaException,),
    ):
        failure = batch.failure
        assert failure is not None
        if _resolved_meanwhile(config, msg):
            raise InvalidArgumentError(
                f"no parked, unresolved message with id {msg_id!r} (resolved meanwhile)"
            ) from failure
        error = kafka_error(failure)
        if error is not None and error.code() in _FENCED:
            raise ParkedReplayError(
                f"{verb} parked message {msg_id}: another resolution of the same message "
                f"started meanwhile and fenced this one ({_text(failure)}); that one resolves it "
                "(see 'bridge transactions parked')",
                error,
            ) from failure
        cause = _cause(metadata, real, failure, timeout_s, auto_create_allowed(config))
        raise ParkedReplayError(
            f"{verb} parked message {msg_id}: {cause}; it stays parked", error
        ) from failure
    return msg


def _resolution(
    config: ClientConfig, msg: MessageExt, *, action: OpAction, real: PreparedRecord | None
) -> TransactionBatch:
    """The real record (on replay) and the operator's OP record, for one Kafka transaction.
    A failed delivery makes its commit fail."""
    batch = TransactionBatch()
    if real is not None:
        batch.add(real)
    entry = OpEntry(
        half_partition=OPERATOR_PARTITION,
        half_offset=msg.queue_offset,
        transaction_id=msg.transaction_id or msg.msg_id,
        msg_id=msg.msg_id,
        producer_group=msg.get_property(MessageConst.PRODUCER_GROUP) or "",
        action=action,
        decided_at_ms=time.time_ns() // 1_000_000,
    )
    op_topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.OP)
    batch.add(PreparedRecord(op_topic, msg.msg_id.encode(), entry.encode(), [], msg.msg_id, 0, 0))
    return batch


def _log_abort(text: str) -> None:
    logger.debug("the operator's transaction: %s", text)  # fenced, or fatal


def _text(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return f"{error.str()} ({error.name()})" if isinstance(error, KafkaError) else str(exc)


def _target_problem(
    metadata: Any, real: PreparedRecord, timeout_s: float, auto_create: bool
) -> str | None:
    try:
        problem, count = topic_problem(
            metadata, real.kafka_topic, timeout_s, confirm_s=1.0 if auto_create else 0.0
        )
    except KafkaException:
        return None  # the write finds out
    return problem or partition_problem(real.kafka_topic, real.partition, count)


def _cause(
    metadata: Any,
    real: PreparedRecord | None,
    exc: KafkaException,
    timeout_s: float,
    auto_create: bool,
) -> str:
    """What made the write fail, in words: the target's metadata when it shows a problem,
    else the error itself."""
    error = exc.args[0] if exc.args else None
    if real is not None:
        problem = _target_problem(metadata, real, timeout_s, auto_create)
        if problem is not None:
            return problem
        if isinstance(error, KafkaError):
            return delivery_problem(real.kafka_topic, error)
    return _text(exc)
