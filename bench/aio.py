"""The asyncio API's throughput: ``bridge.aio`` beside the threaded API and raw
``confluent_kafka.aio``, in the same run on the same broker.

Send (100-byte bodies, acknowledged by the broker before the run counts as done):

* ``aio send``: ``await producer.send(msg)`` from up to :data:`WINDOW` tasks at once;
* ``aio send_batch``: ``await producer.send_batch(msgs)`` of :data:`WINDOW` messages;
* baselines: the threaded ``Producer.send_async`` with callbacks and a final flush (the same
  records), and raw ``confluent_kafka.aio.AIOProducer`` producing the value alone (its batched
  ``produce`` takes no headers, so it cannot send the bridge's records), awaited in windows
  of :data:`WINDOW`.

Consume (a topic of 4 partitions, from the start, with a new group each run, until every
message is done; time from the first message handed over):

* ``aio consume``: ``bridge.aio.PushConsumer`` with an ``async def`` listener;
* baselines: the threaded ``PushConsumer`` with a plain listener, and a raw
  ``confluent_kafka.aio.AIOConsumer`` (``consume`` of 500, a trivial handler per record,
  a commit every 5 s).

Loop lag (how long the loop is held while the clients work): a probe task sleeps 5 ms in a
loop and records each overshoot, less the time the loop's thread waited for a CPU (the
kernel's run-queue time: another process's doing), while :data:`LAG_MESSAGES` are sent
(single sends, batches and oneway sends, all at once) and consumed:

* ``aio``: through ``bridge.aio`` on the probed loop, with an ``async def`` listener;
* baseline: the same work through the threaded API in the same process while the probe runs on
  an otherwise idle loop: the GIL hand-offs the clients' threads cost any loop in the process.

Both run with ``sys.setswitchinterval(0.001)`` and the heap frozen before (``gc.freeze()``),
as docs/asyncio.md advises latency-minded services.

``python -m bench aio``; ``BENCH_AIO_MESSAGES`` (50,000) and ``BENCH_AIO_ROUNDS`` (3).
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka.aio import AIOConsumer, AIOProducer

from bench.harness import Row, interleaved_rates, print_rows, timed
from bridge import ClientConfig, ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer
from bridge import aio as bridge_aio
from bridge.consumer import PushConsumer
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import consumer_config, producer_config
from topics.catalog import TopicSpec

MESSAGES = int(os.environ.get("BENCH_AIO_MESSAGES", "50000"))
ROUNDS = int(os.environ.get("BENCH_AIO_ROUNDS", "3"))
LAG_MESSAGES = 5000
"""Messages sent and consumed while the loop's lag is probed."""
WINDOW = 1000
"""Sends awaited at once (tasks, or messages per batch)."""
PARTITIONS = 4
BODY = b"x" * 100


# --- send ----------------------------------------------------------------------------------
async def _aio_send(producer: bridge_aio.Producer, topic: str) -> int:
    for start in range(0, MESSAGES, WINDOW):
        window = min(WINDOW, MESSAGES - start)
        await asyncio.gather(
            *(producer.send(Message(topic, BODY, tags="T")) for _ in range(window))
        )
    return MESSAGES


async def _aio_send_batch(producer: bridge_aio.Producer, topic: str) -> int:
    for start in range(0, MESSAGES, WINDOW):
        window = min(WINDOW, MESSAGES - start)
        results = await producer.send_batch(Message(topic, BODY, tags="T") for _ in range(window))
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            raise RuntimeError(f"aio send_batch: {len(failed)} failed, {failed[0]}")
    return MESSAGES


async def _raw_aio_send(producer: AIOProducer, topic: str) -> int:
    for start in range(0, MESSAGES, WINDOW):
        window = min(WINDOW, MESSAGES - start)
        futures = [await producer.produce(topic, BODY) for _ in range(window)]
        await producer.flush()
        await asyncio.gather(*futures)
    return MESSAGES


def _threaded_send(producer: Producer, topic: str) -> int:
    done = 0
    lock = threading.Lock()
    failed: list[Exception] = []

    def acknowledged(_: Any) -> None:
        nonlocal done
        with lock:
            done += 1

    for _ in range(MESSAGES):
        producer.send_async(Message(topic, BODY, tags="T"), acknowledged, failed.append)
    producer.flush(60_000)
    if done != MESSAGES or failed:
        raise RuntimeError(f"threaded: {done} of {MESSAGES} acknowledged, {failed[:1]}")
    return MESSAGES


