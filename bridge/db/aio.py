"""The asyncio twins of :class:`~bridge.db.DatabaseTransactionListener` and
:class:`~bridge.db.IdempotentListener`, over SQLAlchemy's ``AsyncEngine`` (PostgreSQL through
psycopg 3's asyncio support, SQLite through aiosqlite), for :mod:`bridge.aio`'s producer and
consumer. Same tables, same rows, same argument (see :mod:`bridge.db.transaction`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bridge.aio.listeners import AsyncTransactionListener
from bridge.consumer.model import ConsumeStatus
from bridge.db.rows import (
    DEFAULT_CHECK_LOCK_TIMEOUT_MS,
    MessageKey,
    check_milliseconds,
    consume_status,
    consumed_row,
    ended_by_user,
    fence_failed,
    group_name,
    is_consumed_row_conflict,
    is_log_row_conflict,
    lock_timeout,
    log_row,
    logged_state,
    message_key,
    require_shared_database,
    require_transaction,
    state_of,
    work_failed,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageExt
from bridge.transaction.model import TransactionStatus

logger = logging.getLogger("bridge.db")

AsyncLocalWork = Callable[[AsyncConnection], Awaitable[object]]
AsyncHandler = Callable[[AsyncConnection, MessageExt], Awaitable[ConsumeStatus | None]]


def _engine(engine: object) -> AsyncEngine:
    if not isinstance(engine, AsyncEngine):
        raise InvalidArgumentError(
            f"engine must be a sqlalchemy AsyncEngine, got {type(engine).__name__}"
        )
    require_shared_database(engine.url)
    return engine


class AsyncDatabaseTransactionListener(AsyncTransactionListener):
    """:class:`~bridge.db.DatabaseTransactionListener` for ``bridge.aio.TransactionMQProducer``:
    ``await producer.send_message_in_transaction(msg, work)`` with ``async def
    work(connection)`` on an ``AsyncConnection``."""

    def __init__(
        self, engine: AsyncEngine, *, check_lock_timeout_ms: int = DEFAULT_CHECK_LOCK_TIMEOUT_MS
    ) -> None:
        self.engine = _engine(engine)
        self.check_lock_timeout_ms = check_milliseconds(
            "check_lock_timeout_ms", check_lock_timeout_ms
        )

    async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        if not callable(arg):
            raise InvalidArgumentError(
                "send_message_in_transaction(msg, work): work must be an async callable taking "
                f"the database connection, got {type(arg).__name__}"
            )
        work: AsyncLocalWork = arg
        try:
            conn = await self.engine.connect()
        except DBAPIError as exc:
            work_failed(msg, exc)
            return TransactionStatus.ROLLBACK
        try:
            try:
                ours = await conn.begin()
                require_transaction(msg, (await conn.get_raw_connection()).driver_connection)
                await conn.execute(log_row(msg, TransactionStatus.COMMIT))
                await work(conn)
                if not ours.is_active:
                    raise ended_by_user(msg, "work")
            except Exception as exc:
                await conn.rollback()
                work_failed(msg, exc)
                if is_log_row_conflict(exc):
                    return TransactionStatus.ROLLBACK  # its own row never went in
                return await self._fence(conn, msg)
            try:
                await conn.commit()
            except Exception:
                return TransactionStatus.UNKNOWN
        finally:
            await conn.close()
        return TransactionStatus.COMMIT

    async def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        async with self.engine.connect() as conn:
            found = (await conn.execute(logged_state(msg))).scalar_one_or_none()
            await conn.rollback()
            if found is not None:
                return state_of(found)
            return await self._fence(conn, msg)

    async def _fence(self, conn: AsyncConnection, msg: MessageExt) -> TransactionStatus:
        try:
            async with conn.begin():
                bound = lock_timeout(conn.dialect.name, self.check_lock_timeout_ms)
                if bound is not None:
                    await conn.execute(bound)
                await conn.execute(log_row(msg, TransactionStatus.ROLLBACK))
        except IntegrityError:
            found = (await conn.execute(logged_state(msg))).scalar_one_or_none()
            await conn.rollback()
            return state_of(found)
        except DBAPIError as exc:
            return fence_failed(msg, exc)
        return TransactionStatus.ROLLBACK


class AsyncIdempotentListener:
    """:class:`~bridge.db.IdempotentListener` for ``bridge.aio.PushConsumer``: ``async def
    handler(connection, msg)`` on an ``AsyncConnection``; a message whose row is there is
    acknowledged without calling it."""

    def __init__(
        self,
        engine: AsyncEngine,
        consumer_group: str,
        handler: AsyncHandler,
        *,
        key: MessageKey = message_key,
    ) -> None:
        if not callable(handler) or not callable(key):
            raise InvalidArgumentError("handler and key must be callables")
        self.engine = _engine(engine)
        self.consumer_group = group_name(consumer_group)
        self.handler = handler
        self.key = key

    async def __call__(self, msg: MessageExt) -> ConsumeStatus:
        row = consumed_row(msg, self.consumer_group, self.key(msg))
        async with self.engine.connect() as conn:
            try:
                ours = await conn.begin()
                require_transaction(msg, (await conn.get_raw_connection()).driver_connection)
                await conn.execute(row)
            except IntegrityError as exc:
                await conn.rollback()
                if not is_consumed_row_conflict(exc):
                    raise
                logger.info("message %s: already consumed; acknowledged", msg.msg_id)
                return ConsumeStatus.CONSUME_SUCCESS
            try:
                status = consume_status(await self.handler(conn, msg), msg)
            except BaseException:
                await conn.rollback()
                raise
            if not ours.is_active:
                await conn.rollback()
                raise ended_by_user(msg, "handler")
            if status is ConsumeStatus.CONSUME_SUCCESS:
                await conn.commit()
            else:
                await conn.rollback()
        return status
