"""Delay levels and timer messages against a real broker: on time, durable, exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.cli.admin.delays import delay_status
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_reader, read_record_at
from bridge.kafka.quarantine import QuarantinedRecord, read_quarantine
from bridge.message import MessageConst
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker

LEVELS = "1s 2s 3s"
PRECISION_MS = 100
SLACK_MS = 700
"""Scheduling slack on a busy 2-core machine, beyond the precision."""


@pytest.fixture()
def delay_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level=LEVELS,
        timer_precision_ms=PRECISION_MS,
        timer_max_delay_ms=365 * 86_400_000,
    )


def coordinator_config(client: ClientConfig, coordinator_id: str = "delay") -> CoordinatorConfig:
    return CoordinatorConfig(
        client=client,
        coordinator_id=coordinator_id,
        transaction_partitions=1,
        session_timeout_ms=6000,
    )


@pytest.fixture()
def coordinator(delay_config: ClientConfig, topic: str) -> Iterator[Coordinator]:
    with Coordinator(coordinator_config(delay_config)) as running:
        # Both delay services own their partitions once a warm-up of each kind arrives.
        with Producer("warmup", config=delay_config) as producer:
            producer.send_sync(Message(f"{topic}-warmup", b"level", delay_time_level=1))
            timer = Message(f"{topic}-warmup", b"timer")
            timer.set_delay_time_ms(300)
            producer.send_sync(timer)
        assert len(list(read_messages(delay_config, [f"{topic}-warmup"], max_messages=2))) == 2
        yield running


def stamped_topic(config: ClientConfig, topic: str) -> str:
    """Create ``topic`` with the broker's append time as record time: the delivery time."""
    TopicAdmin(config).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    return topic


def arrivals(config: ClientConfig, topic: str, count: int) -> dict[str, float]:
    """Body -> when it was delivered to ``topic`` (epoch s, broker clock)."""
    out: dict[str, float] = {}
    for msg in read_messages(config, [topic], max_messages=count, timeout_ms=30_000):
        assert msg.store_timestamp_ms is not None
        out[msg.body.decode()] = msg.store_timestamp_ms / 1000
    return out