class _Loop:
    """An event loop in a thread of its own, so measurements of both APIs interleave."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-aio-loop")
        self.thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def timed(self, make: Callable[[], Any]) -> tuple[int, float]:
        async def measure() -> tuple[int, float]:
            started = time.perf_counter()
            count = await make()
            return count, time.perf_counter() - started

        result: tuple[int, float] = self.run(measure())
        return result

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _send_rows(config: ClientConfig, loop: _Loop) -> list[Row]:
    topic = f"bench-aio-send-{uuid.uuid4().hex[:6]}"
    TopicAdmin(config).ensure_topics([TopicSpec(topic, PARTITIONS)])

    async def open_clients() -> tuple[bridge_aio.Producer, AIOProducer]:
        ours = bridge_aio.Producer("bench_aio", config=config)
        await ours.start()
        raw = AIOProducer(producer_config(config, "bench-raw-aio"), batch_size=WINDOW)
        return ours, raw

    ours, raw = loop.run(open_clients())
    with Producer("bench_threaded", config=config) as threaded:
        # Warm up every client (connections, producer ids, topic metadata).
        loop.run(ours.send(Message(topic, BODY)))
        loop.run(_raw_aio_send_one(raw, topic))
        threaded.send_sync(Message(topic, BODY))
        rates = interleaved_rates(
            ROUNDS,
            {
                "threaded": lambda: timed(lambda: _threaded_send(threaded, topic)),
                "aio send": lambda: loop.timed(lambda: _aio_send(ours, topic)),
                "aio batch": lambda: loop.timed(lambda: _aio_send_batch(ours, topic)),
                "raw aio": lambda: loop.timed(lambda: _raw_aio_send(raw, topic)),
            },
        )
    loop.run(ours.shutdown())
    loop.run(raw.close())
    return [
        Row("aio send (awaited) 100 B", "msg/s", rates["aio send"], rates["threaded"],
            "threaded send_async"),
        Row("aio send (awaited) 100 B", "msg/s", rates["aio send"], rates["raw aio"],
            "raw AIOProducer, value only"),
        Row("aio send_batch 100 B", "msg/s", rates["aio batch"], rates["threaded"],
            "threaded send_async"),
        Row("aio send_batch 100 B", "msg/s", rates["aio batch"], rates["raw aio"],
            "raw AIOProducer, value only"),
        Row("threaded send_async 100 B", "msg/s", rates["threaded"], rates["raw aio"],
            "raw AIOProducer, value only"),
    ]  # fmt: skip


async def _raw_aio_send_one(raw: AIOProducer, topic: str) -> None:
    future = await raw.produce(topic, BODY)
    await raw.flush()
    await future


# --- consume -------------------------------------------------------------------------------
def _fill(config: ClientConfig, topic: str) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, PARTITIONS)])
    with Producer("bench_aio_fill", config=config) as producer:
        for i in range(MESSAGES):
            producer.send_async(Message(topic, BODY, keys=f"k{i}", tags="T"))
        producer.flush(60_000)


def _group() -> str:
    return f"bench_aio_{uuid.uuid4().hex[:8]}"


def _options() -> dict[str, Any]:
    return {"consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET}


def _threaded_consume(config: ClientConfig, topic: str) -> tuple[int, float]:
    first: list[float] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        if not first:
            first.append(time.perf_counter())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(_group(), config=config, **_options())
    consumer.subscribe(topic, listener)
    consumer.start()
    try:
        while consumer.stats().consumed < MESSAGES:
            time.sleep(0.005)
        return MESSAGES, time.perf_counter() - first[0]
    finally:
        consumer.shutdown()


async def _aio_consume(config: ClientConfig, topic: str) -> tuple[int, float]:
    first: list[float] = []

    async def listener(msg: MessageExt) -> ConsumeStatus:
        if not first:
            first.append(time.perf_counter())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = bridge_aio.PushConsumer(_group(), config=config, **_options())
    consumer.subscribe(topic, listener)
    async with consumer:
        while consumer.stats().consumed < MESSAGES:
            await asyncio.sleep(0.005)
        return MESSAGES, time.perf_counter() - first[0]


async def _raw_aio_consume(config: ClientConfig, topic: str) -> tuple[int, float]:
    consumer = AIOConsumer(consumer_config(config, _group(), "bench-raw-aio"))
    handled = 0
    started = 0.0
    await consumer.subscribe([topic])
    last_commit = time.perf_counter()
    while handled < MESSAGES:
        for record in await consumer.consume(num_messages=500, timeout=0.1):
            if not started:
                started = time.perf_counter()
            if record.error() is None and record.value() is not None:
                handled += 1
        if time.perf_counter() - last_commit > 5:
            await consumer.commit(asynchronous=True)
            last_commit = time.perf_counter()
    elapsed = time.perf_counter() - started
    await consumer.commit(asynchronous=False)
    await consumer.close()
    return handled, elapsed


def _consume_rows(config: ClientConfig, loop: _Loop) -> list[Row]:
    topic = f"bench-aio-consume-{uuid.uuid4().hex[:6]}"
    _fill(config, topic)
    rates = interleaved_rates(
        ROUNDS,
        {
            "threaded": lambda: _threaded_consume(config, topic),
            "aio": lambda: loop.run(_aio_consume(config, topic)),
            "raw aio": lambda: loop.run(_raw_aio_consume(config, topic)),
        },
    )
    return [
        Row("aio consume, async listener", "msg/s", rates["aio"], rates["threaded"],
            "threaded PushConsumer"),
        Row("aio consume, async listener", "msg/s", rates["aio"], rates["raw aio"],
            "raw AIOConsumer"),
        Row("threaded consume", "msg/s", rates["threaded"], rates["raw aio"], "raw AIOConsumer"),
    ]  # fmt: skip


# --- loop lag ------------------------------------------------------------------------------
def _waited_for_a_cpu_s() -> float:
    """How long the calling thread has been runnable but waiting for a CPU (Linux
    ``schedstat``), s; 0 where the kernel does not tell."""
    try:
        with open("/proc/thread-self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class _Probe:
    """Sleeps 5 ms at a time on the loop it runs on; each overshoot less the CPU wait, s."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop.is_set():
            before, starved = loop.time(), _waited_for_a_cpu_s()
            await asyncio.sleep(0.005)
            overshoot = loop.time() - before - 0.005
            self.lags.append(max(0.0, overshoot - (_waited_for_a_cpu_s() - starved)))


