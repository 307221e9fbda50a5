"""A check storm: many undecided transactions of one live producer checked at once.

``BENCH_STORM_TRANSACTIONS`` (20,000) transactions are sent by one ``TransactionMQProducer``
whose ``execute_local_transaction`` answers UNKNOWN (as during a database outage), to one
coordinator process (transaction timeout 3 s, check interval 3 s, ``transaction_check_max``
3); its ``check_local_transaction`` answers ``BENCH_STORM_ANSWER`` (COMMIT, or UNKNOWN) at
once. While they are being checked, ordinary transactions (``execute_local_transaction``
answers COMMIT) are sent at 20/s, half by the same producer group and half by another.

Printed: how many checks the coordinator wrote (check requests read back from the group's
check topic) and how many reached ``check_local_transaction`` (calls per transaction: fewest
and most), how many transactions were committed and parked, the time from the first check
to the last decision (the drain), and the commit-to-visible latency of the ordinary commits
during the storm beside the same latency measured in the same run without a storm (the
baseline; ratio = storm / baseline).

``python -m bench storm`` (or ``python -m bench.check_storm``; KAFKA_BOOTSTRAP_SERVERS or a
local broker).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness import Row, broker, print_rows
from bench.transactions import _pct, _Reader, _uniq_key
from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer
from topics.catalog import SystemTopic, TopicCatalog

TRANSACTIONS = int(os.environ.get("BENCH_STORM_TRANSACTIONS", "20000"))
ANSWER = TransactionStatus(os.environ.get("BENCH_STORM_ANSWER", "COMMIT"))
ORDINARY = 200
ORDINARY_RATE_PER_S = 20
SENDERS = 8
TIMEOUT_MS = 3000
INTERVAL_MS = 3000
CHECK_MAX = 3
DRAIN_LIMIT_S = float(os.environ.get("BENCH_STORM_LIMIT_S", "300"))


class _Listener(TransactionListener):
    """``execute_local_transaction`` answers ``arg``; checks of storm messages (body starting
    with ``s``) answer :data:`ANSWER`, others COMMIT. Counts the checks of each message."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.first_check: float | None = None
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return arg if isinstance(arg, TransactionStatus) else TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        with self._lock:
            self.calls[msg.msg_id] += 1
            if self.first_check is None:
                self.first_check = time.monotonic()
        return ANSWER if msg.body.startswith(b"s") else TransactionStatus.COMMIT


class _Count:
    """A ``read_committed`` reader of a topic on a thread of its own: records and distinct
    keys seen."""

    def __init__(self, config: ClientConfig, topic: str) -> None:
        self.records = 0
        self.keys: set[bytes] = set()
        self._consumer = new_consumer(config, f"bench-{uuid.uuid4().hex}", "bench")
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="bench-count")
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for record in self._consumer.consume(1000, 0.1):
                if record.error() is None:
                    self.records += 1
                    self.keys.add(record.key() or b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def _coordinator(config: ClientConfig, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": "storm",
        "BRIDGE_TRANSACTION_TIMEOUT_MS": str(TIMEOUT_MS),
        "BRIDGE_CHECK_INTERVAL_MS": str(INTERVAL_MS),
        "BRIDGE_TRANSACTION_CHECK_MAX": str(CHECK_MAX),
    }
    env.pop("BRIDGE_COORDINATOR_PROCESSES", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "coordinator"],
            env=env, cwd=Path(__file__).resolve().parents[1],
            stdout=subprocess.DEVNULL, stderr=out,
        )  # fmt: skip


def _ordinary(
    config: ClientConfig, topic: str, producers: list[TransactionMQProducer]
) -> list[list[float]]:
    """:data:`ORDINARY` committing transactions at :data:`ORDINARY_RATE_PER_S`, taking turns
    among ``producers``: for each producer, milliseconds from the end of each of its sends
    until it is visible."""
    ended: dict[str, tuple[int, float]] = {}
    reader = _Reader(config, topic, _uniq_key)
    try:
        for i in range(ORDINARY):
            producer = producers[i % len(producers)]
            result = producer.send_message_in_transaction(Message(topic, f"o{i}"))
            ended[result.msg_id] = (i % len(producers), time.monotonic())
            time.sleep(1 / ORDINARY_RATE_PER_S)
        reader.wait_for(ended, 60)
    finally:
        reader.close()
    out: list[list[float]] = [[] for _ in producers]
    for m, (slot, t) in ended.items():
        if m in reader.seen:
            out[slot].append((reader.seen[m] - t) * 1000)
    return out