# Serial: it bounds lateness against the wall clock, which the other workers' load moves.
@pytest.mark.serial
def test_each_level_is_never_early_and_late_by_at_most_precision_plus_slack(
    delay_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    sent: dict[str, tuple[float, int]] = {}
    stamped_topic(delay_config, topic)
    with Producer("pg", config=delay_config) as producer:
        for level in (1, 2, 3):
            producer.send_sync(Message(topic, f"L{level}", delay_time_level=level, tags="T"))
            sent[f"L{level}"] = (time.time(), level * 1000)
        producer.send_sync(Message(topic, "L9", delay_time_level=9))  # clamped to 3 (3 s)
        sent["L9"] = (time.time(), 3000)
    got = arrivals(delay_config, topic, 4)
    for name, (at, delay_ms) in sent.items():
        waited_ms = (got[name] - at) * 1000
        assert delay_ms <= waited_ms + 50, f"{name} early: {waited_ms:.0f} ms < {delay_ms}"
        assert waited_ms <= delay_ms + PRECISION_MS + SLACK_MS, f"{name} late: {waited_ms:.0f} ms"
    (first,) = [m for m in read_messages(delay_config, [topic], max_messages=4) if m.body == b"L1"]
    assert first.tags == "T"
    assert MessageConst.DELAY_TIME_LEVEL not in first.properties
    assert MessageConst.REAL_TOPIC not in first.properties


# Serial: it bounds lateness against the wall clock, which the other workers' load moves.
@pytest.mark.serial
def test_timers_are_never_early_and_late_by_at_most_precision_plus_slack(
    delay_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    stamped_topic(delay_config, topic)
    now_ms = time.time_ns() // 1_000_000
    timers = {
        "ms1500": Message(topic, "ms1500"),
        "sec2": Message(topic, "sec2"),
        "at2700": Message(topic, "at2700"),
    }
    timers["ms1500"].set_delay_time_ms(1500)
    timers["sec2"].set_delay_time_sec(2)
    timers["at2700"].set_deliver_time_ms(now_ms + 2700)
    due = {"ms1500": now_ms + 1500, "sec2": now_ms + 2000, "at2700": now_ms + 2700}
    past = Message(topic, "past")
    past.set_deliver_time_ms(now_ms - 60_000)
    with Producer("pg", config=delay_config) as producer:
        for msg in timers.values():
            producer.send_sync(msg)
        producer.send_sync(past)
    got = arrivals(delay_config, topic, 4)
    assert got["past"] * 1000 - now_ms < 1000
    for name, due_ms in due.items():
        arrived_ms = got[name] * 1000
        # Sent a few ms after now_ms: relative timers are due a little later than due_ms.
        assert arrived_ms >= due_ms, f"{name} early by {due_ms - arrived_ms:.0f} ms"
        assert arrived_ms <= due_ms + PRECISION_MS + SLACK_MS, (
            f"{name} late by {arrived_ms - due_ms:.0f} ms"
        )


def coordinator_process(config: ClientConfig, coordinator_id: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": coordinator_id,
        "BRIDGE_MESSAGE_DELAY_LEVEL": config.message_delay_level,
        "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
        "BRIDGE_TIMER_MAX_DELAY_MS": str(config.timer_max_delay_ms),
        "BRIDGE_TRANSACTION_PARTITIONS": "1",
        "BRIDGE_SESSION_TIMEOUT_MS": "6000",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO_ROOT,
    )  # fmt: skip


def test_sigkill_while_thousands_are_due_delivers_each_exactly_once(
    delay_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(delay_config).ensure_system_topics(coordinator_config(delay_config).catalog)
    count = 3000
    due_ms = time.time_ns() // 1_000_000 + 4000
    with Producer("pg", config=delay_config) as producer:
        for i in range(count):
            msg = Message(topic, f"m{i}")
            if i % 2:
                msg.set_deliver_time_ms(due_ms)
            else:
                msg.set_delay_time_level(3)
            producer.send_async(msg)
        assert producer.flush(30_000) == 0
    first = coordinator_process(delay_config, "killed")
    try:
        wait_until(
            lambda: list(read_messages(delay_config, [topic], max_messages=1, timeout_ms=200)),
            timeout_s=60,
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    second = coordinator_process(delay_config, "killed")
    try:
        received = [
            m for m in read_messages(delay_config, [topic], max_messages=count, timeout_ms=60_000)
        ]
        received += list(read_messages(delay_config, [topic], timeout_ms=3000))[count:]
    finally:
        second.terminate()
        second.wait(30)
    bodies = sorted(m.body.decode() for m in received)
    assert len(bodies) == count, f"{len(bodies)} delivered, {len(set(bodies))} distinct"
    assert len(set(bodies)) == count
    timers = [m for m in received if int(m.body[1:]) % 2]
    assert all(m.born_timestamp_ms > 0 for m in timers)


@pytest.mark.check("G5")
def test_a_timer_far_in_the_future_survives_restarts(
    delay_config: ClientConfig, topic: str
) -> None:
    with Producer("pg", config=delay_config) as producer:
        far = Message(topic, "in-an-hour")
        far.set_delay_time_sec(3600)
        soon = Message(topic, "soon")
        soon.set_delay_time_ms(4000)
        producer.send_sync(far)
        producer.send_sync(soon)
    for run in range(2):
        with Coordinator(coordinator_config(delay_config, f"restart{run}")):
            wait_until(
                lambda: sum(q.pending for q in delay_status(delay_config) if q.kind == "tier") >= 1,
                timeout_s=30,
            )
    with Coordinator(coordinator_config(delay_config, "restart-final")):
        (soon_msg,) = read_messages(delay_config, [topic], max_messages=1, timeout_ms=20_000)
        assert soon_msg.body == b"soon"
        waiting = [q for q in delay_status(delay_config) if q.kind == "tier" and q.pending]
        assert waiting and all(q.next_due_ms for q in waiting)
    assert [m.body for m in read_messages(delay_config, [topic], timeout_ms=2000)] == [b"soon"]


def test_delays_status_shows_when_a_timer_leaves_its_tier(
    delay_config: ClientConfig, topic: str
) -> None:
    """A timer record whose delivery time comes before its tier's wait is over (e.g. written
    by a producer with a finer precision) leaves the tier when that wait is over: the status
    says so, not its delivery time (which read as overdue: "next in -21.5s")."""
    with Producer("pg", config=delay_config) as producer:  # creates the system topics
        far = Message(topic, "in-an-hour")
        far.set_delay_time_sec(3600)
        producer.send_sync(far)
    policy = delay_config.delay_policy
    timer_topic = TopicCatalog(namespace=delay_config.namespace).topic(SystemTopic.TIMER)
    tier = 10
    deliver_ms = int(time.time() * 1000) + 5000  # long before the tier's 102.4 s are over
    raw = RawProducer({"bootstrap.servers": delay_config.bootstrap_servers})
    raw.produce(
        timer_topic,
        b"early",
        partition=tier,
        headers=[(MessageConst.TIMER_DELIVER_MS, str(deliver_ms).encode())],
    )
    assert raw.flush(10) == 0
    reader = new_reader(delay_config, f"status-test-{topic}", "test")
    try:
        head = read_record_at(reader, TopicPartition(timer_topic, tier, 0), 10.0)
    finally:
        reader.close()
    assert head is not None and head.value() == b"early"
    stored_ms = head.timestamp()[1]

    queues = {q.index: q for q in delay_status(delay_config) if q.kind == "tier" and q.pending}

    assert queues[tier].next_due_ms == stored_ms + policy.tier_delay_ms(tier), (
        f"next due {queues[tier].next_due_ms}, delivery time {deliver_ms}"
    )
    # The hour-long timer waits out its own tier's time (it is due long after).
    (far_tier,) = set(queues) - {tier}
    far_due = queues[far_tier].next_due_ms
    assert far_due is not None
    assert far_due - int(time.time() * 1000) > 60_000


def test_malformed_schedule_and_timer_records_are_quarantined(
    delay_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    catalog = coordinator.config.catalog
    raw = RawProducer({"bootstrap.servers": delay_config.bootstrap_servers})
    raw.produce(catalog.topic(SystemTopic.SCHEDULE), b"garbage", partition=0)
    # Delivery times that are no number: the reason names the header and (the start of) the
    # value, not Python's int() message (5,000 digits: advice to raise its digit limit).
    for value, deliver in ((b"garbage", b"x"), (b"long", b"9" * 5000)):
        raw.produce(
            catalog.topic(SystemTopic.TIMER),
            value,
            partition=0,
            headers=[("TIMER_DELIVER_MS", deliver)],
        )
    raw.flush(10)
    with Producer("pg", config=delay_config) as producer:
        producer.send_sync(Message(topic, "after", delay_time_level=1))
    (after,) = read_messages(delay_config, [topic], max_messages=1, timeout_ms=20_000)
    assert after.body == b"after"

    def three_quarantined() -> list[QuarantinedRecord] | None:
        found = list(read_quarantine(delay_config, timeout_ms=1000))
        return found if len(found) >= 3 else None

    kept = wait_until(three_quarantined, timeout_s=20)
    reasons = {(k.source_topic, k.value): k.reason for k in kept}
    assert "marker C3 01" in reasons[catalog.topic(SystemTopic.SCHEDULE), b"garbage"]
    timer = catalog.topic(SystemTopic.TIMER)
    assert reasons[timer, b"garbage"] == "header TIMER_DELIVER_MS is not a time: 'x'"
    assert reasons[timer, b"long"] == f"header TIMER_DELIVER_MS is not a time: {'9' * 64!r}"
