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

A producer's checker is called one check at a time, as RocketMQ 5's single-thread executor
calls it, although a producer answers checks on threads of its own for each topic: a check
waits for the call before it (at most :data:`CHECKER_WAIT_S`). An answer for a transaction
this process sent and has not decided is kept, so that deciding it the other way afterwards
raises instead of being ignored by the coordinator.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable
from enum import Enum, IntEnum
from typing import Any, Final

from bridge.consumer.simple import MessageView
from bridge.errors import IllegalStateError, InvalidArgumentError, SendError, SendTimeoutError
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
    within ``transaction_timeout_ms``, 6 s by default, the producer gone, ...).

    A producer calls :meth:`check` one check at a time (never two at once, whatever the
    number of its topics). While the local transaction may still be running, answer
    ``TRANSACTION_RESOLUTION_UNSPECIFIED``: a ROLLBACK then would stand against the
    :meth:`Transaction.commit` that follows."""

    @abc.abstractmethod
    def check(self, message: MessageView) -> TransactionResolution:
        """The outcome of ``message``'s transaction: COMMIT, ROLLBACK, or
        ``TRANSACTION_RESOLUTION_UNSPECIFIED`` (ask again later); an exception counts as
        the latter. ``message`` is the half message (``message_id`` is the transaction's
        :attr:`Transaction.message_id`)."""


CHECK_TIMEOUT_MS: Final = 30_000
"""The ``check_timeout_ms`` of a v5 producer's transactional producers: a checker call
running longer than this gets another check thread started in its place."""
CHECKER_WAIT_S: Final = CHECK_TIMEOUT_MS / 2000
"""How long a check waits for the checker while another check's call of it runs, s: half of
:data:`CHECK_TIMEOUT_MS`, so a waiting check is never taken for a hung one. Then it is
answered UNKNOWN and asked again at the next check interval."""


class _CheckerListener(TransactionListener):
    """A :class:`~bridge.TransactionListener` whose check-back asks a
    :class:`TransactionChecker`, one call at a time (RocketMQ 5 calls it on a single-thread
    executor), and lets ``answered`` reconcile each answer with this process's own
    transactions. Its ``execute_local_transaction`` is never called: a v5 transaction ends with
    :meth:`Transaction.commit` or :meth:`Transaction.rollback`."""

    def __init__(
        self,
        checker: TransactionChecker,
        answered: Callable[[str, TransactionStatus], TransactionStatus] | None,
        wait_s: float,
    ) -> None:
        self._checker = checker
        self._answered = answered
        self._wait_s = wait_s
        # One lock for every topic's check threads (a producer runs one transactional
        # producer per topic), held only around the checker's call.
        self._calls = threading.Lock()

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        tid = msg.transaction_id or msg.msg_id
        # Bounded: a checker call that never returns delays the other checks, never stops
        # them (the check threads' watchdog counts a waiting call as running).
        if not self._calls.acquire(timeout=self._wait_s):
            logger.warning(
                "transaction %s: the TransactionChecker was busy with another check for "
                "%.1f s; answered UNKNOWN (asked again)",
                tid,
                self._wait_s,
            )
            return TransactionStatus.UNKNOWN
        try:
            answer = self._checker.check(MessageView(msg))
        finally:
            self._calls.release()
        status = transaction_status(answer)
        if status is None:
            logger.error(
                "transaction %s: the TransactionChecker answered %r, not a "
                "TransactionResolution; it stays undecided (asked again)",
                tid,
                answer,
            )
            return TransactionStatus.UNKNOWN
        return status if self._answered is None else self._answered(tid, status)


def checker_listener(
    checker: object,
    answered: Callable[[str, TransactionStatus], TransactionStatus] | None = None,
    *,
    wait_s: float = CHECKER_WAIT_S,
) -> TransactionListener:
    """The listener answering check-backs with ``checker``, one call at a time (a check
    waits at most ``wait_s`` for the call before it, then is answered UNKNOWN);
    ``answered(transaction_id, status)`` gives the answer sent for each of its answers (None:
    the checker's). :class:`InvalidArgumentError` unless ``checker`` has a ``check(message)``
    method."""
    if not callable(getattr(checker, "check", None)):
        raise InvalidArgumentError(
            f"checker must be a TransactionChecker (a check(message) method), got "
            f"{type(checker).__name__}"
        )
    # Any object with a check(message) method will do.
    return _CheckerListener(checker, answered, wait_s)  # type: ignore[arg-type]


class _State(Enum):
    OPEN = "open: no message sent in it yet"
    SENDING = "sending its message"
    SENT = "sent, undecided"
    NOT_STORED = "its half message was not stored"
    ENDING = "being committed or rolled back"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"


_DECIDED = {
    _State.COMMITTED: TransactionStatus.COMMIT,
    _State.ROLLED_BACK: TransactionStatus.ROLLBACK,
}
_CALLS = {TransactionStatus.COMMIT: "commit()", TransactionStatus.ROLLBACK: "rollback()"}


def _maybe_stored(exc: BaseException) -> bool:
    """Whether a decision whose write raised ``exc`` may have been stored all the same: unless
    it was refused before anything was sent (the producer not running, a bad argument) or
    the broker reported it not stored (a :class:`~bridge.errors.SendError` other than a
    timeout)."""
    if isinstance(exc, IllegalStateError | InvalidArgumentError):
        return False
    return not isinstance(exc, SendError) or isinstance(exc, SendTimeoutError)


def _names(statuses: list[TransactionStatus]) -> str:
    return " and then ".join(status.value for status in statuses)


class Transaction:
    """RocketMQ 5's ``Transaction``, from :meth:`Producer.begin_transaction
    <bridge.v5.Producer.begin_transaction>`: ``send(message, transaction)`` stores its one
    message as a half message, never visible on its topic; :meth:`commit` delivers it,
    :meth:`rollback` drops it. Left undecided, the producer's :class:`TransactionChecker`
    decides it when the coordinator checks it back; once this producer's checker answered
    COMMIT or ROLLBACK for it, the opposite decision raises
    :class:`~bridge.errors.IllegalStateError` (the coordinator keeps the first decision it
    reads), and the same one is written again, harmlessly.

    One message per transaction, as in RocketMQ 5: a second ``send`` in it raises
    :class:`~bridge.errors.InvalidArgumentError` (each half message is decided on its own,
    so two could not be made one). Thread-safe."""

    def __init__(
        self,
        require_running: Callable[[], None],
        on_stored: Callable[[str, Transaction], None] | None = None,
    ) -> None:
        self._require_running = require_running
        self._on_stored = on_stored
        self._lock = threading.Lock()
        self._state = _State.OPEN
        self._producer: TransactionMQProducer | None = None
        self._half: HalfMessage | None = None
        self._failure = ""
        self._attempted: TransactionStatus | None = None
        """A decision whose write failed with an unknown outcome: it may be stored."""
        self._checked: list[TransactionStatus] = []
        """The check-back's answers (COMMIT or ROLLBACK, each once) sent while it was
        undecided here."""

    @property
    def message_id(self) -> str | None:
        """The id of the message sent in it (the transaction's id too); None before."""
        half = self._half
        return half.transaction_id if half is not None else None

    def _send(self, producer: TransactionMQProducer, message: Message) -> HalfMessage:
        """Store ``message`` as this transaction's half message with ``producer`` (the one of
        its topic's producer group; the caller checked the topic). A second message raises
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
        if self._on_stored is not None:
            # Before SENT: a check-back of it finds it from now on (an answer that comes
            # while it is SENDING counts as one for SENT).
            self._on_stored(half.transaction_id, self)
        with self._lock:
            self._producer, self._half, self._state = producer, half, _State.SENT
        return half

    def commit(self) -> None:
        """Deliver the message: the decision is stored in Kafka when this returns, and the
        coordinator applies it, delivering the message exactly once, unless it read another
        decision first: one from a check-back answered by another producer declaring the
        topic (this one's checker answering ROLLBACK makes this raise instead).

        Raises :class:`~bridge.errors.IllegalStateError` when no message was stored in it,
        when it is decided already, once the producer is shut down, when this producer's
        :class:`TransactionChecker` answered ROLLBACK for it (a check-back), and after a
        :meth:`rollback` whose outcome is unknown; :class:`~bridge.errors.SendError` when the
        decision was not stored (call again, or leave it to the checker; after a
        :class:`~bridge.errors.SendTimeoutError` it may have been, so only a commit is
        allowed again)."""
        self._end(TransactionStatus.COMMIT)

    def rollback(self) -> None:
        """Drop the message: it never reaches its topic. Raises as :meth:`commit` does (the
        other way round: after a check-back answered COMMIT, or a commit whose outcome is
        unknown)."""
        self._end(TransactionStatus.ROLLBACK)

    def _refusal(self, status: TransactionStatus) -> str | None:
        """Why ``status`` cannot be written now, or None. Under the lock."""
        what = "commit" if status is TransactionStatus.COMMIT else "roll back"
        if self._state is not _State.SENT:
            detail = self._state.value
            if self._state is _State.NOT_STORED:
                detail += (
                    f" ({self._failure}); if it was stored after all, the "
                    "TransactionChecker decides it"
                )
            return f"cannot {what} a transaction that is {detail}"
        unknown = ""
        if self._attempted is not None:
            unknown = (
                f"a {self._attempted.value} of it was sent and its outcome is unknown "
                f"({self._failure}): it may be stored"
            )
        if any(answer is not status for answer in self._checked):
            return (
                f"cannot {what} transaction {self.message_id}: the TransactionChecker answered "
                f"{_names(self._checked)} when the coordinator checked it back, and the "
                "coordinator applies the first decision it reads"
                + (f" ({unknown}, perhaps before)" if unknown else "")
            )
        if self._attempted is not None and self._attempted is not status:
            advice = f"call {_CALLS[self._attempted]} again, or leave it to the TransactionChecker"
            if self._checked:
                advice = (
                    f"the TransactionChecker answered {_names(self._checked)} since: whichever "
                    "the coordinator read first stands"
                )
            return (
                f"cannot {what} transaction {self.message_id}: {unknown}, and the coordinator "
                f"applies the first decision it reads; {advice}"
            )
        return None

    def _end(self, status: TransactionStatus) -> None:
        with self._lock:
            refusal = self._refusal(status)
            if refusal is not None:
                raise IllegalStateError(refusal)
            self._require_running()
            self._state = _State.ENDING
        producer, half = self._producer, self._half
        assert producer is not None and half is not None  # set together with SENT
        try:
            producer.end_transaction(half, status)
        except BaseException as exc:
            with self._lock:
                self._state = _State.SENT  # undecided still: decide again, or the checker will
                if _maybe_stored(exc):
                    self._attempted = status
                    self._failure = f"{type(exc).__name__}: {exc}"
            raise
        with self._lock:
            committed = status is TransactionStatus.COMMIT
            self._state = _State.COMMITTED if committed else _State.ROLLED_BACK

    def _check_answered(self, status: TransactionStatus) -> TransactionStatus:
        """The answer to send for a check-back of this transaction the checker answered
        ``status``: this process's own decision once it is stored, UNKNOWN while one is
        being written (that one decides), else the checker's, kept so that a later
        :meth:`commit` or :meth:`rollback` saying otherwise raises."""
        with self._lock:
            decided = _DECIDED.get(self._state)
            if decided is not None:
                return decided
            if self._state is _State.ENDING:
                return TransactionStatus.UNKNOWN
            if status is not TransactionStatus.UNKNOWN and self._state in (
                _State.SENDING,
                _State.SENT,
            ):
                if self._checked and status not in self._checked:
                    logger.warning(
                        "transaction %s: the TransactionChecker answered %s, having answered "
                        "%s before; the coordinator applies the first it reads",
                        self.message_id,
                        status.value,
                        _names(self._checked),
                    )
                if status not in self._checked:
                    self._checked.append(status)
            return status

    def __repr__(self) -> str:
        checked = f", the checker answered {_names(self._checked)}" if self._checked else ""
        return f"Transaction(message_id={self.message_id!r}, {self._state.value}{checked})"
