"""Producer throughput: our ``Producer`` against raw confluent-kafka on the same broker.

Baselines, measured in the same run with the same client settings (idempotent, acks=all,
linger 5 ms, murmur2 partitioner):
* ``raw same record``: confluent-kafka producing exactly the record ours produces (value, key,
  and the ``UNIQ_KEY``/``BORN_HOST``/``TAGS`` headers): the cost of our Python layer;
* ``raw bare``: confluent-kafka producing the value alone: what our record format costs too;
* for ``send_batch`` (batches of :data:`BATCH_SIZES` messages): per batch, confluent-kafka
  producing the same records, then ``flush()`` waiting for every delivery report.

Every raw produce loop waits on a full local queue (``BufferError``: serve reports, retry).
Beside each rate, the process's CPU time a message (``time.process_time``: our Python layer,
confluent-kafka and librdkafka's threads, not the broker's): on a machine shared with other
work, the rates move with the load while the CPU a message moves much less, so its ratio
shows what our layer costs.
``BENCH_PRODUCER_MESSAGES`` (100,000) messages per measurement, ``BENCH_PRODUCER_RUNS`` (5)
interleaved rounds; ``python -m bench producer``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

from confluent_kafka import Producer as RawProducer

from bench.harness import Row, interleaved_rates, print_rows
from bridge import ClientConfig, Message, Producer
from bridge.errors import KafkaClientError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import producer_config
from bridge.message import MessageIdGenerator

RawHeaders = list[tuple[str, str | bytes | None]]

ASYNC_MESSAGES = int(os.environ.get("BENCH_PRODUCER_MESSAGES", "100000"))
SYNC_MESSAGES = 1_000
RUNS = int(os.environ.get("BENCH_PRODUCER_RUNS", "5"))
BATCH_SIZES = (100, 1_000)
"""Messages per ``send_batch``."""


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self, *args: Any) -> None:
        with self.lock:
            self.count += 1


def _produce_when_room(
    raw: RawProducer, topic: str, body: bytes, headers: RawHeaders | None, done: Any
) -> None:
    """``raw.produce`` after it raised ``BufferError`` (the local queue is full): serve
    delivery reports and retry until there is room. The loops call ``produce`` inline and
    this only on that error, so the baselines pay nothing for it otherwise."""
    while True:
        raw.poll(0.01)
        try:
            raw.produce(topic, body, headers=headers, on_delivery=done)
            return
        except BufferError:
            continue


class _Reports:
    """Delivery reports of raw batches: served by ``flush()`` on the producing thread."""

    def __init__(self) -> None:
        self.acked = 0
        self.failed: list[Any] = []

    def __call__(self, err: Any, _kmsg: Any) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(err)


def _raw_batches(raw: RawProducer, topic: str, body: bytes, batch: int) -> int:
    reports = _Reports()
    ids = MessageIdGenerator()
    batches = max(ASYNC_MESSAGES // batch, 1)
    for _ in range(batches):
        for _ in range(batch):
            headers: RawHeaders = [
                ("UNIQ_KEY", ids.next_id().encode()),
                ("BORN_HOST", b"127.0.0.1"),
                ("TAGS", b"T"),
            ]
            try:
                raw.produce(topic, body, headers=headers, on_delivery=reports)
            except BufferError:
                _produce_when_room(raw, topic, body, headers, reports)
        raw.flush(60)
    if reports.acked != batches * batch or reports.failed:
        raise RuntimeError(f"raw: {reports.acked} of {batches * batch} acknowledged")
    return batches * batch


def _ours_batches(producer: Producer, topic: str, body: bytes, batch: int) -> int:
    batches = max(ASYNC_MESSAGES // batch, 1)
    for _ in range(batches):
        results = producer.send_batch([Message(topic, body, tags="T") for _ in range(batch)])
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise RuntimeError(f"ours: {len(failed)} of {batch} failed, {failed[0]}")
    return batches * batch


def _raw_async(raw: RawProducer, topic: str, body: bytes, with_headers: bool) -> int:
    done = _Counter()
    ids = MessageIdGenerator()
    for _ in range(ASYNC_MESSAGES):
        headers: RawHeaders | None = (
            [("UNIQ_KEY", ids.next_id().encode()), ("BORN_HOST", b"127.0.0.1"), ("TAGS", b"T")]
            if with_headers
            else None
        )
        try:
            raw.produce(topic, body, headers=headers, on_delivery=done)
        except BufferError:
            _produce_when_room(raw, topic, body, headers, done)
        raw.poll(0)
    raw.flush(60)
    if done.count != ASYNC_MESSAGES:
        raise RuntimeError(f"raw: {done.count} of {ASYNC_MESSAGES} acknowledged")
    return ASYNC_MESSAGES


def _ours_async(producer: Producer, topic: str, body: bytes) -> int:
    done = _Counter()
    failed: list[Exception] = []
    for _ in range(ASYNC_MESSAGES):
        producer.send_async(Message(topic, body, tags="T"), done, failed.append)
    producer.flush(60_000)
    if done.count != ASYNC_MESSAGES or failed:
        raise RuntimeError(f"ours: {done.count} of {ASYNC_MESSAGES} acknowledged, {failed[:1]}")
    return ASYNC_MESSAGES


def _raw_sync(raw: RawProducer, topic: str, body: bytes) -> int:
    ids = MessageIdGenerator()
    for _ in range(SYNC_MESSAGES):
        headers: RawHeaders = [
            ("UNIQ_KEY", ids.next_id().encode()),
            ("BORN_HOST", b"127.0.0.1"),
            ("TAGS", b"T"),
        ]
        try:
            raw.produce(topic, body, headers=headers)
        except BufferError:
            _produce_when_room(raw, topic, body, headers, None)
        raw.flush(10)
    return SYNC_MESSAGES


def _ours_sync(producer: Producer, topic: str, body: bytes) -> int:
    for _ in range(SYNC_MESSAGES):
        producer.send_sync(Message(topic, body, tags="T"))
    return SYNC_MESSAGES


def _measure_size(raw: RawProducer, producer: Producer, size: int) -> list[Row]:
    body = b"x" * size
    topic = f"bench-producer-{size}-{uuid.uuid4().hex[:6]}"
    # Warm up both clients (connections, idempotent producer id, topic metadata).
    _raw_sync(raw, topic, body)
    _ours_sync(producer, topic, body)
    cpu: dict[str, list[float]] = defaultdict(list)
    measures = {
        "raw same": _bind(cpu, "raw same", _raw_async, raw, topic, body, True),
        "raw bare": _bind(cpu, "raw bare", _raw_async, raw, topic, body, False),
        "ours": _bind(cpu, "ours", _ours_async, producer, topic, body),
        "raw sync": _bind(cpu, "raw sync", _raw_sync, raw, topic, body),
        "ours sync": _bind(cpu, "ours sync", _ours_sync, producer, topic, body),
    }
    for batch in BATCH_SIZES:
        raw_name, ours_name = f"raw batch {batch}", f"ours batch {batch}"
        measures[raw_name] = _bind(cpu, raw_name, _raw_batches, raw, topic, body, batch)
        measures[ours_name] = _bind(cpu, ours_name, _ours_batches, producer, topic, body, batch)
    try:
        rates = interleaved_rates(RUNS, measures)
    finally:
        _delete_topic(producer.config, topic)
    cpu_ns = {name: statistics.median(values) for name, values in cpu.items()}
    name = f"send_async {size} B"
    batches = [
        (f"send_batch {batch} x {size} B", f"ours batch {batch}", f"raw batch {batch}")
        for batch in BATCH_SIZES
    ]
    return [
        Row(name, "msg/s", rates["ours"], rates["raw same"], "raw produce, same record"),
        Row(name, "msg/s", rates["ours"], rates["raw bare"], "raw produce, value only"),
        *(
            Row(row, "msg/s", rates[ours], rates[base], "raw produce+flush per batch, same records")
            for row, ours, base in batches
        ),
        Row(f"send_sync {size} B", "msg/s", rates["ours sync"], rates["raw sync"],
            "raw produce+flush, same record"),
        Row(f"{name} CPU", "ns/msg", cpu_ns["ours"], cpu_ns["raw same"], "raw produce, same record",
            higher_is_better=False),
        *(
            Row(f"{row} CPU", "ns/msg", cpu_ns[ours], cpu_ns[base], "raw produce+flush per batch",
                higher_is_better=False)
            for row, ours, base in batches
        ),
    ]  # fmt: skip


def _delete_topic(config: ClientConfig, topic: str) -> None:
    """Delete a measured topic: its records are not read, and at the default sizes a run
    writes ~2.5 GB, which filled a disk on a broker kept from run to run."""
    try:
        TopicAdmin(config).delete_topics([topic])
    except KafkaClientError as exc:
        print(f"bench topic {topic} not deleted: {exc}")


def _bind(cpu: dict[str, list[float]], name: str, fn: Any, *args: Any) -> Any:
    """A measurement of ``fn(*args)`` (a count): (count, seconds), with the process's CPU
    time a message (ns) appended to ``cpu[name]``."""

    def measure() -> tuple[int, float]:
        cpu_started = time.process_time()
        started = time.perf_counter()
        count = int(fn(*args))
        seconds = time.perf_counter() - started
        cpu[name].append((time.process_time() - cpu_started) / count * 1e9)
        return count, seconds

    return measure


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap)
    raw = RawProducer(producer_config(config, "bench-raw"))
    with Producer("bench", config=config) as producer:
        rows = [row for size in (100, 1024) for row in _measure_size(raw, producer, size)]
    raw.flush(10)
    print_rows("Producer throughput, messages/s (ratio = ours / baseline)", rows)
    return rows
