"""How held messages reach a listener: what the concurrent, orderly and FIFO strategies share.

:class:`~bridge.consumer.concurrent.ConcurrentConsumption` runs a partition's messages on many
threads at once and sends failures back; :class:`~bridge.consumer.orderly.OrderlyConsumption`
runs each partition one batch at a time and retries a failure in place;
:class:`~bridge.consumer.fifo.FifoConsumption` runs each message group one message at a time
and retries a failure in place. They call listeners the same way
(:meth:`Consumption._call_listener`) and hand failures to one
:class:`~bridge.consumer.retry_policy.RetryPolicy`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import ClassVar, Final, Generic, TypeVar, cast

from bridge.consumer.context import ConsumerContext, Listener, MessageCallback
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    effective_max_reconsume_times,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.consumer.retry_policy import RetryPolicy
from bridge.errors import EventLoopClosedError
from bridge.message import FAILURE_MESSAGE_MAX_BYTES, MessageConst, MessageExt, truncate_utf8
from bridge.tracing import TraceSpan, process_span, tracing_active

logger = logging.getLogger(__name__)

ContextT = TypeVar("ContextT", ConsumeConcurrentlyContext, ConsumeOrderlyContext)
BatchListener = MessageListenerConcurrently | MessageListenerOrderly


_NO_SPAN: contextlib.nullcontext[TraceSpan] = contextlib.nullcontext(TraceSpan())
"""What a listener call runs in without recorded spans (costs nothing)."""


def _span(msgs: list[MessageExt], group: str) -> AbstractContextManager[TraceSpan]:
    """The process span of a listener call on ``msgs`` when OpenTelemetry records spans
    (:func:`bridge.tracing.process_span`), else nothing."""
    return process_span(msgs, group) if tracing_active() else _NO_SPAN


class Failure:
    """The values of ``CONSUME_FAILURE`` the consumer writes that are not a listener status
    (see :class:`bridge.message.MessageConst`)."""

    EXCEPTION: Final = "EXCEPTION"
    NONE: Final = "NONE"
    ACK_INDEX: Final = "ACK_INDEX"
    CONSUME_TIMEOUT: Final = "CONSUME_TIMEOUT"
    NO_SUBSCRIPTION: Final = "NO_SUBSCRIPTION"
    NOT_ACKED: Final = "NOT_ACKED"
    """A :class:`~bridge.SimpleConsumer`'s message not acked within its invisible duration."""


