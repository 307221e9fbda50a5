"""Changing the partitions of a spread SCHEDULE or timer topic on a live namespace.

A coordinator (or ``bridge topics create --system``) whose level or tier count differs from
the one the topic was laid out for: before the spread layout a larger count was refused (the
topic had fewer partitions than levels or tiers), which ``ClientConfig.timer_max_delay_ms``
still promises; now the topic is expanded and the records waiting in its lanes past the first
are read as other levels or tiers. And partitions added beside a running coordinator, as
docs/delays.md allows, wait for its next metadata refresh."""

from __future__ import annotations

import time

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import TopicProvisioningError
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker

DAY_MS = 86_400_000


def _partitions(config: ClientConfig, system: SystemTopic) -> int:
    return TopicAdmin(config).list_topics()[config.catalog().topic(system)]


def test_another_tier_count_is_refused_on_a_spread_timer_topic(
    kafka_bootstrap: str, namespace: str
) -> None:
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, timer_partitions_per_tier=2
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    assert _partitions(laid_out, SystemTopic.TIMER) == 36  # 18 tiers x 2
    longer = laid_out.replace(timer_max_delay_ms=7 * DAY_MS)  # 20 tiers
    with pytest.raises(TopicProvisioningError, match="tier"):
        TopicAdmin(longer).ensure_system_topics(longer.catalog())
    assert _partitions(laid_out, SystemTopic.TIMER) == 36


def test_appended_levels_are_refused_on_a_spread_schedule_topic(
    kafka_bootstrap: str, namespace: str
) -> None:
    laid_out = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, delay_partitions_per_level=2
    )
    TopicAdmin(laid_out).ensure_system_topics(laid_out.catalog())
    assert _partitions(laid_out, SystemTopic.SCHEDULE) == 36  # 18 levels x 2
    appended = laid_out.replace(message_delay_level=laid_out.message_delay_level + " 3h 4h")
    with pytest.raises(TopicProvisioningError, match="level"):
        TopicAdmin(appended).ensure_system_topics(appended.catalog())
    assert _partitions(laid_out, SystemTopic.SCHEDULE) == 36


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
