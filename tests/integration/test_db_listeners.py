"""The database-backed listeners against real databases (a PostgreSQL server from the
machine's binaries, and SQLite): the work and its log row commit together or not at all, a
check answers only what can no longer change, and the idempotent consumer runs a handler once
per key. The Kafka side is in test_db_transactions.py."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
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
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from bridge.consumer.model import ConsumeStatus
from bridge.db import (
    DEFAULT_RETENTION_MS,
    DatabaseTransactionListener,
    IdempotentListener,
    consumed_message,
    purge,
    transaction_log,
)
from bridge.db.aio import AsyncDatabaseTransactionListener, AsyncIdempotentListener
from bridge.db.tables import now_ms
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import TransactionStatus

business = MetaData()
orders = Table(
    "orders",
    business,
    Column("id", String(64), primary_key=True),
    Column("note", String(200)),
)
effects = Table(  # no unique key on purpose: a second effect would show
    "effects",
    business,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("key", String(255), nullable=False),
    Column("body", LargeBinary, nullable=False),
)


@pytest.fixture()
def engine(db_engine: Engine) -> Engine:
    business.create_all(db_engine)
    return db_engine


def half(tid: str | None = None, topic: str = "orders", body: bytes = b"x") -> MessageExt:
    tid = tid or uuid.uuid4().hex.upper()
    return MessageExt(
        topic,
        body,
        msg_id=tid,
        properties={MessageConst.TRANSACTION_ID: tid, MessageConst.PRODUCER_GROUP: "g"},
    )


def count(engine: Engine, table: Table, **where: Any) -> int:
    query = select(func.count()).select_from(table)
    for name, value in where.items():
        query = query.where(table.c[name] == value)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def add_order(order_id: str, note: str = "ok") -> Any:
    def work(conn: Connection) -> None:
        conn.execute(insert(orders).values(id=order_id, note=note))

    return work


def test_commit_writes_work_and_row_together(engine: Engine) -> None:
    listener = DatabaseTransactionListener(engine)
    msg = half(topic="订单")
    assert listener.execute_local_transaction(msg, add_order("o-1", "über ☃")) is (
        TransactionStatus.COMMIT
    )
    with engine.connect() as conn:
        row = conn.execute(select(transaction_log)).one()
        assert conn.execute(select(orders.c.note)).scalar_one() == "über ☃"
    assert (row.transaction_id, row.state, row.topic, row.producer_group) == (
        msg.transaction_id, "COMMIT", "订单", "g",
    )  # fmt: skip
    assert listener.check_local_transaction(msg) is TransactionStatus.COMMIT


def test_failing_work_rolls_back_and_is_fenced(engine: Engine) -> None:
    listener = DatabaseTransactionListener(engine)
    msg = half()

    def work(conn: Connection) -> None:
        conn.execute(insert(orders).values(id="o-2"))
        raise RuntimeError("payment declined")

    assert listener.execute_local_transaction(msg, work) is TransactionStatus.ROLLBACK
    assert count(engine, orders) == 0
    assert count(engine, transaction_log, state="ROLLBACK") == 1
    assert listener.check_local_transaction(msg) is TransactionStatus.ROLLBACK


def test_work_that_commits_by_itself_then_raises_is_answered_commit(engine: Engine) -> None:
    # The answer comes from the log, not from the exception.
    listener = DatabaseTransactionListener(engine)
    msg = half()

    def work(conn: Connection) -> None:
        conn.execute(insert(orders).values(id="o-3"))
        conn.commit()
        raise RuntimeError("after its own commit")

    assert listener.execute_local_transaction(msg, work) is TransactionStatus.COMMIT
    assert count(engine, orders) == 1


def test_check_before_the_local_transaction_fences_it_out(engine: Engine) -> None:
    listener = DatabaseTransactionListener(engine)
    msg = half()
    assert listener.check_local_transaction(msg) is TransactionStatus.ROLLBACK
    # The local transaction comes late (a paused process): it can no longer commit.
    assert listener.execute_local_transaction(msg, add_order("o-4")) is (TransactionStatus.ROLLBACK)
    assert count(engine, orders) == 0
    assert listener.check_local_transaction(msg) is TransactionStatus.ROLLBACK


@pytest.mark.parametrize("outcome", ["commit", "raise"])
def test_check_waits_for_a_running_local_transaction(engine: Engine, outcome: str) -> None:
    listener = DatabaseTransactionListener(engine, check_lock_timeout_ms=20_000)
    msg = half()
    inside, release = threading.Event(), threading.Event()
    answers: list[TransactionStatus] = []

    def work(conn: Connection) -> None:
        conn.execute(insert(orders).values(id="o-5"))
        inside.set()
        assert release.wait(30)
        if outcome == "raise":
            raise RuntimeError("rolled back after the check began")

    local = threading.Thread(
        target=lambda: answers.append(listener.execute_local_transaction(msg, work))
    )
    local.start()
    assert inside.wait(30)
    checker = threading.Thread(target=lambda: answers.append(listener.check_local_transaction(msg)))
    checker.start()
    checker.join(0.5)
    assert checker.is_alive(), "the check answered while the local transaction was open"
    release.set()
    local.join(30)
    checker.join(30)
    expected = TransactionStatus.COMMIT if outcome == "commit" else TransactionStatus.ROLLBACK
    assert answers == [expected, expected]
    assert count(engine, orders) == (1 if outcome == "commit" else 0)


def test_check_gives_up_waiting_with_unknown(database_url: str) -> None:
    # SQLite bounds the wait by its busy timeout, PostgreSQL by lock_timeout.
    engine = create_engine(
        database_url, connect_args={"timeout": 0.3} if "sqlite" in database_url else {}
    )
    try:
        business.create_all(engine)
        listener = DatabaseTransactionListener(engine, check_lock_timeout_ms=300)
        msg = half()
        inside, release = threading.Event(), threading.Event()

        def work(conn: Connection) -> None:
            inside.set()
            assert release.wait(30)

        local = threading.Thread(target=listener.execute_local_transaction, args=(msg, work))
        local.start()
        assert inside.wait(30)
        assert listener.check_local_transaction(msg) is TransactionStatus.UNKNOWN
        release.set()
        local.join(30)
        assert listener.check_local_transaction(msg) is TransactionStatus.COMMIT
    finally:
        engine.dispose()


def consumed(msg_id: str, body: bytes, keys: str | None = None, **props: str) -> MessageExt:
    return MessageExt("orders", body, msg_id=msg_id, keys=keys, properties=props)


def record_effect(conn: Connection, msg: MessageExt) -> None:
    conn.execute(insert(effects).values(key=msg.msg_id, body=msg.body))


def test_inbox_runs_a_handler_once_per_message(engine: Engine) -> None:
    listener = IdempotentListener(engine, "inventory", record_effect)
    body = b"\xff\xfe not utf-8 \x00"
    msg = consumed("M1", body)
    assert listener(msg) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(msg) is ConsumeStatus.CONSUME_SUCCESS  # a redelivery
    # A retry copy: a new id, the first one kept in ORIGIN_MESSAGE_ID.
    retry = consumed("M2", body, **{MessageConst.ORIGIN_MESSAGE_ID: "M1", "RECONSUME_TIME": "1"})
    assert listener(retry) is ConsumeStatus.CONSUME_SUCCESS
    with engine.connect() as conn:
        assert conn.execute(select(effects.c.body)).scalars().all() == [body]
    # Another group handles it once too.
    assert IdempotentListener(engine, "billing", record_effect)(msg) is (
        ConsumeStatus.CONSUME_SUCCESS
    )
    assert count(engine, effects) == 2
    assert count(engine, consumed_message) == 2


def test_inbox_failure_rolls_back_the_effect_and_the_row(engine: Engine) -> None:
    calls = []

    def handler(conn: Connection, msg: MessageExt) -> ConsumeStatus | None:
        record_effect(conn, msg)
        calls.append(msg.msg_id)
        if len(calls) == 1:
            raise RuntimeError("stock service down")
        if len(calls) == 2:
            return ConsumeStatus.RECONSUME_LATER
        return None

    listener = IdempotentListener(engine, "inventory", handler)
    msg = consumed("M3", "ünïcode".encode())
    with pytest.raises(RuntimeError):
        listener(msg)
    assert listener(msg) is ConsumeStatus.RECONSUME_LATER
    assert count(engine, effects) == 0 and count(engine, consumed_message) == 0
    assert listener(msg) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(msg) is ConsumeStatus.CONSUME_SUCCESS
    assert calls == ["M3", "M3", "M3"]
    assert count(engine, effects) == 1


def test_inbox_by_business_key_and_a_bad_key(engine: Engine) -> None:
    def record_by_key(conn: Connection, msg: MessageExt) -> None:
        conn.execute(insert(effects).values(key=msg.keys[0], body=msg.body))

    listener = IdempotentListener(engine, "inventory", record_by_key, key=lambda m: m.keys[0])
    assert listener(consumed("A", b"1", keys="order-9")) is ConsumeStatus.CONSUME_SUCCESS
    assert listener(consumed("B", b"2", keys="order-9")) is ConsumeStatus.CONSUME_SUCCESS
    assert count(engine, effects) == 1
    # An id another Kafka client made up, longer than the column: stored cut, handled once.
    long_id = "i" * 300
    assert listener(consumed(long_id, b"3", keys="order-10")) is ConsumeStatus.CONSUME_SUCCESS
    assert count(engine, consumed_message, message_id="i" * 255) == 1
    with pytest.raises(ValueError, match="key must be"):
        listener(consumed("C", b"3", keys="k" * 256))


def test_inbox_concurrent_copies_run_the_handler_once(engine: Engine) -> None:
    inside, release = threading.Event(), threading.Event()
    calls = []

    def slow(conn: Connection, msg: MessageExt) -> None:
        calls.append(msg.msg_id)
        record_effect(conn, msg)
        inside.set()
        assert release.wait(30)

    listener = IdempotentListener(engine, "inventory", slow)
    first = threading.Thread(target=listener, args=(consumed("M4", b"x"),))
    first.start()
    assert inside.wait(30)
    second_answer: list[ConsumeStatus] = []
    second = threading.Thread(target=lambda: second_answer.append(listener(consumed("M4", b"x"))))
    second.start()
    second.join(0.3)
    release.set()
    first.join(30)
    second.join(30)
    assert second_answer == [ConsumeStatus.CONSUME_SUCCESS]
    assert calls == ["M4"]


def test_purge_keeps_recent_rows(engine: Engine) -> None:
    listener = DatabaseTransactionListener(engine)
    listener.execute_local_transaction(half(), add_order("o-6"))
    IdempotentListener(engine, "g", record_effect)(consumed("M5", b"x"))
    kept = purge(engine)
    assert (kept.transactions, kept.consumed) == (0, 0)
    week_ago = now_ms() - DEFAULT_RETENTION_MS - 1
    with engine.begin() as conn:
        conn.execute(update(transaction_log).values(created_ms=week_ago))
        conn.execute(update(consumed_message).values(consumed_ms=week_ago))
    listener.execute_local_transaction(half(), add_order("o-7"))  # recent: kept
    gone = purge(engine)
    assert (gone.transactions, gone.consumed) == (1, 1)
    assert count(engine, transaction_log) == 1
    assert count(engine, consumed_message) == 0


def _async_url(url: str) -> str:
    return url.replace("sqlite://", "sqlite+aiosqlite://", 1)


def test_async_twins(database_url: str, engine: Engine) -> None:
    async def scenario() -> None:
        aengine = create_async_engine(_async_url(database_url))
        try:
            listener = AsyncDatabaseTransactionListener(aengine)
            msg = half()

            async def work(conn: AsyncConnection) -> None:
                await conn.execute(insert(orders).values(id="a-1"))

            assert await listener.execute_local_transaction(msg, work) is (TransactionStatus.COMMIT)
            assert await listener.check_local_transaction(msg) is TransactionStatus.COMMIT

            async def failing(conn: AsyncConnection) -> None:
                await conn.execute(insert(orders).values(id="a-2"))
                raise RuntimeError("declined")

            failed = half()
            assert await listener.execute_local_transaction(failed, failing) is (
                TransactionStatus.ROLLBACK
            )
            assert await listener.check_local_transaction(half()) is TransactionStatus.ROLLBACK

            async def handler(conn: AsyncConnection, m: MessageExt) -> None:
                await conn.execute(insert(effects).values(key=m.msg_id, body=m.body))

            inbox = AsyncIdempotentListener(aengine, "inventory", handler)
            copy = consumed("M6", b"\x80\x81")
            assert await inbox(copy) is ConsumeStatus.CONSUME_SUCCESS
            assert await inbox(copy) is ConsumeStatus.CONSUME_SUCCESS
        finally:
            await aengine.dispose()

    asyncio.run(scenario())
    assert count(engine, orders) == 1
    assert count(engine, effects) == 1
    assert count(engine, transaction_log, state="ROLLBACK") == 2


def test_integrity_error_of_the_work_is_not_taken_for_a_fence(engine: Engine) -> None:
    listener = DatabaseTransactionListener(engine)
    assert listener.execute_local_transaction(half(), add_order("dup")) is (
        TransactionStatus.COMMIT
    )
    msg = half()
    assert listener.execute_local_transaction(msg, add_order("dup")) is (TransactionStatus.ROLLBACK)
    with pytest.raises(IntegrityError), engine.begin() as conn:
        conn.execute(insert(orders).values(id="dup"))


def test_own_row_meeting_an_older_row_is_rolled_back_not_committed(engine: Engine) -> None:
    # Ids recur (the id's time field counts from the start of the month): a log row under
    # the same key that is not this transaction's says nothing of this one's work.
    listener = DatabaseTransactionListener(engine)
    msg = half()
    assert listener.execute_local_transaction(msg, add_order("o-old")) is TransactionStatus.COMMIT
    again = listener.execute_local_transaction(msg, add_order("o-new"))
    assert again is TransactionStatus.ROLLBACK
    assert count(engine, orders, id="o-new") == 0


def test_an_autocommit_engine_is_refused_before_anything_commits(database_url: str) -> None:
    # Autocommit would commit the log row (or the consumed row) before the work: a work that
    # then fails would be answered COMMIT, a handler that fails would never run again.
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        business.create_all(engine)
        listener = DatabaseTransactionListener(engine)
        msg = half()

        def work(conn: Connection) -> None:
            raise RuntimeError("payment declined")

        assert listener.execute_local_transaction(msg, work) is TransactionStatus.ROLLBACK
        assert count(engine, transaction_log, state="COMMIT") == 0
        assert listener.check_local_transaction(msg) is TransactionStatus.ROLLBACK

        def handler(conn: Connection, m: MessageExt) -> None:
            raise RuntimeError("out of stock")

        inbox = IdempotentListener(engine, "inventory", handler)
        with pytest.raises(InvalidArgumentError, match="needs a transaction"):
            inbox(consumed("M-auto", b"x"))
        assert count(engine, consumed_message) == 0
    finally:
        engine.dispose()


def test_async_twins_refuse_an_autocommit_engine_and_an_older_row(database_url: str) -> None:
    async def scenario() -> None:
        aengine = create_async_engine(_async_url(database_url), isolation_level="AUTOCOMMIT")
        plain = create_async_engine(_async_url(database_url))
        try:
            listener = AsyncDatabaseTransactionListener(aengine)
            msg = half()

            async def failing(conn: AsyncConnection) -> None:
                raise RuntimeError("declined")

            assert await listener.execute_local_transaction(msg, failing) is (
                TransactionStatus.ROLLBACK
            )
            assert await listener.check_local_transaction(msg) is TransactionStatus.ROLLBACK

            async def handler(conn: AsyncConnection, m: MessageExt) -> None:
                raise RuntimeError("out of stock")

            with pytest.raises(InvalidArgumentError, match="needs a transaction"):
                await AsyncIdempotentListener(aengine, "inventory", handler)(consumed("A", b"x"))

            async def nothing(conn: AsyncConnection) -> None:
                return None

            again = half()
            ok = AsyncDatabaseTransactionListener(plain)
            assert await ok.execute_local_transaction(again, nothing) is TransactionStatus.COMMIT
            assert await ok.execute_local_transaction(again, failing) is (
                TransactionStatus.ROLLBACK
            )
            assert await ok.execute_local_transaction(again, nothing) is (
                TransactionStatus.ROLLBACK
            )
        finally:
            await aengine.dispose()
            await plain.dispose()

    asyncio.run(scenario())
    with create_engine(database_url).connect() as conn:
        assert conn.execute(select(func.count()).select_from(consumed_message)).scalar_one() == 0
        states = conn.execute(select(transaction_log.c.state)).scalars().all()
    assert sorted(states) == ["COMMIT", "ROLLBACK"]


def test_work_or_handler_ending_the_transaction_itself_is_answered_from_the_log(
    engine: Engine,
) -> None:
    # A work that rolls back and returns (giving up without raising) was answered COMMIT:
    # the message delivered with neither the order row nor a log row.
    listener = DatabaseTransactionListener(engine)
    gave_up, wrote_after = half(), half()

    def give_up(conn: Connection) -> None:
        conn.execute(insert(orders).values(id="o-8"))
        conn.rollback()

    def write_after_rollback(conn: Connection) -> None:
        conn.rollback()
        conn.execute(insert(orders).values(id="o-9"))

    assert listener.execute_local_transaction(gave_up, give_up) is TransactionStatus.ROLLBACK
    assert listener.execute_local_transaction(wrote_after, write_after_rollback) is (
        TransactionStatus.ROLLBACK
    )
    assert count(engine, orders) == 0
    assert listener.check_local_transaction(wrote_after) is TransactionStatus.ROLLBACK

    calls: list[str] = []

    def handler(conn: Connection, msg: MessageExt) -> None:
        calls.append(msg.msg_id)
        record_effect(conn, msg)
        if len(calls) == 1:
            conn.rollback()  # the first time only

    inbox = IdempotentListener(engine, "inventory", handler)
    with pytest.raises(InvalidArgumentError, match="ended the database transaction"):
        inbox(consumed("M9", b"x"))
    assert count(engine, consumed_message) == 0
    assert inbox(consumed("M9", b"x")) is ConsumeStatus.CONSUME_SUCCESS  # the retry runs it
    assert calls == ["M9", "M9"]
    assert count(engine, effects) == 1


def test_async_twins_answer_from_the_log_when_the_work_ends_the_transaction(
    database_url: str, engine: Engine
) -> None:
    async def scenario() -> None:
        aengine = create_async_engine(_async_url(database_url))
        try:
            msg = half()

            async def give_up(conn: AsyncConnection) -> None:
                await conn.execute(insert(orders).values(id="a-9"))
                await conn.rollback()

            listener = AsyncDatabaseTransactionListener(aengine)
            assert await listener.execute_local_transaction(msg, give_up) is (
                TransactionStatus.ROLLBACK
            )

            async def handler(conn: AsyncConnection, m: MessageExt) -> None:
                await conn.execute(insert(effects).values(key=m.msg_id, body=m.body))
                await conn.rollback()

            with pytest.raises(InvalidArgumentError, match="ended the database transaction"):
                await AsyncIdempotentListener(aengine, "inventory", handler)(consumed("A9", b"x"))
        finally:
            await aengine.dispose()

    asyncio.run(scenario())
    assert count(engine, orders) == 0
    assert count(engine, transaction_log, state="COMMIT") == 0
    assert count(engine, consumed_message) == 0