def exception_class_name(exc: BaseException) -> str:
    """``module.QualifiedName`` of ``exc``'s class; builtins by their name alone."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def record_failure(
    msgs: Iterable[MessageExt], failure: str, exc: BaseException | None = None
) -> None:
    """Note on each of ``msgs`` how its listener failed it (``CONSUME_FAILURE``: ``failure``;
    with ``exc``, the exception's class and message, each at most
    :data:`~bridge.message.FAILURE_MESSAGE_MAX_BYTES` bytes), for its retry or DLQ copy to
    carry. A failure without an exception removes what an earlier one noted."""
    if exc is not None:
        cls = truncate_utf8(exception_class_name(exc), FAILURE_MESSAGE_MAX_BYTES)
        try:
            text = truncate_utf8(str(exc), FAILURE_MESSAGE_MAX_BYTES)
        except Exception:  # a __str__ that raises
            text = ""
    for msg in msgs:
        msg.put_system_property(MessageConst.CONSUME_FAILURE, failure)
        if exc is None:
            msg.clear_property(MessageConst.CONSUME_EXCEPTION_CLASS)
            msg.clear_property(MessageConst.CONSUME_EXCEPTION_MESSAGE)
        else:
            msg.put_system_property(MessageConst.CONSUME_EXCEPTION_CLASS, cls)
            msg.put_system_property(MessageConst.CONSUME_EXCEPTION_MESSAGE, text)


def status_failure(status: object, msg_id: str) -> str:
    """``CONSUME_FAILURE`` for a listener that returned ``status`` (not a success) for the
    message ``msg_id`` (the first of its batch); a value that is no status is logged
    (:func:`_warn_not_a_status`)."""
    if not isinstance(status, ConsumeStatus | ConsumeOrderlyStatus):
        _warn_not_a_status(status, msg_id)
    if status is None:
        return Failure.NONE
    name = getattr(status, "name", None)
    return name if isinstance(name, str) else truncate_utf8(repr(status), 100)


Place = tuple[str, str, int, int]
"""Where a held message was read: topic (RocketMQ name), Kafka topic, partition, offset."""


def places(msgs: list[MessageExt]) -> list[Place]:
    """Where each of ``msgs`` was read, taken before a listener call (see :func:`restore`)."""
    return [(m.topic, m.kafka_topic, m.queue_id, m.queue_offset) for m in msgs]


def restore(msgs: list[MessageExt], where: list[Place], group: str) -> None:
    """Put back where ``msgs`` were read (``where``, from :func:`places`) after a listener
    call changed it. The consumer finds a message it holds by its offset, and routes its retry
    by its topic: a listener that set ``queue_offset`` or ``topic`` (the messages are its to
    read, and Python cannot stop it writing) would otherwise leave the message held for ever,
    its partition's committed offset stuck before it, or send its retry to a topic no
    subscription reads."""
    for msg, place in zip(msgs, where, strict=True):
        now = (msg.topic, msg.kafka_topic, msg.queue_id, msg.queue_offset)
        if now != place:
            logger.warning(
                "push consumer %s: the listener changed where the message at %s[%d]@%d was "
                "read (to %r); the consumer keeps the original",
                group,
                place[1],
                place[2],
                place[3],
                now,
            )
            msg.topic, msg.kafka_topic, msg.queue_id, msg.queue_offset = place


def _warn_not_a_status(result: object, msg_id: str) -> None:
    """Log that a listener returned ``result`` (None, True, a string ...) for the message
    ``msg_id``, which is no status: a failure, retried like RECONSUME_LATER. Without it a
    listener returning ``"CONSUME_SUCCESS"`` or ``True`` would have every message retried
    until the DLQ with nothing said before."""
    logger.warning(
        "listener returned %s for %s, which is no ConsumeStatus: a failure",
        truncate_utf8(repr(result), 100),
        msg_id,
    )


def leading_successes(
    callback: MessageCallback,
    msgs: list[MessageExt],
    group: str = "",
    caught: type[BaseException] = Exception,
) -> int:
    """Call a per-message listener on ``msgs`` in order until one fails (a failure status,
    None or an exception of the class ``caught``); return how many succeeded. The failed
    message and those after it (not called) get the failure noted (:func:`record_failure`).
    Each call runs in a process span of ``group`` when OpenTelemetry is installed. Where the
    messages were read is restored after the calls (see :func:`restore`)."""
    where = places(msgs)
    try:
        return _leading_successes(callback, msgs, group, caught)
    finally:
        restore(msgs, where, group)


def _leading_successes(
    callback: MessageCallback, msgs: list[MessageExt], group: str, caught: type[BaseException]
) -> int:
    for index, msg in enumerate(msgs):
        with _span([msg], group) as span:
            try:
                result = callback(msg)
            except EventLoopClosedError:
                # Not run, not a failure: the strategy leaves the messages held. Those
                # consumed before it in this request are consumed again by the next owner.
                raise
            except caught as exc:
                logger.warning("listener raised on %s: a failure", msg.msg_id, exc_info=True)
                span.failed("the listener raised", exc)
                record_failure(msgs[index:], Failure.EXCEPTION, exc)
                return index
            if (
                result is not ConsumeStatus.CONSUME_SUCCESS
                and result is not ConsumeOrderlyStatus.SUCCESS
            ):
                failure = status_failure(result, msg.msg_id)
                span.failed(failure)
                record_failure(msgs[index:], failure)
                return index
    return len(msgs)


class Strategy(abc.ABC):
    """What the fetcher hands a partition's newly held messages to (:meth:`submit`), with the
    one :class:`~bridge.consumer.retry_policy.RetryPolicy` of its consumer: a consumption
    strategy running listeners (:class:`Consumption`), or a
    :class:`~bridge.SimpleConsumer`'s receive buffer."""

    orderly: ClassVar[bool]
    """True for the orderly strategy (an unlimited retry budget unless one is set)."""
    in_place: ClassVar[bool] = False
    """Failures are retried in place, never through the retry topic (orderly and FIFO
    consumption): the group's retry topic is neither read nor written, and a rebalance waits
    up to ``consume_timeout`` for a running listener, so the partition's next owner never
    runs a message while its listener still runs here."""
    _RETRY_AT_ONCE: ClassVar[bool] = False
    """Retry copies go straight to the retry topic, not through the delay levels."""
    expires_while_waiting: ClassVar[bool] = False
    """:meth:`expire_overdue` runs while a rebalance waits for running work too."""
    cooperative: ClassVar[bool] = False
    """The group rebalances incrementally (librdkafka's ``cooperative-sticky``): a rebalance
    takes from a member only the partitions that change owner, so work out on the others
    goes on. Eager (every partition revoked and assigned again) otherwise."""

    def __init__(self, context: ConsumerContext, quarantine: Quarantine) -> None:
        self._context = context
        self.policy = RetryPolicy(
            context,
            quarantine,
            max_reconsume_times=effective_max_reconsume_times(
                context.settings.max_reconsume_times, orderly=self.orderly
            ),
            redeliver=self._redeliver,
            at_once=self._RETRY_AT_ONCE,
        )

    @abc.abstractmethod
    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Take ``msgs``, newly held in ``pq`` in offset order."""

    @abc.abstractmethod
    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Offer held ``msgs`` of ``pq`` again (a local retry is due)."""

    def expire_overdue(self, queues: Iterable[ProcessQueue]) -> None:  # noqa: B027 - a hook
        """Called on each poll with every partition held: act on messages that have been
        out too long. Nothing by default."""

    def released(self, queues: Iterable[ProcessQueue]) -> None:  # noqa: B027 - a hook
        """Called once ``queues`` were given up (a rebalance, lost partitions, a shutdown),
        after the wait for their running work: end what is still out of them. Nothing by
        default (a listener's late result is ignored by its queue)."""

    def inherit(self, pq: ProcessQueue, offset: int, metadata: str) -> None:  # noqa: B027
        """Called when ``pq``'s partition is taken, with the offset it starts at and the
        metadata committed with it (by this strategy's :meth:`commit_metadata` in an earlier
        owner, or by anything else). Nothing by default."""

    def commit_metadata(self, pq: ProcessQueue, offset: int) -> str:
        """The metadata to commit with ``offset`` for ``pq``'s partition; "" by default."""
        return ""

    def commit_wanted(self) -> bool:
        """True to have the poll thread commit at its next poll, before the commit interval
        is up (called there; it clears the wish). False by default."""
        return False

    # --- running on the poll thread (see bridge.consumer.listener_path) -----------------
    def may_run_here(self) -> bool:
        """True if the strategy may run listeners on the poll thread (:meth:`taken_here`):
        the fetcher then watches how long they hold it. False by default."""
        return False

    def receive(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Take ``msgs``, newly held in ``pq`` in offset order, from the poll thread: to run
        there after the poll (:meth:`taken_here`) or elsewhere (:meth:`submit`, the
        default)."""
        self.submit(pq, msgs)

    def taken_here(self) -> list[tuple[ProcessQueue, list[MessageExt]]]:
        """What :meth:`receive` kept for the poll thread since the last call, oldest first
        (each to run with :meth:`run_here`, or :meth:`submit`); none by default."""
        return []

    def run_here(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Run held ``msgs`` of ``pq`` on the calling thread (the poll thread)."""
        self.submit(pq, msgs)

    def held_too_long(self, held_s: float) -> None:  # noqa: B027 - a hook
        """The listener held the poll thread ``held_s`` seconds and its poll loop went on
        on a new thread: run no more there until measured fast again. Nothing by default."""


class Consumption(Strategy, Generic[ContextT]):
    """A consumption strategy: takes a partition's newly held messages (:meth:`submit`) and
    runs the listeners on the consumer's pool."""

    _BATCH_LISTENER: ClassVar[type[BatchListener]]
    """The listener class that takes whole batches here (anything else is a callable)."""
    _LISTENER_RAISED: ClassVar[str]
    """The warning logged when a batch listener raises (``%s``: the message ids)."""
    _CAUGHT: ClassVar[type[BaseException]] = Exception
    """What a listener may raise for it to count as the listener's failure; anything else
    escapes the pool task (the concurrent strategy then leaves the message to
    ``consume_timeout``)."""

    @abc.abstractmethod
    def _consume_batch(
        self, listener: BatchListener, msgs: list[MessageExt], context: ContextT
    ) -> int:
        """Hand ``msgs`` to a batch listener: how many leading messages it consumed, read
        from its status and ``context``, noting on the others why (:func:`record_failure`).
        Raises what the listener raises."""

    def _call_listener(self, listener: Listener, msgs: list[MessageExt], context: ContextT) -> int:
        """Run ``listener`` on ``msgs``: how many leading messages it consumed. A listener
        object of this strategy's kind takes the batch and ``context``; a callable is called
        per message until one fails. An exception counts as a failure of the whole batch
        (logged), except :class:`~bridge.errors.EventLoopClosedError`, raised here: the
        listener did not run, and the caller leaves the messages held (uncommitted, for the
        next owner: the asyncio client is shutting down). The messages not consumed get the
        failure noted (:func:`record_failure`); with OpenTelemetry, each call runs in a
        process span (one per batch). A batch listener gets its own list of the messages, and
        where they were read is restored after it (see :func:`restore`): what it changes
        there cannot hide a message from the consumer."""
        group = self._context.group
        if isinstance(listener, self._BATCH_LISTENER):
            with _span(msgs, group) as span:
                where = places(msgs)
                try:
                    done = self._consume_batch(listener, msgs, context)
                except EventLoopClosedError:
                    raise  # not run, not a failure: the strategy leaves the messages held
                except self._CAUGHT as exc:
                    logger.warning(self._LISTENER_RAISED, [m.msg_id for m in msgs], exc_info=True)
                    span.failed("the listener raised", exc)
                    record_failure(msgs, Failure.EXCEPTION, exc)
                    return 0
                finally:
                    restore(msgs, where, group)
                if done < len(msgs):
                    reason = msgs[done].get_property(MessageConst.CONSUME_FAILURE)
                    span.failed(reason if isinstance(reason, str) else "failed")
                return done
        # subscribe() refuses a listener object of the other kind: this is a callable.
        return leading_successes(cast(MessageCallback, listener), msgs, group, self._CAUGHT)
