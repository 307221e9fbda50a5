"""RocketMQ's push consumer over a Kafka consumer group, with retry topics and a DLQ.

One named thread polls Kafka and commits offsets; a named pool runs the listeners, except a
concurrent listener measured fast, which runs on the poll thread after each poll (see
:mod:`~bridge.consumer.listener_path`; a watchdog moves the poll loop to a new thread when a
listener holds it too long). Each
partition's received messages are held in a :class:`ProcessQueue` until they are done, and
the committed offset is the smallest one still held, so work in flight is never skipped,
whatever order the listener threads finish in, and a rebalance or a crash only redelivers.

A failed message (CLUSTERING) is copied to the group's retry topic through the delay levels,
or to its dead-letter queue once its retries are spent, and only counts as done once Kafka
has acknowledged the copy. If the copy cannot be written, the message is consumed again
locally after ``send_back_retry_delay_ms``, and its offset stays uncommitted meanwhile; if it
cannot even be built, or is refused for good (too large, not authorized) a few times, the
record goes to the QUARANTINE topic with the reason (without its value if the whole record is
refused there too). Records are handled one by one, so one that cannot be decoded is
quarantined and never costs the rest of its batch. Waits are bounded: ``consume_timeout`` for
a listener (concurrent: the message is sent back; orderly: a rebalance waits that long),
``shutdown(timeout_ms)`` for shutdown.

:class:`PushConsumer` is the public front; the work is done by its parts, each in its module:

* :mod:`~bridge.consumer.fetcher`: the poll thread (flow control, rebalances, commits,
  BROADCASTING partitions), with :mod:`~bridge.consumer.intake` (decoding a poll) and
  :mod:`~bridge.consumer.tuning` (the Kafka consumer's settings);
* :mod:`~bridge.consumer.concurrent`, :mod:`~bridge.consumer.orderly` and
  :mod:`~bridge.consumer.fifo`: the consumption strategies, over
  :mod:`~bridge.consumer.consumption` (the listener call);
* :mod:`~bridge.consumer.retry_policy`: send-back, DLQ and local retries;
  :mod:`~bridge.consumer.quarantine`: QUARANTINE copies;
* :mod:`~bridge.consumer.scheduler`, :mod:`~bridge.consumer.counters` and
  :mod:`~bridge.consumer.context` (what they all share).

Guarantees kept here (see ``docs/guarantees.md``): G6, G9, G11.

Some 500 lines, this docstring included, and kept so: what is left here is the public face
alone (RocketMQ's ``DefaultMQPushConsumer`` settings, ``subscribe``, ``start`` and
``shutdown``, each checked against the lifecycle), which a reader looks for in one place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from functools import partial
from typing import Any, Final

from bridge.client.sender import RecordSender
from bridge.config import ClientConfig
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.config import PushConsumerConfig, apply_group_kafka_config
from bridge.consumer.consumption import Consumption
from bridge.consumer.context import (
    ConsumerContext,
    Listener,
    MessageCallback,
    Subscription,
    timed_subscription,
)
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.fetcher import CLOSE_GRACE_S, Fetcher
from bridge.consumer.fifo import FifoConsumption
from bridge.consumer.model import (
    FilterExpression,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    effective_max_reconsume_times,
    subscription_filter,
)
from bridge.consumer.orderly import OrderlyConsumption
from bridge.consumer.quarantine import Quarantine
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka_config import apply_kafka_config, pick_hook, read_kafka_config
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.observability.metrics import active_metrics
from bridge.serialization import Deserializer, Deserializers
from topics.catalog import SystemTopic
from topics.naming import RETRY_GROUP_TOPIC_PREFIX, to_kafka_topic, validate_user_group

__all__ = ["ConsumerStats", "Listener", "MessageCallback", "PushConsumer"]

logger = logging.getLogger(__name__)

_COPY_LINGER_MS: Final = 50
"""The producer of copies (retry, DLQ and quarantine copies) batches them for at least this
long, ms (``linger_ms`` when that is longer): only the failed message waits on its copy, held
meanwhile, and a retry waits a delay level (a second or more) anyway. Fewer, larger produce
requests took less CPU a failure in the consumer than the default 5 ms on the benchmark's
2-core machine."""


_listener_thread = threading.local()
"""``consumer``: the :class:`PushConsumer` whose listener thread this is, on those threads (its
poll threads included, where a fast listener runs)."""


def _mark_listener_thread(consumer: PushConsumer) -> None:
    """The listener threads' initializer: lets :meth:`PushConsumer.shutdown` know its caller."""
    _listener_thread.consumer = consumer


