"""Kafka transactions that cannot hang (:class:`BoundedTransactions`, made by
:func:`transactional_producer`), and the rules about delivery errors shared by every writer
of transactions (:func:`is_permanent_delivery_error`)."""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from bridge.config import ClientConfig
from bridge.errors import SendError
from bridge.kafka.clients import new_producer
from bridge.lifecycle import FatalServiceError
from bridge.message import DELAY_PROPERTIES, MessageConst

logger = logging.getLogger(__name__)

DELIVERY_ATTEMPTS: Final = "DELIVERY_ATTEMPTS"
"""Property: how many times delivering a message to its real topic failed so far (the same
name as ``MessageConst.DELIVERY_ATTEMPTS``); removed when it gets there."""
DELIVERY_ERROR: Final = "DELIVERY_ERROR"
"""Property: why the last delivery attempt failed (``MessageConst.DELIVERY_ERROR``)."""
MAX_DELIVERY_ERROR_CHARS: Final = 500
"""``DELIVERY_ERROR`` is cut to this many characters."""
REMOVED_ON_DELIVERY: Final = frozenset(
    {
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QUEUE_ID,
        *DELAY_PROPERTIES,
        DELIVERY_ATTEMPTS,
        DELIVERY_ERROR,
    }
)
"""Properties a delayed message loses when it reaches its real topic."""


def is_permanent_delivery_error(err: KafkaError | None) -> bool:
    """True if a record's delivery failed for a reason that will not go away by retrying it
    (unknown topic or partition, authorization, record too large, invalid or internal
    topic), False for transient, transport, timeout, purge and fencing errors and for None:
    a :class:`~bridge.errors.SendError` with ``err`` would not be
    :attr:`~bridge.errors.BridgeError.retriable` (the rule is
    :meth:`SendError.retriable_kafka_error <bridge.errors.SendError.retriable_kafka_error>`).

    Meant for delivery reports and ``produce()`` errors of one record; the error a failed
    transaction raises names a record's problem only when such a report does.
    """
    return err is not None and not SendError.retriable_kafka_error(err)


WATCHDOG_GRACE_S: Final = 5.0
"""How long past its own timeout a transactional call may run before its producer is given up."""
MAX_STUCK_CALLS: Final = 8
"""Given-up calls still running in this process past which the process stops instead: each
holds a thread and a librdkafka instance, and a restart is safe by design."""
_stuck_lock = threading.Lock()
_stuck_calls = 0


class _Call:
    """One transaction call handed to a :class:`_CallWorker`, and what became of it."""

    __slots__ = ("args", "done", "given_up", "method", "outcome", "target")

    def __init__(self, target: Any, method: str, args: tuple[Any, ...]) -> None:
        self.target = target
        self.method = method
        self.args = args
        self.done = threading.Event()
        self.given_up = False
        """Set (under ``_stuck_lock``) when the caller stopped waiting for it."""
        self.outcome: BaseException | None = None


class _CallWorker:
    """The thread that runs one producer's transaction calls, one at a time, started with the
    first call and kept for the next ones (a thread started per call cost more than the call's
    own Python work). It ends when its :class:`BoundedTransactions` is collected (see
    :meth:`close`), or, if a call never returns, with that call."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, call: _Call) -> None:
        """Hand ``call`` to the thread (started on first use)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve_calls, args=(self._jobs,), name=f"{self._name}-txn", daemon=True
            )
            self._thread.start()
        self._jobs.put(call)

    def close(self) -> None:
        """Let the thread end once the call it runs (if any) returns."""
        self._jobs.put(None)


def _serve_calls(jobs: queue.SimpleQueue[_Call | None]) -> None:
    """The body of a :class:`_CallWorker` thread. It holds a call (and its producer) only
    while running it, so that a producer given up is not kept alive by an idle thread."""
    global _stuck_calls  # noqa: PLW0603 - one count per process
    while True:
        call = jobs.get()
        if call is None:
            return
        try:
            getattr(call.target, call.method)(*call.args)
        except BaseException as exc:
            call.outcome = exc
        finally:
            with _stuck_lock:
                call.done.set()
                if call.given_up:
                    _stuck_calls -= 1
            call = None  # no reference to the producer while waiting for the next call