def _lag_messages(topic: str) -> tuple[list[list[Message]], list[Message], list[Message]]:
    """The lag workload: batches of 100, single sends and oneway sends, 5 : 1 : 4."""
    batches = [
        [Message(topic, BODY, keys=f"{j}") for j in range(100)] for _ in range(LAG_MESSAGES // 200)
    ]
    singles = [Message(topic, BODY) for _ in range(LAG_MESSAGES // 10)]
    oneway = [Message(topic, BODY) for _ in range(LAG_MESSAGES - LAG_MESSAGES // 2 - len(singles))]
    return batches, singles, oneway


async def _aio_lag(config: ClientConfig, topic: str) -> list[float]:
    probe = _Probe()
    done = 0

    async def listener(msg: MessageExt) -> ConsumeStatus:
        nonlocal done
        done += 1
        await asyncio.sleep(0)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = bridge_aio.PushConsumer(
        _group(), config=config, consume_thread_count=8, **_options()
    )
    consumer.subscribe(topic, listener)
    async with bridge_aio.Producer("bench_aio_lag", config=config) as producer, consumer:
        prober = asyncio.create_task(probe.run())
        batches, singles, oneway = _lag_messages(topic)
        sends = [producer.send_batch(b) for b in batches] + [producer.send(m) for m in singles]
        await asyncio.gather(*sends)
        for msg in oneway:
            await producer.send_oneway(msg)
        while done < LAG_MESSAGES:
            await asyncio.sleep(0.05)
        probe.stop.set()
        await prober
    return probe.lags


def _threaded_lag(config: ClientConfig, topic: str, loop: _Loop) -> list[float]:
    probe = _Probe()
    prober = asyncio.run_coroutine_threadsafe(probe.run(), loop.loop)
    consumer = PushConsumer(_group(), config=config, consume_thread_count=8, **_options())
    consumer.subscribe(topic, lambda msg: ConsumeStatus.CONSUME_SUCCESS)
    consumer.start()
    try:
        with Producer("bench_threaded_lag", config=config) as producer:
            batches, singles, oneway = _lag_messages(topic)
            for batch in batches:
                producer.send_batch(batch)
            for msg in singles:
                producer.send_async(msg)
            for msg in oneway:
                producer.send_oneway(msg)
            producer.flush(60_000)
        while consumer.stats().consumed < LAG_MESSAGES:
            time.sleep(0.05)
    finally:
        consumer.shutdown()
        loop.loop.call_soon_threadsafe(probe.stop.set)
        prober.result()
    return probe.lags


def _lag_rows(config: ClientConfig, loop: _Loop) -> list[Row]:
    worst: dict[str, list[float]] = {"aio": [], "threaded": []}
    p99: dict[str, list[float]] = {"aio": [], "threaded": []}
    gc.collect()
    gc.freeze()
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        for _ in range(ROUNDS):
            for name in ("aio", "threaded"):
                topic = f"bench-aio-lag-{uuid.uuid4().hex[:6]}"
                TopicAdmin(config).ensure_topics([TopicSpec(topic, PARTITIONS)])
                if name == "aio":
                    lags = loop.run(_aio_lag(config, topic))
                else:
                    lags = _threaded_lag(config, topic, loop)
                worst[name].append(max(lags) * 1e6)
                p99[name].append(statistics.quantiles(lags, n=100)[98] * 1e6)
    finally:
        sys.setswitchinterval(switch_interval)
        gc.unfreeze()
    median = statistics.median
    return [
        Row("aio loop lag, worst", "µs", median(worst["aio"]), median(worst["threaded"]),
            "idle loop beside threaded clients", higher_is_better=False),
        Row("aio loop lag, p99", "µs", median(p99["aio"]), median(p99["threaded"]),
            "idle loop beside threaded clients", higher_is_better=False),
    ]  # fmt: skip


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"ba{uuid.uuid4().hex[:8]}")
    loop = _Loop()
    try:
        rows = _send_rows(config, loop) + _consume_rows(config, loop) + _lag_rows(config, loop)
    finally:
        loop.close()
    print_rows(f"asyncio API ({MESSAGES:,} messages x 100 B; ratio = first / second figure)", rows)
    return rows
