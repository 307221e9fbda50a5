"""What the database-backed listeners write and how they read it back: the pure part, shared
by the threaded and the asyncio listeners (no I/O here)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Insert, Select, insert, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from bridge.consumer.model import ConsumeStatus
from bridge.db.tables import (
    KEY_MAX_CHARS,
    TEXT_MAX_CHARS,
    consumed_message,
    now_ms,
    transaction_log,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import TransactionStatus

logger = logging.getLogger("bridge.db")

MessageKey = Callable[[MessageExt], str]
"""Names a message for the idempotent consumer: the same value for every copy of one
business event."""

DEFAULT_CHECK_LOCK_TIMEOUT_MS = 5_000
"""How long a check waits for a local transaction still running, ms (then: UNKNOWN)."""


def message_key(msg: MessageExt) -> str:
    """The default key: the first message id (``ORIGIN_MESSAGE_ID`` on a retry or DLQ copy),
    the same for the original, its retry copies and a replay from the DLQ. An id longer than
    the key column (``topic-partition-offset`` of another Kafka client's record on a long
    topic name, or a long id it made up) is replaced by ``sha256:`` and its digest: cutting
    it could give two messages one key, and refusing it would dead-letter the message."""
    origin = msg.get_property(MessageConst.ORIGIN_MESSAGE_ID)
    key = origin if isinstance(origin, str) and origin else msg.msg_id
    if len(key) > KEY_MAX_CHARS:
        return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def transaction_id_of(msg: MessageExt) -> str:
    tid = msg.transaction_id or msg.msg_id
    if not tid:
        raise InvalidArgumentError("the message has neither a transaction id nor a message id")
    return tid


def log_row(msg: MessageExt, state: TransactionStatus) -> Insert:
    """The transaction-log row of ``msg``: ``COMMIT`` for the local transaction's own row,
    ``ROLLBACK`` for a check's fence."""
    group = msg.get_property(MessageConst.PRODUCER_GROUP)
    return insert(transaction_log).values(
        transaction_id=transaction_id_of(msg),
        producer_group=group if isinstance(group, str) else "",
        message_id=msg.msg_id[:TEXT_MAX_CHARS],
        topic=msg.topic[:TEXT_MAX_CHARS],
        state=state.value,
        created_ms=now_ms(),
    )


def logged_state(msg: MessageExt) -> Select[Any]:
    return select(transaction_log.c.state).where(
        transaction_log.c.transaction_id == transaction_id_of(msg)
    )


def autocommit_problem(driver_connection: object) -> str | None:
    """Why a database transaction begun on this driver connection would not hold its
    statements together (each one committed on its own), or None. Looked at after
    ``begin()``: a log row committed before the work would answer COMMIT for work that
    failed, and a consumed row committed before the handler would skip a redelivery."""
    if getattr(driver_connection, "autocommit", False) is True:
        return "the connection is in autocommit mode (isolation_level='AUTOCOMMIT')"
    if (
        getattr(driver_connection, "isolation_level", "") is None
        and getattr(driver_connection, "in_transaction", True) is False
    ):
        return (
            "the SQLite connection commits each statement (isolation_level='AUTOCOMMIT', or "
            "the driver's isolation_level=None without a 'begin' event emitting BEGIN)"
        )
    return None


def require_transaction(msg: MessageExt, driver_connection: object) -> None:
    """Raise :class:`InvalidArgumentError` when the connection would autocommit."""
    problem = autocommit_problem(driver_connection)
    if problem is not None:
        raise InvalidArgumentError(
            f"message {msg.msg_id}: the database work needs a transaction, but {problem}"
        )


def state_of(found: str | None) -> TransactionStatus:
    """The answer a row gives (UNKNOWN for a state this version does not write)."""
    if found in (TransactionStatus.COMMIT.value, TransactionStatus.ROLLBACK.value):
        return TransactionStatus(found)
    if found is not None:
        logger.error("transaction log: unknown state %r; answering UNKNOWN", found)
    return TransactionStatus.UNKNOWN


