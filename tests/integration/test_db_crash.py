"""The crash proof of G13: exactly-once effects end to end, through kill -9 of every process
at every step.

An orders application places 20 orders through a ``DatabaseTransactionListener`` (orders
2, 7, 12 and 17 fail their business rule and are rolled back) and is killed with SIGKILL at
each step of a transaction: before its database commit (order 4), between the commit and the
END (order 8), and after the END (order 11); the coordinator is killed twice (between two
application runs, and while the last run sends); an inventory application that applies each
order once through an ``IdempotentListener`` is killed between a database commit and the
offset commit. Each is restarted. Then a checker compares the three sources of truth (the
orders database, the real topic, the inventory database): every committed order has exactly
one message and exactly one effect, byte for byte; no message and no effect without an order
row; rolled-back and crashed-before-commit orders leave nothing. Against a real PostgreSQL
server and SQLite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, select

from bridge import ClientConfig, read_messages
from bridge.coordinator.health import coordinator_health
from bridge.db import create_tables, transaction_log
from bridge.kafka.admin import TopicAdmin
from tests.conftest import REPO_ROOT, wait_until
from tests.db_crash_apps import app_tables, effects, fails, order_id, orders
from tests.db_fixtures import new_postgres_database
from topics.catalog import TopicSpec

pytestmark = [pytest.mark.broker, pytest.mark.slow]

LAST_ORDER = 20
CRASHED_BEFORE_COMMIT = 4


class Apps:
    """The processes of one run: started with the run's environment, output kept per start."""

    def __init__(self, config: ClientConfig, tmp_path: Path) -> None:
        self.config = config
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def start(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        self.count += 1
        out = self.tmp_path / f"{self.count:02d}-{argv[0]}-{argv[1] if len(argv) > 1 else ''}.log"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv],
                cwd=REPO_ROOT,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "KAFKA_BOOTSTRAP_SERVERS": self.config.bootstrap_servers,
                    "BRIDGE_NAMESPACE": self.config.namespace,
                    **(env or {}),
                },
            )
        self.started.append(proc)
        return proc, out

    def coordinator(self) -> subprocess.Popen[bytes]:
        proc, _ = self.start(
            "bridge.cli", "coordinator",
            env={
                "BRIDGE_COORDINATOR_ID": f"crash-{uuid.uuid4().hex[:6]}",
                "BRIDGE_TRANSACTION_PARTITIONS": "1",
                "BRIDGE_TRANSACTION_TIMEOUT_MS": "1000",
                # Checks every 2 s, 300 of them (10 min): no transaction is parked while no
                # producer takes checks. Each killed run's check consumer holds its partitions
                # until its session times out (10 s), and a run killed within seconds of its
                # start may never get them: the crashed order's first answer can come only
                # from the last run, minutes later on a loaded machine.
                "BRIDGE_CHECK_INTERVAL_MS": "2000",
                "BRIDGE_TRANSACTION_CHECK_MAX": "300",
                "BRIDGE_SESSION_TIMEOUT_MS": "6000",
            },
        )  # fmt: skip
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _killed(proc: subprocess.Popen[bytes], out: Path, what: str) -> None:
    """The process ended by its own SIGKILL at the step named ``what``."""
    proc.wait(timeout=120)
    text = out.read_text(errors="replace")
    assert proc.returncode == -signal.SIGKILL, text
    assert f"killed {what}" in text, text


def check(config: ClientConfig, topic: str, orders_db: Engine, inventory_db: Engine) -> list[str]:
    """Every violation of G13 the three sources show (empty: none)."""
    with orders_db.connect() as conn:
        rows = {r.id: r.body for r in conn.execute(select(orders))}
        logged = {r.message_id: r.state for r in conn.execute(select(transaction_log))}
    with inventory_db.connect() as conn:
        applied = list(conn.execute(select(effects.c.order_id, effects.c.body)))
    messages = list(read_messages(config, [topic], timeout_ms=3000))
    on_topic = Counter(m.keys[0] for m in messages)
    effect_count = Counter(order for order, _ in applied)
    wrong: list[str] = []
    for oid in sorted(set(rows) | set(on_topic) | set(effect_count)):
        if oid in rows:
            if on_topic[oid] != 1:
                wrong.append(f"{oid}: committed, {on_topic[oid]} messages on the topic")
            if effect_count[oid] != 1:
                wrong.append(f"{oid}: committed, {effect_count[oid]} effects")
        else:
            if on_topic[oid]:
                wrong.append(f"{oid}: no order row, {on_topic[oid]} messages on the topic")
            if effect_count[oid]:
                wrong.append(f"{oid}: no order row, {effect_count[oid]} effects")
    for m in messages:
        if m.keys and m.keys[0] in rows and m.body != rows[m.keys[0]]:
            wrong.append(f"{m.keys[0]}: message body {m.body!r} differs from the row")
        if logged.get(m.msg_id) != "COMMIT":
            wrong.append(f"{m.keys[0]}: on the topic, log state {logged.get(m.msg_id)}")
    for oid, body in applied:
        if oid in rows and body != rows[oid]:
            wrong.append(f"{oid}: effect body {body!r} differs from the row")
    return wrong


