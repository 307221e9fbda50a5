"""The push consumer's fast path against a real broker: a listener measured fast runs on the
poll thread, each poll's messages in a row, with every guarantee of the pool path. A kill -9 in
the middle of such a batch, and a rebalance while the batches run, deliver every message at
least once and never commit past one not done; failures of a batch reach the retry topic each
exactly once; a listener that hangs on the poll thread holds neither the poll loop nor the
offsets (the loop goes on on a new thread, consume_timeout sends the message back)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from bridge import ClientConfig, Message, MessageExt, Producer, read_messages
from bridge.consumer import ConsumeFromWhere, ConsumeStatus, PushConsumer
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import TopicSpec
from topics.naming import RETRY_GROUP_TOPIC_PREFIX

# One worker runs the module: its coordinator (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_consumer_fast_path")]

POLL_THREAD = "bridge-consumer-"
"""The poll threads' names start so (the listener threads': ``bridge-consume-``)."""


@pytest.fixture(scope="module")
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"fp{uuid.uuid4().hex[:10]}",
        message_delay_level="1s 1s 1s 2s 3s",  # a first retry (level 3) waits 1 s
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture(scope="module")
def coordinator(config: ClientConfig) -> Iterator[Coordinator]:
    """Delivers send-backs (through the delay levels) to the retry topics."""
    settings = CoordinatorConfig(
        client=config, coordinator_id="fast-path-tests", transaction_partitions=1,
        session_timeout_ms=6000,
    )  # fmt: skip
    with Coordinator(settings) as running:
        yield running


@pytest.fixture()
def consumers() -> Iterator[list[PushConsumer]]:
    made: list[PushConsumer] = []
    yield made
    for consumer in made:
        consumer.shutdown(timeout_ms=5000)


def make_topic(config: ClientConfig, name: str, partitions: int) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def send(config: ClientConfig, topic: str, bodies: list[str]) -> None:
    with Producer("fast_path_p", config=config) as producer:
        for body in bodies:
            producer.send_async(Message(topic, body.encode()))
        assert producer.flush(60_000) == 0


def start(
    made: list[PushConsumer], config: ClientConfig, group: str, topic: str, listener: Any,
    **options: Any,
) -> PushConsumer:  # fmt: skip
    options.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    options.setdefault("persist_consumer_offset_interval_ms", 100)
    consumer = PushConsumer(group, config=config, **options)
    consumer.subscribe(topic, listener)
    consumer.start()
    made.append(consumer)
    return consumer


def strategy(consumer: PushConsumer) -> ConcurrentConsumption:
    assert consumer._fetcher is not None, "started"
    consumption = consumer._fetcher._consumption
    assert isinstance(consumption, ConcurrentConsumption)
    return consumption


def committed(config: ClientConfig, group: str, topic: str, partitions: int) -> list[int]:
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return [int(tp.offset) for tp in reader.committed(tps, timeout=10)]
    finally:
        reader.close()


class Seen:
    """What a listener saw: each delivery's body, reconsume count and thread name."""

    def __init__(self, decide: Callable[[MessageExt], bool] = lambda msg: True) -> None:
        self.decide = decide
        self.lock = threading.Lock()
        self.deliveries: list[tuple[str, int, str]] = []

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.deliveries.append(
                (msg.body.decode(), msg.reconsume_times, threading.current_thread().name)
            )
        return ConsumeStatus.CONSUME_SUCCESS if self.decide(msg) else ConsumeStatus.RECONSUME_LATER

    def bodies(self) -> list[str]:
        with self.lock:
            return [body for body, _, _ in self.deliveries]

    def threads(self) -> set[str]:
        with self.lock:
            return {name for _, _, name in self.deliveries}


