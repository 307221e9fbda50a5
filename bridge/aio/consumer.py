"""The asyncio ``PushConsumer``: listeners that may be ``async def``.

A front over the threaded :class:`bridge.consumer.PushConsumer`, which keeps every rule of
consumption: the fetcher (poll, flow control, rebalances, commits), the process queues (the
committed offset is the smallest message still held), the concurrent and orderly strategies,
the retry policy (retry topic, DLQ, local retries, quarantine), ``consume_timeout`` and the
bounded shutdown. Each listener is wrapped so that, called on a listener thread of the
consumer's pool as in the threaded API, what an ``async def`` listener returns runs on the
event loop while that thread waits (:mod:`bridge.aio.runner`). Hence:

* concurrent: at most ``consume_thread_count`` listeners in flight (one per pool thread);
* orderly: one listener per partition at a time, in offset order;
* a listener task that is cancelled counts as RECONSUME_LATER (orderly: the batch is retried
  in place after the suspension), as an exception does;
* a concurrent listener task still running 2 s past ``consume_timeout`` (its messages were
  sent back, its result is ignored) is cancelled, freeing its pool thread;
* a plain (not ``async``) listener runs on the pool thread, never on the loop;
* with ``key_deserializer``/``value_deserializer``, the messages are deserialized on the pool
  thread before the listener is called (a Schema Registry deserializer's HTTP calls never
  block the loop); a deserializer that raises fails the listener's call as an exception from
  the listener would (retried, then dead-lettered; orderly: retried in place);
* once the loop has ended without :meth:`PushConsumer.shutdown`, the consumer shuts itself
  down (logged as an error) and the messages it still held stay uncommitted, for the group's
  other members: not failed, not sent back (:class:`~bridge.errors.EventLoopClosedError`).

No Kafka call runs on the loop: the poll, the commits and the copies' sends stay on the
consumer's threads. ``confluent_kafka.aio.AIOConsumer`` is not used for that reason too: the
threaded fetcher is what keeps offsets, pauses and rebalances right.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final

from bridge.aio.listeners import AsyncMessageListenerConcurrently, AsyncMessageListenerOrderly
from bridge.aio.runner import AsyncClient, LoopRunner, call_listener
from bridge.config import ClientConfig
from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    FilterExpression,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
)
from bridge.consumer.push_consumer import PushConsumer as ThreadedPushConsumer
from bridge.lifecycle import ServiceState
from bridge.message import MessageExt
from bridge.serialization import Deserializer

__all__ = ["PushConsumer"]

_CANCEL_PAST_TIMEOUT_S: Final = 2.0
"""A concurrent listener task still running this long past ``consume_timeout`` is cancelled,
seconds (by then its messages were sent back: the consumer looks every second)."""


def _deserialized(msgs: list[MessageExt]) -> None:
    """Make each message's deserialized value and key now, on this (a pool) thread, so that
    an ``async def`` listener reading them does not run a deserializer on the loop; raises
    the :class:`~bridge.errors.DeserializationError` of the first that fails."""
    for msg in msgs:
        if getattr(msg, "_pending", None) is not None:
            msg._deserialize()


class _Concurrently(MessageListenerConcurrently):
    """A concurrent batch listener whose ``consume_message`` may be ``async def``."""

    def __init__(
        self,
        listener: MessageListenerConcurrently | AsyncMessageListenerConcurrently,
        runner: LoopRunner,
        cancel_after_s: float | None = None,
    ) -> None:
        self.listener = listener
        self._runner = runner
        self._cancel_after_s = cancel_after_s

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        consume = self.listener.consume_message
        _deserialized(msgs)
        status: ConsumeStatus = call_listener(
            self._runner,
            lambda: consume(msgs, context),
            ConsumeStatus.RECONSUME_LATER,
            cancel_after_s=self._cancel_after_s,
        )
        return status


class _Orderly(MessageListenerOrderly):
    """An orderly batch listener whose ``consume_message`` may be ``async def``."""

    def __init__(
        self, listener: MessageListenerOrderly | AsyncMessageListenerOrderly, runner: LoopRunner
    ) -> None:
        self.listener = listener
        self._runner = runner

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        consume = self.listener.consume_message
        _deserialized(msgs)
        status: ConsumeOrderlyStatus = call_listener(
            self._runner,
            lambda: consume(msgs, context),
            ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
        )
        return status


class _PerMessage:
    """A per-message callable that may be ``async def``."""

    __slots__ = ("_cancel_after_s", "_runner", "listener")

    def __init__(
        self,
        listener: Callable[[MessageExt], Any],
        runner: LoopRunner,
        cancel_after_s: float | None = None,
    ) -> None:
        self.listener = listener
        self._runner = runner
        self._cancel_after_s = cancel_after_s

    def __call__(self, msg: MessageExt) -> ConsumeStatus | ConsumeOrderlyStatus | None:
        listener = self.listener
        _deserialized([msg])
        status: ConsumeStatus | ConsumeOrderlyStatus | None = call_listener(
            self._runner,
            lambda: listener(msg),
            ConsumeStatus.RECONSUME_LATER,
            cancel_after_s=self._cancel_after_s,
        )
        return status


def on_loop(listener: object, runner: LoopRunner, cancel_after_s: float | None = None) -> object:
    """``listener`` wrapped to run what it returns on ``runner``'s loop, of the same kind
    (batch concurrent, batch orderly, per message); anything else as it is (the threaded
    ``subscribe`` refuses it with its own error). ``cancel_after_s``: a concurrent listener's
    task still running after this long (seconds) is cancelled."""
    if isinstance(listener, MessageListenerOrderly | AsyncMessageListenerOrderly):
        return _Orderly(listener, runner)
    if isinstance(listener, MessageListenerConcurrently | AsyncMessageListenerConcurrently):
        return _Concurrently(listener, runner, cancel_after_s)
    if callable(listener):
        return _PerMessage(listener, runner, cancel_after_s)
    return listener


class PushConsumer(AsyncClient):
    """RocketMQ's push consumer for asyncio code.

    ``consumer = PushConsumer("group", bootstrap_servers=...)``,
    ``consumer.subscribe(topic, listener, "TagA || TagB")``, then ``async with consumer:``.
    Arguments, settings and listener kinds are those of :class:`bridge.PushConsumer`; a
    listener (a callable, or ``consume_message`` of a listener object) may be ``async def``.
    """

    def __init__(
        self,
        group: str,
        *,
        message_model: MessageModel | None = None,
        orderly: bool = False,
        fifo: bool = False,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        config: ClientConfig | None = None,
        settings: PushConsumerConfig | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        **options: Any,
    ) -> None:
        self._consumer = ThreadedPushConsumer(
            group,
            message_model=message_model,
            orderly=orderly,
            fifo=fifo,
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            config=config,
            settings=settings,
            kafka_config=kafka_config,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            **options,
        )
        self.group = self._consumer.group
        self._runner = LoopRunner(f"push consumer {group}", on_closed=self._consumer.shutdown)
        self._shutting_down: asyncio.Future[None] | None = None
        """The shutdown a listener of this consumer started (see :meth:`shutdown`)."""

    # --- configuration ---------------------------------------------------------------------
    @property
    def threaded(self) -> ThreadedPushConsumer:
        """The threaded consumer underneath."""
        return self._consumer

    @property
    def config(self) -> ClientConfig:
        """Connection and delay settings."""
        return self._consumer.config

    @property
    def settings(self) -> PushConsumerConfig:
        """Consumption settings."""
        return self._consumer.settings

    @property
    def message_model(self) -> MessageModel:
        """CLUSTERING or BROADCASTING."""
        return self._consumer.message_model

    @property
    def orderly(self) -> bool:
        """True if the consumer consumes orderly (see :attr:`bridge.PushConsumer.orderly`)."""
        return self._consumer.orderly

    @property
    def fifo(self) -> bool:
        """True if the consumer is FIFO (see :attr:`bridge.PushConsumer.fifo`)."""
        return self._consumer.fifo

    @property
    def max_reconsume_times(self) -> int:
        """Failures before the DLQ."""
        return self._consumer.max_reconsume_times

    def subscribe(
        self, topic: str, listener: object, expression: str | FilterExpression = "*"
    ) -> None:
        """Consume ``topic`` with ``listener`` (see :meth:`bridge.PushConsumer.subscribe`),
        which may be ``async def``, keeping what ``expression`` selects (a tag expression, or
        a ``MessageSelector.by_sql(...)`` / ``FilterExpression``). Before :meth:`start`.

        Raises :class:`~bridge.errors.FilterExpressionError` for an invalid SQL92 expression."""
        # A concurrent listener past consume_timeout has had its messages sent back (the
        # consumer looks at least every second) and its result will be ignored: its task is
        # cancelled soon after, so that it holds neither a pool thread nor the loop for ever.
        # An orderly or FIFO listener is never timed out (its partition or its message group
        # waits for it).
        cancel_after_s = (
            None
            if self._consumer.orderly or self._consumer.fifo
            else self._consumer.settings.consume_timeout * 60 + _CANCEL_PAST_TIMEOUT_S
        )
        wrapped = on_loop(listener, self._runner, cancel_after_s)
        self._consumer.subscribe(topic, wrapped, expression)  # type: ignore[arg-type]

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The consumer's lifecycle state."""
        return self._consumer.state

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters."""
        return self._consumer.stats()

    @property
    def listeners_running(self) -> int:
        """``async`` listener calls on the loop now (call on the loop)."""
        return self._runner.running

    async def start(self) -> None:
        """:meth:`bridge.PushConsumer.start` on a worker thread; listener coroutines run on
        the running loop."""
        self._runner.bind(asyncio.get_running_loop())
        await asyncio.to_thread(self._consumer.start)

    async def shutdown(self, timeout_ms: int | None = None) -> None:
        """:meth:`bridge.PushConsumer.shutdown` on a worker thread: stop fetching, let running
        listeners (on the loop, which stays free) finish for up to ``timeout_ms`` (default
        ``drain_timeout_ms``), commit what is done, leave the group. Listener tasks still
        running then are cancelled: the threaded consumer abandoned them already (their
        messages are consumed again by the group, their results ignored). Idempotent.

        If the awaiting task is cancelled, the shutdown goes on to its end all the same.
        Awaited in one of this consumer's own listeners, it starts the shutdown and returns at
        once: the shutdown waits for that listener too, which could not return before it.
        """
        done = asyncio.ensure_future(asyncio.to_thread(self._consumer.shutdown, timeout_ms))
        done.add_done_callback(lambda _: self._runner.cancel_all())
        if self._runner.runs_current_task():
            self._shutting_down = done  # a reference, so the running shutdown is not collected
            return
        await asyncio.shield(done)
