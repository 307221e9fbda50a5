"""Operator views of transactions: parked (check-max) messages and undecided ones."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from bridge.client.reader import read_to_end
from bridge.codec import envelope_to_message
from bridge.config import ClientConfig
from bridge.errors import InvalidArgumentError, WireFormatError
from bridge.kafka.clients import new_producer
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import (
    END_TRANSACTION_SCHEMA,
    ENVELOPE_SCHEMA,
    OpAction,
    OpEntry,
    committed_record,
)
from topics.avro import default_registry
from topics.catalog import SystemTopic, TopicCatalog

OPERATOR_PARTITION = -1
"""``half_partition`` of the OP records an operator writes when replaying or dropping a parked
message (``half_offset`` is then its offset in the check-max topic)."""


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


def read_parked(
    config: ClientConfig, timeout_ms: int = 10_000, include_resolved: bool = False
) -> list[MessageExt]:
    """Half messages parked in the check-max topic (``TRANS_CHECK_MAX_TIME_TOPIC``) that no
    operator replayed or dropped yet (all of them with ``include_resolved``);
    ``queue_offset`` is the offset in the check-max topic."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.CHECK_MAX)
    resolved = {} if include_resolved else _operator_resolutions(config, timeout_ms)
    out = []
    for record in read_to_end(config, topic, timeout_ms):
        if record.offset() in resolved:
            continue
        try:
            msg = envelope_to_message(default_registry().decode(ENVELOPE_SCHEMA, record.value()))
        except WireFormatError:
            continue
        msg.queue_offset = record.offset()
        out.append(msg)
    return out


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


def list_undecided(config: ClientConfig, timeout_ms: int = 30_000) -> list[UndecidedTransaction]:
    """Transactions whose half message has neither an OP record nor a decision yet.

    Reads HALF and OP from the beginning of their retention: an operator's view, not a
    hot path.
    """
    catalog = TopicCatalog(namespace=config.namespace)
    decided: set[str] = set()
    for record in read_to_end(config, catalog.topic(SystemTopic.OP), timeout_ms):
        try:
            decided.add(OpEntry.decode(record.value()).transaction_id)
        except WireFormatError:
            continue
    latest: dict[str, UndecidedTransaction] = {}
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
        times = msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES) or "0"
        latest[tid] = UndecidedTransaction(
            transaction_id=tid,
            producer_group=msg.get_property(MessageConst.PRODUCER_GROUP) or "",
            real_topic=msg.get_property(MessageConst.REAL_TOPIC) or "",
            half_partition=record.partition(),
            half_offset=record.offset(),
            check_times=int(times) if times.isdigit() else 0,
            age_ms=now - msg.born_timestamp_ms,
        )
    return sorted(latest.values(), key=lambda t: -t.age_ms)


def resolve_parked(config: ClientConfig, msg_id: str, action: OpAction) -> MessageExt:
    """Replay (``OpAction.COMMIT``: deliver to its real topic) or drop (``OpAction.ROLLBACK``)
    a parked message, in one Kafka transaction with an OP record that marks it resolved, so it
    is never replayed twice. Raises :class:`InvalidArgumentError` if no such message is parked.
    """
    if action is OpAction.DISCARD:
        raise InvalidArgumentError("a parked message is replayed (COMMIT) or dropped (ROLLBACK)")
    parked = [m for m in read_parked(config) if m.msg_id == msg_id]
    if not parked:
        raise InvalidArgumentError(f"no parked, unresolved message with id {msg_id!r}")
    msg = parked[-1]
    catalog = TopicCatalog(namespace=config.namespace)
    producer = new_producer(
        config,
        "bridge-operator",
        transactional_id=f"{config.namespace}.operator.{uuid.uuid4().hex}",
    )
    timeout_s = config.request_timeout_ms / 1000
    producer.init_transactions(timeout_s)
    producer.begin_transaction()
    if action is OpAction.COMMIT:
        real = committed_record(msg, config.namespace)
        headers: list[tuple[str, str | bytes | None]] = list(real.headers)
        producer.produce(
            real.topic, real.value, real.key, partition=real.partition,
            headers=headers, timestamp=real.timestamp_ms,
        )  # fmt: skip
    entry = OpEntry(
        half_partition=OPERATOR_PARTITION,
        half_offset=msg.queue_offset,
        transaction_id=msg.transaction_id or msg.msg_id,
        msg_id=msg.msg_id,
        producer_group=msg.get_property(MessageConst.PRODUCER_GROUP) or "",
        action=action,
        decided_at_ms=time.time_ns() // 1_000_000,
    )
    producer.produce(
        catalog.topic(SystemTopic.OP), entry.encode(), msg.msg_id.encode(), partition=0
    )
    producer.commit_transaction(timeout_s)
    return msg