@pytest.fixture()
def databases(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> Iterator[tuple[str, str]]:
    if backend == "postgresql":
        server = request.getfixturevalue("postgres_server")
        urls = (new_postgres_database(server), new_postgres_database(server))
    else:
        urls = (f"sqlite:///{tmp_path}/orders.db", f"sqlite:///{tmp_path}/inventory.db")
    for url in urls:
        engine = create_engine(url)
        create_tables(engine)
        app_tables.create_all(engine)
        if backend == "sqlite":
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        engine.dispose()
    yield urls


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_kill_9_at_every_step_leaves_exactly_once_effects(
    client_config: ClientConfig, tmp_path: Path, databases: tuple[str, str], backend: str
) -> None:
    orders_url, inventory_url = databases
    topic = f"crash-orders-{uuid.uuid4().hex[:6]}"
    # The consumer subscribes before the first commit: the topic must exist (Kafka's client
    # looks for a missing one again only every 5 min).
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 2)])
    apps = Apps(client_config, tmp_path)
    orders_db, inventory_db = create_engine(orders_url), create_engine(inventory_url)
    try:
        coordinator = apps.coordinator()
        wait_until(
            lambda: any(
                h.kind == "transaction" and h.healthy for h in coordinator_health(client_config)
            ),
            timeout_s=90,
        )
        consumer_env = {"BRIDGE_KAFKA_SESSION_TIMEOUT_MS": "6000"}
        group = f"inventory-{uuid.uuid4().hex[:6]}"
        consumer, consumer_out = apps.start(
            "tests.db_crash_apps", "consume", inventory_url, topic, group, "--crash-after", "6",
            env=consumer_env,
        )  # fmt: skip

        def produce(first: int, last: int, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
            return apps.start(
                "tests.db_crash_apps", "produce", orders_url, topic, str(first), str(last), *extra
            )

        run, out = produce(1, 6, "--crash", f"before_db_commit:{CRASHED_BEFORE_COMMIT}")
        _killed(run, out, f"before_db_commit {order_id(CRASHED_BEFORE_COMMIT)}")
        run, out = produce(5, 10, "--crash", "after_db_commit:8")
        _killed(run, out, f"after_db_commit {order_id(8)} (COMMIT)")
        coordinator.kill()  # the decision of order 8 was never sent: only a check finds it
        coordinator.wait()
        coordinator = apps.coordinator()
        run, out = produce(9, 14, "--crash", "after_end:11")
        _killed(run, out, f"after_end {order_id(11)}")
        _, last_out = produce(12, LAST_ORDER, "--stay")
        wait_until(lambda: order_id(13) in last_out.read_text(), timeout_s=120)
        coordinator.kill()  # while the last run sends
        coordinator.wait()
        coordinator = apps.coordinator()
        wait_until(lambda: "done" in last_out.read_text().split(), timeout_s=180)

        _killed(consumer, consumer_out, "after handling")
        consumer, consumer_out = apps.start(
            "tests.db_crash_apps", "consume", inventory_url, topic, group, env=consumer_env
        )
        expected = {
            order_id(n)
            for n in range(1, LAST_ORDER + 1)
            if not fails(n) and n != CRASHED_BEFORE_COMMIT
        }

        def converged() -> bool:
            with inventory_db.connect() as conn:
                done = set(conn.execute(select(effects.c.order_id)).scalars())
            return done >= expected

        wait_until(converged, timeout_s=240, interval_s=0.5)

        def log_states() -> Counter[str]:
            with orders_db.connect() as conn:
                return Counter(conn.execute(select(transaction_log.c.state)).scalars())

        # 15 committed; 4 rolled back by their work, 1 fenced by a check after its crash. The
        # fence is written when a check of the crashed order reaches the last (live) producer,
        # which the consumer's effects above do not wait for.
        want = {"COMMIT": len(expected), "ROLLBACK": 5}
        deadline = time.monotonic() + 120
        while log_states() != want and time.monotonic() < deadline:
            time.sleep(0.5)
        violations = check(client_config, topic, orders_db, inventory_db)
        for line in violations:
            print("VIOLATION", line)
        assert violations == []
        with orders_db.connect() as conn:
            assert set(conn.execute(select(orders.c.id)).scalars()) == expected
        assert log_states() == want
    finally:
        apps.stop_all()
        orders_db.dispose()
        inventory_db.dispose()
