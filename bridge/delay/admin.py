"""Operator views of delayed messages: how many wait in each level and timer tier, and when
the next one is due."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from bridge.config import ClientConfig
from bridge.delay.fetch import Held
from bridge.delay.service import timer_exit_ms
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer, new_reader, read_record_at
from bridge.kafka.quarantine import read_headers
from topics.catalog import SystemTopic, TopicCatalog
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
    out of the tier (:func:`~bridge.delay.service.timer_exit_ms`): the end of its wait there,
    or its delivery time if that comes within the hold window after."""


def _delay_ms(config: ClientConfig, kind: str, partition: int) -> int:
    """The delay of SCHEDULE partition ``partition`` (a level) or of timer tier ``partition``."""
    policy = config.delay_policy
    if kind == "level":
        return policy.level_delays_ms[partition]
    return policy.tier_delay_ms(partition)


def delay_status(config: ClientConfig, timeout_ms: int = 10_000) -> list[QueueStatus]:
    """The state of every delay level and timer tier of ``config.namespace``; a level or tier
    whose topic does not exist yet (nothing was delayed that way) has none waiting."""
    catalog = TopicCatalog(namespace=config.namespace)
    policy = config.delay_policy
    existing = TopicAdmin(config).list_topics(include_internal=True)
    out: list[QueueStatus] = []
    for kind, system, count in (
        ("level", SystemTopic.SCHEDULE, policy.level_count),
        ("tier", SystemTopic.TIMER, policy.tier_count),
    ):
        topic = catalog.topic(system)
        if topic not in existing:
            out.extend(
                QueueStatus(
                    kind, i + 1 if kind == "level" else i, _delay_ms(config, kind, i), 0, None
                )
                for i in range(count)
            )
            continue
        service = "schedule" if system is SystemTopic.SCHEDULE else "timer"
        consumer = new_consumer(
            config,
            coordinator_group(config.namespace, service),
            f"bridge-admin-{uuid.uuid4().hex[:6]}",
        )
        head_reader = new_reader(config, f"bridge-admin-{uuid.uuid4().hex}", "bridge-admin")
        try:
            tps = [TopicPartition(topic, p) for p in range(count)]
            committed = consumer.committed(tps, timeout_ms / 1000)
            for tp in committed:
                low, high = consumer.get_watermark_offsets(tp, timeout=timeout_ms / 1000)
                start = tp.offset if tp.offset >= 0 else low
                delay = _delay_ms(config, kind, tp.partition)
                next_due = None
                pending = max(high - start, 0)
                if start < high:
                    head = read_record_at(
                        head_reader, TopicPartition(topic, tp.partition, start), 5.0
                    )
                    if head is None:
                        pending = 0  # only transaction markers are left
                    elif kind == "tier":
                        headers, header_error = read_headers(head)
                        held = Held(head, tp.partition, head.offset(), headers, header_error)
                        next_due = timer_exit_ms(policy, held)
                    else:
                        next_due = head.timestamp()[1] + delay
                out.append(
                    QueueStatus(
                        kind,
                        tp.partition + 1 if kind == "level" else tp.partition,
                        delay,
                        pending,
                        next_due,
                    )
                )
        finally:
            consumer.close()
            head_reader.close()
    return out
