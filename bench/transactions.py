"""Transactional messages: throughput, commit-to-visible latency, first-check lateness.

The coordinator runs as its own process (``bridge coordinator``), as deployed. Baselines from
the same run and broker:
* plain ``Producer.send_sync`` with the same number of sending threads (a transactional send
  is synchronous too: the half message must be stored before the local transaction runs);
* the naive approach: one Kafka transaction per message (begin, produce, commit).

The three are measured in turn, ``BENCH_TX_ROUNDS`` (3) rounds of ``BENCH_TX_SECONDS`` (4 s)
each, so that drift on a shared machine hits all alike; the median of each is reported, and
the per-round ratios. Commit-to-visible latency is measured over
``BENCH_TX_LATENCY_MESSAGES`` (400) messages sent at 100/s, from the end of
``send_message_in_transaction`` (the end request handed to the client) until a
``read_committed`` consumer (``fetch.wait.max.ms`` 10) has the real message.

Beside it, the floor Kafka itself gives on the same broker, at the same rate, read the same
way: a raw confluent-kafka transactional producer writing one record per Kafka transaction
(begin, produce, ``commit_transaction``), and one writing what a coordinator's commit writes
(the real record and an OP-sized record to another topic, ``send_offsets_to_transaction``,
commit). Each gives the latency from ``commit_transaction``'s call, and from
``begin_transaction``, until visible; ours / floor is printed as a ratio.

``BENCH_TX_PARTS`` picks parts, comma-separated: ``throughput``, ``latency``, ``floor``,
``checks`` (all by default).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from bench.harness import Row, cpu_seconds, listening_pid, print_rows
from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
)
from bridge.codec import decode_headers
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer, producer_config
from bridge.message import property_text
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec
from topics.naming import coordinator_group

THREADS = 4
SECONDS = 8.0
"""How long :func:`_threads_rate` sends, s (``bench.rocketmq`` uses it too)."""
ROUND_SECONDS = float(os.environ.get("BENCH_TX_SECONDS", "4"))
ROUNDS = int(os.environ.get("BENCH_TX_ROUNDS", "3"))
LATENCY_MESSAGES = int(os.environ.get("BENCH_TX_LATENCY_MESSAGES", "400"))
LATENCY_RATE_PER_S = 100
PARTS = frozenset(
    p.strip()
    for p in os.environ.get("BENCH_TX_PARTS", "throughput,latency,floor,checks").split(",")
    if p.strip()
)
FIRST_CHECKS = 40
TIMEOUT_MS = 6000


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


class _CheckTimes(TransactionListener):
    """Unknown at first; records when each check arrives, then commits."""

    def __init__(self) -> None:
        self.checked_at: dict[str, float] = {}

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        self.checked_at.setdefault(msg.msg_id, time.time() * 1000 - msg.born_timestamp_ms)
        return TransactionStatus.COMMIT


def _threads_rate(send_one: Any, seconds: float | None = None) -> float:
    """Messages per second over ``seconds`` (default :data:`SECONDS`) with ``THREADS``
    threads calling ``send_one(slot, i)``."""
    counts = [0] * THREADS
    deadline = time.monotonic() + (SECONDS if seconds is None else seconds)

    def work(slot: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            send_one(slot, i)
            i += 1
        counts[slot] = i

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(s,), name=f"bench-{s}") for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - started)


def _naive_sender(config: ClientConfig, topic: str) -> Any:
    """``send(slot, i)``: one Kafka transaction per message, a producer per thread."""
    producers = []
    for slot in range(THREADS):
        raw = RawProducer(
            producer_config(config, f"naive-{slot}", transactional_id=f"naive-{uuid.uuid4().hex}")
        )
        raw.init_transactions(30)
        producers.append(raw)

    def send(slot: int, i: int) -> None:
        raw = producers[slot]
        raw.begin_transaction()
        raw.produce(topic, b"x" * 100)
        raw.commit_transaction(30)

    return send


def _coordinator(config: ClientConfig) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": "bench",
        "BRIDGE_TRANSACTION_TIMEOUT_MS": str(TIMEOUT_MS),
    }
    env.pop("BRIDGE_COORDINATOR_PROCESSES", None)  # one process: its CPU is what is read
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        env=env, cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


class _CpuSplit:
    """CPU time a message over a round, of each process a transactional send involves: this
    one (the senders and their clients), the coordinator and the broker (when it runs on this
    machine). Shows where a transactional message's cost lands on a small machine."""

    PARTS = ("senders", "coordinator", "broker")

    def __init__(self, coordinator_pid: int, config: ClientConfig) -> None:
        self._pids = {
            "coordinator": coordinator_pid,
            "broker": listening_pid(config.bootstrap_servers),
        }
        self._config = config
        self.us: dict[str, dict[str, list[float]]] = {}

    def _now(self) -> dict[str, float | None]:
        now: dict[str, float | None] = {"senders": time.process_time()}
        for part, pid in self._pids.items():
            now[part] = cpu_seconds(pid) if pid is not None else None
        return now

    def measure(self, name: str, rate: Any) -> float:
        """``rate()`` (messages per second over :data:`ROUND_SECONDS`), noting the CPU time
        a message of each part under ``name``, us, up to when the coordinator has decided
        everything sent (its work after the senders stopped counts for this round, not the
        next)."""
        before, started = self._now(), time.monotonic()
        per_second = float(rate())
        messages = per_second * (time.monotonic() - started)
        _drain(self._config)
        after = self._now()
        for part in self.PARTS:
            b, a = before[part], after[part]
            if a is not None and b is not None and messages:
                self.us.setdefault(name, {}).setdefault(part, []).append((a - b) / messages * 1e6)
        return per_second

    def line(self, name: str) -> str:
        parts = self.us.get(name, {})
        return ", ".join(
            f"{part} {statistics.median(parts[part]):,.0f}" for part in self.PARTS if part in parts
        )