class BoundedTransactions:
    """A transactional producer whose transaction calls return by their timeout, plus
    :data:`WATCHDOG_GRACE_S`.

    librdkafka's ``send_offsets_to_transaction`` can block past its timeout, for ever, once the
    coordinator it waits for is lost (a dropped connection, a broker gone from the metadata:
    confluentinc/librdkafka#5456 and #5511), and with it the service thread and every message
    the service moves. Each of these calls therefore runs on a thread of the producer's own
    (one, kept from call to call); one that has not returned in time raises a *fatal*
    ``_TIMED_OUT`` :class:`KafkaException`, and the producer counts as wedged: every later
    transactional call fails the same way at once. The service then replaces it
    (:meth:`bridge.kafka.service.TransactionalService.transaction_failed`): the new producer's
    ``init_transactions`` fences the wedged one and has the broker abort what it left open,
    and a commit whose outcome that leaves unknown is handled as any commit that timed out.
    The stuck call's thread ends whenever librdkafka lets go; until then it keeps the old
    producer alive, so it is never destroyed under a running call.

    Everything else (``produce``, ``poll``, ``flush``, ``list_topics``...) goes straight to
    the producer.
    """

    def __init__(self, producer: Any, name: str) -> None:
        self._producer = producer
        self._name = name
        self._wedged: str | None = None
        self._worker = _CallWorker(name)
        weakref.finalize(self, self._worker.close)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._producer, attr)

    def __len__(self) -> int:
        return len(self._producer)

    def __bool__(self) -> bool:  # not len(): an empty queue is still a producer
        return True

    @property
    def wedged(self) -> str | None:
        """The call that never returned, once one did not; else None."""
        return self._wedged

    def init_transactions(self, timeout: float) -> None:
        """``Producer.init_transactions``, bounded; ``timeout`` in seconds."""
        self._bounded("init_transactions", timeout, timeout)

    def begin_transaction(self) -> None:
        """``Producer.begin_transaction`` (local: it never waits for the broker)."""
        if self._wedged is not None:
            raise self._wedged_error(self._wedged)
        self._producer.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        """``Producer.send_offsets_to_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("send_offsets_to_transaction", timeout, offsets, metadata, timeout)

    def commit_transaction(self, timeout: float) -> None:
        """``Producer.commit_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("commit_transaction", timeout, timeout)

    def abort_transaction(self, timeout: float) -> None:
        """``Producer.abort_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("abort_transaction", timeout, timeout)

    def _bounded(self, method: str, timeout_s: float, *args: Any) -> None:
        if self._wedged is not None:
            raise self._wedged_error(self._wedged)
        call = _Call(self._producer, method, args)
        self._worker.run(call)
        limit_s = timeout_s + WATCHDOG_GRACE_S
        if not call.done.wait(limit_s):
            global _stuck_calls  # noqa: PLW0603 - one count per process
            with _stuck_lock:
                if not call.done.is_set():
                    call.given_up = True
                    _stuck_calls += 1
                stuck = _stuck_calls
            if call.given_up:
                self._wedged = method
                logger.error(
                    "%s: %s did not return within %.0f s although its timeout is %.0f s; "
                    "giving this producer up (%d given-up calls still running)",
                    self._name,
                    method,
                    limit_s,
                    timeout_s,
                    stuck,
                )
                if stuck > MAX_STUCK_CALLS:
                    raise FatalServiceError(
                        f"{stuck} Kafka transaction calls did not return within their "
                        "timeout; stopping so that a restart frees their threads"
                    )
                raise self._wedged_error(method)
        error, call.outcome = call.outcome, None  # no cycle through this frame
        if error is not None:
            raise error

    def _wedged_error(self, call: str) -> KafkaException:
        return KafkaException(
            KafkaError(
                KafkaError._TIMED_OUT,
                f"{call} did not return within its timeout plus {WATCHDOG_GRACE_S:.0f} s "
                "(the producer lost its transaction coordinator); the producer is replaced",
                fatal=True,
            )
        )


def transactional_producer(
    config: ClientConfig,
    name: str,
    transactional_id: str,
    timeout_s: float,
    **overrides: Any,
) -> BoundedTransactions:
    """A new transactional producer (client id ``name``) whose transaction calls are bounded,
    its id registered at the broker: ``init_transactions`` fences an older producer of the
    same id and completes or aborts what that one left open. ``timeout_s`` bounds the
    registration, seconds; ``overrides`` are producer settings. Raises ``KafkaException``
    when the registration fails."""
    producer = BoundedTransactions(
        new_producer(config, name, transactional_id=transactional_id, **overrides), name
    )
    producer.init_transactions(timeout_s)
    return producer
