"""The idempotent ("inbox") consumer: the handler's database work and the consumed-message row
in one database transaction, so a message handled once is never handled again.

The row is inserted *first*: two copies of one message handled at once (a retry copy and the
original after a rebalance) wait on its primary key, and the second finds the first's row once
that commits. A copy whose row is already there is acknowledged without calling the handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from bridge.consumer.model import ConsumeStatus
from bridge.db.rows import (
    MessageKey,
    consume_status,
    consumed_row,
    ended_by_user,
    group_name,
    is_consumed_row_conflict,
    message_key,
    require_shared_database,
    require_transaction,
)
from bridge.errors import InvalidArgumentError
from bridge.message import MessageExt

logger = logging.getLogger("bridge.db")

Handler = Callable[[Connection, MessageExt], ConsumeStatus | None]
"""The user's handler: its database work on the connection it is given; None or
CONSUME_SUCCESS commits it, RECONSUME_LATER (or an exception) rolls it back for a retry."""


class IdempotentListener:
    """A per-message listener for :class:`bridge.PushConsumer` (``consumer.subscribe(topic,
    IdempotentListener(engine, "group", handler))``) that handles each message once.

    For each message it opens a database transaction, inserts ``(consumer_group, key)`` into
    ``bridge_consumed_message``, calls ``handler(connection, msg)`` and commits. A message whose
    row is there (a redelivery after a crash before the offset commit, a retry copy, a replay
    from the DLQ, a rebalance) is acknowledged without calling the handler. The handler raising
    or returning RECONSUME_LATER rolls both back and asks for a retry (the retry ladder, then
    the DLQ). ``key(msg)`` names the business event (default :func:`message_key`: the first
    message id, kept by retry and DLQ copies); ``consumer_group`` should be the consumer's
    group, so each group handles each message once.
    """

    def __init__(
        self,
        engine: Engine,
        consumer_group: str,
        handler: Handler,
        *,
        key: MessageKey = message_key,
    ) -> None:
        if not isinstance(engine, Engine):
            raise InvalidArgumentError(
                f"engine must be a sqlalchemy Engine, got {type(engine).__name__}"
            )
        if not callable(handler) or not callable(key):
            raise InvalidArgumentError("handler and key must be callables")
        require_shared_database(engine.url)
        self.engine = engine
        self.consumer_group = group_name(consumer_group)
        self.handler = handler
        self.key = key

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        row = consumed_row(msg, self.consumer_group, self.key(msg))
        with self.engine.connect() as conn:
            try:
                ours = conn.begin()
                require_transaction(msg, conn.connection.driver_connection)
                conn.execute(row)
            except IntegrityError as exc:
                conn.rollback()
                if not is_consumed_row_conflict(exc):
                    raise
                logger.info("message %s: already consumed; acknowledged", msg.msg_id)
                return ConsumeStatus.CONSUME_SUCCESS
            try:
                status = consume_status(self.handler(conn, msg), msg)
            except Exception:
                conn.rollback()
                raise  # the consumer logs it and sends the message back
            if not ours.is_active:
                # The handler committed or rolled back by itself: what it wrote since is rolled
                # back, and the message retried (a copy finds the row if it was committed).
                conn.rollback()
                raise ended_by_user(msg, "handler")
            if status is ConsumeStatus.CONSUME_SUCCESS:
                conn.commit()
            else:
                conn.rollback()
        return status
