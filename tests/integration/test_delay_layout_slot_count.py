"""Changing the partitions of a spread SCHEDULE or timer topic on a live namespace.

A coordinator whose level or tier count differs from the one the records waiting past lane 0
were routed with (levels appended to ``message_delay_level``, ``timer_max_delay_ms`` raised):
it expands the topic, and those partitions serve other levels or tiers for it. Each such
record carries the count it was routed with and is re-routed by its own level or tier: never
early, once, and on time. And partitions added beside a running coordinator (``bridge topics
create --system``, as docs/delays.md allows) are read within its delay services' metadata
refresh."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from tests.delay_layouts import partitions, written
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker

DAY_MS = 86_400_000


def _delivered_once_never_early(
    laid_out: ClientConfig, changed: ClientConfig, topic: str, due: dict[str, int], late_s: int
) -> None:
    """Run a coordinator of ``changed`` until every body of ``due`` arrived in ``topic``; then
    each arrived once, none before its due time (epoch ms), none more than ``late_s`` late."""
    arrived: dict[str, int] = {}
    with Coordinator(
        CoordinatorConfig(
            client=changed,
            coordinator_id="changed",
            transaction_partitions=1,
            session_timeout_ms=6000,
        )
    ):

        def all_in() -> bool:
            for msg in read_messages(laid_out, [topic], timeout_ms=2000):
                arrived.setdefault(msg.body.decode(), msg.store_timestamp_ms or 0)
            return set(due) <= arrived.keys()

        wait_until(all_in, 60 + late_s, 1.0)
    got = Counter(m.body.decode() for m in read_messages(laid_out, [topic], timeout_ms=3000))
    assert set(got) == set(due)
    assert [body for body, n in got.items() if n != 1] == []
    early = {body: due[body] - at for body, at in arrived.items() if at < due[body]}
    assert early == {}
    late = {body: at - due[body] for body, at in arrived.items() if at - due[body] > late_s * 1000}
    assert late == {}


def test_a_timer_of_a_spread_lane_is_on_time_after_timer_max_delay_is_raised(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    """Timers waiting in lane 1 of 18 tiers, read by a coordinator with 20 (7 days): the
    partition of tier 0 or 1 in lane 1 is tier 19 for it (2**19 s); each timer carries the
    tier count it was routed with and hops by its own time at once."""
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, timer_partitions_per_tier=2
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    TopicAdmin(laid_out).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    assert partitions(laid_out, SystemTopic.TIMER) == 36  # 18 tiers x 2
    due: dict[str, int] = {}
    with Producer("slots_timers", config=laid_out) as producer:
        for delay_ms in (1_500, 3_000, 6_000):
            for i in range(8):
                body = f"t{delay_ms}-{i}"
                timer = Message(topic, body.encode())
                due[body] = int(time.time() * 1000) + delay_ms
                timer.set_deliver_time_ms(due[body])
                producer.send_sync(timer)
    # Some wait in lane 1 (tier 0: partition 19, tier 1: 20, tier 2: 21).
    assert sum(written(laid_out, SystemTopic.TIMER)[18:]) > 0
    longer = laid_out.replace(timer_max_delay_ms=7 * DAY_MS)  # 20 tiers
    _delivered_once_never_early(laid_out, longer, topic, due, late_s=20)
    assert partitions(laid_out, SystemTopic.TIMER) == 40  # the coordinator added lane 1's


def test_a_level_of_a_spread_lane_is_never_early_after_levels_are_appended(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    """Level 3 (10 s) waiting in lane 1 of 4 levels (partition 7), read by a coordinator with
    6 levels: partition 7 is lane 1 of level 1 (1 s) for it. Each record carries the level
    count it was routed with and waits its own level's 10 s, then arrives."""
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level="1s 2s 10s 20s",
        delay_partitions_per_level=2,
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    TopicAdmin(laid_out).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    assert partitions(laid_out, SystemTopic.SCHEDULE) == 8  # 4 levels x 2
    due: dict[str, int] = {}
    with Producer("slots_levels", config=laid_out) as producer:
        for i in range(16):
            body = f"l3-{i}"
            due[body] = int(time.time() * 1000) + 10_000
            producer.send_sync(Message(topic, body.encode(), delay_time_level=3))
    assert written(laid_out, SystemTopic.SCHEDULE)[7] > 0  # level 3, lane 1
    appended = laid_out.replace(message_delay_level=laid_out.message_delay_level + " 30s 40s")
    _delivered_once_never_early(laid_out, appended, topic, due, late_s=20)
    assert partitions(laid_out, SystemTopic.SCHEDULE) == 12


def test_partitions_added_beside_a_running_coordinator_are_read_in_time(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    """docs/delays.md, raising the setting: "Set the setting on the coordinators and restart
    them, or run `bridge topics create --system` with it", then on the producers. A
    coordinator that keeps running learns of the added partitions at its next metadata
    refresh (30 s): what producers put there meanwhile waits for it."""
    older = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, message_delay_level="1s 2s 3s"
    )
    spread = older.replace(delay_partitions_per_level=3)
    TopicAdmin(older).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    coordinator = Coordinator(
        CoordinatorConfig(
            client=older,
            coordinator_id="running",
            transaction_partitions=1,
            session_timeout_ms=6000,
        )
    )
    with coordinator:
        # The coordinator reads its partitions: a level-1 message goes through.
        with Producer("layout_before", config=older) as producer:
            producer.send_sync(Message(topic, b"before", delay_time_level=1))
        wait_until(lambda: list(read_messages(older, [topic], max_messages=1)), 30)
        # What `bridge topics create --system` does to SCHEDULE.
        TopicAdmin(spread).ensure_topics([spread.catalog().spec(SystemTopic.SCHEDULE)], expand=True)
        due: dict[str, int] = {}
        with Producer("layout_after", config=spread) as producer:
            for i in range(12):
                body = f"after-{i}"
                due[body] = int(time.time() * 1000) + 1000
                producer.send_sync(Message(topic, body.encode(), delay_time_level=1))
        arrived: dict[str, int] = {}

        def all_in() -> bool:
            for msg in read_messages(older, [topic], timeout_ms=2000):
                arrived.setdefault(msg.body.decode(), msg.store_timestamp_ms or 0)
            return set(due) <= arrived.keys()

        wait_until(all_in, 90, 1.0)
    late = {body: arrived[body] - at for body, at in due.items() if arrived[body] - at > 5000}
    assert late == {}
