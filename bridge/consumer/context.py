"""What the parts of a push consumer share: its group and settings, its subscriptions, its
counters and scheduler and, once it is started, the producer of copies and the listener
threads."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from bridge.client.sender import RecordSender
from bridge.config import ClientConfig
from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.counters import Counters
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    SubscriptionFilter,
)
from bridge.consumer.scheduler import Scheduler
from bridge.errors import IllegalStateError
from bridge.message import MessageExt
from bridge.observability.metrics import BridgeMetrics
from bridge.serialization import Deserializers
from topics.catalog import TopicCatalog

MessageCallback = Callable[[MessageExt], ConsumeStatus | ConsumeOrderlyStatus | None]
"""A per-message listener, as in RocketMQ's Python client."""
Listener = MessageListenerConcurrently | MessageListenerOrderly | MessageCallback


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscribed topic (RocketMQ and Kafka names), its filter (tags, or a compiled SQL92
    expression) and its listener."""

    topic: str
    kafka_topic: str
    filter: SubscriptionFilter
    listener: Listener


class ConsumerContext:
    """The state every part of one push consumer reads."""

    __slots__ = (
        "catalog",
        "config",
        "counters",
        "deadline",
        "deserializers",
        "executor",
        "group",
        "producer",
        "scheduler",
        "settings",
        "subscriptions",
    )

    def __init__(self, group: str, config: ClientConfig, settings: PushConsumerConfig) -> None:
        self.group = group
        self.config = config
        self.settings = settings
        self.catalog: TopicCatalog = config.catalog()
        self.subscriptions: dict[str, Subscription] = {}
        """By RocketMQ topic name."""
        self.counters = Counters(group, config.namespace)
        self.scheduler = Scheduler(group)
        self.producer: RecordSender | None = None
        """The producer of copies (send-backs, quarantine), once started."""
        self.executor: ThreadPoolExecutor | None = None
        """The listener threads, once started."""
        self.deadline = math.inf
        """When shutdown must be done (monotonic seconds); no wait goes past it."""
        self.deserializers = Deserializers(None, None)
        """The consumer's key and value deserializers (none by default)."""

    @property
    def broadcasting(self) -> bool:
        """True in BROADCASTING mode (failures are dropped, offsets are the instance's)."""
        return self.settings.message_model is MessageModel.BROADCASTING

    @property
    def sender(self) -> RecordSender:
        """The producer of copies, once started."""
        if self.producer is None:
            raise IllegalStateError(f"push consumer {self.group} is not started")
        return self.producer

    def flush_copies(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` (ms) for the copies in flight; return how many are still
        unacknowledged.

        The producer's flush waits for the copies it sent again alone too
        (:meth:`RecordSender.flush`), and the reports it serves may send a copy on (to quarantine):
        flushed again until nothing is in flight, so no copy is still being written when the
        offsets are committed."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            remaining = self.sender.flush(_left_ms(deadline))
            if remaining == 0:
                remaining = self.sender.flush(0)  # what the last reports sent on
            if remaining == 0 or time.monotonic() >= deadline:
                return remaining

    def close_producers(self, timeout_ms: int) -> None:
        """Shut the producer of copies down (with the one it sends copies again alone
        through), waiting up to ``timeout_ms`` (ms)."""
        if self.producer is not None:
            self.producer.shutdown(timeout_ms)

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The listener threads, once started."""
        if self.executor is None:
            raise IllegalStateError(f"push consumer {self.group} is not started")
        return self.executor

    def bounded_ms(self, timeout_ms: int) -> int:
        """``timeout_ms``, cut to what is left before the shutdown deadline, if any (ms)."""
        remaining_s = self.deadline - time.monotonic()
        if remaining_s == math.inf:
            return timeout_ms
        return min(timeout_ms, max(0, math.ceil(remaining_s * 1000)))


_SUCCESS = (ConsumeStatus.CONSUME_SUCCESS, ConsumeOrderlyStatus.SUCCESS)
_Status = TypeVar("_Status")


class _Timing:
    """Records listener calls in ``rocketmq_process_time`` (ms) for one subscription."""

    __slots__ = ("_failure", "_success")

    def __init__(self, metrics: BridgeMetrics, namespace: str, topic: str, group: str) -> None:
        self._success = metrics.process_time.labels(namespace, topic, group, "success")
        self._failure = metrics.process_time.labels(namespace, topic, group, "failure")

    def call(self, listener: Callable[[], _Status]) -> _Status:
        """``listener()``, recorded: a success status is ``success``, anything else (another
        status, an exception) ``failure``."""
        started, ok = time.monotonic(), False
        try:
            status = listener()
            ok = status in _SUCCESS
            return status
        finally:
            (self._success if ok else self._failure).observe((time.monotonic() - started) * 1000)


class _TimedConcurrently(MessageListenerConcurrently):
    def __init__(self, inner: MessageListenerConcurrently, timing: _Timing) -> None:
        self._inner = inner
        self._timing = timing

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        return self._timing.call(lambda: self._inner.consume_message(msgs, context))


class _TimedOrderly(MessageListenerOrderly):
    def __init__(self, inner: MessageListenerOrderly, timing: _Timing) -> None:
        self._inner = inner
        self._timing = timing

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        return self._timing.call(lambda: self._inner.consume_message(msgs, context))


def _timed_callback(callback: MessageCallback, timing: _Timing) -> MessageCallback:
    def timed(msg: MessageExt) -> ConsumeStatus | ConsumeOrderlyStatus | None:
        return timing.call(lambda: callback(msg))

    return timed


def timed_subscription(
    sub: Subscription, metrics: BridgeMetrics, namespace: str, group: str
) -> Subscription:
    """``sub`` with a listener of the same kind that also records each call's duration and
    outcome in ``rocketmq_process_time`` (an exception or a failure status: ``failure``)."""
    timing = _Timing(metrics, namespace, sub.topic, group)
    listener = sub.listener
    wrapped: Listener
    if isinstance(listener, MessageListenerOrderly):
        wrapped = _TimedOrderly(listener, timing)
    elif isinstance(listener, MessageListenerConcurrently):
        wrapped = _TimedConcurrently(listener, timing)
    else:
        wrapped = _timed_callback(listener, timing)
    return dataclasses.replace(sub, listener=wrapped)


def _left_ms(deadline: float) -> int:
    """Milliseconds left before ``deadline`` (a ``time.monotonic()`` value), at least 0."""
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))
