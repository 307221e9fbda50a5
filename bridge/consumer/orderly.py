"""Orderly consumption (RocketMQ's ``ConsumeMessageOrderlyService``).

Each partition is run by one pool task at a time (``ProcessQueue.orderly_scheduled``), one
batch after the other, in offset order. A failed batch goes back to the head of the partition
and is retried in place after ``suspend_current_queue_time_millis``; a message out of retries
goes to the DLQ (dropped, BROADCASTING). A task hands its partition back to the pool after
:data:`_ORDERLY_SLICE_S`, so one busy partition cannot keep a thread for ever.
"""

from __future__ import annotations

import logging
import time
from typing import ClassVar, Final, cast

from bridge.consumer.consumption import (
    BatchListener,
    Consumption,
    record_failure,
    status_failure,
)
from bridge.consumer.counters import Count
from bridge.consumer.model import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerOrderly,
    MessageQueue,
    checked_suspend_millis,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.errors import EventLoopClosedError
from bridge.message import MessageExt

logger = logging.getLogger(__name__)

_ORDERLY_SLICE_S: Final = 60.0
"""An orderly task hands its partition back to the pool after this long (RocketMQ's
``MAX_TIME_CONSUME_CONTINUOUSLY``), seconds."""


class OrderlyConsumption(Consumption[ConsumeOrderlyContext]):
    """Runs an orderly listener (or a callable) one batch per partition at a time."""

    orderly: ClassVar[bool] = True
    in_place: ClassVar[bool] = True
    _LISTENER_RAISED: ClassVar[str] = "orderly listener raised on %s: suspending"
    _BATCH_LISTENER: ClassVar[type[BatchListener]] = MessageListenerOrderly
    # A listener raising SystemExit or KeyboardInterrupt fails its batch like any exception
    # (RocketMQ catches Throwable): escaping the task would leave the batch in its call and
    # the partition owned by no task, frozen for good.
    _CAUGHT: ClassVar[type[BaseException]] = BaseException

    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Queue ``msgs`` behind what ``pq`` already waits with, and make sure a task runs it."""
        pq.enqueue(msgs)
        self._schedule(pq)

    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        # Older than anything still queued: back to the head, in order.
        pq.put_back(msgs)
        self._schedule(pq)

    def _schedule(self, pq: ProcessQueue, delay_ms: int = 0) -> None:
        """Run ``pq`` now (unless a task owns it already) or after ``delay_ms`` (ms)."""
        with pq.lock:
            if pq.orderly_scheduled and delay_ms == 0:
                return
            pq.orderly_scheduled = True
        if delay_ms:
            self._context.scheduler.after(delay_ms, lambda: self._resubmit(pq))
        else:
            self._context.pool.submit(self._consume, pq)

    def _resubmit(self, pq: ProcessQueue) -> None:
        self._context.pool.submit(self._consume, pq)

    def _default_suspend_ms(self) -> int:
        """The consumer's ``suspend_current_queue_time_millis``, at least 1 ms."""
        return max(self._context.settings.suspend_current_queue_time_millis, 1)

    def _consume(self, pq: ProcessQueue) -> None:
        """Consume ``pq`` in order until it is empty; a failed batch waits and is retried in
        place. Exactly one such task owns a partition at a time (``orderly_scheduled``)."""
        if not pq.begin():
            with pq.lock:
                pq.orderly_scheduled = False
            return
        try:
            self._consume_slice(pq)
        except BaseException:  # never leave the partition owned by a task that ended
            logger.exception("push consumer %s: orderly consumption failed", self._context.group)
            with pq.lock:
                pq.orderly_scheduled = False
            # What is still pending must not wait for new records to be looked at again.
            try:
                self._schedule(pq, self._default_suspend_ms())
            except Exception:  # the pool is shut down: the consumer stops
                logger.exception(
                    "push consumer %s: orderly rescheduling failed", self._context.group
                )
        finally:
            pq.end()

    def _consume_slice(self, pq: ProcessQueue) -> None:
        group = self._context.group
        size = self._context.settings.consume_message_batch_max_size
        until = time.monotonic() + _ORDERLY_SLICE_S
        while True:
            with pq.lock:
                msgs = pq.take(size) if not pq.dropped else []
                if not msgs:
                    pq.orderly_scheduled = False
                    return
            call = object()
            pq.start(call, msgs, time.monotonic())
            settled: set[int] | None = None
            retry: list[MessageExt] = []
            suspend = 0
            try:
                context = ConsumeOrderlyContext(MessageQueue(msgs[0].topic, pq.partition))
                listener = self._context.subscriptions[msgs[0].topic].listener
                ok = self._call_listener(listener, msgs, context)
                settled = pq.settle(call, msgs)
                if len(settled) < len(msgs):
                    # Given up while the listener ran (see Fetcher.release): the next owner
                    # has them.
                    logger.warning(
                        "push consumer %s: ignoring the late orderly result for %s",
                        group,
                        [m.msg_id for m in msgs],
                    )
                    with pq.lock:
                        pq.orderly_scheduled = False
                    return
                done, failed = msgs[:ok], msgs[ok:]
                self._context.counters.add(Count.CONSUMED, len(done))
                pq.remove(m.queue_offset for m in done)
                if failed:
                    self._context.counters.add(Count.FAILED, len(failed))
                    try:
                        retry = self.policy.check_reconsume_times(pq, failed)
                    except Exception:
                        # Keep the partition's order: retry the batch in place.
                        logger.exception("push consumer %s: orderly failure handling", group)
                        retry = failed
                    if retry:
                        suspend = self._suspend_ms(context, retry)
            except EventLoopClosedError:
                # Not run, not a failure: back to the head, held (uncommitted) for the next
                # owner; the asyncio client is shutting down, so the partition waits.
                pq.put_back(pq.withdraw(call, msgs))
                with pq.lock:
                    pq.orderly_scheduled = False
                return
            except BaseException:
                # Keep the partition's order: what is still held of the batch goes back to the
                # head, retried after the default suspension.
                retry = (
                    pq.withdraw(call, msgs)
                    if settled is None
                    else [m for m in msgs if pq.holds(m.queue_offset)]
                )
                logger.exception(
                    "push consumer %s: handling the orderly result for %s failed; retrying %d "
                    "of them in place",
                    group,
                    [m.msg_id for m in msgs],
                    len(retry),
                )
                suspend = self._default_suspend_ms()
            if retry:
                pq.put_back(retry)
                self._schedule(pq, suspend)
                return
            if time.monotonic() > until:
                self._resubmit(pq)
                return

    def _suspend_ms(self, context: ConsumeOrderlyContext, msgs: list[MessageExt]) -> int:
        """How long the partition waits before ``msgs`` are retried in place (ms, at least 1):
        the listener's ``suspend_current_queue_time_millis`` if it is a non-negative int,
        else the consumer's setting (a value that is not an int is logged)."""
        suspend = checked_suspend_millis(context.suspend_current_queue_time_millis)
        if suspend is None:
            logger.warning(
                "push consumer %s: the listener set suspend_current_queue_time_millis=%r (not "
                "an int) for %s; using the consumer's setting",
                self._context.group,
                context.suspend_current_queue_time_millis,
                [m.msg_id for m in msgs],
            )
            suspend = -1
        if suspend < 0:
            return self._default_suspend_ms()
        return max(suspend, 1)

    def _consume_batch(
        self, listener: BatchListener, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> int:
        """SUCCESS (or CONSUME_SUCCESS): the whole batch; anything else: none (retried in
        place)."""
        # Its own list: one it empties or reorders must not change what the consumer holds.
        # Typed object: a listener may return anything (None, True, the other enum).
        status: object = cast(MessageListenerOrderly, listener).consume_message(list(msgs), context)
        # Either enum's success, as per-message listeners may return: ConsumeStatus's would
        # otherwise be retried in place for ever (orderly retries are unlimited).
        if status is ConsumeOrderlyStatus.SUCCESS or status is ConsumeStatus.CONSUME_SUCCESS:
            return len(msgs)
        record_failure(msgs, status_failure(status, msgs[0].msg_id))
        return 0
