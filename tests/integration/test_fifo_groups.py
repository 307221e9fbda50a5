"""FIFO message groups against a real broker: groups interleaved in one partition consumed in
parallel, each in send order; a failing message holds up its group only, is retried in place,
then goes to the DLQ; a second member joining mid-stream never runs a group twice at once;
a consumer killed (SIGKILL) while a group retries loses nothing, and every group keeps its
order across the redelivery."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from bridge import ClientConfig, ConsumeStatus, Message, MessageExt, Producer
from bridge.consumer import ConsumeFromWhere, PushConsumer
from bridge.consumer.admin import read_dead_letters
from bridge.kafka.admin import TopicAdmin
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import TopicSpec

pytestmark = pytest.mark.broker


@pytest.fixture()
def config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture()
def consumers() -> Iterator[list[PushConsumer]]:
    made: list[PushConsumer] = []
    yield made
    for consumer in made:
        consumer.shutdown()


def _topic(config: ClientConfig, name: str, partitions: int = 1) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def _send_interleaved(config: ClientConfig, topic: str, groups: list[str], each: int) -> None:
    """``each`` messages of every group, round robin (``<group>:<seq>``), one partition."""
    with Producer("fifo_tests", config=config) as producer:
        for seq, group in itertools.product(range(each), groups):
            producer.send_async(Message(topic, f"{group}:{seq}", message_group=group))
        producer.flush(30_000)


def _start(
    made: list[PushConsumer], config: ClientConfig, group: str, topic: str, listener: Any,
    **options: Any,
) -> PushConsumer:  # fmt: skip
    options.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    options.setdefault("persist_consumer_offset_interval_ms", 200)
    consumer = PushConsumer(group, config=config, fifo=True, **options)
    consumer.subscribe(topic, listener)
    consumer.start()
    made.append(consumer)
    return consumer


def _committed(config: ClientConfig, group: str, topic: str, partition: int = 0) -> int:
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        return int(reader.committed([TopicPartition(topic, partition)], timeout=10)[0].offset)
    finally:
        reader.close()


class _Log:
    """Every delivery (group, seq, reconsume times, when), and how many groups ran at once."""

    def __init__(
        self,
        fail: Callable[[str, int, MessageExt], bool] = lambda g, s, m: False,
        work_s: float = 0.005,
    ) -> None:
        self.fail = fail
        self.work_s = work_s
        self.lock = threading.Lock()
        self.deliveries: list[tuple[str, int, int, float]] = []
        self.running: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.wrong_group: list[tuple[str, str | None]] = []
        self.most_at_once = 0

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        group, seq = msg.body.decode().split(":")
        with self.lock:
            if msg.message_group != group:  # an assert here would only fail the message
                self.wrong_group.append((group, msg.message_group))
            self.running[group] = self.running.get(group, 0) + 1
            if self.running[group] > 1:
                self.overlaps.append(group)
            self.most_at_once = max(self.most_at_once, sum(self.running.values()))
        time.sleep(self.work_s)
        failed = self.fail(group, int(seq), msg)
        with self.lock:
            self.running[group] -= 1
            self.deliveries.append((group, int(seq), msg.reconsume_times, time.monotonic()))
        return ConsumeStatus.RECONSUME_LATER if failed else ConsumeStatus.CONSUME_SUCCESS

    def of(self, group: str) -> list[tuple[int, int, float]]:
        with self.lock:
            return [(s, n, at) for g, s, n, at in self.deliveries if g == group]

    def seqs(self, group: str) -> list[int]:
        return [s for s, _, _ in self.of(group)]

    def count(self) -> int:
        with self.lock:
            return len(self.deliveries)


@pytest.mark.check("G6")
def test_groups_interleaved_in_one_partition_run_in_parallel_each_in_send_order(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = _topic(config, unique("t"))
    groups = [f"g{i}" for i in range(8)]
    _send_interleaved(config, topic, groups, 25)
    log = _Log()
    group = unique("g")
    consumer = _start(consumers, config, group, topic, log, consume_thread_count=8)
    wait_until(lambda: log.count() == 200, timeout_s=60)
    for name in groups:
        assert log.seqs(name) == list(range(25)), f"{name} out of send order"
    assert not log.overlaps, "two messages of one group ran at once"
    assert not log.wrong_group, log.wrong_group
    assert log.most_at_once > 1, "the groups of the partition did not run in parallel"
    consumer.shutdown()
    assert _committed(config, group, topic) == 200


def test_a_failing_message_holds_up_its_group_only_is_retried_in_place_then_dead_lettered(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = _topic(config, unique("t"))
    _send_interleaved(config, topic, ["a", "b", "c"], 6)
    log = _Log(fail=lambda group, seq, msg: (group, seq) == ("a", 1))
    group = unique("g")
    _start(consumers, config, group, topic, log, max_reconsume_times=2,
           suspend_current_queue_time_millis=1000)  # fmt: skip
    wait_until(lambda: log.seqs("a")[-1:] == [5], timeout_s=30)
    a = log.of("a")
    assert [(s, n) for s, n, _ in a] == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0), (3, 0),
                                         (4, 0), (5, 0)]  # fmt: skip
    ones = [at for s, _, at in a if s == 1]
    assert all(later - earlier >= 0.95 for earlier, later in itertools.pairwise(ones)), (
        "retried before suspend_current_queue_time_millis"
    )
    # b and c went on while a waited on a1 (two suspensions, then the DLQ): only a was held.
    assert log.seqs("b") == list(range(6)) and log.seqs("c") == list(range(6))
    others_done = max(at for name in ("b", "c") for _, _, at in log.of(name))
    assert others_done < ones[1], "b or c waited for a's failing message"
    [letter] = read_dead_letters(config, group)
    assert (letter.body, letter.reconsume_times, letter.message_group) == (b"a:1", 3, "a")
    assert not log.overlaps


def test_a_rebalance_mid_stream_never_runs_a_group_twice_at_once_nor_out_of_order(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = _topic(config, unique("t"), partitions=2)
    groups = [f"g{i}" for i in range(10)]
    _send_interleaved(config, topic, groups, 60)
    slow = _Log(work_s=0.02)
    group = unique("g")
    _start(consumers, config, group, topic, slow, consume_thread_count=2)
    wait_until(lambda: slow.count() >= 60, timeout_s=60)
    _start(consumers, config, group, topic, slow, consume_thread_count=2)  # the same log
    assert slow.count() < 300, "the second member joined after the stream was done"
    wait_until(lambda: all(set(slow.seqs(name)) == set(range(60)) for name in groups), 90)
    assert consumers[1].stats().consumed > 0, "the second member took no partition"
    assert not slow.overlaps, "two messages of one group ran at once across the rebalance"
    for name in groups:
        seqs = slow.seqs(name)
        firsts = sorted(range(60), key=seqs.index)
        assert firsts == list(range(60)), f"{name} out of order across the rebalance"


CONSUMER_SCRIPT = """
import os, sys, time
from bridge import ClientConfig, ConsumeStatus, PushConsumer, ConsumeFromWhere
config = ClientConfig(bootstrap_servers=sys.argv[1], namespace=sys.argv[2],
                      kafka={"session.timeout.ms": "6000"})
