"""RocketMQ 5's simple consumer over a Kafka consumer group: ``receive``, ``ack``,
``change_invisible_duration``, with the invisible duration kept by the consumer itself.

The parts are the push consumer's (:mod:`~bridge.consumer.fetcher`,
:mod:`~bridge.consumer.intake`, :mod:`~bridge.consumer.process_queue`,
:mod:`~bridge.consumer.retry_policy`, :mod:`~bridge.consumer.quarantine`), with a receive
buffer and the leases of :mod:`~bridge.consumer.simple` and
:mod:`~bridge.consumer.invisibility` in place of the listener threads. Why consumer groups
and not Kafka's share groups, and what that costs, is in ``docs/simple-consumer.md``.

Guarantees kept here (see ``docs/guarantees.md``): G6, G9, G10, G11.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Final

from bridge.client.sender import RecordSender
from bridge.client_configuration import (
    ClientConfiguration,
    as_client_config,
    check_tls_enable,
)
from bridge.config import ClientConfig
from bridge.consumer.config import (
    MAX_INVISIBLE_DURATION_S,
    SimpleConsumerConfig,
    apply_group_kafka_config,
    shared_settings,
)
from bridge.consumer.context import ConsumerContext, Subscription
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.fetcher import Fetcher
from bridge.consumer.invisibility import check_duration
from bridge.consumer.model import (
    ConsumeStatus,
    FilterExpression,
    subscription_filter,
)
from bridge.consumer.quarantine import Quarantine
from bridge.consumer.simple import MessageView, SimpleConsumption
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka_config import apply_kafka_config, pick_hook, read_kafka_config
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import MessageExt
from bridge.serialization import Deserializer, Deserializers
from bridge.settings import require_int
from topics.catalog import SystemTopic
from topics.naming import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    to_kafka_topic,
    validate_user_group,
)

__all__ = ["MessageView", "SimpleConsumer"]

logger = logging.getLogger(__name__)

DEFAULT_AWAIT_DURATION_S: Final = 20
"""How long ``receive`` waits for a message by default, seconds (RocketMQ 5's Python
client's ``await_duration``)."""
_COPY_LINGER_MS: Final = 50
"""The producer of copies batches them for at least this long, ms: only the expired message
waits on its copy (as the push consumer's, see ``push_consumer._COPY_LINGER_MS``)."""


def _never_called(msg: MessageExt) -> ConsumeStatus:  # pragma: no cover - never called
    """The listener slot of a simple consumer's subscriptions: messages are received, not
    pushed, so nothing calls it."""
    raise IllegalStateError("a simple consumer has no listener")


class SimpleConsumer(Startable):
    """RocketMQ 5's ``SimpleConsumer``: the application pulls messages with :meth:`receive`,
    acks each with :meth:`ack` within its invisible duration, or lets it come back.

    ``SimpleConsumer(client_configuration, consumer_group, subscription, await_duration)``
    as in RocketMQ 5's Python client: ``client_configuration`` is a
    :class:`bridge.v5.ClientConfiguration` or a :class:`~bridge.ClientConfig` (None:
    ``ClientConfig()``'s defaults, with ``bootstrap_servers`` and ``namespace`` given here;
    :meth:`ClientConfig.from_env <bridge.ClientConfig.from_env>` reads the environment),
    ``subscription`` maps topics to a
    :class:`~bridge.FilterExpression` (TAG or SQL92) or a tag expression, and
    ``await_duration`` is how long :meth:`receive` waits for a message, seconds. Settings are
    the fields of :class:`SimpleConsumerConfig`, as keyword arguments or ``settings``.
    RocketMQ 5's ``tls_enable`` (fifth) is accepted as :class:`bridge.v5.Producer` takes it:
    TLS is a setting of the Kafka connection, so True raises
    :class:`~bridge.errors.InvalidArgumentError` unless the configuration connects over TLS.
    :meth:`startup` (or :meth:`start`, or ``with``) joins the group; :meth:`shutdown` leaves
    it.

    Semantics (``docs/simple-consumer.md``): each message received is invisible to the group
    for its invisible duration; :meth:`ack` ends it; :meth:`change_invisible_duration` moves
    its deadline. Not acked in time, it comes back to the group with ``delivery_attempt`` one
    more (a copy in ``%RETRY%<group>``), and after ``max_delivery_attempts`` deliveries goes
    to ``%DLQ%<group>``, body and properties as they were. Offsets are committed only up to
    the first message not yet acked or sent back, so a crash redelivers, never skips.
    Consumers of one group share the partitions; :meth:`receive`, :meth:`ack` and
    :meth:`change_invisible_duration` may be called from any threads at once.

    Kafka's conventions: ``kafka_config`` (a confluent-kafka config dict), and
    ``key_deserializer``/``value_deserializer``, as for :class:`~bridge.PushConsumer`; the
    deserialized value is :attr:`MessageView.value`, made on the first read.
    """

    def __init__(
        self,
        client_configuration: ClientConfiguration | ClientConfig | None = None,
        consumer_group: str | None = None,
        subscription: Mapping[str, FilterExpression | str] | None = None,
        await_duration: float = DEFAULT_AWAIT_DURATION_S,
        tls_enable: bool | None = None,
        *,
        kafka_config: Mapping[str, Any] | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        settings: SimpleConsumerConfig | None = None,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        **options: Any,
    ) -> None:
        given_config = as_client_config(client_configuration, "client_configuration")
        if not isinstance(consumer_group, str) or not consumer_group.strip():
            raise InvalidArgumentError("a simple consumer needs a consumer_group")
        parts = read_kafka_config(kafka_config)
        client = apply_kafka_config(given_config or ClientConfig(), parts).replace(
            bootstrap_servers=bootstrap_servers, namespace=namespace
        )
        check_tls_enable(tls_enable, client, "SimpleConsumer")
        self.consumer_group = validate_user_group(consumer_group, client.namespace)
        for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
            if consumer_group.startswith(prefix):
                raise InvalidArgumentError(
                    f"consumer group {consumer_group!r} may not start with {prefix}"
                )
        settings = settings or SimpleConsumerConfig()
        apply_group_kafka_config(consumer_group, parts, options, settings.consume_from_where)
        self.settings = settings.replace(**options)
        """The consumer's :class:`SimpleConsumerConfig`."""
        self.await_duration = check_duration(
            "await_duration", await_duration, MAX_INVISIBLE_DURATION_S
        )
        """How long :meth:`receive` waits for a message, seconds."""
        self._lifecycle = Lifecycle(f"simple consumer {consumer_group}")
        self._context = ConsumerContext(self.consumer_group, client, shared_settings(self.settings))
        self._context.deserializers = Deserializers(
            pick_hook(parts, "key.deserializer", key_deserializer),
            pick_hook(parts, "value.deserializer", value_deserializer),
        )
        self._quarantine = Quarantine(self._context)
        self._consumption = SimpleConsumption(
            self._context, self._quarantine, self.settings.max_unacked_messages
        )
        self._topic_names: dict[str, str] = {}
        """Kafka topic -> RocketMQ name of each topic read (the retry topic too, once started);
        read by the fetcher, changed under the state lock."""
        self._fetcher: Fetcher | None = None
        self._state_lock = threading.Lock()
        for topic, expression in (subscription or {}).items():
            self._subscribe(topic, expression)

    # --- subscriptions -------------------------------------------------------------------
    @property
    def config(self) -> ClientConfig:
        """Connection settings."""
        return self._context.config

    def subscribe(
        self, topic: str, filter_expression: FilterExpression | str | None = None
    ) -> None:
        """Receive ``topic`` (a RocketMQ name) too, keeping the messages ``filter_expression``
        selects (a :class:`~bridge.FilterExpression`, TAG or SQL92, or a tag expression;
        None: every message). Messages filtered out are committed, never delivered. Before
        or after :meth:`startup`; while running, the group rebalances to take the topic's
        partitions. Raises :class:`~bridge.errors.FilterExpressionError` (naming the
        position) for an invalid SQL92 expression, :class:`InvalidArgumentError` for a bad
        topic name or expression, :class:`IllegalStateError` once shut down."""
        with self._state_lock:
            if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
                raise IllegalStateError(f"simple consumer {self.consumer_group} is shut down")
            self._subscribe(topic, filter_expression)
            self._apply_subscriptions()

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving ``topic``. Its messages already fetched and not received are no
        longer handed out once the rebalance that follows has taken its partitions away;
        messages received from it can still be acked until then. Unknown topics are
        ignored."""
        with self._state_lock:
            if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
                raise IllegalStateError(f"simple consumer {self.consumer_group} is shut down")
            sub = self._context.subscriptions.pop(topic, None)
            if sub is None:
                return
            self._topic_names.pop(sub.kafka_topic, None)
            self._apply_subscriptions()

    def _subscribe(self, topic: str, expression: FilterExpression | str | None) -> None:
        if not isinstance(topic, str):
            raise InvalidArgumentError(f"a topic must be a string, got {type(topic).__name__}")
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError(
                f"subscribe({topic!r}): a consumer reads its own retry topic by itself"
            )
        kafka_topic = to_kafka_topic(topic, self.config.namespace)
        chosen = subscription_filter("*" if expression is None else expression)
        self._context.subscriptions[topic] = Subscription(topic, kafka_topic, chosen, _never_called)
        self._topic_names[kafka_topic] = topic

    def _apply_subscriptions(self) -> None:
        """Running: have the poll thread subscribe the Kafka consumer anew."""
        fetcher = self._fetcher
        if fetcher is not None and self._lifecycle.state is ServiceState.RUNNING:
            self._context.scheduler.after(0, fetcher.resubscribe)

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The consumer's lifecycle state."""
        return self._lifecycle.state

    @property
    def is_running(self) -> bool:
        """True between :meth:`startup` and :meth:`shutdown` (RocketMQ 5's name)."""
        return self._lifecycle.state is ServiceState.RUNNING

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters (``consumed``: messages acked)."""
        return self._context.counters.snapshot()

    def unacked(self) -> int:
        """Messages received whose leases are open: neither acked, nor sent back after their
        invisible duration, nor let go with their partition (a message past its deadline
        counts until the fetch thread sends it back)."""
        return self._consumption.unacked()

    def startup(self) -> None:
        """Create the group's retry and DLQ topics, join the group and start fetching. May be
        called once; a subscription is needed."""
        with self._state_lock:
            if not self._context.subscriptions:
                raise IllegalStateError(f"simple consumer {self.consumer_group}: no subscription")
            self._lifecycle.start_with(self._start, self._undo_start)

    def start(self) -> None:
        """:meth:`startup` (the ``start()/stop()`` lifecycle)."""
        self.startup()

    def _start(self) -> None:
        context = self._context
        catalog = context.catalog
        TopicAdmin(self.config).ensure_topics(
            [catalog.spec(SystemTopic.QUARANTINE), *catalog.group_specs(self.consumer_group)]
        )
        retry_kafka_topic = catalog.retry_topic(self.consumer_group)
        self._topic_names[retry_kafka_topic] = RETRY_GROUP_TOPIC_PREFIX + self.consumer_group
        linger_ms = max(self.config.linger_ms, _COPY_LINGER_MS)
        context.producer = RecordSender(
            self.config.replace(linger_ms=linger_ms), self.consumer_group
        )
        context.producer.start()
        self._fetcher = Fetcher(
            context, self._consumption, self._quarantine, self._topic_names, retry_kafka_topic
        )
        self._consumption.persist_with(self._fetcher.commit_now)
        self._fetcher.start()
        logger.info(
            "simple consumer %s started (topics %s)",
            self.consumer_group,
            list(context.subscriptions),
        )

    def _undo_start(self) -> None:
        self._close_clients()
        self._consumption.close()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Leave the group: commit what is acked, give the partitions up and close the Kafka
        clients, within about ``timeout_ms`` (ms; default ``drain_timeout_ms``) plus the few
        seconds closing takes. Idempotent.

        Messages received and not acked are not waited for: the partitions' next owners
        deliver them again at once (the same delivery attempt); acking them afterwards raises
        :class:`IllegalStateError`, as does every call but :meth:`shutdown`."""
        if timeout_ms is None:
            timeout_ms = self.settings.drain_timeout_ms
        require_int("shutdown timeout_ms", timeout_ms, minimum=0)
        with self._state_lock:
            state = self._lifecycle.state
            if state is ServiceState.SHUTDOWN_ALREADY:
                return
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        released = self._consumption.close()
        if state is ServiceState.CREATE_JUST:
            return
        if self._fetcher is not None:
            self._fetcher.stop_within(timeout_ms)
        self._close_clients()
        logger.info(
            "simple consumer %s shut down (%d received messages not acked, delivered again by "
            "the group); %s",
            self.consumer_group,
            released,
            self.stats(),
        )

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def _close_clients(self) -> None:
        self._context.close_producers(self._context.bounded_ms(self.config.send_msg_timeout_ms))

    # --- receiving -----------------------------------------------------------------------
    def receive(self, max_message_num: int, invisible_duration: float) -> list[MessageView]:
        """Up to ``max_message_num`` messages of the subscribed topics, each invisible to the
        group for ``invisible_duration`` seconds (at most 12 hours), waiting up to
        :attr:`await_duration` seconds for the first; an empty list if none came. Fewer
        than asked when ``max_unacked_messages`` are out already.

        Raises :class:`InvalidArgumentError` for a count below 1 or a duration that is not a
        positive number of seconds, :class:`IllegalStateError` unless running."""
        if (
            isinstance(max_message_num, bool)
            or not isinstance(max_message_num, int)
            or max_message_num < 1
        ):
            raise InvalidArgumentError(
                f"max_message_num must be an integer greater than 0, got {max_message_num!r}"
            )
        duration = check_duration(
            "invisible_duration", invisible_duration, MAX_INVISIBLE_DURATION_S
        )
        self._lifecycle.require_running()
        return self._consumption.take(max_message_num, duration, self.await_duration)

    def ack(self, message: MessageView) -> None:
        """End ``message``'s invisibility for good: it is consumed, and the group's offset
        can pass it (committed within ``persist_consumer_offset_interval_ms``).

        Raises :class:`~bridge.errors.InvalidReceiptHandleError` when ``message`` was not
        received by this consumer, or its receipt handle is stale (acked already, past its
        invisible duration and sent back, or its partition moved to another consumer), with
        ``reason`` saying which; :class:`InvalidArgumentError` for anything but a
        :class:`MessageView`; :class:`IllegalStateError` unless running."""
        self._lifecycle.require_running()
        self._consumption.ack(message)

    def give_back(self, messages: list[MessageView]) -> None:
        """Undo the :meth:`receive` that returned ``messages`` when they were never worked
        on (the asyncio client's cancelled ``receive``): they are offered again first, the
        same delivery. Those acked or expired meanwhile, and those another consumer
        received, are left as they are; :class:`InvalidArgumentError` for anything but a
        :class:`MessageView`."""
        self._consumption.give_back(messages)

    def change_invisible_duration(self, message: MessageView, invisible_duration: float) -> None:
        """Make ``message`` invisible for ``invisible_duration`` seconds from now, longer or
        shorter than it had left. Its :attr:`~MessageView.receipt_handle` is replaced (the
        old one is stale from now on, as in RocketMQ). Raises as :meth:`ack` does, and
        :class:`InvalidArgumentError` for a duration that is not a positive number of seconds
        (at most 12 hours)."""
        duration = check_duration(
            "invisible_duration", invisible_duration, MAX_INVISIBLE_DURATION_S
        )
        self._lifecycle.require_running()
        self._consumption.change(message, duration)
