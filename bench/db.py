"""The database in the loop (``bridge.db``), each figure beside the same work without the
bridge, measured in the same run, in interleaved rounds (``BENCH_DB_ROUNDS``, 3):

* business transactions per second through ``DatabaseTransactionListener`` (one order row,
  its log row, the half message and its END), against the same database transaction alone
  (the order row), from ``BENCH_DB_THREADS`` (8) threads for ``BENCH_DB_SECONDS`` (4 s) each;
  and, to show where the ceiling is, the same transactional sends with a listener that answers
  COMMIT without a database (the half message's round trip, the END and the coordinator's
  commit on the same broker and cores);
* ``IdempotentListener`` consuming ``BENCH_DB_MESSAGES`` (5,000) messages with a handler that
  inserts a row, against a plain ``PushConsumer`` listener running the same insert in its own
  database transaction.

On PostgreSQL (``BENCH_DATABASE_URL``, else a server started from the machine's binaries);
``BENCH_DB_BACKENDS=postgresql,sqlite`` adds SQLite. ``BENCH_DB_PROFILE=1`` also prints a
profile of one thread sending transactions and of one consuming through the inbox.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
)

from bench.delays import _await_coordinator, _coordinator
from bench.harness import Row, interleaved_rates, print_rows
from bench.transactions import _Commit
from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionMQProducer,
)
from bridge.db import DatabaseTransactionListener, IdempotentListener, create_tables
from bridge.kafka.admin import TopicAdmin
from bridge.runtime.local_postgres import LocalPostgres
from topics.catalog import TopicSpec

THREADS = int(os.environ.get("BENCH_DB_THREADS", "8"))
SECONDS = float(os.environ.get("BENCH_DB_SECONDS", "4"))
ROUNDS = int(os.environ.get("BENCH_DB_ROUNDS", "3"))
MESSAGES = int(os.environ.get("BENCH_DB_MESSAGES", "5000"))
BACKENDS = os.environ.get("BENCH_DB_BACKENDS", "postgresql").split(",")
BODY = b"x" * 100

tables = MetaData()
orders = Table(
    "bench_orders",
    tables,
    Column("id", String(64), primary_key=True),
    Column("body", LargeBinary, nullable=False),
)
effects = Table(
    "bench_effects",
    tables,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(64), nullable=False),
)


@contextmanager
def _database(backend: str) -> Iterator[Engine]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bridge-bench-db-") as tmp:
            engine = create_engine(f"sqlite:///{tmp}/bench.db", pool_size=THREADS + 4)
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            yield _ready(engine)
        return
    given = os.environ.get("BENCH_DATABASE_URL")
    server = None if given else LocalPostgres()
    if server is not None:
        server.start()
    try:
        engine = create_engine(given or server.url, pool_size=THREADS + 4)  # type: ignore[union-attr]
        yield _ready(engine)
        engine.dispose()
    finally:
        if server is not None:
            server.stop()


def _ready(engine: Engine) -> Engine:
    create_tables(engine)
    tables.create_all(engine)
    return engine


def _threads_rate(do_one: Callable[[], object]) -> tuple[int, float]:
    """(calls, seconds) of ``THREADS`` threads calling ``do_one`` for ``SECONDS``."""
    counts = [0] * THREADS
    deadline = time.monotonic() + SECONDS

    def work(slot: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            do_one()
            n += 1
        counts[slot] = n

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.monotonic() - started


def _save_order(conn: Connection, order_id: str) -> None:
    conn.execute(insert(orders).values(id=order_id, body=BODY))


def _producer_rows(config: ClientConfig, engine: Engine, backend: str) -> list[Row]:
    topic = f"bench-db-{uuid.uuid4().hex[:6]}"
    with (
        TransactionMQProducer(
            "bench_db_tx", DatabaseTransactionListener(engine), config=config
        ) as producer,
        # The bridge's half of a business transaction without a database: COMMIT at once.
        TransactionMQProducer("bench_db_tx_kafka", _Commit(), config=config) as kafka_only,
    ):

        def alone() -> None:
            with engine.begin() as conn:
                _save_order(conn, uuid.uuid4().hex)

        def through_bridge() -> None:
            oid = uuid.uuid4().hex
            producer.send_message_in_transaction(
                Message(topic, BODY, keys=oid), lambda conn: _save_order(conn, oid)
            )

        def without_database() -> None:
            kafka_only.send_message_in_transaction(Message(topic, BODY, keys=uuid.uuid4().hex))

        through_bridge()  # warm: topics, metadata, connections
        without_database()
        rates = interleaved_rates(
            ROUNDS,
            {
                "alone": lambda: _threads_rate(alone),
                "bridge": lambda: _threads_rate(through_bridge),
                "kafka": lambda: _threads_rate(without_database),
            },
        )
        if os.environ.get("BENCH_DB_PROFILE"):
            _profile(f"DatabaseTransactionListener send ({backend})", through_bridge, 300)
    return [
        Row(
            f"db tx producer ({backend})", "tx/s", rates["bridge"], rates["alone"],
            "the same DB transactions alone",
        ),
        # Where the ceiling is: the transactional sends alone (half message, END, the
        # coordinator's commit), on the same broker, threads and machine.
        Row(
            f"tx sends without a DB ({backend})", "tx/s", rates["kafka"], rates["alone"],
            "the same DB transactions alone",
        ),
        Row(
            f"db tx producer ({backend})", "tx/s", rates["bridge"], rates["kafka"],
            "the same tx sends without a DB",
        ),
    ]  # fmt: skip


def _consume(config: ClientConfig, topic: str, listener: Callable[[MessageExt], object]) -> int:
    """Consume every message of ``topic`` once with ``listener``; the count."""
    done = threading.Semaphore(0)

    def counting(msg: MessageExt) -> ConsumeStatus:
        listener(msg)
        done.release()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"bench_db_{uuid.uuid4().hex[:8]}", config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )  # fmt: skip
    consumer.subscribe(topic, counting)
    with consumer:
        for _ in range(MESSAGES):
            if not done.acquire(timeout=120):
                raise RuntimeError("consumption stalled for 120 s")
    return MESSAGES


def _consumer_rows(config: ClientConfig, engine: Engine, backend: str) -> list[Row]:
    topic = f"bench-db-consume-{uuid.uuid4().hex[:6]}"
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 4)])
    with Producer("bench_db_fill", config=config) as producer:
        for i in range(MESSAGES):
            producer.send_async(Message(topic, BODY, keys=f"k{i}"))
        producer.flush(60_000)

    def handler(conn: Connection, msg: MessageExt) -> None:
        conn.execute(insert(effects).values(order_id=msg.keys[0]))

    def plain(msg: MessageExt) -> None:
        with engine.begin() as conn:
            handler(conn, msg)

    def timed_consume(listener: Callable[[MessageExt], object]) -> tuple[int, float]:
        started = time.perf_counter()
        count = _consume(config, topic, listener)
        return count, time.perf_counter() - started

    rates = interleaved_rates(
        ROUNDS,
        {
            "plain": lambda: timed_consume(plain),
            # A group name per round: each round handles every message again.
            "inbox": lambda: timed_consume(
                IdempotentListener(engine, f"g{uuid.uuid4().hex[:8]}", handler)
            ),
        },
    )
    if os.environ.get("BENCH_DB_PROFILE"):
        inbox = IdempotentListener(engine, "profile", handler)
        msgs = iter(
            MessageExt(topic, BODY, msg_id=uuid.uuid4().hex, keys="k") for _ in range(100_000)
        )
        _profile(f"IdempotentListener call ({backend})", lambda: inbox(next(msgs)), 1000)
    return [
        Row(
            f"idempotent consumer ({backend})", "msg/s", rates["inbox"], rates["plain"],
            "plain listener, same handler",
        )
    ]  # fmt: skip


def _profile(title: str, call: Callable[[], object], count: int) -> None:
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for _ in range(count):
        call()
    profiler.disable()
    elapsed = time.perf_counter() - started
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
    print(
        f"\n-- profile: {title}, {count} calls on one thread, {elapsed / count * 1e3:.2f} ms each"
    )
    print("\n".join(out.getvalue().splitlines()[4:24]))


def run(bootstrap: str) -> list[Row]:
    """Measure and print; return the rows."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bdb{uuid.uuid4().hex[:6]}")
    coordinator = _coordinator(config, "bench-db")
    rows: list[Row] = []
    try:
        _await_coordinator(config)
        for backend in BACKENDS:
            with _database(backend) as engine:
                rows += _producer_rows(config, engine, backend)
                rows += _consumer_rows(config, engine, backend)
    finally:
        coordinator.terminate()
        coordinator.wait(60)
    print_rows("database in the loop", rows)
    return rows
