"""FIFO consumption (RocketMQ 5's FIFO consumer groups; Confluent Parallel Consumer's KEY order).

A partition's messages wait in lanes by message group (:mod:`bridge.consumer.message_groups`).
The pool's threads take the head of whichever lane is ready, from any partition, so different
groups run in parallel, even within one partition, while each group runs one message at a
time, in offset order. A failed message stays at the head of its lane and is retried in place
after ``suspend_current_queue_time_millis``, holding up its group only; once its retries are
spent (``max_reconsume_times``, -1: 16, RocketMQ's default for a group) it goes to the DLQ
(dropped, BROADCASTING) and its group goes on. Every message stays held in its
:class:`~bridge.consumer.process_queue.ProcessQueue` until done, so the committed offset never
passes one that is waiting, running or failing (G6); after a crash or a rebalance, the next
owner consumes again from there, each group in order.

As with orderly consumption, nothing goes through the retry topic, and a rebalance waits up
to ``consume_timeout`` for a running listener, so two members never run one group at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import ClassVar, cast

from bridge.consumer.consumption import (
    BatchListener,
    Consumption,
    Failure,
    record_failure,
    status_failure,
)
from bridge.consumer.context import ConsumerContext
from bridge.consumer.counters import Count
from bridge.consumer.message_groups import GroupKey, GroupLanes, Lane, group_of
from bridge.consumer.model import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerOrderly,
    MessageQueue,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.errors import EventLoopClosedError
from bridge.message import MessageExt

logger = logging.getLogger(__name__)


class FifoConsumption(Consumption[ConsumeOrderlyContext]):
    """Runs a per-message listener one message per group at a time, many groups at once."""

    orderly: ClassVar[bool] = False  # the retry budget of a group: 16 unless set
    in_place: ClassVar[bool] = True
    _LISTENER_RAISED: ClassVar[str] = "listener raised on %s: retrying in place"
    # subscribe() gives a FIFO consumer callables only; the batch kind is never called here.
    _BATCH_LISTENER: ClassVar[type[BatchListener]] = MessageListenerOrderly
    # A listener raising SystemExit or KeyboardInterrupt fails its message like any exception:
    # escaping the task would leave its group out for good.
    _CAUGHT: ClassVar[type[BaseException]] = BaseException

    def __init__(self, context: ConsumerContext, quarantine: Quarantine) -> None:
        super().__init__(context, quarantine)
        self._lock = threading.Lock()
        """Guards the lanes and the worker count."""
        self._lanes: GroupLanes[MessageExt] = GroupLanes()
        self._workers = 0
        """Pool tasks taking messages from the lanes now (at most ``consume_thread_count``)."""

    # --- intake ---------------------------------------------------------------------------
    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Queue each of ``msgs`` in its group's lane and make sure enough tasks run them."""
        keyed = [(group_of(msg, _KeyOf(pq, msg.queue_offset)), msg) for msg in msgs]
        with self._lock:
            lanes = self._lanes
            for group, msg in keyed:
                lanes.add(pq, group, msg)
        self._spawn()

    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        # A local retry (a copy that could not be written): back to the head of each lane, in
        # their order, ahead of the lane's waiting messages. A lane with a message out stays
        # out (releasing it here could let two of its messages run at once); one of a
        # partition given up is its next owner's.
        if pq.released:
            return
        by_group: dict[GroupKey, list[MessageExt]] = {}
        for msg in msgs:
            by_group.setdefault(group_of(msg, _KeyOf(pq, msg.queue_offset)), []).append(msg)
        with self._lock:
            for group, mine in by_group.items():
                self._lanes.push_front(pq, group, mine)
        self._spawn()

    def released(self, queues: Iterable[ProcessQueue]) -> None:
        """Forget the lanes of ``queues`` (their messages stay uncommitted for the next
        owner)."""
        with self._lock:
            for pq in queues:
                self._lanes.forget(pq)

    # --- the pool's tasks -----------------------------------------------------------------
    def _spawn(self) -> None:
        """Add pool tasks while lanes are ready and fewer than ``consume_thread_count`` run."""
        with self._lock:
            wanted = min(self._lanes.ready, self._context.settings.consume_thread_count)
            more = wanted - self._workers
            if more <= 0:
                return
            self._workers += more
        pool = self._context.pool
        for started in range(more):
            try:
                pool.submit(self._drain)
            except RuntimeError:  # the pool is shut down: the consumer stops
                with self._lock:
                    self._workers -= more - started
                return

    def _drain(self) -> None:
        """Run ready lanes' heads, one after another, until no lane is ready."""
        lanes = self._lanes
        while True:
            with self._lock:
                taken = lanes.take()
                if taken is None:
                    self._workers -= 1
                    return
            lane, msg = taken
            try:
                self._consume(lane, msg)
            except Exception:
                # Outside the listener call and its handling (which retry in place whatever
                # happens), so a programming error: the lane stays out rather than risk two of
                # its messages at once. Its group waits, and its partition's offset with it,
                # until the partition is given up (a rebalance, a restart).
                logger.exception(
                    "push consumer %s: FIFO consumption of %s failed; its message group waits "
                    "until its partition is given up",
                    self._context.group,
                    msg.msg_id,
                )
            except BaseException:
                with self._lock:
                    self._workers -= 1
                raise

    def _resume(self, lane: Lane) -> None:
        """``lane``'s message is settled, or its retry is due: offer the lane's next one."""
        with self._lock:
            ready = self._lanes.release(lane)
        if ready:
            self._spawn()

    def _resume_later(self, lane: Lane, delay_ms: int | None = None) -> None:
        """:meth:`_resume` after ``delay_ms`` (default ``suspend_current_queue_time_millis``)."""
        if delay_ms is None:
            delay_ms = max(self._context.settings.suspend_current_queue_time_millis, 1)
        self._context.scheduler.after(delay_ms, lambda: self._resume(lane))

    def _consume(self, lane: Lane, msg: MessageExt) -> None:
        """Run the listener on ``msg``, the head of ``lane``: consumed, the lane goes on;
        failed, it is put back and retried after the suspension, or dead-lettered once its
        retries are spent. A partition given up meanwhile keeps its lanes out: they are
        forgotten, and the message is the next owner's."""
        pq = cast(ProcessQueue, lane[0])
        if not pq.begin():
            return  # revoked or stopping: held, uncommitted, for the next owner
        group = self._context.group
        try:
            call = object()
            pq.start(call, [msg], time.monotonic())
            settled: set[int] | None = None
            retry: list[MessageExt] = []
            try:
                sub = self._context.subscriptions.get(msg.topic)
                if sub is None:  # pragma: no cover - a FIFO consumer reads no retry topic
                    record_failure([msg], Failure.NO_SUBSCRIPTION)
                    ok = 0
                else:
                    context = ConsumeOrderlyContext(MessageQueue(msg.topic, pq.partition))
                    ok = self._call_listener(sub.listener, [msg], context)
                settled = pq.settle(call, [msg])
                if not settled:
                    # Given up while the listener ran (see Fetcher.release): the next owner
                    # has it.
                    logger.warning(
                        "push consumer %s: ignoring the late FIFO result for %s", group, msg.msg_id
                    )
                    return
                if ok:
                    self._context.counters.add(Count.CONSUMED)
                    pq.remove([msg.queue_offset])
                else:
                    self._context.counters.add(Count.FAILED)
                    try:
                        retry = self.policy.check_reconsume_times(pq, [msg])
                    except Exception:
                        logger.exception("push consumer %s: FIFO failure handling", group)
                        retry = [msg] if pq.holds(msg.queue_offset) else []
            except EventLoopClosedError:
                # Not run, not a failure: held (uncommitted) for the next owner; the asyncio
                # client is shutting down, so the group waits.
                pq.withdraw(call, [msg])
                with self._lock:
                    self._lanes.put_back(lane, [msg])
                return
            except BaseException:
                # Keep the group's order: retry in place after the default suspension.
                held = pq.withdraw(call, [msg]) if settled is None else [msg]
                logger.exception(
                    "push consumer %s: handling the FIFO result for %s failed; retrying it in "
                    "place",
                    group,
                    msg.msg_id,
                )
                retry = [m for m in held if pq.holds(m.queue_offset)]
            # Released once, here, whatever happened above: a second release could let two
            # messages of the group out at once.
            if retry:
                with self._lock:
                    self._lanes.put_back(lane, retry)
                self._resume_later(lane)
            else:
                self._resume(lane)
        finally:
            pq.end()

    def _consume_batch(
        self, listener: BatchListener, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> int:  # pragma: no cover - subscribe() gives a FIFO consumer callables only
        """SUCCESS (or CONSUME_SUCCESS): the message; anything else: retried in place."""
        status: object = cast(MessageListenerOrderly, listener).consume_message(list(msgs), context)
        if status is ConsumeOrderlyStatus.SUCCESS or status is ConsumeStatus.CONSUME_SUCCESS:
            return len(msgs)
        record_failure(msgs, status_failure(status, msgs[0].msg_id))
        return 0


class _KeyOf:
    """The Kafka key of the record held at ``offset`` in ``pq``, read when called (only a
    record another Kafka client wrote needs it)."""

    __slots__ = ("offset", "pq")

    def __init__(self, pq: ProcessQueue, offset: int) -> None:
        self.pq = pq
        self.offset = offset

    def __call__(self) -> object:
        key = getattr(self.pq.record_of(self.offset), "key", None)
        return key() if callable(key) else None
