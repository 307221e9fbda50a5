"""Delayed delivery: what an idle coordinator costs the broker (its CPU beside the broker's
alone), timer lateness on an idle system (a few hundred timers of random delays),
at a steady rate, and at a steady rate beside thousands of timers hopping between tiers in
bulk, a burst due in one second (in the one-partition layout, then with each tier spread over
:data:`SPREAD_PARTITIONS` partitions read by one and by two coordinator processes),
coordinator memory with a million pending timers, and recovery after SIGKILL.

The coordinator runs as its own process, with 100 ms timer precision. Lateness is measured
on the broker's clock: the real topic stores the append time, compared with the due time the
sender wrote into each body. Baseline for the burst: a plain consume-and-produce copy of the
same number of records (what any Kafka pipeline moving them once would cost).
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from bench.harness import Row, cpu_seconds, listening_pid, print_rows
from bridge import ClientConfig, Message, Producer, read_messages
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin, new_consumer, new_reader, producer_config
from topics.catalog import SystemTopic, TopicSpec
from topics.naming import coordinator_group

IDLE_TIMERS = int(os.environ.get("BENCH_IDLE_TIMERS", "200"))
IDLE_DELAY_MS = (1000, 8000)
"""The idle row's timers are due a random 1 to 8 s after they are sent."""
STEADY_RATE_PER_S = int(os.environ.get("BENCH_STEADY_RATE", "5000"))
STEADY_SECONDS = 10
HOPPING = int(os.environ.get("BENCH_HOPPING", "3000"))
"""Timers sent at once, due in :data:`HOPPING_DELAY_MS`, hopping between tiers in bulk while
the steady timers of the row beside hops are delivered."""
HOPPING_DELAY_MS = 12_000
BESIDE_RATE_PER_S = 200
BESIDE_DELAY_MS = 1500
BURST = int(os.environ.get("BENCH_BURST", "500000"))
SPREAD_PARTITIONS = int(os.environ.get("BENCH_SPREAD_PARTITIONS", "2"))
"""Partitions per timer tier (and delay level) of the spread burst rows."""
PENDING = int(os.environ.get("BENCH_PENDING", "1000000"))
QUIET_S = float(os.environ.get("BENCH_QUIET_S", "30"))
"""How long the quiet row measures the broker's CPU alone and beside an idle coordinator, s."""
DAY_MS = 86_400_000
ROWS = ("quiet", "idle", "steady", "beside", "burst", "spread", "pending")
"""The rows of this part, in the order they run; ``BENCH_DELAYS_ROWS`` (comma-separated)
picks some of them (all by default)."""


def _rows_wanted() -> list[str]:
    """The rows ``BENCH_DELAYS_ROWS`` names (all when unset); raises ``ValueError`` naming an
    unknown one."""
    given = [w.strip() for w in os.environ.get("BENCH_DELAYS_ROWS", "").split(",") if w.strip()]
    unknown = [w for w in given if w not in ROWS]
    if unknown:
        raise ValueError(f"BENCH_DELAYS_ROWS: unknown rows {unknown}; known: {', '.join(ROWS)}")
    return given or list(ROWS)


_PROFILED = """
import atexit, cProfile, runpy, sys, threading
prefix, profiles, run = sys.argv[1], [], threading.Thread.run
def profiled(self):
    profile = cProfile.Profile()
    profiles.append((self.name, profile))
    profile.enable()
    try:
        run(self)
    finally:
        profile.disable()
threading.Thread.run = profiled
atexit.register(lambda: [p.dump_stats(f"{prefix}-{n}.prof") for n, p in profiles])
sys.argv = ["bridge.cli", *sys.argv[2:]]
runpy.run_module("bridge.cli", run_name="__main__")
"""
"""Runs the command line with each thread under cProfile (the services run in threads, which
``python -m cProfile`` does not see); writes ``<prefix>-<thread name>.prof`` at exit."""


