"""Running a chunk of messages one by one through per-message listeners: :class:`OneByOne`,
the fast path of :class:`~bridge.consumer.concurrent.ConcurrentConsumption` when each consume
request holds one message (``consume_message_batch_max_size == 1``) and no span is recorded.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol, cast

from bridge.consumer.consumption import (
    Failure,
    record_failure,
    restore,
    status_failure,
)
from bridge.consumer.context import ConsumerContext, MessageCallback
from bridge.consumer.counters import Count
from bridge.consumer.model import (
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
)
from bridge.consumer.process_queue import ProcessQueue, Run
from bridge.consumer.retry_policy import RetryPolicy
from bridge.errors import EventLoopClosedError
from bridge.message import MessageExt

# A part of the concurrent strategy: its records go where the strategy's go.
logger = logging.getLogger("bridge.consumer.concurrent")

_SETTLE_S: Final = 0.01
"""A task running messages one by one marks those consumed done at least this often, seconds
(so the commit follows a slow listener)."""


class ConsumeRequests(Protocol):
    """:meth:`~bridge.consumer.concurrent.ConcurrentConsumption._consume_requests`."""

    def __call__(
        self,
        pq: ProcessQueue,
        requests: list[list[MessageExt]],
        *,
        begun: bool = ...,
        run: Run | None = ...,
    ) -> None: ...


class OneByOne:
    """Runs chunks of messages one by one for ``context``'s consumer: failures go to
    ``policy``, a message of a batch listener to ``consume_requests``, and each chunk's
    listener time per message (s) to ``measured``."""

    def __init__(
        self,
        context: ConsumerContext,
        policy: RetryPolicy,
        *,
        consume_requests: ConsumeRequests,
        measured: Callable[[float], None],
    ) -> None:
        self._context = context
        self.policy = policy
        self._consume_requests = consume_requests
        self._measured = measured

    def run(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Run ``msgs`` one by one, each a request of its own, with the bookkeeping done per
        chunk rather than per message (:class:`~bridge.consumer.process_queue.Run`): the queue
        learns which message is in the listener by one assignment, and what was consumed is
        marked done in one step before the next call once :data:`_SETTLE_S` passed (so the
        commit follows a slow listener), and at the end. A message of a batch listener
        (``MessageListenerConcurrently``) or of a topic no longer subscribed goes through
        ``consume_requests`` alone. Failures are sent back together at the end, as
        ``consume_requests`` does."""
        if not pq.begin():
            return  # revoked or stopping: the messages stay uncommitted for the next owner
        run = pq.open_run()
        # Shared with the consume timeout, which takes what is left to run it elsewhere.
        run.messages = pending = iter(msgs)
        consumed = run.consumed
        failed: list[MessageExt] = []
        run.failed = failed  # shared with the consume timeout (see Run)
        index = 0
        group = self._context.group
        try:
            subscriptions = self._context.subscriptions
            monotonic = time.monotonic
            topic: str | None = None
            callback: MessageCallback | None = None
            began = settled_at = monotonic()
            for msg in pending:
                if pq.dropped:
                    break  # what is left stays held: redelivered to the next owner
                if msg.topic != topic:
                    topic = msg.topic
                    sub = subscriptions.get(topic)
                    callback = (
                        None
                        if sub is None or isinstance(sub.listener, MessageListenerConcurrently)
                        else cast(MessageCallback, sub.listener)
                    )
                if callback is None:
                    run.current = None  # the last callable's message is consumed, not in a call
                    index += 1
                    self._consume_requests(pq, [[msg]], begun=True, run=run)
                    continue
                now = monotonic()
                if now - settled_at >= _SETTLE_S and len(consumed) > run.settled:
                    settled_at = now
                    self._count_done(pq, run)
                run.current = (msg, now, len(consumed))
                place = (topic, msg.kafka_topic, msg.queue_id, msg.queue_offset)
                try:
                    result = callback(msg)
                except EventLoopClosedError:
                    # Not run, not a failure: it and the rest stay held (uncommitted) for
                    # the next owner; the asyncio client is shutting down.
                    break
                except Exception as exc:
                    logger.warning("listener raised on %s: a failure", msg.msg_id, exc_info=True)
                    record_failure([msg], Failure.EXCEPTION, exc)
                    failed.append(msg)
                else:
                    # Either enum's success, as leading_successes takes them.
                    if (
                        result is ConsumeStatus.CONSUME_SUCCESS
                        or result is ConsumeOrderlyStatus.SUCCESS
                    ):
                        consumed.append(msg)
                    else:
                        record_failure([msg], status_failure(result, msg.msg_id))
                        failed.append(msg)
                finally:
                    if (msg.topic, msg.kafka_topic, msg.queue_id, msg.queue_offset) != place:
                        restore([msg], [place], group)
                index += 1
            run.current = None
            if index:
                self._measured((monotonic() - began) / index)
            failed = self._count_done(pq, run, failed)
            try:
                self.policy.fail(pq, failed, [0] * len(failed))
            except Exception:
                logger.exception(
                    "push consumer %s: handling %d failed messages; consuming them again later",
                    group,
                    len(failed),
                )
                self.policy.retry_locally(pq, [m for m in failed if pq.holds(m.queue_offset)])
        except Exception:
            # Whatever was not accounted for is consumed again later, never held for ever.
            back = pq.withdraw_run(run, consumed[run.settled :] + failed + msgs[index:])
            logger.exception(
                "push consumer %s: handling the listener results of %d messages failed; "
                "consuming %d of them again later",
                group,
                len(msgs),
                len(back),
            )
            if back:
                self.policy.retry_locally(pq, back)
        except BaseException:
            # Escaping the task (SystemExit, a cancellation): what was consumed is done, the
            # message in the listener stays in a call (consume_timeout sends it back, as for a
            # call that never returns), and the chunk's failed and unrun messages run again.
            current = run.current
            run.current = None
            with contextlib.suppress(Exception):
                self._count_done(pq, run)
                if current is not None:
                    pq.start(object(), [current[0]], current[1])
                after = index + 1 if current is not None else index
                back = pq.withdraw_run(run, failed + msgs[after:])
                if back:
                    self.policy.retry_locally(pq, back)
            raise
        finally:
            run.current = None
            pq.close_run(run)
            pq.end()

    def _count_done(
        self, pq: ProcessQueue, run: Run, failed: list[MessageExt] | None = None
    ) -> list[MessageExt]:
        """Mark what ``run`` consumed done and count it (:meth:`ProcessQueue.finish`); return
        those of ``failed`` whose results still count. Late results ignored (taken past
        ``consume_timeout``, or the partition given up) are logged."""
        ignored = run.ignored
        kept = pq.finish(run, failed or [])
        done = run.done
        if done > run.counted:
            self._context.counters.add(Count.CONSUMED, done - run.counted)
            run.counted = done
        if run.ignored > ignored:
            logger.warning(
                "push consumer %s: ignoring the late listener results for %d messages of %s[%d]",
                self._context.group,
                run.ignored - ignored,
                pq.topic,
                pq.partition,
            )
        return kept
