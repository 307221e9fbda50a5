"""The database-backed transaction listener: the business work and the transaction-log row in
one database transaction; check-back answered from the log.

Why a check never answers wrongly (docs/guarantees.md, G13):

* The local transaction inserts its log row (``state`` COMMIT) *first*, then runs the work,
  then commits. So the row is committed if and only if the work is.
* A check reads the row: found, it answers the row's state. Not found, it inserts a fence
  row (``state`` ROLLBACK) under the same primary key and commits it before answering
  ROLLBACK. If the local transaction is still open, its uncommitted row holds the key's lock
  and the fence waits for it (bounded by ``check_lock_timeout_ms``: then UNKNOWN, asked again
  later); once it commits, the fence fails on the key and the check answers COMMIT. If the
  local transaction has not written its row yet (or will never: the process died), the fence
  commits first and the local transaction's own insert fails on the key: it can no longer
  commit. So ROLLBACK is only answered once the row can never appear, and COMMIT only for a
  committed row: no timing assumption, only the primary key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from bridge.db.rows import (
    DEFAULT_CHECK_LOCK_TIMEOUT_MS,
    check_milliseconds,
    ended_by_user,
    fence_failed,
    is_log_row_conflict,
    lock_timeout,
    log_row,
    logged_state,
    require_shared_database,
    require_transaction,
    state_of,
    work_failed,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageExt
from bridge.transaction.model import TransactionListener, TransactionStatus

LocalWork = Callable[[Connection], object]
"""The business work of one local transaction: called with the database connection whose
transaction also holds the log row; raise to roll back."""


class DatabaseTransactionListener(TransactionListener):
    """A :class:`TransactionListener` whose local transaction is a database transaction.

    ``TransactionMQProducer(group, DatabaseTransactionListener(engine), ...)``, then
    ``send_message_in_transaction(msg, work)`` where ``work(connection)`` does the business
    writes on the SQLAlchemy ``Connection`` it is given (``Session(connection)`` works too):
    the listener writes the ``bridge_transaction_log`` row in the same database transaction
    and commits. Committed: COMMIT. The work raised (or the row was fenced by a check first):
    the database transaction is rolled back, the error logged, ROLLBACK. The commit itself
    failed: UNKNOWN (the check answers from the log). ``check_local_transaction`` answers from
    the log, waiting at most ``check_lock_timeout_ms`` (ms, default 5000) for a local
    transaction still running (PostgreSQL's ``lock_timeout``; SQLite waits its busy timeout,
    5 s by default, the ``timeout`` connect argument).
    """

    def __init__(
        self, engine: Engine, *, check_lock_timeout_ms: int = DEFAULT_CHECK_LOCK_TIMEOUT_MS
    ) -> None:
        if not isinstance(engine, Engine):
            raise InvalidArgumentError(
                f"engine must be a sqlalchemy Engine, got {type(engine).__name__}"
            )
        require_shared_database(engine.url)
        self.engine = engine
        self.check_lock_timeout_ms = check_milliseconds(
            "check_lock_timeout_ms", check_lock_timeout_ms
        )

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        if not callable(arg):
            raise InvalidArgumentError(
                "send_message_in_transaction(msg, work): work must be a callable taking the "
                f"database connection, got {type(arg).__name__}"
            )
        work: LocalWork = arg
        try:
            conn = self.engine.connect()
        except DBAPIError as exc:
            work_failed(msg, exc)
            return TransactionStatus.ROLLBACK  # nothing began: nothing can commit
        with conn:
            try:
                ours = conn.begin()
                require_transaction(msg, conn.connection.driver_connection)
                conn.execute(log_row(msg, TransactionStatus.COMMIT))
                work(conn)
                if not ours.is_active:
                    # The work committed or rolled back by itself: committing now would answer
                    # COMMIT whether or not the row went in. Whatever it wrote since is
                    # rolled back, and the log answers (the fence below).
                    raise ended_by_user(msg, "work")
            except Exception as exc:
                conn.rollback()
                work_failed(msg, exc)
                if is_log_row_conflict(exc):
                    # Its own row never went in, so this work never committed, whatever the
                    # row under its key says (a check's fence: ROLLBACK; a recurring id's
                    # older transaction: COMMIT, which is not this one's answer).
                    return TransactionStatus.ROLLBACK
                # Fenced, not assumed: a work that committed on its own before raising has its
                # row in the log, and the answer is COMMIT.
                return self._fence(conn, msg)
            try:
                conn.commit()
            except Exception:
                # The outcome is unknown (the connection may have died inside COMMIT): the
                # check answers from the log.
                return TransactionStatus.UNKNOWN
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        with self.engine.connect() as conn:
            found = conn.execute(logged_state(msg)).scalar_one_or_none()
            conn.rollback()
            if found is not None:
                return state_of(found)
            return self._fence(conn, msg)

    def _fence(self, conn: Connection, msg: MessageExt) -> TransactionStatus:
        """Write the ROLLBACK row unless the log has one: the answer that can no longer
        change."""
        try:
            with conn.begin():
                bound = lock_timeout(conn.dialect.name, self.check_lock_timeout_ms)
                if bound is not None:
                    conn.execute(bound)
                conn.execute(log_row(msg, TransactionStatus.ROLLBACK))
        except IntegrityError:
            # The local transaction committed its row meanwhile (or another check fenced).
            found = conn.execute(logged_state(msg)).scalar_one_or_none()
            conn.rollback()
            return state_of(found)
        except DBAPIError as exc:
            return fence_failed(msg, exc)
        return TransactionStatus.ROLLBACK