def _coordinator(config: ClientConfig, coordinator_id: str) -> subprocess.Popen[bytes]:
    """A coordinator process of ``config``'s namespace; with ``BENCH_PROFILE=<dir>`` each of
    its threads runs under cProfile and writes ``<dir>/<coordinator_id>-<thread>.prof`` when
    it stops."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": coordinator_id,
        "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
        "BRIDGE_TIMER_MAX_DELAY_MS": str(config.timer_max_delay_ms),
        "BRIDGE_DELAY_PARTITIONS_PER_LEVEL": str(config.delay_partitions_per_level),
        "BRIDGE_TIMER_PARTITIONS_PER_TIER": str(config.timer_partitions_per_tier),
    }
    profile = os.environ.get("BENCH_PROFILE")
    runner = ["-c", _PROFILED, f"{profile}/{coordinator_id}"] if profile else ["-m", "bridge.cli"]
    return subprocess.Popen(
        [sys.executable, *runner, "coordinator"],
        env=env, cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _await_coordinator(config: ClientConfig) -> None:
    """Wait until a coordinator delivers a level-1 message (its services own their partitions)."""
    topic = f"bench-warmup-{uuid.uuid4().hex[:6]}"
    with Producer("bench_warmup", config=config) as producer:
        producer.send_sync(Message(topic, b"warmup", delay_time_level=1))
    if not list(read_messages(config, [topic], max_messages=1, timeout_ms=120_000)):
        raise RuntimeError("the coordinator delivered nothing within 120 s")


def _stamped(config: ClientConfig, topic: str) -> str:
    TopicAdmin(config).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    return topic


def _lateness(config: ClientConfig, topic: str, count: int, timeout_ms: int) -> list[int]:
    """Delivered minus due, ms, for each message of ``topic`` (body = due time)."""
    return [
        int(msg.store_timestamp_ms or 0) - int(msg.body)
        for msg in read_messages(config, [topic], max_messages=count, timeout_ms=timeout_ms)
    ]


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else float("nan")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _idle(config: ClientConfig) -> Row:
    """Timers of random delays sent at once on an otherwise idle system: how late each is
    beside its neighbours' (the precision is the baseline: none should be later)."""
    topic = _stamped(config, f"bench-idle-{uuid.uuid4().hex[:6]}")
    rng = random.Random(16)
    with Producer("bench_idle", config=config) as producer:
        for _ in range(IDLE_TIMERS):
            due = time.time_ns() // 1_000_000 + rng.randint(*IDLE_DELAY_MS)
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(30_000)
    late = _lateness(config, topic, IDLE_TIMERS, IDLE_DELAY_MS[1] + 30_000)
    precision = config.timer_precision_ms
    over = sum(1 for v in late if v >= precision)
    early = sum(1 for v in late if v < 0)
    print(
        f"timer lateness of {IDLE_TIMERS} timers due in {IDLE_DELAY_MS[0] // 1000}-"
        f"{IDLE_DELAY_MS[1] // 1000} s on an idle system ({precision} ms precision): "
        f"p50 {_pct(late, 0.5):.0f} ms, p99 {_pct(late, 0.99):.0f} ms, "
        f"max {max(late, default=0)} ms, {over} at or over the precision, "
        f"early {early}, delivered {len(late)}/{IDLE_TIMERS}"
    )
    return Row(
        f"{IDLE_TIMERS} idle timers: p99 lateness",
        "ms",
        _pct(late, 0.99),
        precision,
        "the timer precision",
        higher_is_better=False,
    )


def _steady(config: ClientConfig) -> Row:
    topic = _stamped(config, f"bench-steady-{uuid.uuid4().hex[:6]}")
    count = STEADY_RATE_PER_S * STEADY_SECONDS
    with Producer("bench_steady", config=config) as producer:
        started = time.monotonic()
        for i in range(count):
            while time.monotonic() < started + i / STEADY_RATE_PER_S:
                time.sleep(0.0005)
            due = time.time_ns() // 1_000_000 + 2000
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(30_000)
    late = _lateness(config, topic, count, 30_000)
    early = sum(1 for v in late if v < 0)
    print(
        f"timer lateness at {STEADY_RATE_PER_S}/s for {STEADY_SECONDS} s (100 ms precision): "
        f"p50 {_pct(late, 0.5):.0f} ms, p99 {_pct(late, 0.99):.0f} ms, "
        f"max {max(late, default=0)} ms, "
        f"early {early}, delivered {len(late)}/{count}"
    )
    return Row(
        f"timers at {STEADY_RATE_PER_S}/s: p99 lateness",
        "ms",
        _pct(late, 0.99),
        config.timer_precision_ms,
        "the timer precision",
        higher_is_better=False,
    )


