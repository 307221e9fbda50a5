"""Concurrent consumption (RocketMQ's ``ConsumeMessageConcurrentlyService``).

A partition's messages are cut into consume requests and run on the pool, many at once;
each message is done once its listener consumed it or its retry copy is acknowledged, so the
committed offset follows however the threads finish. A message in its listener for longer
than ``consume_timeout`` is sent back (RocketMQ's ``cleanExpireMsg``) and its listener's late
result ignored, and the messages of its task not started yet go to another task (a call that
never returns holds only its own messages, as a RocketMQ consume thread holds only its request).
The consume timeout's send-back is :mod:`bridge.consumer.overdue`; what a listener's answer
means, :mod:`bridge.consumer.concurrent_results`.

A listener measured fast runs on the poll thread instead, each poll's messages in a row after
the poll (:meth:`ConcurrentConsumption.receive`, :meth:`ConcurrentConsumption.run_here`), with
the same bookkeeping, so the same guarantees; which path, :mod:`bridge.consumer.listener_path`
decides.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import ClassVar, Final, cast

from bridge.consumer.concurrent_results import batch_consumed, delay_level
from bridge.consumer.consumption import (
    BatchListener,
    Consumption,
    Failure,
    leading_successes,
    record_failure,
)
from bridge.consumer.context import ConsumerContext, MessageCallback
from bridge.consumer.counters import Count
from bridge.consumer.listener_path import PathChoice
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    MessageListenerConcurrently,
    MessageQueue,
)
from bridge.consumer.one_by_one import OneByOne
from bridge.consumer.overdue import send_back_overdue
from bridge.consumer.process_queue import Call, ProcessQueue, Run
from bridge.consumer.quarantine import Quarantine
from bridge.errors import EventLoopClosedError
from bridge.message import MessageExt
from bridge.tracing import tracing_active

logger = logging.getLogger(__name__)

_MAX_REQUESTS_PER_TASK: Final = 64
"""Most consume requests in one chunk of the backlog (a pool task runs a chunk's requests in a
row, then sends its failed messages back together)."""
_CHUNK_TARGET_S: Final = 0.002
"""A chunk holds at least as many messages as the listener runs in this long, by its measured
durations, seconds: a fast listener runs many messages per task (see
:meth:`ConcurrentConsumption.submit`)."""
_DURATION_WEIGHT: Final = 0.25
"""The weight of a chunk's measured listener durations in their moving average."""
_EXPIRY_CHECK_S: Final = 1.0
"""How often, at most, messages in listeners are checked against ``consume_timeout``, s."""


