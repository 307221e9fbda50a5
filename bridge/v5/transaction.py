"""RocketMQ 5's transactions: :class:`Transaction` (begun, one half message sent in it, then
committed or rolled back), :class:`TransactionChecker` (answers the check-back of one left
undecided) and :class:`TransactionResolution` (its answer).

They run on the project's half-message protocol unchanged: the half message is stored by
:meth:`TransactionMQProducer.send_half_message
<bridge.transaction.producer.TransactionMQProducer.send_half_message>`, a decision by
:meth:`~bridge.transaction.producer.TransactionMQProducer.end_transaction`, and the checker
answers through a :class:`~bridge.TransactionListener` whose ``check_local_transaction`` asks
it. The resolution maps onto :class:`~bridge.TransactionStatus` as RocketMQ 5's proxy maps it
onto RocketMQ's: COMMIT, ROLLBACK, and anything else (``TRANSACTION_RESOLUTION_UNSPECIFIED``,
the Java client's ``UNKNOWN``, None, a checker that raises) is UNKNOWN, asked again at the
next check interval, until ``transaction_check_max`` checks park it.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable
from enum import Enum, IntEnum
from typing import Any

from bridge.consumer.simple import MessageView
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.message import Message, MessageExt
from bridge.transaction import TransactionListener, TransactionMQProducer, TransactionStatus
from bridge.transaction.producer import HalfMessage

__all__ = [
    "Transaction",
    "TransactionChecker",
    "TransactionResolution",
    "checker_listener",
    "transaction_status",
]

logger = logging.getLogger(__name__)


class TransactionResolution(IntEnum):
    """A :class:`TransactionChecker`'s answer, with RocketMQ 5's protocol values (its Python
    client's ``TransactionResolution``, whose values are these integers)."""

    TRANSACTION_RESOLUTION_UNSPECIFIED = 0
    """Not known yet: asked again later (UNKNOWN)."""
    COMMIT = 1
    ROLLBACK = 2
    UNKNOWN = 0
    """The Java client's name for ``TRANSACTION_RESOLUTION_UNSPECIFIED``."""


_STATUSES = {
    TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED: TransactionStatus.UNKNOWN,
    TransactionResolution.COMMIT: TransactionStatus.COMMIT,
    TransactionResolution.ROLLBACK: TransactionStatus.ROLLBACK,
}


def transaction_status(answer: object) -> TransactionStatus | None:
    """The :class:`~bridge.TransactionStatus` a checker's ``answer`` stands for: a
    :class:`TransactionResolution` or its integer value, and None (the Java client's
    ``null``) for UNKNOWN; None when ``answer`` is none of them (a ``bool`` neither)."""
    if answer is None:
        return TransactionStatus.UNKNOWN
    if isinstance(answer, bool) or not isinstance(answer, int):
        return None
    try:
        return _STATUSES[TransactionResolution(answer)]
    except ValueError:
        return None


class TransactionChecker(abc.ABC):
    """RocketMQ 5's ``TransactionChecker``: answers the coordinator's check-back of a
    transaction left undecided (its :class:`Transaction` neither committed nor rolled back
    within ``transaction_timeout_ms``, 6 s by default, the producer gone, ...)."""

    @abc.abstractmethod
    def check(self, message: MessageView) -> TransactionResolution:
        """The outcome of ``message``'s transaction: COMMIT, ROLLBACK, or
        ``TRANSACTION_RESOLUTION_UNSPECIFIED`` (ask again later); an exception counts as
        the latter. ``message`` is the half message (``message_id`` is the transaction's
        :attr:`Transaction.message_id`)."""


class _CheckerListener(TransactionListener):
    """A :class:`~bridge.TransactionListener` whose check-back asks a
    :class:`TransactionChecker`. Its ``execute_local_transaction`` is never called: a v5
    transaction ends with :meth:`Transaction.commit` or :meth:`Transaction.rollback`."""

    def __init__(self, checker: TransactionChecker) -> None:
        self._checker = checker

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        answer = self._checker.check(MessageView(msg))
        status = transaction_status(answer)
        if status is None:
            logger.error(
                "transaction %s: the TransactionChecker answered %r, not a "
                "TransactionResolution; it stays undecided (asked again)",
                msg.msg_id,
                answer,
            )
            return TransactionStatus.UNKNOWN
        return status


def checker_listener(checker: object) -> TransactionListener:
    """The listener answering check-backs with ``checker``;
    :class:`InvalidArgumentError` unless it has a ``check(message)`` method."""
    if not callable(getattr(checker, "check", None)):
        raise InvalidArgumentError(
            f"checker must be a TransactionChecker (a check(message) method), got "
            f"{type(checker).__name__}"
        )
    return _CheckerListener(checker)  # type: ignore[arg-type]  # any check(message) will do


class _State(Enum):
    OPEN = "open: no message sent in it yet"
    SENDING = "sending its message"
    SENT = "sent, undecided"
    NOT_STORED = "its half message was not stored"
    ENDING = "being committed or rolled back"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"


class Transaction:
    """RocketMQ 5's ``Transaction``, from :meth:`Producer.begin_transaction
    <bridge.v5.Producer.begin_transaction>`: ``send(message, transaction)`` stores its one
    message as a half message, never visible on its topic; :meth:`commit` delivers it (once),
    :meth:`rollback` drops it. Left undecided, the producer's :class:`TransactionChecker`
    decides it when the coordinator checks it back.

    One message per transaction, as in RocketMQ 5: a second ``send`` in it raises
    :class:`~bridge.errors.InvalidArgumentError` (each half message is decided on its own,
    so two could not be made one). Thread-safe."""

    def __init__(self, require_running: Callable[[], None]) -> None:
        self._require_running = require_running
        self._lock = threading.Lock()
        self._state = _State.OPEN
        self._producer: TransactionMQProducer | None = None
        self._half: HalfMessage | None = None
        self._failure = ""

    @property
    def message_id(self) -> str | None:
        """The id of the message sent in it (the transaction's id too); None before."""
        half = self._half
        return half.transaction_id if half is not None else None

    def send(self, producer: TransactionMQProducer, message: Message) -> HalfMessage:
        """Store ``message`` as this transaction's half message with ``producer`` (the one of
        its topic's producer group). A second message raises
        :class:`~bridge.errors.InvalidArgumentError`."""
        with self._lock:
            if self._state is not _State.OPEN:
                raise InvalidArgumentError(
                    f"a transaction holds one message, and this one is {self._state.value}"
                    + (f" ({self.message_id})" if self._half is not None else "")
                    + ": begin another transaction for the next message"
                )
            self._state = _State.SENDING
        try:
            half = producer.send_half_message(message)
        except BaseException as exc:
            with self._lock:
                self._state = _State.NOT_STORED
                self._failure = f"{type(exc).__name__}: {exc}"
            raise
        with self._lock:
            self._producer, self._half, self._state = producer, half, _State.SENT
        return half

    def commit(self) -> None:
        """Deliver the message: the decision is stored in Kafka when this returns, and the
        coordinator writes the message to its topic, once. Raises
        :class:`~bridge.errors.IllegalStateError` when no message was stored in it, when it is
        decided already, or once the producer is shut down, and
        :class:`~bridge.errors.SendError` when the decision was not stored (call again, or
        leave it to the checker)."""
        self._end(TransactionStatus.COMMIT)

    def rollback(self) -> None:
        """Drop the message: it never reaches its topic. Raises as :meth:`commit` does."""
        self._end(TransactionStatus.ROLLBACK)

    def _end(self, status: TransactionStatus) -> None:
        with self._lock:
            if self._state is not _State.SENT:
                what = "commit" if status is TransactionStatus.COMMIT else "roll back"
                detail = self._state.value
                if self._state is _State.NOT_STORED:
                    detail += (
                        f" ({self._failure}); if it was stored after all, the "
                        "TransactionChecker decides it"
                    )
                raise IllegalStateError(f"cannot {what} a transaction that is {detail}")
            self._require_running()
            self._state = _State.ENDING
        producer, half = self._producer, self._half
        assert producer is not None and half is not None  # set together with SENT
        try:
            producer.end_transaction(half, status)
        except BaseException:
            with self._lock:
                self._state = _State.SENT  # undecided still: decide again, or the checker will
            raise
        with self._lock:
            committed = status is TransactionStatus.COMMIT
            self._state = _State.COMMITTED if committed else _State.ROLLED_BACK

    def __repr__(self) -> str:
        return f"Transaction(message_id={self.message_id!r}, {self._state.value})"
