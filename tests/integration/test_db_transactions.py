"""The database-backed listeners through a real broker and coordinator, threaded and asyncio:
what the log says is what the real topic gets, check-backs are answered from the log, and the
idempotent consumer applies each message once, on a real PostgreSQL server and on SQLite."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionMQProducer,
    TransactionStatus,
    aio,
    read_messages,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.db import DatabaseTransactionListener, IdempotentListener, transaction_log
from bridge.db.aio import AsyncDatabaseTransactionListener, AsyncIdempotentListener
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from tests.db_crash_apps import app_tables, effects, orders
from topics.catalog import TopicSpec

pytestmark = pytest.mark.broker

BODY = "注文 ✓".encode() + b"\xff\x00\xfe"


@pytest.fixture()
def engine(db_engine: Engine) -> Engine:
    app_tables.create_all(db_engine)
    return db_engine


@pytest.fixture()
def coordinator(client_config: ClientConfig) -> Any:
    config = CoordinatorConfig(
        client=client_config, coordinator_id=f"db-{uuid.uuid4().hex[:6]}",
        transaction_partitions=1, transaction_timeout_ms=1000, check_interval_ms=1000,
        transaction_check_max=60,
    )  # fmt: skip
    with Coordinator(config) as running:
        yield running


class _EndLost(DatabaseTransactionListener):
    """Commits (or not) in the database, then reports UNKNOWN, as if the END were lost."""

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        if arg is None:  # a crash before the database commit: nothing written
            return TransactionStatus.UNKNOWN
        super().execute_local_transaction(msg, arg)
        return TransactionStatus.UNKNOWN


def add(oid: str) -> Any:
    def work(conn: Connection) -> None:
        conn.execute(insert(orders).values(id=oid, body=BODY))

    return work


def fail(conn: Connection) -> None:
    conn.execute(insert(orders).values(id="failed", body=BODY))
    raise RuntimeError("out of stock")


def keys_on(config: ClientConfig, topic: str, count: int) -> list[str]:
    """The keys of the ``count`` messages on ``topic``, once they are there, and no more: a
    second read, until the topic has had nothing new for 5 s, finds the same number."""
    got = list(read_messages(config, [topic], max_messages=count, timeout_ms=60_000))
    assert all(m.body == BODY for m in got)
    again = list(read_messages(config, [topic], timeout_ms=5_000))
    assert len(again) == count, sorted(m.keys[0] for m in again)
    return sorted(m.keys[0] for m in got)


@pytest.mark.check("G13")
def test_outcomes_and_check_back_answered_from_the_log(
    client_config: ClientConfig, engine: Engine, coordinator: Any, topic: str
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 2)])  # read before it is written
    with TransactionMQProducer(
        f"g-{uuid.uuid4().hex[:6]}", _EndLost(engine), config=client_config
    ) as producer:
        lost_commit = producer.send_message_in_transaction(Message(topic, BODY, keys="a"), add("a"))
        never_ran = producer.send_message_in_transaction(Message(topic, BODY, keys="b"), None)
        assert lost_commit.local_transaction_state is TransactionStatus.UNKNOWN
        # The checks answer COMMIT for "a" (row) and fence "b" (no row): only "a" arrives.
        assert keys_on(client_config, topic, 1) == ["a"]

        def fenced() -> bool:
            with engine.connect() as conn:
                state = conn.execute(
                    select(transaction_log.c.state).where(
                        transaction_log.c.transaction_id == never_ran.transaction_id
                    )
                ).scalar_one_or_none()
            return state == "ROLLBACK"

        wait_until(fenced, timeout_s=60)
    with TransactionMQProducer(
        f"g-{uuid.uuid4().hex[:6]}", DatabaseTransactionListener(engine), config=client_config
    ) as producer:
        ok = producer.send_message_in_transaction(Message(topic, BODY, keys="c"), add("c"))
        bad = producer.send_message_in_transaction(Message(topic, BODY, keys="d"), fail)
    assert (ok.local_transaction_state, bad.local_transaction_state) == (
        TransactionStatus.COMMIT, TransactionStatus.ROLLBACK,
    )  # fmt: skip
    assert keys_on(client_config, topic, 2) == ["a", "c"]
    with engine.connect() as conn:
        assert sorted(conn.execute(select(orders.c.id)).scalars()) == ["a", "c"]


def test_idempotent_consumer_applies_each_message_once(
    client_config: ClientConfig, engine: Engine, coordinator: Any, topic: str
) -> None:
    # The coordinator delivers the retry copy (delay level 3, 10 s).
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 2)])
    attempts: dict[str, int] = {}

    def apply(conn: Connection, msg: MessageExt) -> None:
        attempts[msg.keys[0]] = attempts.get(msg.keys[0], 0) + 1
        conn.execute(insert(effects).values(order_id=msg.keys[0], body=msg.body))
        if msg.keys[0] == "flaky" and attempts["flaky"] == 1:
            raise RuntimeError("first attempt fails")  # rolled back, retried

    consumer = PushConsumer(
        f"inv-{uuid.uuid4().hex[:6]}", config=client_config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )  # fmt: skip
    consumer.subscribe(topic, IdempotentListener(engine, "inv", apply, key=lambda m: m.keys[0]))
    with Producer("p", config=client_config) as producer:
        for key in ("x", "y", "x", "flaky"):  # "x" twice: a publisher's retry
            producer.send_sync(Message(topic, BODY, keys=key))
    with consumer:

        def applied() -> list[str]:
            with engine.connect() as conn:
                return sorted(conn.execute(select(effects.c.order_id)).scalars())

        wait_until(lambda: applied() == ["flaky", "x", "y"], timeout_s=90)
    assert attempts == {"x": 1, "y": 1, "flaky": 2}
    with engine.connect() as conn:
        assert set(conn.execute(select(effects.c.body)).scalars()) == {BODY}


def _async_url(url: str) -> str:
    return url.replace("sqlite://", "sqlite+aiosqlite://", 1)


def test_asyncio_producer_and_consumer(
    client_config: ClientConfig, database_url: str, engine: Engine, coordinator: Any, topic: str
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 2)])

    async def scenario() -> None:
        aengine = create_async_engine(_async_url(database_url))
        try:

            async def work(conn: AsyncConnection) -> None:
                await conn.execute(insert(orders).values(id="async-1", body=BODY))

            async def failing(conn: AsyncConnection) -> None:
                await conn.execute(insert(orders).values(id="async-2", body=BODY))
                raise RuntimeError("declined")

            async def apply(conn: AsyncConnection, msg: MessageExt) -> None:
                await conn.execute(insert(effects).values(order_id=msg.keys[0], body=msg.body))

            producer = aio.TransactionMQProducer(
                f"g-{uuid.uuid4().hex[:6]}", AsyncDatabaseTransactionListener(aengine),
                config=client_config,
            )  # fmt: skip
            async with producer:
                ok = await producer.send_message_in_transaction(
                    Message(topic, BODY, keys="async-1"), work
                )
                bad = await producer.send_message_in_transaction(
                    Message(topic, BODY, keys="async-2"), failing
                )
            assert ok.local_transaction_state is TransactionStatus.COMMIT
            assert bad.local_transaction_state is TransactionStatus.ROLLBACK
            consumer = aio.PushConsumer(
                f"inv-{uuid.uuid4().hex[:6]}", config=client_config,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            )  # fmt: skip
            consumer.subscribe(topic, AsyncIdempotentListener(aengine, "inv", apply))
            async with consumer:
                for _ in range(600):
                    async with aengine.connect() as conn:
                        done = (
                            await conn.execute(select(func.count()).select_from(effects))
                        ).scalar_one()
                    if done:
                        break
                    await asyncio.sleep(0.1)
        finally:
            await aengine.dispose()

    asyncio.run(scenario())
    assert keys_on(client_config, topic, 1) == ["async-1"]
    with engine.connect() as conn:
        assert list(conn.execute(select(effects.c.order_id)).scalars()) == ["async-1"]
