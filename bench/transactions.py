"""Transactional messages: throughput, commit-to-visible latency, first-check lateness.

The coordinator runs as its own process (``bridge coordinator``), as deployed. Baselines from
the same run and broker:
* plain ``Producer.send_sync`` with the same number of sending threads (a transactional send
  is synchronous too: the half message must be stored before the local transaction runs);
* the naive approach: one Kafka transaction per message (begin, produce, commit).

The three are measured in turn, ``BENCH_TX_ROUNDS`` (3) rounds of ``BENCH_TX_SECONDS`` (4 s)
each, so that drift on a shared machine hits all alike; the median of each is reported, and
the per-round ratios. Commit-to-visible latency is measured over
``BENCH_TX_LATENCY_MESSAGES`` (400) messages sent at 100/s.
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

from bench.harness import Row, print_rows
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
from topics.catalog import TopicCatalog, TopicSpec

THREADS = 4
SECONDS = 8.0
"""How long :func:`_threads_rate` sends, s (``bench.rocketmq`` uses it too)."""
ROUND_SECONDS = float(os.environ.get("BENCH_TX_SECONDS", "4"))
ROUNDS = int(os.environ.get("BENCH_TX_ROUNDS", "3"))
LATENCY_MESSAGES = int(os.environ.get("BENCH_TX_LATENCY_MESSAGES", "400"))
LATENCY_RATE_PER_S = 100
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
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        env=env, cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _visible_latencies(
    config: ClientConfig, topic: str, producer: TransactionMQProducer
) -> list[float]:
    """Send at a moderate pace; milliseconds from the end of each send to visibility."""
    ended: dict[str, float] = {}
    seen: dict[str, float] = {}
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    # A fresh topic read from its start; a short fetch wait, as a latency-minded consumer sets.
    consumer = new_consumer(config, f"bench-{uuid.uuid4().hex}", "bench", fetch_wait_max_ms=10)
    consumer.subscribe([topic])
    assigned_by = time.monotonic() + 30
    while not consumer.assignment():
        if time.monotonic() > assigned_by:
            raise RuntimeError(f"no partition of {topic} assigned within 30 s")
        consumer.poll(0.1)
    done = threading.Event()

    def read() -> None:
        while not done.is_set() or len(seen) < len(ended):
            record = consumer.poll(0.05)
            if record is not None and record.error() is None:
                seen[property_text(decode_headers(record.headers())["UNIQ_KEY"])] = time.monotonic()
            if done.is_set() and time.monotonic() > give_up:
                return

    give_up = float("inf")
    reader = threading.Thread(target=read, name="bench-reader")
    reader.start()
    # Not timed: the coordinator may still be applying what an earlier measurement sent; a
    # latency measured behind that backlog would be the backlog's.
    settle = producer.send_message_in_transaction(Message(topic, "settle"))
    ended[settle.msg_id] = time.monotonic()
    settled_by = time.monotonic() + 60
    while settle.msg_id not in seen and time.monotonic() < settled_by:
        time.sleep(0.05)
    del ended[settle.msg_id]
    seen.pop(settle.msg_id, None)
    for i in range(LATENCY_MESSAGES):
        result = producer.send_message_in_transaction(Message(topic, f"lat{i}"))
        ended[result.msg_id] = time.monotonic()
        time.sleep(1 / LATENCY_RATE_PER_S)
    give_up = time.monotonic() + 30
    done.set()
    reader.join()
    consumer.close()
    return [(seen[m] - t) * 1000 for m, t in ended.items() if m in seen]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bench{uuid.uuid4().hex[:6]}")
    TopicAdmin(config).ensure_system_topics(TopicCatalog(namespace=config.namespace))
    coordinator = _coordinator(config)
    rows: list[Row] = []
    try:
        topic = f"bench-tx-{uuid.uuid4().hex[:6]}"
        naive = _naive_sender(config, topic)
        rates: dict[str, list[float]] = {"plain": [], "naive": [], "tx": []}
        with (
            Producer("bench_plain", config=config) as plain,
            TransactionMQProducer("bench_tx", _Commit(), config=config) as producer,
        ):
            plain.send_sync(Message(topic, b"warm"))
            producer.send_message_in_transaction(Message(topic, b"warm"))
            for _ in range(ROUNDS):
                rates["plain"].append(
                    _threads_rate(
                        lambda s, i: plain.send_sync(Message(topic, b"x" * 100)), ROUND_SECONDS
                    )
                )
                rates["naive"].append(_threads_rate(naive, ROUND_SECONDS))
                rates["tx"].append(
                    _threads_rate(
                        lambda s, i: producer.send_message_in_transaction(
                            Message(topic, b"x" * 100)
                        ),
                        ROUND_SECONDS,
                    )
                )
            latencies = _visible_latencies(config, f"{topic}-lat", producer)
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
            f"commit-to-visible at {LATENCY_RATE_PER_S}/s: p50 {_pct(latencies, 0.5):.1f} ms, "
            f"p99 {_pct(latencies, 0.99):.1f} ms, "
            f"max {max(latencies, default=float('nan')):.1f} ms "
            f"({len(latencies)}/{LATENCY_MESSAGES} seen)"
        )
        listener = _CheckTimes()
        with TransactionMQProducer("bench_check", listener, config=config) as producer:
            for i in range(FIRST_CHECKS):
                producer.send_message_in_transaction(Message(topic, f"check{i}"))
            deadline = time.monotonic() + TIMEOUT_MS / 1000 + 30
            while len(listener.checked_at) < FIRST_CHECKS and time.monotonic() < deadline:
                time.sleep(0.1)
        late = [age - TIMEOUT_MS for age in listener.checked_at.values()]
        print(
            f"first check after the {TIMEOUT_MS} ms timeout: late by p50 {_pct(late, 0.5):.0f} ms, "
            f"p99 {_pct(late, 0.99):.0f} ms, max {max(late, default=float('nan')):.0f} ms, "
            f"min {min(late, default=float('nan')):.0f} ms ({len(late)}/{FIRST_CHECKS} checked)"
        )
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    return rows
