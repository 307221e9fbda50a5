"""The spread layout against a real broker: records written in the one-partition layout (the
layout of releases before the spread one, and of the default settings), waiting in topics of
that size and hopping when the settings change, are still delivered once each and never
early, beside records written in the spread layout, by two coordinators sharing the levels
and tiers."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.delay.service import ScheduleDeliveryService, TimerService
from bridge.errors import TopicProvisioningError
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from tests.delay_layouts import partitions, written
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker

LEVELS = "1s 2s 3s"
LANES = 3
TIMER_DELAYS_MS = (700, 2_500, 5_000, 9_000)
"""Timers of the older layout due after the switch hop in the new one (9 s at 100 ms
precision: tier 6, then tier 4, ...)."""


def _config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level=LEVELS,
        timer_precision_ms=100,
        timer_max_delay_ms=365 * 86_400_000,
    )


def _coordinator(config: ClientConfig, coordinator_id: str) -> Coordinator:
    return Coordinator(
        CoordinatorConfig(
            client=config,
            coordinator_id=coordinator_id,
            transaction_partitions=1,
            session_timeout_ms=6000,
        )
    )


def _send(config: ClientConfig, topic: str, tag: str, due: dict[str, int]) -> None:
    """Send each level and each timer of :data:`TIMER_DELAYS_MS` five times; note each body's
    earliest allowed delivery (epoch ms) in ``due``."""
    with Producer(f"layout_{tag}", config=config) as producer:
        for round_ in range(5):
            for level in (1, 2, 3):
                body = f"{tag}-L{level}-{round_}"
                due[body] = int(time.time() * 1000) + 1000 * level
                producer.send_sync(Message(topic, body.encode(), delay_time_level=level))
            for delay in TIMER_DELAYS_MS:
                body = f"{tag}-T{delay}-{round_}"
                timer = Message(topic, body.encode())
                at = int(time.time() * 1000) + delay
                timer.set_deliver_time_ms(at)
                due[body] = at
                producer.send_sync(timer)


def test_records_of_the_one_partition_layout_are_delivered_once_beside_spread_ones(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    older = _config(kafka_bootstrap, namespace)  # one partition per level and tier
    spread = older.replace(delay_partitions_per_level=LANES, timer_partitions_per_tier=LANES)
    policy = older.delay_policy
    TopicAdmin(older).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    due: dict[str, int] = {}

    # 1. The older layout, with a coordinator of it delivering and hopping some.
    with _coordinator(older, "older"):
        _send(older, topic, "a", due)
        wait_until(lambda: list(read_messages(older, [topic], max_messages=1)), 30)
    # 2. In flight with no coordinator: written in the older layout, read after the switch.
    _send(older, topic, "b", due)
    # The older layout's topics: level L in partition L - 1, tier k in k, nothing beyond.
    assert partitions(older, SystemTopic.SCHEDULE) == policy.level_count
    assert partitions(older, SystemTopic.TIMER) == policy.tier_count
    # A producer of the spread settings meets the topics of the older size: a typed error
    # that says how to add the partitions, and nothing is sent.
    early_producer = Producer("layout_early", config=spread)
    with pytest.raises(TopicProvisioningError, match="delay_partitions_per_level"), early_producer:
        early_producer.send_sync(Message(topic, b"never", delay_time_level=1))

    # 3. The spread layout: two coordinators add the partitions and share them.
    with _coordinator(spread, "spread-a") as one, _coordinator(spread, "spread-b") as two:
        wait_until(lambda: partitions(older, SystemTopic.TIMER) == policy.tier_count * LANES)
        assert partitions(older, SystemTopic.SCHEDULE) == policy.level_count * LANES
        _send(spread, topic, "c", due)
        # The new records went to the added lanes too (15 level messages over 3 lanes).
        assert sum(written(older, SystemTopic.SCHEDULE)[policy.level_count :]) > 0
        assert sum(written(older, SystemTopic.TIMER)[policy.tier_count :]) > 0
        expected = set(due)
        got: Counter[str] = Counter()
        arrived: dict[str, int] = {}

        def all_in() -> bool:
            for msg in read_messages(older, [topic], max_messages=len(expected), timeout_ms=5000):
                body = msg.body.decode()
                if body not in arrived:
                    arrived[body] = msg.store_timestamp_ms or 0
            return expected <= arrived.keys()

        wait_until(all_in, 90, 1.0)
        # Each share of the load: both coordinators delivered levels and timers.
        for running in (one, two):
            for kind in (ScheduleDeliveryService, TimerService):
                assert sum(s.delivered for s in running.services if isinstance(s, kind)) > 0
    # Exactly once (read everything there is, after the coordinators stopped) and never early.
    for msg in read_messages(older, [topic], timeout_ms=3000):
        got[msg.body.decode()] += 1
    assert set(got) == expected
    assert [body for body, n in got.items() if n != 1] == []
    early = {body: due[body] - at for body, at in arrived.items() if at < due[body]}
    assert early == {}


def test_recalls_apply_whichever_coordinator_reads_the_timers_partition(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    """Each coordinator reads every recall marker: a recalled timer is skipped by the one that
    owns its partition among its tier's, and the others arrive once."""
    config = _config(kafka_bootstrap, namespace).replace(
        timer_partitions_per_tier=LANES, timer_max_delay_ms=86_400_000
    )
    TopicAdmin(config).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    with _coordinator(config, "recall-a") as one, _coordinator(config, "recall-b") as two:
        timer_services = [
            s for running in (one, two) for s in running.services if isinstance(s, TimerService)
        ]
        with Producer("layout_warmup", config=config) as producer:

            def both_deliver() -> bool:
                # Timers through every lane until each coordinator delivered some: both own
                # partitions of the timer topic (the second one's joining has rebalanced).
                for i in range(6):
                    warm = Message(f"{topic}-warmup", f"w{i}".encode())
                    warm.set_delay_time_ms(300)
                    producer.send_sync(warm)
                return all(s.delivered > 0 for s in timer_services)

            wait_until(both_deliver, 60, 0.5)
        due = int(time.time() * 1000) + 4000
        with Producer("layout_recall", config=config) as producer:
            sent = []
            for i in range(40):
                timer = Message(topic, f"t{i}".encode())
                timer.set_deliver_time_ms(due)
                sent.append(producer.send_sync(timer))
            recalled = {f"t{i}" for i in range(0, 40, 2)}
            for i, result in enumerate(sent):
                if f"t{i}" in recalled:
                    assert result.recall_handle is not None
                    producer.recall_message(topic, result.recall_handle)
        kept = {f"t{i}" for i in range(40)} - recalled

        def arrived() -> Counter[str]:
            return Counter(m.body.decode() for m in read_messages(config, [topic], timeout_ms=3000))

        wait_until(lambda: kept <= arrived().keys(), 60, 1.0)
        counts = [
            sum(s.recalled for s in running.services if isinstance(s, TimerService))
            for running in (one, two)
        ]
    got = arrived()
    assert set(got) == kept
    assert all(n == 1 for n in got.values())
    assert sum(counts) == len(recalled)
    assert min(counts) > 0  # both shared the tier: each skipped the recalls of its partitions
