"""Side by side with Apache RocketMQ 5.3: the same benchmarks on both, in one run.

``python -m bench rocketmq`` starts a local RocketMQ name server and broker from Maven jars
(:mod:`bridge.runtime.rocketmq`, timer precision 100 ms like the bridge's coordinator here),
runs each benchmark against it with the Java remoting client (the driver of the differential
suite, ``tests/differential/RocketMQDriver.java``), then the same benchmark against the bridge
on the run's Kafka broker with a coordinator process, and prints each of our figures beside
RocketMQ's with the ratio (ours / RocketMQ; the last column says which way is better):

* a burst of timers due in the same second: time until all were delivered, and how many within
  1 s of their time (RocketMQ issue #6566);
* timer lateness p50/p99 at a steady rate;
* delay-level throughput: messages at level 1 delivered per second;
* transactional sends per second (4 threads, every local transaction commits) and
  commit-to-visible latency at 100 per second;
* push consumer throughput with 10 % of the messages failing once.

Lateness is measured on each broker's clock: the delivered record's store time (RocketMQ's
store timestamp, the bridge's ``LogAppendTime``) minus the due time written into its body.
Sizes shrink with ``BENCH_ROCKETMQ_BURST`` (100,000 by default; the issue's figure is 500,000),
``BENCH_ROCKETMQ_STEADY_RATE`` (1000/s for 10 s), ``BENCH_ROCKETMQ_LEVELS`` (50,000) and
``BENCH_ROCKETMQ_CONSUME`` (50,000). ``BENCH_ROCKETMQ_PARTS`` picks benchmarks,
comma-separated: ``burst``, ``steady``, ``levels``, ``transactions``, ``consume`` (all by
default). Both run on the same machine, one after the other; on a shared machine the figures
are noisy.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import consumer as bench_consumer
from bench.delays import _await_coordinator, _coordinator, _lateness, _pct, _stamped
from bench.harness import Row, print_rows
from bench.transactions import THREADS, _Commit, _threads_rate, _visible_latencies
from bridge import ClientConfig, Message, Producer, TransactionMQProducer, read_messages
from bridge.runtime.rocketmq import LocalRocketMQ, LocalRocketMQConfig
from tests.differential.rocketmq_side import DriverRun, Event

BURST = int(os.environ.get("BENCH_ROCKETMQ_BURST", "100000"))
STEADY_RATE_PER_S = int(os.environ.get("BENCH_ROCKETMQ_STEADY_RATE", "1000"))
STEADY_SECONDS = 10
STEADY_DELAY_MS = 2000
LEVEL_MESSAGES = int(os.environ.get("BENCH_ROCKETMQ_LEVELS", "50000"))
CONSUME_MESSAGES = int(os.environ.get("BENCH_ROCKETMQ_CONSUME", "50000"))
PARTS = frozenset(
    p.strip()
    for p in os.environ.get(
        "BENCH_ROCKETMQ_PARTS", "burst,steady,levels,transactions,consume"
    ).split(",")
    if p.strip()
)
TX_SECONDS = 8
LATENCY_MESSAGES = 400
LATENCY_RATE_PER_S = 100
PRECISION_MS = 100
DAY_MS = 86_400_000
ROCKETMQ = "RocketMQ 5.3.3"
LOWER = f"{ROCKETMQ}; lower is better"


def _due_in_ms() -> int:
    """How far ahead the burst is due: room to send it all first (1 ms per message; both
    sides send faster, RocketMQ's Java client one request per message)."""
    return 15_000 + BURST


def _driver(rmq: LocalRocketMQ, home: Path, workload: str, **args: Any) -> Event:
    suffix = uuid.uuid4().hex[:6]
    run = DriverRun(
        workload, rmq.namesrv_addr, home, 1800,
        topic=f"bench-{workload}-{suffix}", producer_group=f"bench_p_{suffix}",
        consumer_group=f"bench_c_{suffix}", **args,
    )  # fmt: skip
    (result,) = [e for e in run.events() if e["ev"] == "result"]
    return result


def _send_timers(config: ClientConfig, topic: str, dues: list[int]) -> float:
    """Send one timer per due time (body = due time); seconds the sends took."""
    started = time.monotonic()
    with Producer("bench_rmq_timers", config=config) as producer:
        for due in dues:
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(300_000)
    return time.monotonic() - started


def _burst(config: ClientConfig) -> dict[str, float]:
    topic = _stamped(config, f"bench-rmq-burst-{uuid.uuid4().hex[:6]}")
    due = time.time_ns() // 1_000_000 + _due_in_ms()
    send_s = _send_timers(config, topic, [due] * BURST)
    before_ms = due - time.time_ns() // 1_000_000
    late = _lateness(config, topic, BURST, 300_000)
    return {
        "before_ms": float(before_ms),
        "all_in_ms": float(max(late, default=-1)),
        "within_1s": float(sum(1 for v in late if v <= 1000)),
        "p99_ms": _pct(late, 0.99),
        "delivered": float(len(late)),
        "send_s": send_s,
    }


def _steady(config: ClientConfig) -> dict[str, float]:
    topic = _stamped(config, f"bench-rmq-steady-{uuid.uuid4().hex[:6]}")
    count = STEADY_RATE_PER_S * STEADY_SECONDS
    with Producer("bench_rmq_steady", config=config) as producer:
        started = time.monotonic()
        for i in range(count):
            while time.monotonic() < started + i / STEADY_RATE_PER_S:
                time.sleep(0.0005)
            due = time.time_ns() // 1_000_000 + STEADY_DELAY_MS
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(60_000)
    late = _lateness(config, topic, count, 60_000)
    return {
        "p50_ms": _pct(late, 0.5),
        "p99_ms": _pct(late, 0.99),
        "early": float(sum(1 for v in late if v < 0)),
        "delivered": float(len(late)),
    }


def _levels(config: ClientConfig) -> dict[str, float]:
    topic = _stamped(config, f"bench-rmq-levels-{uuid.uuid4().hex[:6]}")
    level1_ms = config.delay_policy.level_delays_ms[0]
    started_ms = time.time_ns() // 1_000_000
    with Producer("bench_rmq_levels", config=config) as producer:
        for _ in range(LEVEL_MESSAGES):
            due = time.time_ns() // 1_000_000 + level1_ms
            producer.send_async(Message(topic, str(due), delay_time_level=1))
        producer.flush(300_000)
    stored = [
        (m.store_timestamp_ms or 0, int(m.body))
        for m in read_messages(config, [topic], max_messages=LEVEL_MESSAGES, timeout_ms=120_000)
    ]
    late = [store - due for store, due in stored]
    seconds = (max(store for store, _ in stored) - started_ms) / 1000
    return {"per_second": len(stored) / seconds, "p99_late_ms": _pct(late, 0.99)}


def _transactions(config: ClientConfig) -> dict[str, float]:
    topic = f"bench-rmq-tx-{uuid.uuid4().hex[:6]}"
    with TransactionMQProducer("bench_rmq_tx", _Commit(), config=config) as producer:
        producer.send_message_in_transaction(Message(topic, b"warm"))
        rate = _threads_rate(
            lambda s, i: producer.send_message_in_transaction(Message(topic, b"x" * 100))
        )
        latencies = _visible_latencies(config, f"{topic}-lat", producer)
    return {
        "per_second": rate,
        "p50_ms": _pct([int(v) for v in latencies], 0.5),
        "p99_ms": _pct([int(v) for v in latencies], 0.99),
    }


def _consume(config: ClientConfig) -> dict[str, float]:
    bench_consumer.MESSAGES = CONSUME_MESSAGES
    topic = f"bench-rmq-consume-{uuid.uuid4().hex[:6]}"
    bench_consumer._fill(config, topic)
    count, seconds, _cpu = bench_consumer._ours(config, topic, failing=True)
    return {"per_second": count / seconds}


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(
        bootstrap_servers=bootstrap,
        namespace=f"benchr{uuid.uuid4().hex[:6]}",
        timer_precision_ms=PRECISION_MS,
        timer_max_delay_ms=DAY_MS,
    )
    rows: list[Row] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-rocketmq-") as tmp:
        rmq = LocalRocketMQ(
            LocalRocketMQConfig(
                data_dir=Path(tmp) / "rocketmq",
                timer_precision_ms=PRECISION_MS,
                broker_heap_mb=1024,
            )
        )
        rmq.start()
        rss = rmq.rss_bytes()
        print(
            f"RocketMQ: name server + broker up in {rmq.start_seconds:.1f} s, resident "
            f"{rss.get('namesrv', 0) / 2**20:.0f} + {rss.get('broker', 0) / 2**20:.0f} MiB"
        )
        home = Path(tmp) / "driver"
        coordinator = _coordinator(config, "bench-rocketmq")
        try:
            _await_coordinator(config)

            if "burst" in PARTS:
                r = _driver(rmq, home, "bench-burst", count=BURST, due_in_ms=_due_in_ms(),
                            deadline_ms=300_000)  # fmt: skip
                o = _burst(config)
                notes.append(
                    f"burst of {BURST:,}: RocketMQ sent in {r['send_s']:.1f} s "
                    f"({r['send_failed']} sends failed, not sent again), delivered "
                    f"{r['delivered']:,}, {r['within_1s']:,} within 1 s, p99 {r['p99_ms']} ms, "
                    f"early {r['early']}; ours sent in {o['send_s']:.1f} s, delivered "
                    f"{o['delivered']:,.0f}, {o['within_1s']:,.0f} within 1 s, "
                    f"p99 {o['p99_ms']:.0f} ms"
                )
                for side, before_ms in (
                    ("RocketMQ", r["sent_before_due_ms"]),
                    ("ours", o["before_ms"]),
                ):
                    if before_ms < 0:
                        notes.append(
                            f"WARNING: {side} finished sending the burst {-before_ms / 1000:.1f} s "
                            "after its due time: its figures are not those of a burst (lower "
                            "BENCH_ROCKETMQ_BURST)"
                        )
                rows += [
                    Row(f"burst of {BURST:,}: all delivered after", "ms", o["all_in_ms"],
                        r["all_in_ms"], LOWER, higher_is_better=False),
                    Row(f"burst of {BURST:,}: within 1 s of due", "msgs", o["within_1s"],
                        r["within_1s"], ROCKETMQ),
                ]  # fmt: skip

            if "steady" in PARTS:
                r = _driver(rmq, home, "bench-steady", rate=STEADY_RATE_PER_S,
                            seconds=STEADY_SECONDS, delay_ms=STEADY_DELAY_MS)  # fmt: skip
                o = _steady(config)
                notes.append(
                    f"steady timers at {STEADY_RATE_PER_S}/s: RocketMQ early {r['early']}, "
                    f"max {r['max_ms']} ms; ours early {o['early']:.0f}"
                )
                rows += [
                    Row(f"timer lateness p50 ({STEADY_RATE_PER_S}/s)", "ms", o["p50_ms"],
                        r["p50_ms"], LOWER, higher_is_better=False),
                    Row(f"timer lateness p99 ({STEADY_RATE_PER_S}/s)", "ms", o["p99_ms"],
                        r["p99_ms"], LOWER, higher_is_better=False),
                ]  # fmt: skip

            if "levels" in PARTS:
                r = _driver(rmq, home, "bench-levels", count=LEVEL_MESSAGES)
                o = _levels(config)
                rows.append(
                    Row(f"delay level 1, {LEVEL_MESSAGES:,} msgs", "msg/s", o["per_second"],
                        r["delivered"] / r["seconds"], ROCKETMQ)
                )  # fmt: skip

            if "transactions" in PARTS:
                r = _driver(rmq, home, "bench-transactions", threads=THREADS, seconds=TX_SECONDS,
                            rate=LATENCY_RATE_PER_S, count=LATENCY_MESSAGES)  # fmt: skip
                o = _transactions(config)
                rows += [
                    Row(f"transactional sends ({THREADS} threads)", "msg/s", o["per_second"],
                        r["per_second"], ROCKETMQ),
                    Row("commit-to-visible p50", "ms", o["p50_ms"], r["p50_ms"], LOWER,
                        higher_is_better=False),
                    Row("commit-to-visible p99", "ms", o["p99_ms"], r["p99_ms"], LOWER,
                        higher_is_better=False),
                ]  # fmt: skip

            if "consume" in PARTS:
                r = _driver(rmq, home, "bench-consume", count=CONSUME_MESSAGES)
                o = _consume(config)
                rows.append(
                    Row(f"consume, 10% failing once ({CONSUME_MESSAGES:,})", "msg/s",
                        o["per_second"], r["per_second"], ROCKETMQ)
                )  # fmt: skip
            rss = rmq.rss_bytes()
            notes.append(
                f"RocketMQ resident at the end: {rss.get('namesrv', 0) / 2**20:.0f} + "
                f"{rss.get('broker', 0) / 2**20:.0f} MiB"
            )
        finally:
            coordinator.terminate()
            coordinator.wait(60)
            rmq.stop()
    print_rows(f"Bridge vs {ROCKETMQ} (ratio = ours / RocketMQ)", rows)
    for line in notes:
        print(line)
    return rows