out = os.open(sys.argv[5], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def listener(msg):
    time.sleep(0.02)
    ok = msg.body != b"g0:2"
    # One write a delivery: a line is whole or missing after a SIGKILL.
    os.write(out, b"%s %d %s\\n" % (msg.body, msg.reconsume_times, b"ok" if ok else b"failed"))
    return ConsumeStatus.CONSUME_SUCCESS if ok else ConsumeStatus.RECONSUME_LATER
consumer = PushConsumer(sys.argv[3], config=config, fifo=True, consume_thread_count=4,
                        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                        suspend_current_queue_time_millis=100, max_reconsume_times=1000,
                        persist_consumer_offset_interval_ms=100)
consumer.subscribe(sys.argv[4], listener)
consumer.start()
while True:
    time.sleep(1)
"""


def test_a_consumer_killed_while_a_group_retries_loses_nothing_and_keeps_every_groups_order(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    topic = _topic(config, unique("t"))
    groups = [f"g{i}" for i in range(20)]
    _send_interleaved(config, topic, groups, 30)
    group = unique("g")
    out = tmp_path / "deliveries"
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSUMER_SCRIPT, config.bootstrap_servers, config.namespace,
         group, topic, str(out)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # Killed while g0:2 is being retried in place and the other groups are half done.
        wait_until(
            lambda: (
                out.exists()
                and out.read_text().count("g0:2 ") >= 3
                and out.read_text().count(" ok") >= 150
            ),
            timeout_s=90,
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before: dict[str, list[int]] = {name: [] for name in groups}
    for line in out.read_text().splitlines():
        body, _, result = line.split()
        name, seq = body.split(":")
        if result == "ok":
            before[name].append(int(seq))
    assert any(len(before[name]) < 30 for name in groups[1:]), "the kill came after the work"
    for name, seqs in before.items():
        assert seqs == list(range(len(seqs))), f"{name} out of order before the kill"
    assert before["g0"] == [0, 1], "g0 went past its failing message before the kill"

    log = _Log(fail=lambda name, seq, msg: (name, seq) == ("g0", 2))
    _start(consumers, config, group, topic, log, consume_thread_count=8,
           max_reconsume_times=2, suspend_current_queue_time_millis=100)  # fmt: skip
    wait_until(
        lambda: all(log.seqs(name)[-1:] == [29] for name in groups),
        timeout_s=90,
    )
    for name in groups:
        after = [s for s, _, _ in log.of(name)]
        if name == "g0":  # its retries in place, one after the other
            after = [s for s, _ in itertools.groupby(after)]
        # Redelivered from no later than where the first run stopped, then in order.
        first = after[0]
        assert first <= len(before[name]), f"{name} skipped messages across the kill"
        assert after == list(range(first, 30)), f"{name} out of order after the kill: {after}"
    g0 = [(s, n) for s, n, _ in log.of("g0")]
    assert g0[g0.index((2, 0)) :][:3] == [(2, 0), (2, 1), (2, 2)]
    assert [s for s, _ in g0[g0.index((2, 2)) + 1 :]] == list(range(3, 30))
    [letter] = read_dead_letters(config, group)
    assert letter.body == b"g0:2"
    assert not log.overlaps
