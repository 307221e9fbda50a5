"""Simple consumer throughput: ``receive`` and ``ack`` against a push consumer on the same
topic, in the same run.

Every run reads the same topic (4 partitions, 100-byte bodies) from the start with a new
consumer group and stops when every message is acked (simple) or consumed (push). Time runs
from the first message handed over (group join excluded, for both). The simple consumer
receives batches of :data:`BATCH` with an invisible duration long enough that nothing comes
back, and acks each message, on one thread and on :data:`THREADS` threads; the push consumer
runs a trivial per-message listener with its defaults. Nothing fails: the figure is what the
leases, the receive buffer and the caller's loop cost against the listener pool.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from bench.consumer import MESSAGES, PARTITIONS, Clock, _fill, _now, _since
from bench.harness import Row, interleaved_rates, print_rows
from bridge import ClientConfig, ConsumeFromWhere, ConsumeStatus, MessageExt, SimpleConsumer
from bridge.consumer import PushConsumer

ROUNDS = int(os.environ.get("BENCH_SIMPLE_ROUNDS", "3"))
BATCH = 32
"""Messages a ``receive`` asks for (RocketMQ 5 proxies default to 32 a batch)."""
THREADS = 4
"""Threads receiving and acking at once in the threaded run."""
INVISIBLE_S = 300


def _push(config: ClientConfig, topic: str) -> tuple[int, float]:
    first: list[Clock] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        if not first:
            first.append(_now())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"bench_push_{uuid.uuid4().hex[:8]}",
        config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic, listener)
    consumer.start()
    try:
        while consumer.stats().consumed < MESSAGES:
            time.sleep(0.005)
        elapsed, _ = _since(first[0])
    finally:
        consumer.shutdown()
    return MESSAGES, elapsed


def _simple(config: ClientConfig, topic: str, threads: int) -> tuple[int, float]:
    consumer = SimpleConsumer(
        config,
        f"bench_simple_{uuid.uuid4().hex[:8]}",
        {topic: "*"},
        1,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.startup()
    first: list[Clock] = []
    acked = 0
    lock = threading.Lock()
    done = threading.Event()

    def work() -> None:
        nonlocal acked
        while not done.is_set():
            views = consumer.receive(BATCH, INVISIBLE_S)
            if views and not first:
                with lock:
                    if not first:
                        first.append(_now())
            for view in views:
                consumer.ack(view)
            with lock:
                acked += len(views)
                if acked >= MESSAGES:
                    done.set()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    try:
        for worker in workers:
            worker.start()
        done.wait()
        elapsed, _ = _since(first[0])
        for worker in workers:
            worker.join()
    finally:
        done.set()
        consumer.shutdown()
    return MESSAGES, elapsed


def run(bootstrap: str) -> None:
    """Measure and print."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bs{uuid.uuid4().hex[:8]}")
    topic = f"bench-simple-{uuid.uuid4().hex[:6]}"
    _fill(config, topic)
    rates = interleaved_rates(
        ROUNDS,
        {
            "push": lambda: _push(config, topic),
            "simple": lambda: _simple(config, topic, 1),
            "simple_threads": lambda: _simple(config, topic, THREADS),
        },
    )
    rows = [
        Row(
            "receive+ack, 1 thread",
            "msg/s",
            rates["simple"],
            rates["push"],
            "push consumer, same topic",
        ),
        Row(
            f"receive+ack, {THREADS} threads",
            "msg/s",
            rates["simple_threads"],
            rates["push"],
            "push consumer, same topic",
        ),
    ]
    print_rows(
        f"simple consumer ({MESSAGES:,} messages x 100 B, {PARTITIONS} partitions, "
        f"batches of {BATCH})",
        rows,
    )