class _ListenerKind(Enum):
    """What a listener asks of the consumer's mode."""

    CONCURRENT = "a MessageListenerConcurrently: the consumer must be concurrent"
    ORDERLY = "a MessageListenerOrderly: the consumer becomes orderly"
    PER_MESSAGE = "a callable: runs in the consumer's mode"


def _listener_kind(topic: str, listener: object) -> _ListenerKind:
    """The kind of ``listener``; :class:`InvalidArgumentError` if it is none of them."""
    if listener is None:
        raise InvalidArgumentError(f"subscribe({topic!r}): a listener is required")
    if isinstance(listener, MessageListenerOrderly):
        return _ListenerKind.ORDERLY
    if isinstance(listener, MessageListenerConcurrently):
        return _ListenerKind.CONCURRENT
    if callable(listener):
        return _ListenerKind.PER_MESSAGE
    raise InvalidArgumentError(
        f"subscribe({topic!r}): the listener must be a MessageListenerConcurrently, "
        f"a MessageListenerOrderly or a callable, got {type(listener).__name__}"
    )


class PushConsumer(Startable):
    """RocketMQ's push consumer: ``subscribe(topic, listener, expression)``, then
    :meth:`start`; :meth:`shutdown` when done (or use ``with``).

    A listener is a :class:`MessageListenerConcurrently`, a :class:`MessageListenerOrderly`,
    or (as in RocketMQ's Python client) a callable ``listener(msg) -> ConsumeStatus`` called
    once per message; ``orderly=True`` makes such callables orderly. Settings are the fields
    of :class:`PushConsumerConfig`, given as keyword arguments or as ``settings``.

    ``fifo=True`` makes the consumer FIFO (RocketMQ 5's FIFO consumer group): the messages of
    one message group (:attr:`~bridge.Message.message_group`) are consumed one at a time, in
    send order, and a failed one is retried in place after
    ``suspend_current_queue_time_millis``, holding up its group only, until its retries are
    spent (``max_reconsume_times``; -1: 16) and it goes to the DLQ; different groups, even in
    one partition, run in parallel on the listener threads, and messages without a group run
    as normal messages do, in parallel. A FIFO consumer's listeners are callables
    (``docs/fifo.md``).

    Isolation: each record is handled on its own. A record that cannot be decoded (a header
    that cannot be read, a malformed retry record), or a failed message whose retry copy cannot
    be built, is moved to the QUARANTINE topic with its reason, and the rest of its batch and
    partition go on; a copy that cannot be sent is retried locally, and one refused for good
    (too large, not authorized) 3 times is quarantined instead. A message in a concurrent
    listener for longer than ``consume_timeout`` minutes is sent back for retry and the
    listener's late result ignored. Held messages are bounded per partition in number
    (``pull_threshold_for_queue``) and bytes (``pull_threshold_size_for_queue``, MiB).

    Orderly consumers never let two listeners run one partition: on a rebalance the revoke
    callback waits for the running listener up to ``consume_timeout`` (``max.poll.interval.ms``
    is raised above that unless set, so the group keeps the member meanwhile and the
    rebalance waits). Only a listener still running after that, or one abandoned by
    :meth:`shutdown`, can overlap with the partition's next owner; it is logged.

    Kafka's conventions: ``kafka_config`` takes a confluent-kafka config dict as it is
    (:mod:`bridge.kafka_config`; ``group.id`` must be this consumer's group, and
    ``auto.offset.reset`` sets ``consume_from_where`` unless that is given, as a keyword or
    in ``settings`` with a value other than the default).
    ``key_deserializer`` and ``value_deserializer`` take confluent-kafka's ``Deserializer``
    interface (Schema Registry's deserializers as they are): a message's
    :attr:`~bridge.Message.value` and :attr:`~bridge.Message.key` are made when the listener
    first reads them, on its thread (the poll never waits for a deserializer), with the topic
    the message was first sent to (retries and dead letters included), while ``body`` stays
    the bytes. A deserializer that raises makes that read raise a
    :class:`~bridge.errors.DeserializationError` naming the topic and field: a failure of
    the listener, so the message is retried and, after ``max_reconsume_times``,
    dead-lettered (replayable), while the others go on (``docs/serialization.md``).

    Metrics: with recording on in the process before :meth:`start`
    (:func:`bridge.observability.enable_metrics` or ``serve_metrics(port)``), the counters,
    listener durations, held messages and the Kafka consumer's lag are recorded too (see
    ``docs/observability.md``).
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
        parts = read_kafka_config(kafka_config)
        client = apply_kafka_config(config or ClientConfig(), parts).replace(
            bootstrap_servers=bootstrap_servers, namespace=namespace
        )
        self.group = validate_user_group(group, client.namespace)
        if group.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError(f"consumer group {group!r} may not start with %RETRY%")
        apply_group_kafka_config(
            group, parts, options, (settings or PushConsumerConfig()).consume_from_where
        )
        tuned = (settings or PushConsumerConfig()).replace(message_model=message_model, **options)
        if orderly and fifo:
            raise InvalidArgumentError(
                f"push consumer {group}: orderly=True and fifo=True; a consumer is one or the "
                "other (FIFO orders each message group, orderly each partition)"
            )
        self._orderly_asked = orderly
        """``orderly=True`` given: callables are orderly too."""
        self._fifo = fifo
        self._orderly_listener = False
        """A :class:`MessageListenerOrderly` is subscribed."""
        self._lifecycle = Lifecycle(f"push consumer {group}")
        self._context = ConsumerContext(self.group, client, tuned)
        self._context.deserializers = Deserializers(
            pick_hook(parts, "key.deserializer", key_deserializer),
            pick_hook(parts, "value.deserializer", value_deserializer),
        )
        """The one copy of ``config`` and ``settings`` every part reads."""
        self._subscriptions = self._context.subscriptions
        self._quarantine = Quarantine(self._context)
        self._fetcher: Fetcher | None = None
        self._shutdown_lock = threading.Lock()
        self._shut_down = threading.Event()
        """Set once a shutdown has closed everything (or there was nothing to close)."""

    # --- configuration -------------------------------------------------------------------
    @property
    def config(self) -> ClientConfig:
        """Connection and delay settings."""
        return self._context.config

    @config.setter
    def config(self, value: ClientConfig) -> None:
        self._before_start("config")
        self._context.config = value
        self._context.catalog = value.catalog()

    @property
    def settings(self) -> PushConsumerConfig:
        """Consumption settings (:class:`PushConsumerConfig`)."""
        return self._context.settings

    @settings.setter
    def settings(self, value: PushConsumerConfig) -> None:
        self._before_start("settings")
        self._context.settings = value

    def _before_start(self, what: str) -> None:
        if self._lifecycle.state is not ServiceState.CREATE_JUST:
            raise IllegalStateError(
                f"push consumer {self.group}: {what} can only be replaced before start()"
            )

    @property
    def message_model(self) -> MessageModel:
        """CLUSTERING or BROADCASTING."""
        return self.settings.message_model

    @property
    def orderly(self) -> bool:
        """True if the consumer consumes orderly: it was made with ``orderly=True``, or a
        :class:`MessageListenerOrderly` is subscribed (RocketMQ picks the consume service by
        the listener's type). Decided for good by :meth:`start`."""
        return self._orderly_asked or self._orderly_listener

    @orderly.setter
    def orderly(self, value: bool) -> None:
        self._before_start("orderly")
        if value and self._fifo:
            raise IllegalStateError(
                f"push consumer {self.group}: it is FIFO, so it cannot consume orderly"
            )
        if not value and self._orderly_listener:
            raise IllegalStateError(
                f"push consumer {self.group}: a MessageListenerOrderly is subscribed, "
                "so it consumes orderly"
            )
        self._orderly_asked = value

    @property
    def fifo(self) -> bool:
        """True if the consumer is FIFO (``fifo=True``): each message group's messages one at
        a time, in order, groups in parallel. Can be set before :meth:`start`."""
        return self._fifo

    @fifo.setter
    def fifo(self, value: bool) -> None:
        self._before_start("fifo")
        if value and self.orderly:
            raise IllegalStateError(
                f"push consumer {self.group}: it consumes orderly, so it cannot be FIFO"
            )
        if value and any(
            _listener_kind(s.topic, s.listener) is not _ListenerKind.PER_MESSAGE
            for s in self._subscriptions.values()
        ):
            raise IllegalStateError(
                f"push consumer {self.group}: a listener object is subscribed; a FIFO consumer "
                "takes callables"
            )
        self._fifo = bool(value)

    @property
    def max_reconsume_times(self) -> int:
        """Failures before the DLQ (``-1`` resolved: 16 concurrent, unlimited orderly)."""
        return effective_max_reconsume_times(
            self.settings.max_reconsume_times, orderly=self.orderly
        )

    def subscribe(
        self, topic: str, listener: Listener, expression: str | FilterExpression = "*"
    ) -> None:
        """Consume ``topic`` (a RocketMQ name) with ``listener``, keeping the messages
        ``expression`` selects: a tag expression (``"*"`` or ``"TagA || TagB"``), or a
        :class:`MessageSelector` / :class:`FilterExpression`, e.g.
        ``MessageSelector.by_sql("TAGS = 'TagA' AND amount > 100")`` (RocketMQ's SQL92
        property filter, parsed here once). Messages filtered out count as done: their offsets
        are committed, and they are never retried. Call before :meth:`start`.

        A :class:`MessageListenerOrderly` makes the consumer orderly (see :attr:`orderly`), so
        it must come first or join other orderly listeners and callables. A FIFO consumer
        (see :attr:`fifo`) takes callables only: it calls its listener once per message.

        Raises :class:`InvalidArgumentError` for a missing listener, a bad expression or
        topic name, or a listener of the other kind than the consumer's (orderly or not);
        :class:`~bridge.errors.FilterExpressionError` (one of them) names where an SQL92
        expression is invalid and what was expected there.
        """
        if self._lifecycle.state is not ServiceState.CREATE_JUST:
            raise IllegalStateError(f"push consumer {self.group}: subscribe before start()")
        kind = _listener_kind(topic, listener)
        if self._fifo and kind is not _ListenerKind.PER_MESSAGE:
            raise InvalidArgumentError(
                f"subscribe({topic!r}): a FIFO consumer calls its listener once per message; "
                f"give a callable listener(msg) -> ConsumeStatus, not a "
                f"{type(listener).__name__}"
            )
        if kind is _ListenerKind.ORDERLY and self._subscriptions and not self.orderly:
            raise InvalidArgumentError(
                f"subscribe({topic!r}): an orderly listener on a concurrent consumer"
            )
        if kind is _ListenerKind.CONCURRENT and self.orderly:
            raise InvalidArgumentError(
                f"subscribe({topic!r}): a concurrent listener on an orderly consumer"
            )
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError(
                f"subscribe({topic!r}): a consumer subscribes to its own retry topic by itself"
            )
        kafka_topic = to_kafka_topic(topic, self.config.namespace)
        self._subscriptions[topic] = Subscription(
            topic, kafka_topic, subscription_filter(expression), listener
        )
        if kind is _ListenerKind.ORDERLY and not self.orderly:
            logger.info("push consumer %s: orderly, for the listener of %s", self.group, topic)
        if kind is _ListenerKind.ORDERLY:
            self._orderly_listener = True

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The consumer's lifecycle state."""
        return self._lifecycle.state

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters."""
        return self._context.counters.snapshot()

    def start(self) -> None:
        """Create the group's retry and DLQ topics, join the group (CLUSTERING) or take every
        partition (BROADCASTING), and start consuming. May be called once."""
        if not self._subscriptions:
            raise IllegalStateError(
                f"push consumer {self.group}: subscribe(topic, listener) before start()"
            )
        self._lifecycle.start_with(self._start, self._undo_start)
        logger.info(
            "push consumer %s started (%s, %s, topics %s)",
            self.group,
            self.message_model.value,
            "FIFO" if self._fifo else "orderly" if self.orderly else "concurrently",
            sorted(self._subscriptions),
        )

    def _undo_start(self) -> None:
        self._close_clients()
        self._shut_down.set()  # a later shutdown() has nothing to wait for

    def _new_consumption(self) -> Consumption[Any]:
        """The consumption strategy of the consumer's mode (see :attr:`orderly`, :attr:`fifo`)."""
        if self._fifo:
            return FifoConsumption(self._context, self._quarantine)
        if self.orderly:
            return OrderlyConsumption(self._context, self._quarantine)
        return ConcurrentConsumption(self._context, self._quarantine)

    def _start(self) -> None:
        context = self._context
        catalog = context.catalog
        clustering = not context.broadcasting
        specs = [catalog.spec(SystemTopic.QUARANTINE)]
        if clustering:
            specs += catalog.group_specs(self.group)
        TopicAdmin(self.config).ensure_topics(specs)
        metrics = active_metrics()
        if metrics is not None:  # listener durations in rocketmq_process_time
            for topic, sub in list(self._subscriptions.items()):
                self._subscriptions[topic] = timed_subscription(
                    sub, metrics, self.config.namespace, self.group
                )
        consumption = self._new_consumption()
        # Kafka topic -> RocketMQ name of every topic consumed.
        topic_names = {s.kafka_topic: s.topic for s in self._subscriptions.values()}
        retry_kafka_topic = ""
        if clustering and not consumption.in_place:
            retry_kafka_topic = catalog.retry_topic(self.group)
            topic_names[retry_kafka_topic] = RETRY_GROUP_TOPIC_PREFIX + self.group
        # Nothing waits on a copy's acknowledgement but its held message: batch them longer.
        linger_ms = max(self.config.linger_ms, _COPY_LINGER_MS)
        context.producer = RecordSender(self.config.replace(linger_ms=linger_ms), self.group)
        context.producer.start()
        if clustering and not consumption.in_place:
            self._prepare_send_backs(context.producer)
        context.executor = ThreadPoolExecutor(
            self.settings.consume_thread_count,
            thread_name_prefix=f"bridge-consume-{self.group}",
            initializer=_mark_listener_thread,
            initargs=(self,),
        )
        self._fetcher = Fetcher(
            context,
            consumption,
            self._quarantine,
            topic_names,
            retry_kafka_topic,
            # A fast listener runs on the poll thread: shutdown() called there must not wait
            # for it (see shutdown()).
            on_poll_thread=partial(_mark_listener_thread, self),
        )
        self._fetcher.start()

    def _prepare_send_backs(self, producer: RecordSender) -> None:
        """Have the producer of copies check the system topics (SCHEDULE, where a retry copy
        waits) now, before any message is fetched. Otherwise the first send-back of each
        listener thread does it, all at once, while their partitions stop (admin round trips,
        hundreds of ms on a loaded machine, at the start of every consumer that fails a
        message). A failure here is only logged: the first send-back checks again."""
        try:
            producer.ensure_system_topics()
        except Exception as exc:
            logger.warning(
                "push consumer %s: system topics not checked at start (the first send-back "
                "checks them): %s",
                self.group,
                exc,
            )

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop fetching, let running listeners finish for up to ``timeout_ms`` (ms; default
        ``drain_timeout_ms``), commit what is done, leave the group. Idempotent.

        Returns within about ``timeout_ms`` (plus the few seconds closing the Kafka clients may
        take), whatever the listeners do. Messages still in a listener then are abandoned: the
        partitions and counts are logged, their offsets are never committed past (the group
        consumes them again), and the listeners' late results are ignored. Python cannot stop
        a thread: a listener that never returns keeps its thread, and the process, alive.

        Called while another shutdown runs, it waits for that one (as long as it would wait
        itself). Called from one of this consumer's listeners, it starts the shutdown on a
        thread of its own and returns at once: the shutdown drains that listener too, which
        can only return once this call has.
        """
        if timeout_ms is None:
            timeout_ms = self.settings.drain_timeout_ms
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise InvalidArgumentError(
                f"shutdown timeout_ms must be a non-negative integer, got {timeout_ms!r}"
            )
        if getattr(_listener_thread, "consumer", None) is self:
            with self._shutdown_lock:
                running = self._lifecycle.state is ServiceState.RUNNING
            if running:
                threading.Thread(
                    target=self.shutdown,
                    args=(timeout_ms,),
                    name=f"bridge-shutdown-{self.group}",
                    # Not a daemon: a process whose main thread ends meanwhile still commits
                    # what its listeners finished (the shutdown is bounded by timeout_ms).
                    daemon=False,
                ).start()
            return
        with self._shutdown_lock:
            state = self._lifecycle.state
            if state is not ServiceState.SHUTDOWN_ALREADY:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        if state is ServiceState.SHUTDOWN_ALREADY:
            # Another call shuts down: return once it has closed everything, as it will.
            self._shut_down.wait(timeout_ms / 1000 + 2 * CLOSE_GRACE_S)
            return
        try:
            if state is ServiceState.CREATE_JUST:
                return
            if self._fetcher is not None:
                self._fetcher.stop_within(timeout_ms)
            else:
                self._context.deadline = time.monotonic() + timeout_ms / 1000
            self._close_clients()
            logger.info("push consumer %s shut down; %s", self.group, self.stats())
        finally:
            self._shut_down.set()

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def _close_clients(self) -> None:
        # Never wait for the listener threads: every partition is released by now, so queued
        # tasks start no work, and a listener still running is abandoned (see shutdown()).
        context = self._context
        if context.executor is not None:
            context.executor.shutdown(wait=False, cancel_futures=True)
        context.close_producers(context.bounded_ms(self.config.send_msg_timeout_ms))
