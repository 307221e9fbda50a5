"""Operator views of delayed messages: how many wait in each level and timer tier, and when
the next one is due."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from bridge.config import ClientConfig
from bridge.coordinator.delay import records
from bridge.coordinator.delay.fetch import Held
from bridge.coordinator.delay.held import RECORD_ERRORS
from bridge.coordinator.delay.service import timer_exit_ms
from bridge.delay_policy import partition_slot
from bridge.errors import KafkaClientError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import (
    BOUNDED_READER_BUFFER_KB,
    new_consumer,
    new_reader,
    read_record_at,
    translate_error,
)
from bridge.kafka.quarantine import read_headers
from topics.catalog import SystemTopic
from topics.naming import coordinator_group


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One SCHEDULE level or timer tier."""

    kind: str
    """``level`` or ``tier``."""
    index: int
    """The delay level (1-based) or the timer tier (0-based)."""
    delay_ms: int
    pending: int
    """Records not yet delivered or moved on (counted by offsets, so approximate)."""
    next_due_ms: int | None
    """When the oldest one is due, epoch ms; for a timer tier, when the coordinator takes it
    out of the tier (:func:`~bridge.coordinator.delay.service.timer_exit_ms`): the end of its wait
    there, or its delivery time if that comes within the hold window after."""


def _slot(config: ClientConfig, kind: str, partition: int) -> int:
    """The level index (``level - 1``) or tier a SCHEDULE or timer partition serves."""
    policy = config.delay_policy
    return partition_slot(partition, policy.level_count if kind == "level" else policy.tier_count)


def _delay_ms(config: ClientConfig, kind: str, partition: int) -> int:
    """The delay of SCHEDULE partition ``partition`` (its level's) or of timer partition
    ``partition`` (its tier's)."""
    policy = config.delay_policy
    if kind == "level":
        return policy.partition_delay_ms(partition)
    return policy.tier_delay_ms(policy.partition_tier(partition))


@dataclass(frozen=True, slots=True)
class _Waiting:
    """The records of one level or tier partition its coordinator has not taken yet."""

    kind: str
    partition: int
    topic: str
    start: int
    """Its coordinator group's committed offset (the first retained one when none)."""
    high: int
    delay_ms: int


def _waiting(config: ClientConfig, timeout_ms: int) -> Iterator[tuple[_Waiting, Any]]:
    """Each level and tier partition with what waits in it, and a reader to read it with (a
    partition of a topic that does not exist yet, as nothing was delayed that way, has none
    waiting); what ``bridge delays status`` and the due-time histogram read."""
    catalog = config.catalog()
    policy = config.delay_policy
    existing = TopicAdmin(config).list_topics(include_internal=True)
    for kind, system, count in (
        ("level", SystemTopic.SCHEDULE, policy.level_count),
        ("tier", SystemTopic.TIMER, policy.tier_count),
    ):
        topic = catalog.topic(system)
        if topic not in existing:
            for i in range(count):
                yield _Waiting(kind, i, topic, 0, 0, _delay_ms(config, kind, i)), None
            continue
        service = "schedule" if system is SystemTopic.SCHEDULE else "timer"
        consumer = new_consumer(
            config,
            coordinator_group(config.namespace, service),
            f"bridge-admin-{uuid.uuid4().hex[:6]}",
        )
        # The histogram streams up to its cap of waiting records through this reader.
        reader = new_reader(
            config,
            f"bridge-admin-{uuid.uuid4().hex}",
            "bridge-admin",
            queued_max_messages_kbytes=BOUNDED_READER_BUFFER_KB,
        )
        try:
            # Every partition there is: a level or tier has several (an older layout's
            # topic, one), each serving the slot its number says.
            tps = [TopicPartition(topic, p) for p in range(max(existing[topic], 1))]
            committed = consumer.committed(tps, timeout_ms / 1000)
            for tp in committed:
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout_ms / 1000)
                start = tp.offset if tp.offset >= 0 else low
                delay = _delay_ms(config, kind, tp.partition)
                yield _Waiting(kind, tp.partition, topic, start, high, delay), reader
        finally:
            consumer.close()
            reader.close()