def lock_timeout(dialect: str, timeout_ms: int) -> Any | None:
    """The statement bounding a check's wait for a running local transaction on ``dialect``
    (PostgreSQL's ``lock_timeout`` for this database transaction only); None where the
    driver's own timeout bounds it (SQLite: the connection's busy timeout)."""
    if dialect == "postgresql":
        return text(f"SET LOCAL lock_timeout = {int(timeout_ms)}")
    return None


def require_shared_database(url: Any) -> None:
    """Refuse an in-memory SQLite database: each connection (each thread, under SQLAlchemy's
    pool for it) has one of its own, so a check or another consumer thread would find neither
    the tables nor the rows the local transaction wrote."""
    if url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    ):
        raise InvalidArgumentError(
            f"{url}: an in-memory SQLite database is private to each connection; use a file "
            "(sqlite:///path.db)"
        )


def check_milliseconds(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive int (ms), got {value!r}")
    return value


def fence_failed(msg: MessageExt, exc: DBAPIError) -> TransactionStatus:
    """A check's fence that neither committed nor met the row: the local transaction may still
    be running (a lock wait timed out) or the database did not answer."""
    logger.warning(
        "transaction %s: no answer from the transaction log (%s); UNKNOWN, asked again later",
        transaction_id_of(msg),
        type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__,
    )
    return TransactionStatus.UNKNOWN


def is_log_row_conflict(exc: BaseException) -> bool:
    """The local transaction's own log row met a row under its key: a check's fence, or
    (ids recur only in a process running for months) an older transaction's row."""
    return isinstance(exc, IntegrityError) and "bridge_transaction_log" in str(exc.statement or "")


def work_failed(msg: MessageExt, exc: BaseException) -> None:
    """Log why a local transaction did not commit (a check's fence already in the log is a
    warning, not an error: the transaction was too slow to begin)."""
    tid = transaction_id_of(msg)
    if is_log_row_conflict(exc):
        logger.warning("transaction %s: already fenced by a check; rolled back", tid)
    else:
        logger.error("transaction %s: local transaction failed; rolled back", tid, exc_info=exc)


def ended_by_user(msg: MessageExt, what: str) -> InvalidArgumentError:
    """The error of a work or handler that committed or rolled back the database transaction
    itself: what it wrote after that is rolled back, and the answer comes from the tables."""
    return InvalidArgumentError(
        f"message {msg.msg_id}: the {what} ended the database transaction itself (commit or "
        "rollback); it must raise (or return RECONSUME_LATER) instead, the bridge commits"
    )


def consumed_row(msg: MessageExt, group: str, key: str) -> Insert:
    if not isinstance(key, str) or not key or len(key) > KEY_MAX_CHARS:
        raise InvalidArgumentError(
            f"message {msg.msg_id}: key must be a non-empty str of at most {KEY_MAX_CHARS} "
            f"characters, got {key!r:.80}"
        )
    return insert(consumed_message).values(
        consumer_group=group,
        message_key=key,
        message_id=msg.msg_id[:TEXT_MAX_CHARS],
        topic=msg.topic[:TEXT_MAX_CHARS],
        consumed_ms=now_ms(),
    )


def is_consumed_row_conflict(exc: IntegrityError) -> bool:
    return "bridge_consumed_message" in str(exc.statement or "")


def consume_status(result: object, msg: MessageExt) -> ConsumeStatus:
    """What the handler's return value asks: None or CONSUME_SUCCESS commits."""
    if result is None or result is ConsumeStatus.CONSUME_SUCCESS:
        return ConsumeStatus.CONSUME_SUCCESS
    if result is ConsumeStatus.RECONSUME_LATER:
        return ConsumeStatus.RECONSUME_LATER
    logger.error(
        "message %s: handler returned %r, not None or a ConsumeStatus; RECONSUME_LATER",
        msg.msg_id,
        result,
    )
    return ConsumeStatus.RECONSUME_LATER


def group_name(group: str) -> str:
    if not isinstance(group, str) or not group or len(group) > 255:
        raise InvalidArgumentError(f"consumer_group must be a non-empty str, got {group!r}")
    return group
