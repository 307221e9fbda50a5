"""Push consumer throughput, with and without failing messages, and the first retry's delay.

Every run reads the same topic (4 partitions, 100-byte bodies) from the start with a new
consumer group and stops when every message is done: consumed, or (for the failing ones)
safely sent back to the retry topic. Time runs from the first message handed over (group
join and topic set-up excluded, for both). Baselines: a raw confluent-kafka consumer of the
same topic (``read_committed``, manual commits every 5 s) that calls a trivial handler per
record, and a plain at-least-once poll loop that calls the benchmark's own listener on each
confluent-kafka ``Message`` and commits asynchronously after each poll. The same consumer
with ``consume_inline_threshold_us=0`` (every listener call on the listener threads, as before
the poll-thread path) runs beside it, 0% and 10% failing, for a before and after in one run. The
coordinator runs as its own process; the first retry waits at delay level 3 (10 s), and its
end-to-end delay is measured from the failure to the redelivery. Beside each rate, the
process's CPU time a message over the same span (all its threads, librdkafka's included; the
coordinator and the broker are other processes): on a shared machine the rates of one run swing
with the load while the CPU a message moves much less. The same consumer with an SQL92 selector
(:data:`SQL92`, which every message passes, so the listener's work is the same) is measured
beside it with ``*``: the figure is what evaluating the filter costs, reading the headers it
needs included (a listener that reads no property never decodes them). Last, without a broker,
what a listener pays to read fields of a message the push consumer made of a record
(:func:`_read_costs`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.delays import _await_coordinator, _coordinator
from bench.harness import Row, interleaved_rates, print_rows
from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    FilterExpression,
    Message,
    MessageSelector,
    Producer,
)
from bridge.client.records import plain_headers
from bridge.codec import undecoded_message
from bridge.consumer import PushConsumer
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer
from topics.catalog import TopicSpec

MESSAGES = int(os.environ.get("BENCH_CONSUMER_MESSAGES", "100000"))
Clock = tuple[float, float]
"""(``perf_counter``, ``process_time``) at one moment, seconds."""


def _now() -> Clock:
    return time.perf_counter(), time.process_time()


def _since(start: Clock) -> tuple[float, float]:
    """Wall and process CPU seconds since ``start``."""
    wall, cpu = _now()
    return wall - start[0], cpu - start[1]


ROUNDS = int(os.environ.get("BENCH_CONSUMER_ROUNDS", "3"))
PARTITIONS = 4
FAIL_EVERY = 10
"""One message in ten fails once (10%)."""
SQL92 = "TAGS IN ('TagA', 'TagB') AND KEYS STARTSWITH 'k' AND NOT (TAGS = 'TagC')"
"""A selector every message of the benchmark passes (tag ``TagA``, keys ``k<n>``)."""


def _fill(config: ClientConfig, topic: str) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, PARTITIONS)])
    body = b"x" * 100
    with Producer("bench_consumer_fill", config=config) as producer:
        for i in range(MESSAGES):
            producer.send_async(Message(topic, body, keys=f"k{i}", tags="TagA"))
        producer.flush(60_000)


def _raw(config: ClientConfig, topic: str) -> tuple[int, float, float]:
    consumer = new_consumer(config, f"bench-raw-{uuid.uuid4().hex[:8]}", "bench-raw")
    handled = 0

    def handle(record: Any) -> None:
        nonlocal handled
        if record.error() is None and record.value() is not None:
            handled += 1

    consumer.subscribe([topic])
    started: Clock | None = None
    last_commit = time.perf_counter()
    while handled < MESSAGES:
        for record in consumer.consume(num_messages=500, timeout=0.1):
            if started is None:
                started = _now()
            handle(record)
        if time.perf_counter() - last_commit > 5:
            consumer.commit(asynchronous=True)
            last_commit = time.perf_counter()
    assert started is not None
    elapsed, cpu = _since(started)
    consumer.commit(asynchronous=False)
    consumer.close()
    return handled, elapsed, cpu


def _raw_listener_loop(config: ClientConfig, topic: str) -> tuple[int, float, float]:
    """A plain at-least-once Kafka loop: poll, call the listener on each record (the
    confluent-kafka ``Message`` itself, as a Kafka user would), then commit the poll's
    positions asynchronously. The listener is the one ``_ours`` runs with nothing failing."""
    consumer = new_consumer(config, f"bench-loop-{uuid.uuid4().hex[:8]}", "bench-loop")
    first: list[Clock] = []
    listener = _listener(first, failing=False)
    handled = 0
    consumer.subscribe([topic])
    while handled < MESSAGES:
        records = consumer.consume(num_messages=500, timeout=0.1)
        for record in records:
            if record.error() is not None:
                continue
            if listener(record) is not ConsumeStatus.CONSUME_SUCCESS:  # pragma: no cover
                raise RuntimeError("the listener failed a record")
            handled += 1
        if records:
            consumer.commit(asynchronous=True)
    elapsed, cpu = _since(first[0])
    consumer.commit(asynchronous=False)
    consumer.close()
    return handled, elapsed, cpu


def _listener(
    first: list[Clock],
    *,
    failing: bool,
    failed_at: dict[str, float] | None = None,
    back: list[float] | None = None,
) -> Callable[[Any], ConsumeStatus]:
    """The benchmark's listener: notes when the first message came (``first``: wall and CPU
    clocks); when
    ``failing``, fails one message in :data:`FAIL_EVERY` once (noting when in ``failed_at``)
    and notes in ``back`` each first retry's delay (s). Without ``failing`` it reads nothing
    of the message, so a raw loop can call it with a confluent-kafka ``Message``."""
    lock = threading.Lock()

    def listener(msg: Any) -> ConsumeStatus:
        if not first:
            first.append(_now())
        if not failing:
            return ConsumeStatus.CONSUME_SUCCESS
        assert failed_at is not None and back is not None
        if msg.reconsume_times:  # back from the retry topic
            with lock:
                back.append(time.monotonic() - failed_at[msg.msg_id])
            return ConsumeStatus.CONSUME_SUCCESS
        if msg.queue_offset % FAIL_EVERY == 0:
            with lock:
                failed_at[msg.msg_id] = time.monotonic()
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    return listener


def _ours(
    config: ClientConfig,
    topic: str,
    *,
    failing: bool,
    batch: int = 1,
    retries: list[float] | None = None,
    expression: str | FilterExpression = "*",
    pool_only: bool = False,
) -> tuple[int, float, float]:
    """Consume every message once (failures: sent back); if ``retries`` is given, also wait for
    the failed ones to come back and put each first retry's delay (s) in it. ``pool_only``:
    the listener always runs on the listener threads (``consume_inline_threshold_us=0``, the
    consumer before its poll-thread path), for a same-run before and after."""
    failed_at: dict[str, float] = {}
    back: list[float] = []
    first: list[Clock] = []
    listener = _listener(first, failing=failing, failed_at=failed_at, back=back)
    consumer = PushConsumer(
        f"bench_ours_{uuid.uuid4().hex[:8]}",
        config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_message_batch_max_size=batch,
        consume_inline_threshold_us=0 if pool_only else None,
    )
    consumer.subscribe(topic, listener, expression)
    consumer.start()
    expected_failures = 0
    try:
        while True:
            stats = consumer.stats()
            if stats.consumed + stats.sent_back >= MESSAGES:
                break
            time.sleep(0.005)
        elapsed, cpu = _since(first[0])
        expected_failures = stats.sent_back
        if retries is not None:
            deadline = time.monotonic() + 120
            while len(back) < expected_failures and time.monotonic() < deadline:
                time.sleep(0.05)
            retries.extend(back)
    finally:
        consumer.shutdown()
    return MESSAGES, elapsed, cpu


READS = 20_000
"""Messages read per timing of :func:`_read_costs`."""


class _Record:
    """A consumed record as confluent-kafka hands it over: what :func:`_read_costs` needs of
    one (its headers are passed beside it, as the intake passes them)."""

    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000


def _read_costs() -> list[Row]:
    """What a listener pays to read a field of a received message, ns a read (best of 5
    timings of :data:`READS` messages): ``reconsume_times`` (what a RocketMQ listener often
    checks first) and ``msg_id`` (which decodes every header), against ``queue_offset`` (a
    plain slot). The messages are what the push consumer makes of a benchmark message read
    from its topic: a first delivery, its 4 headers not decoded yet."""
    msg = Message("t", b"x" * 100, keys="k1", tags="TagA")
    headers = plain_headers(msg, uuid.uuid4().hex.upper(), b"127.0.0.1:1234")

    def best(read: Callable[[Any], object]) -> float:
        timings = []
        for _ in range(5):
            received = [
                undecoded_message(
                    _Record(i, msg.body), "t", "t", 0, list(headers), first_delivery=True
                )
                for i in range(READS)
            ]
            started = time.perf_counter()
            for each in received:
                read(each)
            timings.append(time.perf_counter() - started)
        return min(timings) / READS * 1e9

    plain = best(lambda m: m.queue_offset)
    return [
        Row(
            "read reconsume_times (received)",
            "ns",
            best(lambda m: m.reconsume_times),
            plain,
            "read queue_offset",
            higher_is_better=False,
        ),
        Row(
            "read msg_id (decodes the headers)",
            "ns",
            best(lambda m: m.msg_id),
            plain,
            "read queue_offset",
            higher_is_better=False,
        ),
    ]


def _noting_cpu(
    name: str, measure: Callable[[], tuple[int, float, float]], cpu_ns: dict[str, list[float]]
) -> Callable[[], tuple[int, float]]:
    """``measure`` as :func:`~bench.harness.interleaved_rates` takes it, putting the process CPU
    time a message of each run (ns) in ``cpu_ns[name]``."""

    def run() -> tuple[int, float]:
        count, seconds, cpu_s = measure()
        cpu_ns[name].append(cpu_s / count * 1e9)
        return count, seconds

    return run


def run(bootstrap: str) -> None:
    """Measure and print."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bc{uuid.uuid4().hex[:8]}")
    coordinator = _coordinator(config, "bench-consumer")
    try:
        _await_coordinator(config)
        topic = f"bench-consume-{uuid.uuid4().hex[:6]}"
        _fill(config, topic)
        timed: dict[str, Callable[[], tuple[int, float, float]]] = {
            "raw": lambda: _raw(config, topic),
            "loop": lambda: _raw_listener_loop(config, topic),
            "ours": lambda: _ours(config, topic, failing=False),
            "ours_fail": lambda: _ours(config, topic, failing=True),
            "pool": lambda: _ours(config, topic, failing=False, pool_only=True),
            "pool_fail": lambda: _ours(config, topic, failing=True, pool_only=True),
            "ours_batch": lambda: _ours(config, topic, failing=False, batch=32),
            "ours_sql": lambda: _ours(
                config, topic, failing=False, expression=MessageSelector.by_sql(SQL92)
            ),
        }
        cpu_ns: dict[str, list[float]] = {name: [] for name in timed}
        measures = {name: _noting_cpu(name, fn, cpu_ns) for name, fn in timed.items()}
        rates = interleaved_rates(ROUNDS, measures)
        retries: list[float] = []
        _ours(config, topic, failing=True, retries=retries)
    finally:
        coordinator.terminate()
        coordinator.wait(60)
    level3_s = config.delay_policy.level_delays_ms[2] / 1000
    rows = [
        Row("consume, 0% failing", "msg/s", rates["ours"], rates["raw"], "raw confluent-kafka"),
        Row(
            "consume, 0% failing (vs loop)",
            "msg/s",
            rates["ours"],
            rates["loop"],
            "raw poll loop + listener + commit",
        ),
        Row(
            "consume, 0%, listener threads only",
            "msg/s",
            rates["pool"],
            rates["loop"],
            "raw poll loop + listener + commit",
        ),
        Row(
            "consume, 10% failing once",
            "msg/s",
            rates["ours_fail"],
            rates["ours"],
            "ours, 0% failing",
        ),
        Row(
            "consume, 10% failing, listener threads only",
            "msg/s",
            rates["pool_fail"],
            rates["pool"],
            "listener threads only, 0%",
        ),
        Row(
            "consume, 10% failing once (vs raw)",
            "msg/s",
            rates["ours_fail"],
            rates["raw"],
            "raw confluent-kafka",
        ),
        Row(
            "consume, SQL92 selector (all pass)",
            "msg/s",
            rates["ours_sql"],
            rates["ours"],
            "ours, '*'",
        ),
        Row(
            "consume, 0%, batches of 32",
            "msg/s",
            rates["ours_batch"],
            rates["raw"],
            "raw confluent-kafka",
        ),
    ]
    cpu = {name: statistics.median(values) for name, values in cpu_ns.items()}
    rows += [
        Row(
            "CPU a message, 0% failing",
            "ns",
            cpu["ours"],
            cpu["loop"],
            "raw poll loop + listener + commit",
            higher_is_better=False,
        ),
        Row(
            "CPU a message, 0%, listener threads only",
            "ns",
            cpu["pool"],
            cpu["loop"],
            "raw poll loop + listener + commit",
            higher_is_better=False,
        ),
        Row(
            "CPU a message, SQL92 selector",
            "ns",
            cpu["ours_sql"],
            cpu["ours"],
            "ours, '*'",
            higher_is_better=False,
        ),
        Row(
            "CPU a message, 10% failing once",
            "ns",
            cpu["ours_fail"],
            cpu["ours"],
            "ours, 0% failing",
            higher_is_better=False,
        ),
    ]
    if retries:
        ordered = sorted(retries)
        p50 = statistics.median(ordered)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        rows += [
            Row(
                "first retry delay p50",
                "ms",
                p50 * 1000,
                level3_s * 1000,
                "level 3 delay",
                higher_is_better=False,
            ),
            Row(
                "first retry delay p99",
                "ms",
                p99 * 1000,
                level3_s * 1000,
                "level 3 delay",
                higher_is_better=False,
            ),
        ]
    print_rows(f"push consumer ({MESSAGES:,} messages x 100 B, {PARTITIONS} partitions)", rows)
    print(f"retries measured: {len(retries)}")
    print_rows("a listener's reads of a received message (no broker)", _read_costs())