def _drain(config: ClientConfig, timeout_s: float = 60.0) -> None:
    """Wait until the coordinator's transaction service has committed its read position at
    the end of every HALF partition (everything sent is decided), up to ``timeout_s``."""
    half = TopicCatalog(namespace=config.namespace).topic(SystemTopic.HALF)
    # A client that never fetches: lookups only (see ``bridge.cli.admin.delays.delay_status``).
    probe = new_consumer(config, coordinator_group(config.namespace, "transaction"), "bench")
    try:
        count = len(probe.list_topics(half, timeout=10).topics[half].partitions)
        tps = [TopicPartition(half, p) for p in range(count)]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            committed = probe.committed(tps, timeout=10)
            if all(
                tp.offset >= probe.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                for tp in committed
            ):
                return
            time.sleep(0.05)
        print(f"(the coordinator had not decided everything {timeout_s:.0f} s after a round)")
    finally:
        probe.close()


class _Reader:
    """A ``read_committed`` consumer of a fresh one-partition topic on a thread of its own:
    when (monotonic s) each record was first seen, by ``key(record)``."""

    def __init__(self, config: ClientConfig, topic: str, key: Any) -> None:
        self.seen: dict[str, float] = {}
        self._key = key
        TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
        # Read from its start; a short fetch wait, as a latency-minded consumer sets.
        self._consumer = new_consumer(
            config, f"bench-{uuid.uuid4().hex}", "bench", fetch_wait_max_ms=10
        )
        self._consumer.subscribe([topic])
        assigned_by = time.monotonic() + 30
        while not self._consumer.assignment():
            if time.monotonic() > assigned_by:
                raise RuntimeError(f"no partition of {topic} assigned within 30 s")
            self._consumer.poll(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="bench-reader")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            record = self._consumer.poll(0.05)
            if record is not None and record.error() is None:
                self.seen.setdefault(self._key(record), time.monotonic())

    def wait_for(self, keys: Any, timeout_s: float) -> None:
        """Wait until every key of ``keys`` was seen, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while any(k not in self.seen for k in keys) and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def _uniq_key(record: Any) -> str:
    return property_text(decode_headers(record.headers())["UNIQ_KEY"])


def _visible_latencies(
    config: ClientConfig, topic: str, producer: TransactionMQProducer
) -> list[float]:
    """Send at a moderate pace; milliseconds from the end of each send to visibility."""
    ended: dict[str, float] = {}
    reader = _Reader(config, topic, _uniq_key)
    try:
        # Not timed: the coordinator may still be applying what an earlier measurement sent;
        # a latency measured behind that backlog would be the backlog's.
        settle = producer.send_message_in_transaction(Message(topic, "settle"))
        reader.wait_for([settle.msg_id], 60)
        for i in range(LATENCY_MESSAGES):
            result = producer.send_message_in_transaction(Message(topic, f"lat{i}"))
            ended[result.msg_id] = time.monotonic()
            time.sleep(1 / LATENCY_RATE_PER_S)
        reader.wait_for(ended, 30)
    finally:
        reader.close()
    seen = reader.seen
    return [(seen[m] - t) * 1000 for m, t in ended.items() if m in seen]


def _kafka_floor(
    config: ClientConfig, topic: str, *, like_coordinator: bool
) -> tuple[list[float], list[float]]:
    """What Kafka itself gives: a raw transactional producer, one Kafka transaction per
    message at :data:`LATENCY_RATE_PER_S`; ``like_coordinator`` adds what a coordinator's
    commit adds (a second record to another topic, offsets of a consumer group). Returns the
    milliseconds from ``commit_transaction``'s call, and from ``begin_transaction``, until
    a ``read_committed`` consumer has the record."""
    side = f"{topic}-op"
    if like_coordinator:
        TopicAdmin(config).ensure_topics([TopicSpec(side, 1)])
    raw = RawProducer(
        producer_config(
            config, "bench-floor", transactional_id=f"floor-{uuid.uuid4().hex}", linger_ms=1
        )
    )
    raw.init_transactions(30)
    group = new_consumer(config, f"bench-floor-{uuid.uuid4().hex}", "bench-floor")
    reader = _Reader(config, topic, lambda r: r.value().decode())
    began: dict[str, float] = {}
    committing: dict[str, float] = {}
    try:
        for i in range(LATENCY_MESSAGES + 1):
            key = f"floor{i}"
            started = time.monotonic()
            raw.begin_transaction()
            raw.produce(topic, key.encode())
            if like_coordinator:
                raw.produce(side, b"o" * 120)
                raw.flush(30)  # the coordinator learns each record's fate before the offsets
                raw.send_offsets_to_transaction(
                    [TopicPartition(side, 0, i + 1)], group.consumer_group_metadata(), 30
                )
            commit = time.monotonic()
            raw.commit_transaction(30)
            if i == 0:  # the first registers the partitions: not timed
                reader.wait_for([key], 60)
            else:
                began[key], committing[key] = started, commit
            time.sleep(1 / LATENCY_RATE_PER_S)
        reader.wait_for(began, 30)
    finally:
        reader.close()
        group.close()
    seen = reader.seen
    return (
        [(seen[k] - t) * 1000 for k, t in committing.items() if k in seen],
        [(seen[k] - t) * 1000 for k, t in began.items() if k in seen],
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _latency_line(name: str, values: list[float]) -> str:
    return (
        f"{name}: p50 {_pct(values, 0.5):.1f} ms, p99 {_pct(values, 0.99):.1f} ms, "
        f"max {max(values, default=float('nan')):.1f} ms ({len(values)}/{LATENCY_MESSAGES} seen)"
    )


def run(bootstrap: str) -> list[Row]:
    """Measure and print (the parts in ``BENCH_TX_PARTS``); return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bench{uuid.uuid4().hex[:6]}")
    TopicAdmin(config).ensure_system_topics(TopicCatalog(namespace=config.namespace))
    coordinator = _coordinator(config)
    cpu = _CpuSplit(coordinator.pid, config)
    rows: list[Row] = []
    try:
        topic = f"bench-tx-{uuid.uuid4().hex[:6]}"
        rates: dict[str, list[float]] = {"plain": [], "naive": [], "tx": []}
        latencies: list[float] = []
        with (
            Producer("bench_plain", config=config) as plain,
            TransactionMQProducer("bench_tx", _Commit(), config=config) as producer,
        ):
            plain.send_sync(Message(topic, b"warm"))
            producer.send_message_in_transaction(Message(topic, b"warm"))
            _drain(config)  # the coordinator is up: its start is in no round
            if "throughput" in PARTS:
                naive = _naive_sender(config, topic)
                for _ in range(ROUNDS):
                    rates["plain"].append(
                        cpu.measure(
                            "plain",
                            lambda: _threads_rate(
                                lambda s, i: plain.send_sync(Message(topic, b"x" * 100)),
                                ROUND_SECONDS,
                            ),
                        )
                    )
                    rates["naive"].append(_threads_rate(naive, ROUND_SECONDS))
                    rates["tx"].append(
                        cpu.measure(
                            "tx",
                            lambda: _threads_rate(
                                lambda s, i: producer.send_message_in_transaction(
                                    Message(topic, b"x" * 100)
                                ),
                                ROUND_SECONDS,
                            ),
                        )
                    )
            if "latency" in PARTS:
                latencies = _visible_latencies(config, f"{topic}-lat", producer)
        if "throughput" in PARTS:
            median = {name: statistics.median(values) for name, values in rates.items()}
            rows += [
                Row(
                    f"transactional msg/s ({THREADS} threads)",
                    "msg/s",
                    median["tx"],
                    median["plain"],
                    "plain send_sync, same threads",
                ),
                Row(
                    f"transactional msg/s ({THREADS} threads)",
                    "msg/s",
                    median["tx"],
                    median["naive"],
                    "one Kafka transaction per message",
                ),
            ]
            print_rows("Transactional messages (ratio = ours / baseline)", rows)
            ratios = [t / p for t, p in zip(rates["tx"], rates["plain"], strict=True)]
            print(
                f"transactional / plain per round ({ROUNDS} rounds of {ROUND_SECONDS:.0f} s): "
                + ", ".join(f"{r:.2f}" for r in ratios)
            )
            print(
                f"CPU a message (us, median of the rounds; {os.cpu_count()} cores in all): "
                "transactional: "
                f"{cpu.line('tx')}; plain send_sync: {cpu.line('plain')}"
            )
        if latencies:
            print(_latency_line(f"commit-to-visible at {LATENCY_RATE_PER_S}/s", latencies))
        if "floor" in PARTS:
            for like_coordinator, what in (
                (False, "raw Kafka transaction per message (produce, commit)"),
                (True, "raw Kafka transaction shaped like a commit (2 records, offsets, commit)"),
            ):
                from_commit, from_begin = _kafka_floor(
                    config,
                    f"{topic}-floor{int(like_coordinator)}",
                    like_coordinator=like_coordinator,
                )
                print(_latency_line(f"{what}: commit call to visible", from_commit))
                print(_latency_line(f"{what}: begin to visible", from_begin))
                if latencies and from_commit:
                    print(
                        "  ours / this (commit call to visible): "
                        f"p50 {_pct(latencies, 0.5) / _pct(from_commit, 0.5):.1f}, "
                        f"p99 {_pct(latencies, 0.99) / _pct(from_commit, 0.99):.1f}"
                    )
        if "checks" in PARTS:
            listener = _CheckTimes()
            with TransactionMQProducer("bench_check", listener, config=config) as producer:
                for i in range(FIRST_CHECKS):
                    producer.send_message_in_transaction(Message(topic, f"check{i}"))
                deadline = time.monotonic() + TIMEOUT_MS / 1000 + 30
                while len(listener.checked_at) < FIRST_CHECKS and time.monotonic() < deadline:
                    time.sleep(0.1)
            late = [age - TIMEOUT_MS for age in listener.checked_at.values()]
            print(
                f"first check after the {TIMEOUT_MS} ms timeout: late by p50 "
                f"{_pct(late, 0.5):.0f} ms, p99 {_pct(late, 0.99):.0f} ms, "
                f"max {max(late, default=float('nan')):.0f} ms, "
                f"min {min(late, default=float('nan')):.0f} ms "
                f"({len(late)}/{FIRST_CHECKS} checked)"
            )
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    return rows
