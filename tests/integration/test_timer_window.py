"""The timers' final window against a real broker: timers whose exact times interleave in one
tier partition are each delivered at their own time (never early, never held behind a
neighbour due later), and a crash between an out-of-order delivery and the commit moving past
it delivers every message exactly once (G5)."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator
from bridge.kafka.admin import TopicAdmin
from tests.integration.test_delays import coordinator_config, coordinator_process, stamped_topic

pytestmark = pytest.mark.broker

PRECISION_MS = 1000
"""The widest hold window (precision + landing margin: 1.25 s), so that holding in order and
delivering out of order are far apart."""
LATE_MS = 500
"""How late a timer may be here on a busy 2-core machine; held behind a neighbour, the
timers below are later than this."""


@pytest.fixture()
def window_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        timer_precision_ms=PRECISION_MS,
        timer_max_delay_ms=86_400_000,
    )


def _send_interleaved(config: ClientConfig, topic: str, delays_ms: list[int]) -> dict[str, int]:
    """Send one timer per delay (from now), in this order and at once; body -> its due time,
    epoch ms. Each delay here is between 1.25 s and 2.25 s: every timer waits in tier 0
    (1 s), in the order sent, and leaves it within the hold window of its time."""
    due: dict[str, int] = {}
    start = time.time_ns() // 1_000_000
    with Producer("pg", config=config) as producer:
        for i, delay_ms in enumerate(delays_ms):
            name = f"t{i}"
            due[name] = start + delay_ms
            msg = Message(topic, name)
            msg.set_deliver_time_ms(due[name])
            producer.send_async(msg)
        assert producer.flush(10_000) == 0
    return due


# Serial: it bounds lateness against the wall clock, which the other workers' load moves.
@pytest.mark.serial
def test_timers_due_in_reverse_order_in_one_partition_are_each_on_time(
    window_config: ClientConfig, topic: str
) -> None:
    stamped_topic(window_config, topic)
    with Coordinator(coordinator_config(window_config, "window")):
        warm = Message(f"{topic}-warmup", b"w")
        warm.set_delay_time_ms(300)
        with Producer("warmup", config=window_config) as producer:
            producer.send_sync(warm)
        assert list(read_messages(window_config, [f"{topic}-warmup"], max_messages=1))
        # The first sent is due last: in offset order, each is held behind all before it.
        due = _send_interleaved(window_config, topic, [2240 - 125 * i for i in range(8)])
        got = {
            m.body.decode(): m.store_timestamp_ms or 0
            for m in read_messages(window_config, [topic], max_messages=8, timeout_ms=20_000)
        }
    assert sorted(got) == sorted(due)
    late = {name: got[name] - due[name] for name in due}
    assert all(v >= 0 for v in late.values()), f"early: {late}"
    assert all(v <= LATE_MS for v in late.values()), f"late (ms): {late}"


def _tail(config: ClientConfig, topic: str) -> Consumer:
    """A consumer of ``topic``'s only partition from its start, without a group (no join to
    wait for)."""
    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"tail-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    return consumer


def _read(tail: Consumer, seen: list[str], count: int, until: float, wait_s: float) -> None:
    """Append the bodies ``tail`` reads to ``seen`` until it holds ``count`` or ``until``
    (monotonic s) passed."""
    while len(seen) < count and time.monotonic() < until:
        record = tail.poll(wait_s)
        if record is not None and record.error() is None:
            seen.append(bytes(record.value() or b"").decode())


def test_sigkill_after_out_of_order_deliveries_delivers_each_exactly_once(
    window_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(window_config).ensure_system_topics(coordinator_config(window_config).catalog)
    stamped_topic(window_config, topic)
    first = coordinator_process(window_config, "window-killed")
    tail = _tail(window_config, topic)
    try:
        warm = Message(topic, "warmup")
        warm.set_delay_time_ms(300)
        with Producer("warmup", config=window_config) as producer:
            producer.send_sync(warm)
        seen: list[str] = []
        deadline = time.monotonic() + 60
        _read(tail, seen, 1, deadline, 0.2)
        assert seen == ["warmup"]
        # "head" waits in the window until its time, 1.24 s after it left tier 0; the three
        # behind it are due 10 ms after leaving it: delivered past the head, out of order.
        due = _send_interleaved(window_config, topic, [2240, 1010, 1020, 1030])
        _read(tail, seen, 2, deadline, 0.02)
        # Killed while the head waits: its partition's committed offset is still below the
        # three delivered past it.
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert seen[1] != "t0", f"the head was delivered first: {seen}"
    finally:
        if first.poll() is None:
            first.kill()
    second = coordinator_process(window_config, "window-killed")
    try:
        _read(tail, seen, 5, deadline, 0.2)
        _read(tail, seen, 99, time.monotonic() + 5, 0.2)  # anything delivered twice comes now
    finally:
        second.terminate()
        second.wait(30)
        tail.close()
    assert sorted(seen) == sorted(["warmup", *due]), f"delivered: {seen}"
    head = [m for m in read_messages(window_config, [topic], timeout_ms=3000) if m.body == b"t0"]
    assert len(head) == 1 and (head[0].store_timestamp_ms or 0) >= due["t0"]