class ConcurrentConsumption(Consumption[ConsumeConcurrentlyContext]):
    """Runs a concurrent listener (or a callable) on many threads at once."""

    orderly: ClassVar[bool] = False
    _LISTENER_RAISED: ClassVar[str] = "listener raised on %s: RECONSUME_LATER"
    _BATCH_LISTENER: ClassVar[type[BatchListener]] = MessageListenerConcurrently

    _next_expiry_check = 0.0
    """When :meth:`expire_overdue` looks next (monotonic seconds)."""

    def __init__(self, context: ConsumerContext, quarantine: Quarantine) -> None:
        super().__init__(context, quarantine)
        self._backlog: deque[tuple[ProcessQueue, list[MessageExt]]] = deque()
        """Chunks of messages not taken by a pool thread yet, oldest first."""
        self._drainers = 0
        """Pool tasks taking chunks from the backlog now (at most ``consume_thread_count``)."""
        self._drainers_lock = threading.Lock()
        self._per_message_s = 0.0
        """How long a per-message listener call takes, a moving average (s; 0: not measured
        yet, or a batch listener): sizes the chunks (see :meth:`submit`)."""
        self._one_by_one = OneByOne(
            context, self.policy, consume_requests=self._consume_requests, measured=self._measured
        )
        self._path = PathChoice(context.settings.consume_inline_threshold_us / 1e6)
        """Where the listener runs: the poll thread or the pool (by its measured times)."""
        self._here: list[tuple[ProcessQueue, list[MessageExt]]] = []
        """What :meth:`receive` kept for the poll thread (poll thread only)."""

    def _measured(self, spent: float) -> None:
        """Add ``spent``, a chunk's listener time per message (s), to the moving average."""
        average = self._per_message_s
        self._per_message_s = (
            spent if average <= 0 else average + _DURATION_WEIGHT * (spent - average)
        )
        self._note_path(spent)

    def _note_path(self, spent: float) -> None:
        """Add ``spent`` (s a message) to the path's estimate; log a change of path."""
        path = self._path
        was = path.inline
        if path.note(spent) != was:
            logger.info(
                "push consumer %s: the listener runs on %s (%.1f us a message)",
                self._context.group,
                "the poll thread" if path.inline else "the listener threads",
                path.estimate_s * 1e6,
            )

    # --- the poll thread's path -----------------------------------------------------------
    def may_run_here(self) -> bool:
        return self._path.threshold_s > 0

    def receive(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Keep ``msgs`` for the poll thread when the listener is measured fast (run after
        the poll by :meth:`run_here`), else queue them for the pool (:meth:`submit`)."""
        if self._path.inline:
            self._here.append((pq, msgs))
        else:
            self.submit(pq, msgs)

    def taken_here(self) -> list[tuple[ProcessQueue, list[MessageExt]]]:
        here, self._here = self._here, []
        return here

    def run_here(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Run ``msgs`` on the calling thread (the poll thread) as a pool task runs a chunk:
        the same consume requests, bookkeeping and batched send-back of the failures."""
        self._consume_chunk(pq, msgs)

    def held_too_long(self, held_s: float) -> None:
        self._path.held_too_long(held_s)
        logger.warning(
            "push consumer %s: the listener held the poll thread %.1f s; it runs on the "
            "listener threads until measured fast again",
            self._context.group,
            held_s,
        )

    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Cut ``msgs`` into chunks small enough to keep every thread busy and large enough
        for a fast listener to run many messages per task, and queue the chunks for the pool
        threads. A chunk is run as consume requests of up to ``consume_message_batch_max_size``
        messages of one topic each (see :meth:`_consume_chunk`).

        A pool task takes chunks one after another until none is left, so a thread goes on
        with the next chunk without waiting to be handed it (with the GIL, every hand-over
        between threads costs a switch interval, 5 ms, when the others are busy: a task per
        chunk made the poll thread and the listeners wait for each other); tasks are added
        while there are more chunks waiting than tasks taking them, up to
        ``consume_thread_count``.

        A chunk takes at least its share of ``msgs`` among the threads, and at least as many
        messages as the listener runs in :data:`_CHUNK_TARGET_S` by the durations measured so
        far (at most :data:`_MAX_REQUESTS_PER_TASK` requests): a slow listener (or one not
        measured yet) gets every thread, a fast one few tasks of many messages each."""
        settings = self._context.settings
        size = settings.consume_message_batch_max_size
        count = len(msgs)
        requests = -(-count // size)
        share = -(-requests // settings.consume_thread_count)
        per_message_s = self._per_message_s
        worth = 1 if per_message_s <= 0 else int(_CHUNK_TARGET_S / (per_message_s * size)) + 1
        per_task = min(_MAX_REQUESTS_PER_TASK, max(share, worth)) * size
        backlog = self._backlog
        if per_task >= count:
            backlog.append((pq, msgs))
        else:
            for i in range(0, count, per_task):
                backlog.append((pq, msgs[i : i + per_task]))
        self._add_drainers()

    def _add_drainers(self) -> None:
        """Start pool tasks for the chunks waiting, up to ``consume_thread_count`` running."""
        limit = self._context.settings.consume_thread_count
        with self._drainers_lock:
            added = min(limit - self._drainers, len(self._backlog))
            if added <= 0:
                return
            self._drainers += added
        pool = self._context.pool
        for started in range(added):
            try:
                pool.submit(self._drain)
            except BaseException:  # the pool is shut down: the consumer stops
                with self._drainers_lock:
                    self._drainers -= added - started
                raise

    def _drain(self) -> None:
        """A pool task: run the backlog's chunks, oldest first, until none is left."""
        backlog = self._backlog
        try:
            while True:
                try:
                    pq, msgs = backlog.popleft()
                except IndexError:
                    with self._drainers_lock:
                        if backlog:
                            continue  # queued after the look: submit() counted this task
                        self._drainers -= 1
                        return
                self._consume_chunk(pq, msgs)
        except BaseException:  # _consume_requests handles what it can (SystemExit, ...)
            with self._drainers_lock:
                self._drainers -= 1
            # The chunks still queued must not wait for the next submit(): another task runs
            # them (unless the pool is shut down, then the consumer stops anyway).
            with contextlib.suppress(BaseException):
                self._add_drainers()
            raise

    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self.submit(pq, msgs)

    def expire_overdue(self, queues: Iterable[ProcessQueue]) -> None:
        """RocketMQ's ``cleanExpireMsg``, at most every :data:`_EXPIRY_CHECK_S`: a message in
        its listener for longer than ``consume_timeout`` is sent back for retry at delay level
        3 (dropped, BROADCASTING), so its offset can be committed past; its listener's late
        result will not count. The messages of its chunk that its task had not started are
        queued for other tasks (that task, should its call return, stops there). See
        :func:`~bridge.consumer.overdue.send_back_overdue`."""
        now = time.monotonic()
        if now < self._next_expiry_check:
            return
        settings = self._context.settings
        self._next_expiry_check = now + min(_EXPIRY_CHECK_S, settings.consume_timeout * 60)
        for pq in list(queues):
            if not pq.dropped:
                send_back_overdue(
                    pq,
                    now,
                    timeout_min=settings.consume_timeout,
                    policy=self.policy,
                    resubmit=self.submit,
                    group=self._context.group,
                )

    def _consume_chunk(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Run a chunk of ``pq``'s messages: one by one through a per-message listener (one
        message per request, no spans recorded: :class:`~bridge.consumer.one_by_one.OneByOne`),
        else as consume requests (:meth:`_consume_requests`)."""
        if self._context.settings.consume_message_batch_max_size == 1 and not tracing_active():
            self._one_by_one.run(pq, msgs)
            return
        size = self._context.settings.consume_message_batch_max_size
        began = time.monotonic()
        requests: list[list[MessageExt]] = []
        batch: list[MessageExt] = []
        for msg in msgs:
            if batch and (len(batch) >= size or batch[0].topic != msg.topic):
                requests.append(batch)
                batch = []
            batch.append(msg)
        if batch:
            requests.append(batch)
        self._consume_requests(pq, requests)
        # Batch listeners (and spans) too: the path follows their time a message.
        if msgs:
            self._note_path((time.monotonic() - began) / len(msgs))

    def _consume_requests(
        self,
        pq: ProcessQueue,
        requests: list[list[MessageExt]],
        *,
        begun: bool = False,
        run: Run | None = None,
    ) -> None:
        """Run the listener on each request, marking what it consumed done at once (so the
        commit follows a slow listener), then send every failed message back together. A
        request whose handling fails unexpectedly is consumed again later and never costs the
        task's other requests. ``begun``: the caller counted the task (:meth:`ProcessQueue.begin`)
        and ends it. ``run``: the caller's run, which holds the chunk's unstarted messages;
        else the requests not started are held by a run of their own. Either way, when the
        consume timeout takes a call's messages, those go to another task."""
        if not begun and not pq.begin():
            return  # revoked or stopping: the messages stay uncommitted for the next owner
        failed: list[MessageExt] = []
        levels: list[int] = []
        pending = iter(requests)
        owned = run is None
        if run is None:
            run = Run()
            run.requests = pending  # shared with the consume timeout (see Run)
            run.failed, run.levels = failed, levels
        try:
            for msgs in pending:
                if pq.dropped:
                    break  # what is left stays held: redelivered to the next owner
                self._consume_request(pq, msgs, failed, levels, run)
            try:
                self.policy.fail(pq, failed, levels)
            except Exception:
                logger.exception(
                    "push consumer %s: handling %d failed messages; consuming them again later",
                    self._context.group,
                    len(failed),
                )
                self.policy.retry_locally(pq, [m for m in failed if pq.holds(m.queue_offset)])
        except Exception:
            logger.exception("push consumer %s: consume request failed", self._context.group)
        except BaseException:
            # Escaping the task (as in OneByOne.run, which handles its own run): the
            # messages of the call it escaped from stay in that call (consume_timeout sends
            # them back), the failed and unstarted messages run again.
            if owned:
                with contextlib.suppress(Exception):
                    unstarted = [m for msgs in pending for m in msgs]
                    back = pq.withdraw_run(run, failed + unstarted)
                    if back:
                        self.policy.retry_locally(pq, back)
            raise
        finally:
            if not begun:
                pq.end()

    def _consume_request(
        self,
        pq: ProcessQueue,
        msgs: list[MessageExt],
        failed: list[MessageExt],
        levels: list[int],
        run: Run,
    ) -> None:
        """Run the listener on ``msgs``, a call of ``run``: mark what it consumed done and add
        the rest, with their delay levels, to ``failed`` and ``levels``. If this goes wrong,
        the messages not yet accounted for are handed back (consumed again after
        ``send_back_retry_delay_ms``) instead of staying held, and in their listener call, for
        ever."""
        call = Call(run)
        pq.start(call, msgs, time.monotonic())
        settled: set[int] | None = None
        added = 0
        try:
            sub = self._context.subscriptions.get(msgs[0].topic)
            if sub is None:
                # A retry of a topic no longer subscribed to: keep it, in the DLQ.
                logger.warning(
                    "push consumer %s: no subscription for %s; %d messages go to the DLQ",
                    self._context.group,
                    msgs[0].topic,
                    len(msgs),
                )
                record_failure(msgs, Failure.NO_SUBSCRIPTION)
                done, level = 0, -1
            elif isinstance(sub.listener, MessageListenerConcurrently):
                context = ConsumeConcurrentlyContext(MessageQueue(msgs[0].topic, pq.partition))
                done = self._call_listener(sub.listener, msgs, context)
                level = self._delay_level(context, msgs) if done < len(msgs) else 0
            else:
                # A callable (subscribe() refuses an orderly listener here) has no context to
                # set: its failures take the default level.
                callback = cast(MessageCallback, sub.listener)
                done = leading_successes(callback, msgs, self._context.group)
                level = 0
            head, tail = msgs[:done], msgs[done:]
            settled = pq.settle(call, msgs)
            if len(settled) < len(msgs):
                # Sent back past consume_timeout, or the partition was given up.
                logger.warning(
                    "push consumer %s: ignoring the late listener result for %s",
                    self._context.group,
                    [m.msg_id for m in msgs if m.queue_offset not in settled],
                )
                head = [m for m in head if m.queue_offset in settled]
                tail = [m for m in tail if m.queue_offset in settled]
            if head:
                self._context.counters.add(Count.CONSUMED, len(head))
                pq.remove(m.queue_offset for m in head)
            failed += tail
            added = len(tail)
            levels += [level] * len(tail)
        except EventLoopClosedError:
            # Not run, not a failure: the messages stay held (uncommitted) for the next owner;
            # the asyncio client is shutting down.
            pq.withdraw(call, msgs)
        except Exception:
            if settled is None:
                back = pq.withdraw(call, msgs)
            else:
                accounted = {id(m) for m in failed[len(failed) - added :]}
                back = [
                    m
                    for m in msgs
                    if m.queue_offset in settled
                    and id(m) not in accounted
                    and pq.holds(m.queue_offset)
                ]
            logger.exception(
                "push consumer %s: handling the listener result for %s failed; consuming %d "
                "of them again later",
                self._context.group,
                [m.msg_id for m in msgs],
                len(back),
            )
            if back:
                self.policy.retry_locally(pq, back)

    def _delay_level(self, context: ConsumeConcurrentlyContext, msgs: list[MessageExt]) -> int:
        return delay_level(context, msgs, self._context.group)

    def _consume_batch(
        self, listener: BatchListener, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> int:
        return batch_consumed(listener, msgs, context, self._context.group)