KILLED_SCRIPT = """
import os, signal, sys, threading
from bridge import ClientConfig, ConsumeStatus, PushConsumer, ConsumeFromWhere
config = ClientConfig(bootstrap_servers=sys.argv[1], namespace=sys.argv[2],
                      kafka={"session.timeout.ms": "6000"})
out = os.open(sys.argv[5], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
kill_at = int(sys.argv[6])
done = [0]
def listener(msg):
    done[0] += 1
    if done[0] == kill_at:
        # kill -9 in the middle of a batch, from the listener itself: exactly mid-batch.
        os.write(out, ("KILL " + threading.current_thread().name + "\\n").encode())
        os.kill(os.getpid(), signal.SIGKILL)
    os.write(out, f"{msg.queue_id} {msg.queue_offset} {msg.body.decode()}\\n".encode())
    return ConsumeStatus.CONSUME_SUCCESS
consumer = PushConsumer(sys.argv[3], config=config,
                        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                        persist_consumer_offset_interval_ms=50)
consumer.subscribe(sys.argv[4], listener)
consumer.start()
threading.Event().wait(120)
"""


@pytest.mark.check("G6")
def test_a_kill_9_mid_batch_on_the_poll_thread_skips_nothing_and_commits_nothing_undone(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    partitions = 3
    topic = make_topic(config, unique("t"), partitions)
    group = unique("g")
    bodies = [f"k{i}" for i in range(20_000)]
    send(config, topic, bodies)
    log = tmp_path / "processed"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SCRIPT, config.bootstrap_servers, config.namespace,
         group, topic, str(log), "12000"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.wait(120) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = log.read_text().splitlines()
    killed_on = [line.split(" ", 1)[1] for line in lines if line.startswith("KILL ")]
    assert killed_on and killed_on[0].startswith(POLL_THREAD), (
        f"killed on {killed_on}: not the poll thread (the fast path)"
    )
    done: dict[int, set[int]] = {p: set() for p in range(partitions)}
    done_bodies: set[str] = set()
    for line in lines:
        if not line.startswith("KILL "):
            fields = line.split()
            done[int(fields[0])].add(int(fields[1]))
            done_bodies.add(fields[2])
    assert len(done_bodies) == 12_000 - 1
    # Never committed past a message not done: every offset below the commit was done.
    for p, at in enumerate(committed(config, group, topic, partitions)):
        undone = [o for o in range(max(at, 0)) if o not in done[p]]
        assert not undone, f"partition {p} committed at {at} past {undone[:5]}"
    seen = Seen()
    start(consumers, config, group, topic, seen)
    _complete(config, group, topic, partitions)
    assert done_bodies | set(seen.bodies()) == set(bodies), "a message was skipped"
    redone = done_bodies & set(seen.bodies())
    assert len(redone) < len(done_bodies), "everything done before the kill was done again"


def _complete(config: ClientConfig, group: str, topic: str, partitions: int) -> None:
    """Wait until ``group`` committed the end of every partition of ``topic``."""
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "wm"})
    try:
        high = [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        reader.close()
    wait_until(lambda: committed(config, group, topic, partitions) == high, timeout_s=90)


@pytest.mark.check("G6")
def test_a_rebalance_while_batches_run_on_the_poll_thread_loses_nothing(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
) -> None:  # fmt: skip
    partitions = 4
    topic = make_topic(config, unique("t"), partitions)
    group = unique("g")
    sent: list[str] = []
    first, second = Seen(), Seen()
    start(consumers, config, group, topic, first)
    stop = threading.Event()

    def stream() -> None:  # keeps batches coming while the second member joins
        n = 0
        with Producer("fast_path_stream", config=config) as producer:
            while not stop.is_set():
                for _ in range(200):
                    body = f"s{n}"
                    producer.send_async(Message(topic, body.encode()))
                    sent.append(body)
                    n += 1
                producer.flush(10_000)
                stop.wait(0.02)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_until(lambda: len(first.bodies()) >= 2000, timeout_s=60)
        assert any(name.startswith(POLL_THREAD) for name in first.threads()), first.threads()
        start(consumers, config, group, topic, second)
        wait_until(lambda: len(second.bodies()) >= 1000, timeout_s=60)
    finally:
        stop.set()
        streamer.join(30)
    wait_until(lambda: set(first.bodies()) | set(second.bodies()) >= set(sent), timeout_s=90)
    assert any(name.startswith(POLL_THREAD) for name in second.threads()), second.threads()
    for consumer in consumers:
        consumer.shutdown()
    assert sum(committed(config, group, topic, partitions)) == len(sent)


@pytest.mark.check("G6")
def test_failures_of_poll_thread_batches_reach_the_retry_topic_each_exactly_once(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"), 2)
    group = unique("g")
    send(config, topic, [f"w{i}" for i in range(500)])  # measured fast on these first
    failing = {f"f{i}" for i in range(0, 2000, 10)}

    def decide(msg: MessageExt) -> bool:
        return msg.reconsume_times > 0 or msg.body.decode() not in failing

    seen = Seen(decide)
    consumer = start(consumers, config, group, topic, seen)
    wait_until(lambda: len(seen.bodies()) >= 500, timeout_s=60)
    assert strategy(consumer)._path.inline, "a fast listener runs on the poll thread"
    send(config, topic, [f"f{i}" for i in range(2000)])
    wait_until(lambda: consumer.stats().sent_back == len(failing), timeout_s=60)

    def back() -> list[str]:
        with seen.lock:
            return sorted(b for b, times, _ in seen.deliveries if times > 0)

    wait_until(lambda: len(back()) >= len(failing), timeout_s=60)
    on_poll_thread = [b for b, _, name in seen.deliveries if name.startswith(POLL_THREAD)]
    assert set(on_poll_thread) & failing, "the failures ran on the poll thread"
    assert back() == sorted(failing), "each failed message came back once, none other"
    # Each copy was written once: the retry topic holds one record per failure.
    copies = Counter(
        m.body.decode()
        for m in read_messages(config, [RETRY_GROUP_TOPIC_PREFIX + group], timeout_ms=3000)
    )
    assert copies == Counter(failing), "one retry record per failure, none other"
    stats = consumer.stats()
    assert (stats.failed, stats.sent_back, stats.retried_locally) == (len(failing),) * 2 + (0,)


@pytest.mark.check("G11")
def test_a_listener_hung_on_the_poll_thread_holds_neither_the_poll_loop_nor_the_offsets(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"), 1)
    group = unique("g")
    send(config, topic, [f"w{i}" for i in range(300)])
    gate = threading.Event()
    hung_on: list[str] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        if msg.body == b"stuck" and not msg.reconsume_times and not hung_on:
            hung_on.append(threading.current_thread().name)
            gate.wait(60)
            return ConsumeStatus.CONSUME_SUCCESS  # late: ignored
        return seen(msg)

    seen = Seen()
    consumer = start(consumers, config, group, topic, listener, consume_timeout=0.05)  # 3 s
    try:
        wait_until(lambda: len(seen.bodies()) >= 300, timeout_s=60)
        assert strategy(consumer)._path.inline
        send(config, topic, ["stuck"])
        wait_until(lambda: bool(hung_on), timeout_s=30)
        assert hung_on[0].startswith(POLL_THREAD), f"hung on {hung_on}"
        started = time.monotonic()
        send(config, topic, [f"a{i}" for i in range(50)])
        # The poll loop went on on another thread: later messages are consumed meanwhile.
        wait_until(lambda: sum(b.startswith("a") for b in seen.bodies()) == 50, timeout_s=30)
        assert not gate.is_set()
        assert not strategy(consumer)._path.inline, "back to the pool after holding the poll"
        # consume_timeout sent the stuck message back: redelivered from the retry topic, and
        # the offset committed past it while its first call still hangs.
        wait_until(lambda: "stuck" in seen.bodies(), timeout_s=60)
        assert time.monotonic() - started >= 2.5, "sent back before consume_timeout"
        wait_until(lambda: committed(config, group, topic, 1) == [351], timeout_s=30)
    finally:
        gate.set()
    consumer.shutdown(timeout_ms=5000)
    stats = consumer.stats()
    assert stats.sent_back == 1 and seen.bodies().count("stuck") == 1, stats
