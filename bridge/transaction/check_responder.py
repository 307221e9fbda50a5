"""Answering the coordinator's check requests for a :class:`~bridge.transaction.producer.
TransactionMQProducer`: :class:`CheckResponder`.

The coordinator writes a check request for an undecided transaction to the producer group's
check topic, which every producer of the group consumes as one Kafka consumer group, so each
request reaches exactly one live member (and a dead member's requests move to the others).
Checks are answered on named threads (RocketMQ's defaults: 1 thread, 2000 requests held).
Every wait is bounded: a ``check_local_transaction`` that runs longer than
``check_timeout_ms`` gets a thread started in its place, so the checks queued behind it go on;
a hung one delays ``shutdown()`` by at most its timeout, and an unanswered check is simply
asked again by the coordinator at its next check interval. Kafka's side (the check consumer,
its flow control and commits) is :class:`~bridge.transaction.check_consumer.CheckConsumer`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

from bridge.codec import decode_envelope
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, WireFormatError
from bridge.message import MessageConst
from bridge.transaction.check_consumer import HOLD_WAIT_S, CheckConsumer
from bridge.transaction.model import CheckRequest, TransactionListener, TransactionStatus

# A part of the transactional producer: its records go where the producer's go, so a level set
# on "bridge.transaction.producer" covers them.
logger = logging.getLogger("bridge.transaction.producer.checks")

_ANSWERS_KEPT = 20_000
"""Answers of the last this many checks are kept: a check asked again is answered the same
way without a second call of ``check_local_transaction``."""


@dataclass(slots=True)
class _RunningCheck:
    """A ``check_local_transaction`` call in progress on a check thread."""

    transaction_id: str
    check_times: int
    started_s: float
    """When it started, ``time.monotonic()`` s."""
    replaced: bool = False
    """Past ``check_timeout_ms``: another check thread was started in its place, and its
    place in the check hold released."""
    refused: bool = False
    """Past ``check_timeout_ms`` with no thread left to start (logged once)."""


def run_listener(what: str, call: Any, transaction_id: str) -> TransactionStatus:
    """``call()``, a listener's method that answers a transaction: its status, or UNKNOWN
    (logged) for one that raised or returned something else."""
    try:
        status = call()
    except Exception:
        logger.exception("transaction %s: %s raised; state is UNKNOWN", transaction_id, what)
        return TransactionStatus.UNKNOWN
    if not isinstance(status, TransactionStatus):
        logger.error(
            "transaction %s: %s returned %r, not a TransactionStatus; state is UNKNOWN",
            transaction_id,
            what,
            status,
        )
        return TransactionStatus.UNKNOWN
    return status


class CheckResponder:
    """Answers the check requests of producer group ``group`` with ``listener()``'s
    ``check_local_transaction``, each answer written by ``end(transaction_id, half_partition,
    status, check_times)``: ``pool_size`` check threads, at most ``hold_max`` requests taken
    and not answered, a thread started in place of a call running past ``timeout_ms``; the
    check consumer's session times out after ``session_timeout_ms``. :meth:`start`, then
    :meth:`stop`."""

    def __init__(
        self,
        config: ClientConfig,
        group: str,
        *,
        listener: Callable[[], TransactionListener],
        end: Callable[[str, int, TransactionStatus, int], None],
        pool_size: int,
        hold_max: int,
        timeout_ms: int,
        session_timeout_ms: int,
    ) -> None:
        self._config = config
        self.group = group
        self._listener = listener
        self._end = end
        self._check_pool_size = pool_size
        self._check_hold = threading.BoundedSemaphore(hold_max)
        self._check_hold_max = hold_max
        self._check_timeout_ms = timeout_ms
        self._session_timeout_ms = session_timeout_ms
        self._stop = threading.Event()
        self._check_thread: threading.Thread | None = None
        # Checks are answered on daemon threads (_start_worker).
        self._check_queue: queue.SimpleQueue[tuple[str, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._checks_lock = threading.Condition()
        self._checks: dict[int, tuple[str, str]] = {}
        """Check number -> (transaction id, ``queued`` or ``running``), for each check taken
        and not answered yet."""
        self._check_numbers = count()
        self._answered: OrderedDict[tuple[str, int], TransactionStatus] = OrderedDict()
        """(transaction id, check number) -> the listener's answer, for the last
        :data:`_ANSWERS_KEPT` checks called."""
        self._answers_closed = False
        # The watchdog (run by the check loop): a check call past check_timeout_ms no longer
        # counts as one of the pool's threads; one more is started in its place, and a thread
        # stops again once the pool is back above its size.
        self._running: dict[int, _RunningCheck] = {}
        """Check number -> the call in progress, for each check a thread is answering."""
        self._workers_alive = 0
        """Check threads started and not stopped (hung ones included)."""
        self._replaced_running = 0
        """Calls still running that another thread was started in place of."""
        self._worker_names = count()

    def start(self) -> None:
        """Start the check threads and the check consumer."""
        with self._checks_lock:
            self._workers_alive += self._check_pool_size
        for _ in range(self._check_pool_size):
            self._start_worker()
        self._check_thread = threading.Thread(
            target=CheckConsumer(
                self._config,
                self.group,
                session_timeout_ms=self._session_timeout_ms,
                hold=self._check_hold,
                stop=self._stop,
                take=self._answer,
                watch=self._watch_checks,
            ).run,
            name=f"bridge-txn-check-{self.group}",
            daemon=True,
        )
        self._check_thread.start()

    def stop(self, deadline: float, timeout: int) -> None:
        """Stop taking check requests and wait until ``deadline`` (monotonic s; ``timeout``:
        the wait asked for, ms, for the logs) for the checks taken to be answered; abandon
        (and log) the rest: an answer that comes later is not sent."""
        self._stop.set()
        check_thread = self._check_thread
        if check_thread is not None:
            # It sees the stop flag within one poll or hold wait, then leaves its group.
            check_thread.join(max(deadline - time.monotonic(), 0) + 2 * HOLD_WAIT_S)
            if check_thread.is_alive():
                logger.warning(
                    "transaction producer %s: the check consumer did not stop within %d ms; "
                    "left behind",
                    self.group,
                    timeout,
                )
        with self._checks_lock:
            self._checks_lock.wait_for(
                lambda: not self._checks, max(deadline - time.monotonic(), 0)
            )
            self._answers_closed = True
            abandoned = sorted(self._checks.values())
            workers = self._workers_alive
        for _ in range(workers):
            self._check_queue.put(None)  # idle workers stop; hung ones are daemons
        if abandoned:
            logger.warning(
                "transaction producer %s: shutdown abandoned %d unanswered checks after %d ms "
                "(%s); the coordinator asks again at its next check interval",
                self.group,
                len(abandoned),
                timeout,
                ", ".join(f"{tid} {state}" for tid, state in abandoned),
            )

    def _answer(self, record: Any) -> bool:
        """Queue a check request for the check threads, in the place the caller took in the
        check hold; False when it is not queued (unreadable: its place is the caller's to
        release)."""
        try:
            request = CheckRequest.decode(record.value())
            msg = decode_envelope(request.message)
            # As RocketMQ's listener sees it: this check counted (the coordinator sends the
            # half message as stored).
            msg.put_system_property(MessageConst.TRANSACTION_CHECK_TIMES, str(request.check_times))
        except WireFormatError as exc:
            logger.error(
                "unreadable check request at %s@%d: %s", record.partition(), record.offset(), exc
            )
            return False
        listener = self._listener()
        tid = request.transaction_id

        number = next(self._check_numbers)

        def work() -> None:
            replaced = False  # then the watchdog released its place in the hold
            try:
                with self._checks_lock:
                    if self._answers_closed:
                        return
                    # One call per transaction at a time: the checks of a transaction whose
                    # call hangs would each take a thread (up to check_request_hold_max).
                    # Unanswered, it is asked again; the running call's answer still counts.
                    # A check asked again (its answer was late, or lost) is answered as
                    # before, without a second call.
                    before = self._answered.get((tid, request.check_times))
                    busy = next(
                        (r for r in self._running.values() if r.transaction_id == tid), None
                    )
                    if before is None and busy is None:
                        self._checks[number] = (tid, "running")
                        self._running[number] = _RunningCheck(
                            tid, request.check_times, time.monotonic()
                        )
                if before is not None:
                    logger.info(
                        "transaction %s: check %d asked again; answered %s again",
                        tid,
                        request.check_times,
                        before.value,
                    )
                    self._end(tid, request.half_partition, before, request.check_times)
                    return
                if busy is not None:
                    # Asked, and still at it: UNKNOWN, so the check counts (a listener that
                    # never returns for it ends with the message parked, not checked for ever).
                    logger.warning(
                        "transaction %s: check %d not called, check %d of it still runs; "
                        "answered UNKNOWN",
                        tid,
                        request.check_times,
                        busy.check_times,
                    )
                    self._end(
                        tid, request.half_partition, TransactionStatus.UNKNOWN, request.check_times
                    )
                    return
                status = run_listener(
                    "check_local_transaction", lambda: listener.check_local_transaction(msg), tid
                )
                with self._checks_lock:
                    late = self._answers_closed
                    run = self._running.pop(number)
                    self._answered[(tid, request.check_times)] = status
                    if len(self._answered) > _ANSWERS_KEPT:
                        self._answered.popitem(last=False)
                    replaced = run.replaced
                    if replaced:
                        self._replaced_running -= 1
                if replaced:
                    logger.warning(
                        "transaction %s: check %d returned %s after %d ms, past "
                        "check_timeout_ms (%d)",
                        tid,
                        request.check_times,
                        status.value,
                        (time.monotonic() - run.started_s) * 1000,
                        self._check_timeout_ms,
                    )
                if late:
                    logger.info(
                        "transaction %s: check %d answered %s after shutdown; not sent, "
                        "the coordinator asks again",
                        tid,
                        request.check_times,
                        status.value,
                    )
                    return
                logger.info(
                    "transaction %s: check %d answered %s", tid, request.check_times, status.value
                )
                try:
                    self._end(tid, request.half_partition, status, request.check_times)
                except IllegalStateError:  # shut down meanwhile (at the shutdown deadline)
                    logger.info("transaction %s: check answer not sent, shut down", tid)
            finally:
                with self._checks_lock:
                    left = self._running.pop(number, None)
                    if left is not None and left.replaced:  # raised past _run_listener
                        replaced = True
                        self._replaced_running -= 1
                    self._checks.pop(number, None)
                    self._checks_lock.notify_all()
                if not replaced:
                    self._check_hold.release()

        with self._checks_lock:
            self._checks[number] = (tid, "queued")
        self._check_queue.put((tid, work))
        return True

    def _start_worker(self) -> None:
        """Start a check thread the caller counted in ``_workers_alive`` already (uncounted
        again if it cannot start). A daemon: a listener that never returns must not keep the
        process alive after shutdown() gave up on it."""
        worker = threading.Thread(
            target=self._check_worker,
            name=f"bridge-txn-check-worker-{self.group}-{next(self._worker_names)}",
            daemon=True,
        )
        try:
            worker.start()
        except BaseException:
            with self._checks_lock:
                self._workers_alive -= 1
            raise

    def _watch_checks(self) -> None:
        """Give each check call running longer than ``check_timeout_ms`` a thread in its
        place, and its place in the check hold back, so the checks queued behind it go on
        (RocketMQ's hold counts the requests waiting for a thread): at most one thread per
        call, and never more than ``check_request_hold_max`` such threads in all. Run by the
        check loop (every 0.2 s at least); the call itself goes on, and its answer is sent if
        it returns."""
        now = time.monotonic()
        limit_s = self._check_timeout_ms / 1000
        hung: list[tuple[_RunningCheck, bool]] = []
        with self._checks_lock:
            if self._answers_closed:
                return
            for run in self._running.values():
                if run.replaced or now - run.started_s < limit_s:
                    continue
                extra = self._workers_alive - self._check_pool_size
                if extra >= self._check_hold_max:
                    # Looked at again on every pass: once extra threads end, it is replaced.
                    if not run.refused:  # logged once
                        run.refused = True
                        hung.append((run, False))
                    continue
                run.replaced = True
                self._check_hold.release()
                self._replaced_running += 1
                self._workers_alive += 1  # started below
                hung.append((run, True))
            if not hung:
                return
        for run, replace in hung:
            ran_ms = (now - run.started_s) * 1000
            if not replace:
                logger.error(
                    "transaction producer %s: transaction %s: check %d has run %d ms, past "
                    "check_timeout_ms (%d); no thread started in its place, %d already are "
                    "(check_request_hold_max)",
                    self.group,
                    run.transaction_id,
                    run.check_times,
                    ran_ms,
                    self._check_timeout_ms,
                    self._check_hold_max,
                )
                continue
            logger.error(
                "transaction producer %s: transaction %s: check %d has run %d ms, past "
                "check_timeout_ms (%d); another check thread is started in its place, its "
                "answer is still sent if it returns",
                self.group,
                run.transaction_id,
                run.check_times,
                ran_ms,
                self._check_timeout_ms,
            )
            try:
                self._start_worker()
            except RuntimeError:
                logger.exception("transaction producer %s: no check thread started", self.group)

    def _check_worker(self) -> None:
        while True:
            with self._checks_lock:
                # A thread started in place of a hung call stops once that call returned:
                # whichever thread finds the pool above its size (the one back from the
                # call, as a rule).
                if (
                    not self._answers_closed
                    and self._workers_alive > self._check_pool_size + self._replaced_running
                ):
                    self._workers_alive -= 1
                    return
            item = self._check_queue.get()
            if item is None:
                with self._checks_lock:
                    self._workers_alive -= 1
                return
            _, work = item
            try:
                work()
            except BaseException:
                # Never lose the worker, to a check's SystemExit either (RocketMQ's check
                # thread catches Throwable); the check is asked again.
                logger.exception("transaction producer %s: answering a check failed", self.group)
