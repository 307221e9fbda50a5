"""`bridge delays status` over the spread layout: one row per level and tier, what waits in
all of its partitions added up."""

from __future__ import annotations

import time

import pytest

from bridge import ClientConfig, Message, Producer
from bridge.cli.admin.delays import delay_status

pytestmark = pytest.mark.broker


def test_status_adds_up_the_partitions_of_each_level_and_tier(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    config = ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level="1h 2h",
        delay_partitions_per_level=3,
        timer_partitions_per_tier=3,
    )
    sent_ms = int(time.time() * 1000)
    with Producer("layout_status", config=config) as producer:
        for i in range(12):
            producer.send_sync(Message(topic, f"l1-{i}".encode(), delay_time_level=1))
        for i in range(5):
            producer.send_sync(Message(topic, f"l2-{i}".encode(), delay_time_level=2))
        for i in range(7):
            timer = Message(topic, f"t-{i}".encode())
            timer.set_delay_time_sec(3600)
            producer.send_sync(timer)
    rows = delay_status(config)
    levels = {q.index: q for q in rows if q.kind == "level"}
    assert sorted(levels) == [1, 2]
    assert (levels[1].pending, levels[2].pending) == (12, 5)
    assert levels[1].next_due_ms is not None
    assert sent_ms + 3_600_000 <= levels[1].next_due_ms <= int(time.time() * 1000) + 3_600_000
    tiers = [q for q in rows if q.kind == "tier"]
    assert len(tiers) == config.delay_policy.tier_count
    assert sum(q.pending for q in tiers) == 7
    assert len([q for q in tiers if q.pending]) == 1  # one tier, over its partitions