def _beside_hops(config: ClientConfig) -> Row:
    """Timers due at a steady rate while :data:`HOPPING` others, due after the last of them,
    hop between tiers in bulk (four times, from 6.4 s on, at 100 ms precision): how late the
    steady ones are beside those batches of hops."""
    topic = _stamped(config, f"bench-beside-{uuid.uuid4().hex[:6]}")
    bulk = f"bench-hopping-{uuid.uuid4().hex[:6]}"
    count = BESIDE_RATE_PER_S * STEADY_SECONDS
    with Producer("bench_beside", config=config) as producer:
        bulk_due = time.time_ns() // 1_000_000 + HOPPING_DELAY_MS
        for _ in range(HOPPING):
            msg = Message(bulk, b"h")
            msg.set_deliver_time_ms(bulk_due)
            producer.send_async(msg)
        started = time.monotonic()
        for i in range(count):
            while time.monotonic() < started + i / BESIDE_RATE_PER_S:
                time.sleep(0.0005)
            due = time.time_ns() // 1_000_000 + BESIDE_DELAY_MS
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(30_000)
    late = _lateness(config, topic, count, 30_000)
    early = sum(1 for v in late if v < 0)
    print(
        f"timer lateness at {BESIDE_RATE_PER_S}/s beside {HOPPING} timers hopping in bulk "
        f"(100 ms precision): p50 {_pct(late, 0.5):.0f} ms, p99 {_pct(late, 0.99):.0f} ms, "
        f"max {max(late, default=0)} ms, early {early}, delivered {len(late)}/{count}"
    )
    return Row(
        f"timers beside {HOPPING} hops: p99 late",
        "ms",
        _pct(late, 0.99),
        config.timer_precision_ms,
        "the timer precision",
        higher_is_better=False,
    )


def _produce(raw: RawProducer, topic: str, value: bytes | None) -> None:
    """Produce, waiting for room when the local queue is full (the baseline must not fail
    where our producer, which waits the same way, does not)."""
    while True:
        try:
            raw.produce(topic, value)
            raw.poll(0)
            return
        except BufferError:
            raw.poll(0.05)


