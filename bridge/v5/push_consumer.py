"""RocketMQ 5's ``PushConsumer``: a :class:`MessageListener` consumes each message of the
subscribed topics and answers :class:`ConsumeResult`, over the project's
:class:`bridge.PushConsumer` (its retry topic, dead-letter queue, offsets and bounds).

The listener is called once per message, with the message as a
:class:`~bridge.consumer.simple.MessageView`; SUCCESS consumes it, FAILURE (or an exception,
or any other answer) retries it and, after 16 retries (17 attempts, RocketMQ 5's default),
sends it to ``%DLQ%<group>``: through ``%RETRY%<group>`` at RocketMQ's back-off (10 s, 30 s,
1 min, ...), or, on a FIFO consumer (``fifo=True``), in place after
``suspend_current_queue_time_millis`` (1 s), its message group waiting (``docs/fifo.md``).
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping
from enum import Enum
from typing import Any

from bridge.client_configuration import ClientConfiguration, as_client_config, check_tls_enable
from bridge.config import ClientConfig
from bridge.consumer import PushConsumer as _PushConsumer
from bridge.consumer import PushConsumerConfig
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.model import ConsumeStatus, FilterExpression, subscription_filter
from bridge.consumer.simple import MessageView
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.lifecycle import ServiceState, Startable
from bridge.message import MessageExt

__all__ = ["ConsumeResult", "MessageListener", "PushConsumer", "consume_status"]

logger = logging.getLogger(__name__)


class ConsumeResult(Enum):
    """What a :class:`MessageListener` answers (RocketMQ 5's ``ConsumeResult``)."""

    SUCCESS = 0
    """Consumed."""
    FAILURE = 1
    """Not consumed: delivered again later (through the retry topic, or in place on a FIFO
    consumer), then dead-lettered."""


class MessageListener(abc.ABC):
    """RocketMQ 5's ``MessageListener``: :meth:`consume` is called once per message, on the
    consumer's threads (``consumption_thread_count`` at once)."""

    @abc.abstractmethod
    def consume(self, message: MessageView) -> ConsumeResult:
        """Consume ``message``; an exception counts as FAILURE."""


def consume_status(result: object) -> ConsumeStatus:
    """The :class:`~bridge.ConsumeStatus` a listener's ``result`` stands for: only
    :attr:`ConsumeResult.SUCCESS` consumes the message."""
    if result is ConsumeResult.SUCCESS:
        return ConsumeStatus.CONSUME_SUCCESS
    return ConsumeStatus.RECONSUME_LATER


class PushConsumer(Startable):
    """RocketMQ 5's ``PushConsumer(client_configuration, consumer_group, message_listener,
    subscription)``: ``subscription`` maps topics to a :class:`~bridge.FilterExpression`
    (TAG or SQL92; a tag expression string, or None for every message).

    ``consumption_thread_count`` is how many listener calls run at once (20). RocketMQ 5's
    ``max_cache_message_count`` and ``max_cache_message_size`` (bounds for the whole
    consumer) are taken in their places only to raise
    :class:`~bridge.errors.InvalidArgumentError`: here the bounds are per partition,
    ``pull_threshold_for_queue`` (messages) and ``pull_threshold_size_for_queue`` (MiB).
    ``tls_enable`` is accepted as :class:`bridge.v5.Producer` takes it (TLS is a setting of
    the Kafka connection). ``fifo=True``
    makes the group FIFO (RocketMQ 5 reads that from the group's settings on the broker;
    here it is the consumer's): the messages of a message group one at a time, in order
    (``docs/fifo.md``). Other settings are the fields of :class:`~bridge.PushConsumerConfig`,
    as keyword arguments or ``settings`` (``consume_from_where``, ``max_reconsume_times``,
    ...). :meth:`subscribe` and :meth:`unsubscribe` work before :meth:`startup` (after it,
    a new consumer is needed); a bad expression raises at once
    (:class:`~bridge.errors.FilterExpressionError` names the position)."""

    def __init__(  # noqa: PLR0917 - RocketMQ 5's positional order
        self,
        client_configuration: ClientConfiguration | ClientConfig,
        consumer_group: str,
        message_listener: MessageListener | None = None,
        subscription: Mapping[str, FilterExpression | str | None] | None = None,
        max_cache_message_count: int | None = None,
        max_cache_message_size: int | None = None,
        consumption_thread_count: int | None = None,
        tls_enable: bool | None = None,
        *,
        fifo: bool = False,
        settings: PushConsumerConfig | None = None,
        **options: Any,
    ) -> None:
        config = as_client_config(client_configuration, "client_configuration")
        if config is None:
            raise InvalidArgumentError("a PushConsumer needs a client_configuration")
        for name, value, instead in (
            ("max_cache_message_count", max_cache_message_count, "pull_threshold_for_queue"),
            ("max_cache_message_size", max_cache_message_size, "pull_threshold_size_for_queue"),
        ):
            if value is not None:
                raise InvalidArgumentError(
                    f"PushConsumer({name}={value!r}): RocketMQ 5 bounds the messages a push "
                    f"consumer holds in all; here the bounds are per partition: give {instead}"
                    " as a keyword (docs/consuming.md), or leave this out"
                )
        check_tls_enable(tls_enable, config, "PushConsumer")
        if not isinstance(consumer_group, str) or not consumer_group.strip():
            raise InvalidArgumentError("a PushConsumer needs a consumer_group")
        if message_listener is not None:
            _check_listener(message_listener)
        self._consumer = _PushConsumer(
            consumer_group,
            config=config,
            fifo=fifo,
            settings=settings,
            consume_thread_count=consumption_thread_count,
            **options,
        )
        self._listener = message_listener
        self._subscription: dict[str, FilterExpression | str] = {}
        for topic, expression in (subscription or {}).items():
            self.subscribe(topic, expression)

    @property
    def consumer_group(self) -> str:
        """The consumer group."""
        return self._consumer.group

    @property
    def subscription(self) -> dict[str, FilterExpression | str]:
        """Topic -> its filter, a copy."""
        return dict(self._subscription)

    def subscribe(
        self, topic: str, filter_expression: FilterExpression | str | None = None
    ) -> None:
        """Consume ``topic`` too, the messages ``filter_expression`` selects (None: all).
        Before :meth:`startup`; raises :class:`~bridge.errors.IllegalStateError` after,
        :class:`~bridge.errors.InvalidArgumentError` for a bad topic or expression."""
        self._before_startup("subscribe")
        if not isinstance(topic, str) or not topic:
            raise InvalidArgumentError(f"subscribe: a topic must be a non-empty string: {topic!r}")
        expression = "*" if filter_expression is None else filter_expression
        subscription_filter(expression)  # FilterExpressionError now, not at startup
        self._subscription[topic] = expression

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic`` (unknown topics are ignored). Before :meth:`startup`."""
        self._before_startup("unsubscribe")
        self._subscription.pop(topic, None)

    def _before_startup(self, what: str) -> None:
        if self._consumer.state is not ServiceState.CREATE_JUST:
            raise IllegalStateError(
                f"push consumer {self.consumer_group}: {what} before startup(); a running "
                "consumer's subscriptions are fixed (start a new consumer to change them)"
            )

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between :meth:`startup` and :meth:`shutdown`."""
        return self._consumer.state is ServiceState.RUNNING

    def startup(self) -> None:
        """Join the group and start consuming. Raises
        :class:`~bridge.errors.IllegalStateError` without a listener or a subscription."""
        if self._listener is None:
            raise IllegalStateError(
                f"push consumer {self.consumer_group}: no message_listener was given"
            )
        if not self._subscription:
            raise IllegalStateError(f"push consumer {self.consumer_group}: no subscription")
        for topic, expression in self._subscription.items():
            self._consumer.subscribe(topic, self._consume, expression)
        self._consumer.start()

    def start(self) -> None:
        """:meth:`startup` (the ``start()/stop()`` lifecycle)."""
        self.startup()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop: running listeners get up to ``timeout_ms`` (default ``drain_timeout_ms``)
        to finish, then what is consumed is committed and the group left. Idempotent."""
        self._consumer.shutdown(timeout_ms)

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def stats(self) -> ConsumerStats:
        """A snapshot of the consumer's counters."""
        return self._consumer.stats()

    def _consume(self, msg: MessageExt) -> ConsumeStatus:
        listener = self._listener
        assert listener is not None  # checked by startup()
        result = listener.consume(MessageView(msg))
        if not isinstance(result, ConsumeResult):
            logger.error(
                "push consumer %s: the listener answered %r for %s, not a ConsumeResult: a failure",
                self.consumer_group,
                result,
                msg.msg_id,
            )
        return consume_status(result)

    def __repr__(self) -> str:
        return (
            f"PushConsumer(consumer_group={self.consumer_group!r}, "
            f"topics={sorted(self._subscription)}, {self._consumer.state.value})"
        )


def _check_listener(listener: object) -> None:
    if not callable(getattr(listener, "consume", None)):
        raise InvalidArgumentError(
            f"message_listener must be a MessageListener (a consume(message) method), got "
            f"{type(listener).__name__}"
        )