def _due_ms(config: ClientConfig, waiting: _Waiting, record: Any) -> int:
    """When a waiting record is due, epoch ms: a level's after its delay; a timer's at its
    delivery time (at the end of its tier's wait when that cannot be read: it is quarantined
    then)."""
    if waiting.kind == "level":
        return int(record.timestamp()[1]) + waiting.delay_ms
    headers, header_error = read_headers(record)
    held = Held(record, waiting.partition, record.offset(), headers, header_error)
    try:
        return records.timer_deliver_ms(held)
    except RECORD_ERRORS:
        return timer_exit_ms(config.delay_policy, held)


def delay_status(config: ClientConfig, timeout_ms: int = 10_000) -> list[QueueStatus]:
    """The state of every delay level and timer tier of ``config.namespace``; a level or tier
    whose topic does not exist yet (nothing was delayed that way) has none waiting."""
    policy = config.delay_policy
    slots: dict[tuple[str, int], QueueStatus] = {}
    for waiting, reader in _waiting(config, timeout_ms):
        kind, start, high = waiting.kind, waiting.start, waiting.high
        next_due = None
        pending = max(high - start, 0)
        if start < high:
            head = read_record_at(
                reader, TopicPartition(waiting.topic, waiting.partition, start), 5.0
            )
            if head is None:
                pending = 0  # only transaction markers are left
            elif kind == "tier":
                headers, header_error = read_headers(head)
                held = Held(head, waiting.partition, head.offset(), headers, header_error)
                next_due = timer_exit_ms(policy, held)
            else:
                next_due = head.timestamp()[1] + waiting.delay_ms
        slot = _slot(config, kind, waiting.partition)
        known = slots.get((kind, slot))
        if known is not None:  # another partition of the same level or tier: add it up
            pending += known.pending
            if known.next_due_ms is not None:
                next_due = (
                    known.next_due_ms if next_due is None else min(next_due, known.next_due_ms)
                )
        slots[kind, slot] = QueueStatus(
            kind, slot + 1 if kind == "level" else slot, waiting.delay_ms, pending, next_due
        )
    return sorted(slots.values(), key=lambda q: (q.kind != "level", q.index))


def scan_due_times(
    config: ClientConfig,
    count: Callable[[int], None],
    *,
    max_records: int,
    timeout_ms: int = 10_000,
) -> tuple[int, int]:
    """Read what waits in every delay level and timer tier (what ``bridge delays status``
    counts) and call ``count`` with each record's due time (epoch ms; a timer's delivery
    time), keeping none of them; stop after ``max_records``. Returns (records counted, records
    waiting by offsets). Raises :class:`KafkaClientError` when a partition stops answering for
    ``timeout_ms``."""
    counted = waiting_total = 0
    for waiting, reader in _waiting(config, timeout_ms):
        if waiting.start >= waiting.high:
            continue
        waiting_total += waiting.high - waiting.start
        if counted >= max_records:
            continue
        for record in _read_range(reader, waiting, timeout_ms):
            count(_due_ms(config, waiting, record))
            counted += 1
            if counted >= max_records:
                break
    return counted, waiting_total


def _read_range(reader: Any, waiting: _Waiting, timeout_ms: int) -> Iterator[Any]:
    """The records of ``waiting`` from its start to its high watermark, one at a time."""
    where = f"reading {waiting.topic}[{waiting.partition}]"
    reader.assign([TopicPartition(waiting.topic, waiting.partition, waiting.start)])
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        while time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                raise translate_error(error, where, default=KafkaClientError)
            if record.offset() >= waiting.high:
                return
            deadline = time.monotonic() + timeout_ms / 1000
            yield record
            if record.offset() + 1 >= waiting.high:
                return
        raise KafkaClientError(f"{where}@{waiting.start}: nothing within {timeout_ms} ms")
    finally:
        reader.unassign()