def _timer_records(config: ClientConfig) -> int:
    """Offsets the timer topic of ``config``'s namespace has taken so far, over all its
    partitions: records (timers sent, and hops between tiers) and transaction markers."""
    kafka_topic = config.catalog().topic(SystemTopic.TIMER)
    reader = new_reader(config, f"bench-timer-offsets-{uuid.uuid4().hex[:8]}", "bench-offsets")
    try:
        partitions = reader.list_topics(kafka_topic, timeout=10).topics[kafka_topic].partitions
        return sum(
            reader.get_watermark_offsets(TopicPartition(kafka_topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        reader.close()


def _burst_rate(config: ClientConfig, label: str) -> float:
    """Send :data:`BURST` timers due in one second and return the rate they are all delivered
    at, msg/s (the count over the time from the due time to the last delivery). Also prints
    how many offsets the timer topic took a timer: one for the send, one for each hop to a
    lower tier, and the transaction markers of the hops (so, with the cost of one timer's
    move, how much of the row's work is hops). A row before it in the same namespace may
    still be moving its last few thousand timers: about 0.01 a timer at the default burst."""
    topic = _stamped(config, f"bench-burst-{uuid.uuid4().hex[:6]}")
    offsets_before = _timer_records(config)
    due = time.time_ns() // 1_000_000 + 25_000
    with Producer("bench_burst", config=config) as producer:
        for _ in range(BURST):
            msg = Message(topic, str(due))
            msg.set_deliver_time_ms(due)
            producer.send_async(msg)
        producer.flush(60_000)
    late = _lateness(config, topic, BURST, 180_000)
    all_in_ms = max(late, default=0)
    early = sum(1 for v in late if v < 0)
    offsets = _timer_records(config) - offsets_before
    print(
        f"burst of {BURST} due in the same second ({label}): all delivered "
        f"{all_in_ms / 1000:.1f} s after the due time (p50 {_pct(late, 0.5):.0f} ms, "
        f"p99 {_pct(late, 0.99):.0f} ms), {len(late)}/{BURST} delivered, early {early}; "
        f"the timer topic took {offsets / BURST:.2f} offsets a timer (send, hops, markers)"
    )
    return BURST / max((all_in_ms + 1) / 1000, 0.001)


def _burst(config: ClientConfig) -> Row:
    ours_rate = _burst_rate(config, "one partition a tier, one coordinator process")
    return Row(
        f"burst of {BURST}: delivered msg/s",
        "msg/s",
        ours_rate,
        _copy_rate(config),
        "plain consume+produce copy",
    )


def _copy_rate(config: ClientConfig) -> float:
    """Baseline: consume :data:`BURST` records and produce each once, plainly, msg/s."""
    source = f"bench-copy-src-{uuid.uuid4().hex[:6]}"
    raw = RawProducer(producer_config(config, "bench-copy"))
    for _ in range(BURST):
        _produce(raw, source, b"x" * 40)
    raw.flush(60)
    consumer = new_consumer(config, f"bench-copy-{uuid.uuid4().hex}", "bench-copy")
    consumer.subscribe([source])
    copied = 0
    started = time.monotonic()
    while copied < BURST and time.monotonic() - started < 300:
        for record in consumer.consume(2000, 0.5):
            if record.error() is None:
                _produce(raw, source + "-out", record.value())
                copied += 1
        raw.poll(0)
    raw.flush(60)
    copy_s = time.monotonic() - started
    consumer.close()
    return copied / copy_s


def _await_members(config: ClientConfig, kind: str, count: int) -> None:
    """Wait until the ``kind`` service's group has ``count`` members with partitions (the
    processes share the topic only then)."""
    admin = new_admin(config)
    group = coordinator_group(config.namespace, kind)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        owners = [m for m in described.members if m.assignment.topic_partitions]
        if len(owners) >= count and str(described.state).endswith("STABLE"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the {kind} group did not reach {count} members within 120 s")


def _spread(config: ClientConfig) -> list[Row]:
    """The burst with each tier over :data:`SPREAD_PARTITIONS` partitions, read by one
    coordinator process and then by two (each in a namespace of its own), beside the plain
    copy of the same run."""
    rates = {}
    for processes in (1, 2):
        spread = config.replace(
            namespace=f"benchs{processes}{uuid.uuid4().hex[:6]}",
            timer_partitions_per_tier=SPREAD_PARTITIONS,
            delay_partitions_per_level=SPREAD_PARTITIONS,
        )
        coordinators = [_coordinator(spread, f"bench-{processes}-{i}") for i in range(processes)]
        try:
            _await_coordinator(spread)
            _await_members(spread, "timer", processes)
            pids = [c.pid for c in coordinators]
            broker = listening_pid(config.bootstrap_servers)
            before = [cpu_seconds(pid) or 0.0 for pid in pids]
            broker_before = cpu_seconds(broker) if broker is not None else None
            started = time.monotonic()
            rates[processes] = _burst_rate(
                spread,
                f"{SPREAD_PARTITIONS} partitions a tier, {processes} coordinator process"
                f"{'es' if processes > 1 else ''}",
            )
            # CPU time is what a model of more cores starts from: wall time on these shared
            # 2 cores depends on what else runs.
            used = [(cpu_seconds(pid) or 0.0) - b for pid, b in zip(pids, before, strict=True)]
            broker_after = cpu_seconds(broker) if broker is not None else None
            broker_used = (
                f"{broker_after - broker_before:.1f} s"
                if broker_after is not None and broker_before is not None
                else "unknown"
            )
            print(
                f"  CPU during the row ({time.monotonic() - started:.0f} s from the first send): "
                f"coordinators {', '.join(f'{u:.1f} s' for u in used)} "
                f"({sum(used) / BURST * 1e6:.0f} us a timer in all), broker {broker_used}"
            )
        finally:
            for coordinator in coordinators:
                coordinator.terminate()
            for coordinator in coordinators:
                coordinator.wait(60)
    copy = _copy_rate(config)
    return [
        Row(
            f"burst, {SPREAD_PARTITIONS}/tier, 1 process: msg/s",
            "msg/s",
            rates[1],
            copy,
            "plain consume+produce copy",
        ),
        Row(
            f"burst, {SPREAD_PARTITIONS}/tier, 2 processes: msg/s",
            "msg/s",
            rates[2],
            copy,
            "plain consume+produce copy",
        ),
        Row(
            f"burst, {SPREAD_PARTITIONS}/tier: 2 processes vs 1",
            "msg/s",
            rates[2],
            rates[1],
            "the same burst, 1 process",
        ),
    ]


def _quiet(config: ClientConfig) -> list[Row]:
    """The broker's CPU a minute beside one idle coordinator (started, its services running,
    nothing sent), against the same broker alone just before; empty where the broker's process
    cannot be found (a remote broker)."""
    broker = listening_pid(config.bootstrap_servers)
    if broker is None:
        print("quiet: the broker's process is not on this machine; row left out")
        return []

    def used(pid: int) -> float:
        seconds = cpu_seconds(pid)
        if seconds is None:
            raise RuntimeError(f"quiet: process {pid} is gone; its CPU cannot be read")
        return seconds

    def per_minute(pid: int) -> float:
        before = used(pid)
        time.sleep(QUIET_S)  # the measured time itself: nothing to poll for
        return (used(pid) - before) * 60 / QUIET_S

    alone = per_minute(broker)
    coordinator = _coordinator(config, "bench-quiet")
    try:
        _await_coordinator(config)
        own_before = used(coordinator.pid)
        beside = per_minute(broker)
        own = (used(coordinator.pid) - own_before) * 60 / QUIET_S
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    print(
        f"an idle coordinator: broker CPU {beside:.2f} s a minute beside it, {alone:.2f} s "
        f"alone; the coordinator's own {own:.2f} s a minute"
    )
    return [
        Row(
            "idle coordinator: broker CPU",
            "CPU ms a minute",
            beside * 1000,
            alone * 1000,
            "the broker alone",
            higher_is_better=False,
        )
    ]


def _pending(config: ClientConfig) -> None:
    idle = _coordinator(config, "bench-memory")
    _await_coordinator(config)
    rss_idle = _rss_bytes(idle.pid)
    rng = random.Random(7)
    topic = f"bench-pending-{uuid.uuid4().hex[:6]}"
    now = time.time_ns() // 1_000_000
    with Producer("bench_pending", config=config) as producer:
        for _ in range(PENDING):
            msg = Message(topic, b"p")
            msg.set_deliver_time_ms(now + 60_000 + rng.randrange(30 * DAY_MS))
            producer.send_async(msg)
        producer.flush(120_000)
    time.sleep(10)  # let the coordinator fetch and pause every tier before measuring
    rss_loaded = _rss_bytes(idle.pid)
    print(
        f"coordinator memory: {rss_idle / 2**20:.0f} MiB idle, {rss_loaded / 2**20:.0f} MiB with "
        f"{PENDING} timers pending over 30 days: "
        f"{max(rss_loaded - rss_idle, 0) / PENDING:.1f} bytes per pending message"
    )
    # Recovery: kill -9, restart, time until a message due now is delivered.
    probe_topic = _stamped(config, f"bench-probe-{uuid.uuid4().hex[:6]}")
    idle.send_signal(signal.SIGKILL)
    idle.wait()
    with Producer("bench_probe", config=config) as producer:
        producer.send_sync(Message(probe_topic, b"probe", delay_time_level=1))
    restarted = time.monotonic()
    again = _coordinator(config, "bench-memory")
    try:
        got = list(read_messages(config, [probe_topic], max_messages=1, timeout_ms=120_000))
        took = time.monotonic() - restarted
        print(
            f"recovery after SIGKILL with {PENDING} pending: a due message delivered "
            f"{took:.1f} s after the restart ({'ok' if got else 'NOT delivered'})"
        )
    finally:
        again.terminate()
        again.wait(30)


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(
        bootstrap_servers=bootstrap,
        namespace=f"benchd{uuid.uuid4().hex[:6]}",
        timer_precision_ms=100,
        timer_max_delay_ms=31 * DAY_MS,
    )
    wanted = _rows_wanted()
    measures = {"idle": _idle, "steady": _steady, "beside": _beside_hops, "burst": _burst}
    rows: list[Row] = []
    if "quiet" in wanted:  # before any other coordinator runs
        rows += _quiet(dataclasses.replace(config, namespace=f"{config.namespace}q"))
    if any(name in measures for name in wanted):
        coordinator = _coordinator(config, "bench")
        try:
            _await_coordinator(config)
            rows += [measure(config) for name, measure in measures.items() if name in wanted]
        finally:
            coordinator.terminate()
            coordinator.wait(30)
    if "spread" in wanted:  # coordinators of its own, one namespace per process count
        rows += _spread(config)
    if rows:
        print_rows("Delayed delivery (ratio = ours / baseline)", rows)
    if "pending" in wanted:
        _pending(config)
    return rows