def _all(per_producer: list[list[float]]) -> list[float]:
    return [v for values in per_producer for v in values]


def _send_storm(producer: TransactionMQProducer, topic: str) -> None:
    def work(slot: int) -> None:
        for i in range(slot, TRANSACTIONS, SENDERS):
            producer.send_message_in_transaction(Message(topic, f"s{i}"), TransactionStatus.UNKNOWN)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"storm{uuid.uuid4().hex[:6]}")
    catalog = TopicCatalog(namespace=config.namespace)
    TopicAdmin(config).ensure_system_topics(catalog)
    log = Path(tempfile.mkdtemp(prefix="bridge-storm-")) / "coordinator.log"
    coordinator = _coordinator(config, log)
    topic = f"storm-{uuid.uuid4().hex[:6]}"
    listener = _Listener()
    rows: list[Row] = []
    try:
        with (
            TransactionMQProducer("storm", listener, config=config) as same,
            TransactionMQProducer("storm_other", _Listener(), config=config) as other,
        ):
            warm = _all(_ordinary(config, f"{topic}-warm", [same, other]))  # coordinator up
            baseline = _all(_ordinary(config, f"{topic}-base", [same, other]))
            committed = _Reader(config, topic, _uniq_key)
            parked = _Count(config, catalog.topic(SystemTopic.CHECK_MAX))
            checks = _Count(config, catalog.check_topic("storm"))
            try:
                sent_at = time.monotonic()
                _send_storm(same, topic)
                sent_s = time.monotonic() - sent_at
                while listener.first_check is None and time.monotonic() - sent_at < 60:
                    time.sleep(0.05)
                split = _ordinary(config, f"{topic}-during", [same, other])
                during = _all(split)
                drained_at = None
                while time.monotonic() - sent_at < DRAIN_LIMIT_S:
                    if len(committed.seen) + len(parked.keys) >= TRANSACTIONS:
                        drained_at = time.monotonic()
                        break
                    time.sleep(0.1)
                first = listener.first_check or sent_at
                storm_calls = [n for body, n in listener.calls.items()]
                print(
                    f"\n== Check storm ({TRANSACTIONS:,} transactions, "
                    f"checks answer {ANSWER.value})"
                )
                print(f"sent in {sent_s:.1f} s by {SENDERS} threads of one producer")
                print(
                    f"checks made (requests written): {checks.records:,}; checks asked "
                    f"(check_local_transaction calls): {sum(storm_calls):,} over "
                    f"{len(storm_calls):,} transactions (fewest {min(storm_calls, default=0)}, "
                    f"most {max(storm_calls, default=0)} calls a transaction); "
                    f"never asked: {TRANSACTIONS - len(storm_calls):,}"
                )
                print(f"committed: {len(committed.seen):,}; parked: {len(parked.keys):,}")
                print(
                    "drained (first check to last decision): "
                    + (
                        f"{drained_at - first:.1f} s"
                        if drained_at is not None
                        else f"not within {DRAIN_LIMIT_S:.0f} s"
                    )
                )
                print(
                    f"ordinary commits during the storm: p50 {_pct(during, 0.5):.0f} ms, p99 "
                    f"{_pct(during, 0.99):.0f} ms ({len(during)}/{ORDINARY} seen); without a "
                    f"storm: p50 {_pct(baseline, 0.5):.0f} ms, p99 {_pct(baseline, 0.99):.0f} ms "
                    f"(warm-up p99 {_pct(warm, 0.99):.0f} ms)"
                )
                print(
                    f"  of them, the storm's group: p50 {_pct(split[0], 0.5):.0f} ms, p99 "
                    f"{_pct(split[0], 0.99):.0f} ms; another group: p50 "
                    f"{_pct(split[1], 0.5):.0f} ms, p99 {_pct(split[1], 0.99):.0f} ms"
                )
                print(f"coordinator log: {log}")
                rows = [
                    Row(
                        "ordinary commit-to-visible p99",
                        "ms",
                        _pct(during, 0.99),
                        _pct(baseline, 0.99),
                        "same, no storm",
                        higher_is_better=False,
                    ),
                    Row(
                        "ordinary commit-to-visible p50",
                        "ms",
                        _pct(during, 0.5),
                        _pct(baseline, 0.5),
                        "same, no storm",
                        higher_is_better=False,
                    ),
                ]
                print_rows("Ordinary commits during a check storm (ratio = storm / none)", rows)
            finally:
                committed.close()
                parked.close()
                checks.close()
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    return rows


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    with broker() as servers:
        run(servers)
