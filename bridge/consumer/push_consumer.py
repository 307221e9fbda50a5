"""RocketMQ's push consumer over a Kafka consumer group, with retry topics and a DLQ.

One named thread polls Kafka and commits offsets; a named pool runs the listeners. Each
partition's received messages are held in a :class:`ProcessQueue` until they are done, and
the committed offset is the smallest one still held, so work in flight is never skipped,
whatever order the listener threads finish in, and a rebalance or a crash only redelivers.

A failed message (CLUSTERING) is copied to the group's retry topic through the delay levels,
or to its dead-letter queue once its retries are spent, and only counts as done once Kafka
has acknowledged the copy. If the copy cannot be written, the message is consumed again
locally after ``send_back_retry_delay_ms``, and its offset stays uncommitted meanwhile; if it
cannot even be built, or is refused for good (too large, not authorized) a few times, the
record goes to the QUARANTINE topic with the reason (without its value if the whole record is
refused there too). Records are
handled one by one, so one that cannot be decoded is quarantined and never costs the rest of
its batch. Waits are bounded: ``consume_timeout`` for a listener (concurrent: the message is
sent back; orderly: a rebalance waits that long), ``shutdown(timeout_ms)`` for shutdown.

Guarantees kept here (see ``docs/guarantees.md``): G6, G9, G11.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from bridge.client.producer import Producer
from bridge.codec import PreparedRecord, message_from_record, read_headers
from bridge.config import ClientConfig
from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    MessageQueue,
    RetryRoute,
    TagFilter,
    checked_ack_index,
    checked_delay_level,
    checked_suspend_millis,
    effective_max_reconsume_times,
    retry_route,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.send_back import origin_topic, send_back_record
from bridge.errors import IllegalStateError, InvalidArgumentError, KafkaClientError, SendError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer
from bridge.kafka.quarantine import quarantine_copy
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import MessageConst, MessageExt, local_ipv4, parse_count
from topics.catalog import SystemTopic
from topics.errors import MalformedRecordError
from topics.naming import (
    RETRY_GROUP_TOPIC_PREFIX,
    broadcast_group,
    to_kafka_topic,
    validate_user_group,
)

logger = logging.getLogger(__name__)

MessageCallback = Callable[[MessageExt], ConsumeStatus | ConsumeOrderlyStatus | None]
"""A per-message listener, as in RocketMQ's Python client."""
Listener = MessageListenerConcurrently | MessageListenerOrderly | MessageCallback

_POLL_TIMEOUT_S = 0.1
_PAUSED_POLL_TIMEOUT_S = 0.005
"""The poll timeout while a partition is paused, seconds: its listeners may drain it at any
moment, and a paused partition fetches nothing, so waiting the full timeout would idle it."""
_FETCH_WAIT_MAX_MS = 100
"""librdkafka's ``fetch.wait.max.ms`` for push consumers (its default: 500 ms)."""
_MAX_RECORDS_PER_POLL = 1000
_MIN_RECORDS_PER_POLL = 100
_BROADCAST_REFRESH_S = 30.0
"""How often a BROADCASTING consumer looks for new partitions, seconds."""
_ORDERLY_SLICE_S = 60.0
"""An orderly task hands its partition back to the pool after this long (RocketMQ's
``MAX_TIME_CONSUME_CONTINUOUSLY``), seconds."""
_MAX_REQUESTS_PER_TASK = 64
"""Most consume requests one pool task runs in a row."""
_RECORD_ERRORS_IGNORED = frozenset({KafkaError._PARTITION_EOF})
_EXPIRY_CHECK_S = 1.0
"""How often, at most, messages in concurrent listeners are checked against
``consume_timeout``, seconds."""
_CONSUME_TIMEOUT_DELAY_LEVEL = 3
"""The delay level of a message sent back for running past ``consume_timeout`` (RocketMQ's
``cleanExpireMsg``)."""
_DEFAULT_MAX_POLL_INTERVAL_MS = 300_000
"""librdkafka's ``max.poll.interval.ms`` default."""
_MAX_POLL_INTERVAL_LIMIT_MS = 86_400_000
"""The largest ``max.poll.interval.ms`` librdkafka takes."""
_POLL_INTERVAL_MARGIN_S = 30.0
"""An orderly consumer's wait in the revoke callback ends this long before
``max.poll.interval.ms``, so the group does not expel it meanwhile, seconds."""
_CLOSE_GRACE_S = 5.0
"""What :meth:`PushConsumer.shutdown` allows beyond its timeout for closing the Kafka
consumer (leaving the group), seconds."""
_WAIT_SLICE_S = 0.1
"""Waits for running listeners look at the shutdown deadline this often, seconds."""
_COPY_ATTEMPTS = 3
"""Times one message's retry or DLQ copy may be refused for good (too large, not authorized,
...) before the message is quarantined instead; between them it is consumed again locally
after ``send_back_retry_delay_ms``, doubled for each further refusal."""


class ConsumerStats(NamedTuple):
    """Counters since start: messages the listener consumed, failed, sent back to the retry
    topic, sent to the DLQ, retried locally after a failed send-back, dropped (BROADCASTING
    failures), filtered out by tag, and records quarantined."""

    consumed: int
    failed: int
    sent_back: int
    dead_lettered: int
    retried_locally: int
    dropped: int
    filtered: int
    quarantined: int


@dataclass(frozen=True, slots=True)
class _Subscription:
    topic: str
    kafka_topic: str
    filter: TagFilter
    listener: Listener


@dataclass(order=True)
class _Later:
    due: float
    seq: int
    action: Callable[[], None] = field(compare=False)


class _Headerless:
    """A consumed record seen without its headers, which cannot be read: confluent-kafka
    raises converting a header name that is not UTF-8, and reading them again would crash."""

    __slots__ = ("_record",)

    def __init__(self, record: Any) -> None:
        self._record = record

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def topic(self) -> Any:
        return self._record.topic()

    def partition(self) -> Any:
        return self._record.partition()

    def offset(self) -> Any:
        return self._record.offset()

    def key(self) -> Any:
        return self._record.key()

    def value(self) -> Any:
        return self._record.value()

    def timestamp(self) -> Any:
        return self._record.timestamp()


class _Incoming:
    """One partition's share of a poll, in offset order: messages to hold (with their sizes in
    bytes and records), those of them to consume, and records to quarantine (held under a
    placeholder until Kafka acknowledges their copy). ``room_count`` and ``room_bytes``: what
    the partition may still hold; once that is taken, the rest of the poll is left to Kafka
    (``cut``: the partition was sought back to the first record not taken)."""

    __slots__ = (
        "bytes", "can_cut", "cut", "msgs", "poison", "records", "room_bytes", "room_count",
        "sizes", "work",
    )  # fmt: skip

    def __init__(self, room_count: int, room_bytes: int) -> None:
        self.msgs: list[MessageExt] = []
        self.sizes: list[int] = []
        self.records: list[Any] = []
        self.work: list[MessageExt] = []
        self.poison: list[tuple[Any, Exception]] = []
        self.room_count = room_count
        self.room_bytes = room_bytes
        self.bytes = 0
        self.cut = False
        self.can_cut = True

    @property
    def full(self) -> bool:
        return len(self.msgs) >= self.room_count or self.bytes >= self.room_bytes

    def hold(self, msg: MessageExt, size: int, record: Any) -> None:
        self.msgs.append(msg)
        self.sizes.append(size)
        self.records.append(record)
        self.work.append(msg)
        self.bytes += size

    def hold_poison(self, record: Any, reason: Exception) -> None:
        offset = record.offset()
        self.msgs.append(
            MessageExt(
                "", msg_id=f"{record.topic()}-{record.partition()}-{offset}", queue_offset=offset
            )
        )
        self.sizes.append(0)
        self.records.append(record)
        self.poison.append((record, reason))


def _leading_successes(callback: MessageCallback, msgs: list[MessageExt]) -> int:
    """Call a per-message listener on ``msgs`` in order until one fails (a failure status,
    None or an exception); return how many succeeded."""
    for index, msg in enumerate(msgs):
        try:
            result = callback(msg)
        except Exception:
            logger.warning("listener raised on %s: a failure", msg.msg_id, exc_info=True)
            return index
        if (
            result is not ConsumeStatus.CONSUME_SUCCESS
            and result is not ConsumeOrderlyStatus.SUCCESS
        ):
            if result is None:
                logger.warning("listener returned None for %s: a failure", msg.msg_id)
            return index
    return len(msgs)


def _refused_for_good(error: object) -> bool:
    """True if a copy failed for a reason that sending it again will not change: a delivery
    report or ``produce()`` error that :func:`is_permanent_delivery_error` calls permanent
    (record too large, topic unknown or not authorized, ...), or a record the client refuses
    (:class:`InvalidArgumentError`, such as :class:`~bridge.errors.MessageTooLargeError`).
    Timeouts, an unreachable broker and anything else are transient."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaClientError):
        error = error.kafka_error
    if isinstance(error, KafkaError):
        return is_permanent_delivery_error(error)
    return isinstance(error, InvalidArgumentError)


def _error_text(error: object) -> str:
    """A delivery report's error or an exception, as a reason (with Kafka's error name)."""
    if isinstance(error, KafkaError):
        return f"{error.str()} ({error.name()})"
    return str(error)


class PushConsumer(Startable):
    """RocketMQ's push consumer: ``subscribe(topic, listener, expression)``, then
    :meth:`start`; :meth:`shutdown` when done (or use ``with``).

    A listener is a :class:`MessageListenerConcurrently`, a :class:`MessageListenerOrderly`,
    or (as in RocketMQ's Python client) a callable ``listener(msg) -> ConsumeStatus`` called
    once per message; ``orderly=True`` makes such callables orderly. Settings are the fields
    of :class:`PushConsumerConfig`, given as keyword arguments or as ``settings``.

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
    """

    def __init__(
        self,
        group: str,
        *,
        message_model: MessageModel | None = None,
        orderly: bool = False,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        config: ClientConfig | None = None,
        settings: PushConsumerConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = (config or ClientConfig()).replace(
            bootstrap_servers=bootstrap_servers, namespace=namespace
        )
        self.group = validate_user_group(group, self.config.namespace)
        if group.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError(f"consumer group {group!r} may not start with %RETRY%")
        self.settings = (settings or PushConsumerConfig()).replace(
            message_model=message_model, **options
        )
        self.orderly = orderly
        self._subscriptions: dict[str, _Subscription] = {}
        self._lifecycle = Lifecycle(f"push consumer {group}")
        self._stats_lock = threading.Lock()
        self._counts = dict.fromkeys(ConsumerStats._fields, 0)
        self._queues: dict[tuple[str, int], ProcessQueue] = {}
        self._paused: set[tuple[str, int]] = set()
        self._later: list[_Later] = []
        self._later_lock = threading.Lock()
        self._seq = itertools.count()
        self._stopping = threading.Event()
        self._kafka: Any = None
        self._producer: Producer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._retry_kafka_topic = ""
        self._topic_names: dict[str, str] = {}
        """Kafka topic -> RocketMQ name of every topic consumed."""
        self._missing_topics: set[str] = set()
        self._born_host = local_ipv4().encode()
        self._catalog = self.config.catalog()
        self._last_commit = 0.0
        self._last_refresh = 0.0
        self._next_expiry_check = 0.0
        self._orderly_wait_s = 0.0
        """How long an orderly revoke waits for the running listener, seconds."""
        self._shutdown_deadline = math.inf
        """When :meth:`shutdown` must be done (monotonic seconds); no wait goes past it."""

    # --- configuration -------------------------------------------------------------------
    @property
    def message_model(self) -> MessageModel:
        """CLUSTERING or BROADCASTING."""
        return self.settings.message_model

    @property
    def max_reconsume_times(self) -> int:
        """Failures before the DLQ (``-1`` resolved: 16 concurrent, unlimited orderly)."""
        return effective_max_reconsume_times(
            self.settings.max_reconsume_times, orderly=self.orderly
        )

    def subscribe(self, topic: str, listener: Listener, expression: str = "*") -> None:
        """Consume ``topic`` (a RocketMQ name) with ``listener``, keeping messages whose tag
        matches ``expression`` (``"*"`` or ``"TagA || TagB"``). Call before :meth:`start`.

        Raises :class:`InvalidArgumentError` for a missing listener, a bad expression or
        topic name, or a listener of the other kind than the consumer's (orderly or not).
        """
        if self._lifecycle.state is not ServiceState.CREATE_JUST:
            raise IllegalStateError(f"push consumer {self.group}: subscribe before start()")
        if listener is None:
            raise InvalidArgumentError(f"subscribe({topic!r}): a listener is required")
        if isinstance(listener, MessageListenerOrderly):
            if self._subscriptions and not self.orderly:
                raise InvalidArgumentError(
                    f"subscribe({topic!r}): an orderly listener on a concurrent consumer"
                )
            self.orderly = True
        elif isinstance(listener, MessageListenerConcurrently):
            if self.orderly:
                raise InvalidArgumentError(
                    f"subscribe({topic!r}): a concurrent listener on an orderly consumer"
                )
        elif not callable(listener):
            raise InvalidArgumentError(
                f"subscribe({topic!r}): the listener must be a MessageListenerConcurrently, "
                f"a MessageListenerOrderly or a callable, got {type(listener).__name__}"
            )
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError(
                f"subscribe({topic!r}): a consumer subscribes to its own retry topic by itself"
            )
        kafka_topic = to_kafka_topic(topic, self.config.namespace)
        self._subscriptions[topic] = _Subscription(
            topic, kafka_topic, TagFilter(expression), listener
        )

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The consumer's lifecycle state."""
        return self._lifecycle.state

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters."""
        with self._stats_lock:
            return ConsumerStats(**self._counts)

    @property
    def _sender(self) -> Producer:
        """The producer of copies (send-backs, quarantine), once started."""
        if self._producer is None:
            raise IllegalStateError(f"push consumer {self.group} is not started")
        return self._producer

    @property
    def _pool(self) -> ThreadPoolExecutor:
        """The listener threads, once started."""
        if self._executor is None:
            raise IllegalStateError(f"push consumer {self.group} is not started")
        return self._executor

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._counts[name] += n

    def start(self) -> None:
        """Create the group's retry and DLQ topics, join the group (CLUSTERING) or take every
        partition (BROADCASTING), and start consuming. May be called once."""
        if not self._subscriptions:
            raise IllegalStateError(
                f"push consumer {self.group}: subscribe(topic, listener) before start()"
            )
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            self._start()
        except Exception:
            self._close_clients()
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        logger.info(
            "push consumer %s started (%s, %s, topics %s)",
            self.group,
            self.message_model.value,
            "orderly" if self.orderly else "concurrently",
            sorted(self._subscriptions),
        )

    def _start(self) -> None:
        clustering = self.message_model is MessageModel.CLUSTERING
        admin = TopicAdmin(self.config)
        specs = [self._catalog.spec(SystemTopic.QUARANTINE)]
        if clustering:
            specs += self._catalog.group_specs(self.group)
        admin.ensure_topics(specs)
        self._topic_names = {s.kafka_topic: s.topic for s in self._subscriptions.values()}
        if clustering and not self.orderly:
            self._retry_kafka_topic = self._catalog.retry_topic(self.group)
            self._topic_names[self._retry_kafka_topic] = RETRY_GROUP_TOPIC_PREFIX + self.group
        self._producer = Producer(self.group, config=self.config)
        self._producer.start()
        self._executor = ThreadPoolExecutor(
            self.settings.consume_thread_count, thread_name_prefix=f"bridge-consume-{self.group}"
        )
        reset = (
            "earliest"
            if self.settings.consume_from_where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            else "latest"
        )
        if clustering:
            self._kafka = new_consumer(
                self.config,
                self.group,
                f"{self.group}-consumer",
                auto_offset_reset=reset,
                **self._fetch_tuning(),
                **self._orderly_tuning(),
            )
            self._kafka.subscribe(
                list(self._topic_names),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        else:
            instance = self.settings.instance_name or f"{socket.gethostname()}@{os.getpid()}"
            self._kafka = new_consumer(
                self.config,
                broadcast_group(self.group, instance),
                f"{self.group}-broadcast",
                auto_offset_reset=reset,
                **self._fetch_tuning(),
            )
            self._assign_new_partitions()
        self._thread = threading.Thread(
            target=self._run, name=f"bridge-consumer-{self.group}", daemon=True
        )
        self._thread.start()

    def _fetch_tuning(self) -> dict[str, Any]:
        """Kafka's fetch wait, shortened unless the user set it: a fetch request spans every
        assigned partition, so a partition resumed after flow control (pause at
        ``pull_threshold_for_queue``) gets records only once the fetch in flight for the
        others (an idle retry topic, say) returns, up to ``fetch.wait.max.ms`` later."""
        if "fetch.wait.max.ms" in self.config.kafka:
            return {}
        return {"fetch_wait_max_ms": _FETCH_WAIT_MAX_MS}

    def _orderly_tuning(self) -> dict[str, Any]:
        """Orderly (CLUSTERING): ``max.poll.interval.ms`` above ``consume_timeout``, unless the
        user set it, so the member is not expelled while its revoke callback waits for a
        running listener; the wait itself stays below that interval."""
        if not self.orderly:
            return {}
        wait_s = self.settings.consume_timeout * 60
        given = self.config.kafka.get("max.poll.interval.ms")
        if given is not None:
            try:
                given_s = int(given) / 1000
            except ValueError:  # librdkafka refuses it when the consumer is created
                given_s = math.inf
            self._orderly_wait_s = max(0.0, min(wait_s, given_s - _POLL_INTERVAL_MARGIN_S))
            if self._orderly_wait_s < wait_s:
                logger.warning(
                    "push consumer %s: max.poll.interval.ms=%s allows an orderly rebalance to "
                    "wait only %.0f s for a running listener (consume_timeout: %.0f s)",
                    self.group,
                    given,
                    self._orderly_wait_s,
                    wait_s,
                )
            return {}
        session = str(self.config.kafka.get("session.timeout.ms", "0"))
        session_ms = int(session) if session.isascii() and session.isdigit() else 0
        interval_ms = min(
            _MAX_POLL_INTERVAL_LIMIT_MS,
            max(
                _DEFAULT_MAX_POLL_INTERVAL_MS,
                session_ms,
                math.ceil((wait_s + _POLL_INTERVAL_MARGIN_S) * 1000),
            ),
        )
        self._orderly_wait_s = min(wait_s, interval_ms / 1000 - _POLL_INTERVAL_MARGIN_S)
        return {"max_poll_interval_ms": interval_ms}

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop fetching, let running listeners finish for up to ``timeout_ms`` (ms; default
        ``drain_timeout_ms``), commit what is done, leave the group. Idempotent.

        Returns within about ``timeout_ms`` (plus the few seconds closing the Kafka clients may
        take), whatever the listeners do. Messages still in a listener then are abandoned: the
        partitions and counts are logged, their offsets are never committed past (the group
        consumes them again), and the listeners' late results are ignored. Python cannot stop
        a thread: a listener that never returns keeps its thread, and the process, alive.
        """
        if timeout_ms is None:
            timeout_ms = self.settings.drain_timeout_ms
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise InvalidArgumentError(
                f"shutdown timeout_ms must be a non-negative integer, got {timeout_ms!r}"
            )
        state = self._lifecycle.state
        if state is ServiceState.SHUTDOWN_ALREADY:
            return
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        if state is ServiceState.CREATE_JUST:
            return
        self._shutdown_deadline = time.monotonic() + timeout_ms / 1000
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_ms / 1000 + _CLOSE_GRACE_S)
            if self._thread.is_alive():
                logger.warning(
                    "push consumer %s: the Kafka consumer is still closing; not waiting", self.group
                )
        self._close_clients()
        logger.info("push consumer %s shut down; %s", self.group, self.stats())

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def _close_clients(self) -> None:
        # Never wait for the listener threads: every partition is released by now, so queued
        # tasks start no work, and a listener still running is abandoned (see shutdown()).
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        if self._producer is not None:
            self._producer.shutdown(self._bounded_ms(self.config.send_msg_timeout_ms))

    def _bounded_ms(self, timeout_ms: int) -> int:
        """``timeout_ms``, cut to what is left before the shutdown deadline, if any (ms)."""
        remaining_s = self._shutdown_deadline - time.monotonic()
        if remaining_s == math.inf:
            return timeout_ms
        return min(timeout_ms, max(0, math.ceil(remaining_s * 1000)))

    # --- the poll thread -----------------------------------------------------------------
    def _run(self) -> None:
        kafka = self._kafka
        try:
            while not self._stopping.is_set():
                try:
                    self._poll_once()
                except Exception:
                    logger.exception("push consumer %s: poll loop error", self.group)
                    self._stopping.wait(1.0)
        finally:
            self._release(list(self._queues), math.inf)
            try:
                kafka.close()
            except Exception:
                logger.exception("push consumer %s: closing the Kafka consumer", self.group)

    def _poll_once(self) -> None:
        now = time.monotonic()
        if self.message_model is MessageModel.BROADCASTING and (
            now - self._last_refresh > _BROADCAST_REFRESH_S
        ):
            self._assign_new_partitions()
        self._run_due()
        self._expire_overdue()
        self._resume_drained()
        limit = min(
            _MAX_RECORDS_PER_POLL,
            max(_MIN_RECORDS_PER_POLL, self.settings.pull_batch_size * len(self._queues)),
        )
        timeout = _PAUSED_POLL_TIMEOUT_S if self._paused else _POLL_TIMEOUT_S
        records = self._kafka.consume(num_messages=limit, timeout=timeout)
        if records:
            self._receive(records)
        if time.monotonic() - self._last_commit >= (
            self.settings.persist_consumer_offset_interval_ms / 1000
        ):
            self._commit(list(self._queues), asynchronous=True)

    def _receive(self, records: list[Any]) -> None:
        """Hold and dispatch ``records``, each on its own: one that cannot be handled goes to
        quarantine with the reason, and the rest of the batch proceeds."""
        batches: dict[tuple[str, int], _Incoming] = {}
        for record in records:
            try:
                self._receive_one(record, batches)
            except Exception as exc:
                self._isolate(record, exc, batches)
        for key, incoming in batches.items():
            pq = self._queues[key]
            pq.put(incoming.msgs, sizes=incoming.sizes, records=incoming.records)
            for record, reason in incoming.poison:
                self._quarantine(record, pq, reason)
            if incoming.work:
                if self.orderly:
                    pq.enqueue(incoming.work)
                    self._schedule_orderly(pq)
                else:
                    self._dispatch(pq, incoming.work)
            settings = self.settings
            if key not in self._paused and pq.over(
                settings.pull_threshold_for_queue, settings.pull_threshold_size_for_queue << 20
            ):
                self._kafka.pause([TopicPartition(*key)])
                self._paused.add(key)

    def _incoming(
        self, key: tuple[str, int], batches: dict[tuple[str, int], _Incoming]
    ) -> _Incoming:
        """``key``'s share of the poll being received."""
        incoming = batches.get(key)
        if incoming is None:
            pq = self._queues[key]
            incoming = batches[key] = _Incoming(
                self.settings.pull_threshold_for_queue - pq.held,
                (self.settings.pull_threshold_size_for_queue << 20) - pq.held_bytes,
            )
        return incoming

    def _cut(self, record: Any, incoming: _Incoming) -> bool:
        """The partition of ``record`` holds all it may: leave ``record`` and the rest of the
        poll to Kafka (seek back to it; it is fetched again once the partition resumes), so
        a partition goes over its thresholds by one record at most. False (the record is
        held after all) if the seek fails."""
        if not incoming.can_cut:
            return False
        try:
            self._kafka.seek(TopicPartition(record.topic(), record.partition(), record.offset()))
        except Exception as exc:
            logger.warning(
                "push consumer %s: cannot seek %s[%d] back to %d, holding beyond its "
                "thresholds: %s",
                self.group, record.topic(), record.partition(), record.offset(), exc,
            )  # fmt: skip
            incoming.can_cut = False
            return False
        incoming.cut = True
        return True

    def _receive_one(self, record: Any, batches: dict[tuple[str, int], _Incoming]) -> None:
        error = record.error()
        if error is not None:
            self._record_error(record, error)
            return
        key = (record.topic(), record.partition())
        pq = self._queues.get(key)
        if pq is None or pq.dropped:
            return  # revoked meanwhile: the next owner reads it
        incoming = self._incoming(key, batches)
        if incoming.cut or (incoming.full and self._cut(record, incoming)):
            return  # fetched again once the partition resumes
        try:
            headers = read_headers(record)
        except MalformedRecordError as exc:
            # A header name that is not UTF-8. The list confluent-kafka keeps afterwards holds
            # a NULL that crashes the process when read: never read them again.
            reason = MalformedRecordError(f"{exc}; quarantined without them")
            incoming.hold_poison(_Headerless(record), reason)
            return
        msg = self._decode(record, headers)
        if isinstance(msg, Exception):
            incoming.hold_poison(record, msg)
            return
        sub = self._subscriptions.get(msg.topic)
        if (
            sub is not None
            and record.topic() == sub.kafka_topic
            and not sub.filter.matches(msg.tags)
        ):
            pq.skip(msg.queue_offset)
            self._count("filtered")
            return
        size = len(msg.body)
        if headers:
            for name, value in headers:
                size += len(name) + (len(value) if value is not None else 0)
        incoming.hold(msg, size, record)

    def _isolate(
        self, record: Any, exc: Exception, batches: dict[tuple[str, int], _Incoming]
    ) -> None:
        """``record`` raised while being received: quarantine it with the reason."""
        logger.warning(
            "push consumer %s: cannot handle %s[%s]@%s, quarantining it",
            self.group,
            record.topic(),
            record.partition(),
            record.offset(),
            exc_info=True,
        )
        key = (record.topic(), record.partition())
        pq = self._queues.get(key)
        if pq is None or pq.dropped:
            return
        # Its headers were read (a record whose headers raise is handled before): reading
        # them again for the copy is safe.
        self._incoming(key, batches).hold_poison(record, exc)

    def _record_error(self, record: Any, error: KafkaError) -> None:
        if error.code() in _RECORD_ERRORS_IGNORED:
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            topic = record.topic() or error.str()
            if topic not in self._missing_topics:
                self._missing_topics.add(topic)
                logger.warning("push consumer %s: topic %s does not exist (yet)", self.group, topic)
            return
        logger.warning("push consumer %s: %s", self.group, error.str())

    def _resume_drained(self) -> None:
        if not self._paused:
            return
        count = self.settings.pull_threshold_for_queue
        size = self.settings.pull_threshold_size_for_queue << 20
        ready = [
            key
            for key in self._paused
            if key not in self._queues or not self._queues[key].over(count, size)
        ]
        for key in ready:
            self._paused.discard(key)
            if key in self._queues:
                self._kafka.resume([TopicPartition(*key)])

    def _decode(
        self, record: Any, headers: list[tuple[str, bytes | None]] | None
    ) -> MessageExt | MalformedRecordError:
        """The message of ``record`` (whose ``headers`` were read), or why it must be
        quarantined (a malformed retry record)."""
        msg = message_from_record(record, headers=headers)
        msg.topic = self._topic_names.get(msg.kafka_topic, msg.kafka_topic)
        if msg.kafka_topic != self._retry_kafka_topic:
            return msg
        origin = msg.get_property(MessageConst.RETRY_TOPIC)
        times = msg.get_property(MessageConst.RECONSUME_TIME)
        if not origin:
            return MalformedRecordError("a retry record without RETRY_TOPIC")
        if not isinstance(origin, str):
            return MalformedRecordError(f"a retry record with RETRY_TOPIC={origin!r}, not text")
        if parse_count(times) is None:
            return MalformedRecordError(
                f"a retry record with RECONSUME_TIME={times!r}, not a count"
            )
        msg.topic = origin
        return msg

    def _quarantine(
        self, record: Any, pq: ProcessQueue, reason: Exception, refused: str | None = None
    ) -> None:
        """Copy ``record`` (held in ``pq``) to QUARANTINE with ``reason``, without waiting; it
        is done once Kafka acknowledges the copy. Until then it stays held. A whole copy that
        is refused for good (too large, say) is replaced by one without the value and headers
        (``refused``: why); a copy that fails otherwise, or a value-less one refused too (an
        error is logged: the record pins its partition), is tried again after
        ``send_back_retry_delay_ms``. Never raises."""
        offset = record.offset()

        def again() -> None:
            if not pq.dropped:
                self._quarantine(record, pq, reason, refused)

        def valueless(why: str) -> None:
            if not pq.dropped:
                self._quarantine(record, pq, reason, why)

        def failed(error: object) -> None:
            text = _error_text(error)
            if not _refused_for_good(error):
                logger.warning(
                    "quarantine of %s[%d]@%d failed, retrying later: %s",
                    pq.topic, pq.partition, offset, text,
                )  # fmt: skip
            elif refused is None:
                logger.warning(
                    "quarantine of %s[%d]@%d refused (%s): quarantining it without its value",
                    pq.topic, pq.partition, offset, text,
                )  # fmt: skip
                # On the poll thread: this may run inside a delivery report.
                self._after(0, lambda: valueless(text))
                return
            else:
                logger.error(
                    "push consumer %s: %s[%d]@%d cannot be quarantined, even without its value "
                    "(%s); it stays held and its offset uncommitted, retrying in %d ms",
                    self.group, pq.topic, pq.partition, offset, text,
                    self.settings.send_back_retry_delay_ms,
                )  # fmt: skip
            self._after(self.settings.send_back_retry_delay_ms, again)

        def delivered(err: KafkaError | None, _: Any) -> None:
            try:
                if err is None:
                    pq.remove([offset])
                    self._count("quarantined")
                else:
                    failed(err)
            except Exception:
                logger.exception("push consumer %s: quarantine report", self.group)

        try:
            copy = self._quarantine_record(record, f"{type(reason).__name__}: {reason}", refused)
            self._sender.send_record_async(copy, -1, delivered)
        except Exception as exc:
            failed(exc)

    def _quarantine_record(
        self, record: Any, reason: str, refused: str | None = None
    ) -> PreparedRecord:
        """The QUARANTINE record of ``record``; without its headers if they break the copy,
        and without its value and headers if the whole copy was ``refused`` (why): then the
        key, the origin (topic, partition, offset), the value's size and the reason remain."""
        by = f"consumer {self.group}"
        if refused is not None:
            value = record.value()
            copy = quarantine_copy(
                self._catalog,
                record,
                f"{reason}; quarantined without its value of {len(value or b'')} bytes and "
                f"its headers, the whole copy being refused ({refused})",
                by,
                keep_value=False,
            )
        else:
            try:
                copy = quarantine_copy(self._catalog, record, reason, by)
            except Exception as exc:
                copy = quarantine_copy(
                    self._catalog,
                    _Headerless(record),
                    f"{reason}; quarantined without its headers ({type(exc).__name__}: {exc})",
                    by,
                )
        return PreparedRecord(
            copy.topic,
            copy.key,
            copy.value if copy.value is not None else b"",
            cast(list[tuple[str, bytes]], copy.headers),
            f"{record.topic()}-{record.partition()}-{record.offset()}",
            copy.timestamp_ms,
        )

    # --- rebalance -----------------------------------------------------------------------
    def _start_positions(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Committed offsets where the group has them; else the retry topic from its start
        and other topics by ``consume_from_where``."""
        try:
            committed = self._kafka.committed(
                partitions, timeout=self.config.request_timeout_ms / 1000
            )
        except Exception as exc:
            logger.warning("push consumer %s: committed offsets unknown (%s)", self.group, exc)
            return partitions
        where = self.settings.consume_from_where
        stamp: list[TopicPartition] = []
        out: list[TopicPartition] = []
        for tp in committed:
            if tp.offset >= 0:
                out.append(tp)
            elif tp.topic == self._retry_kafka_topic:
                out.append(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
            elif where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                when = self.settings.consume_timestamp_ms or int((time.time() - 1800) * 1000)
                stamp.append(TopicPartition(tp.topic, tp.partition, when))
            else:
                first = where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
                out.append(
                    TopicPartition(
                        tp.topic, tp.partition, OFFSET_BEGINNING if first else OFFSET_END
                    )
                )
        if stamp:
            found = self._kafka.offsets_for_times(
                stamp, timeout=self.config.request_timeout_ms / 1000
            )
            out += [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
                for tp in found
            ]
        return out

    def _take(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        positions = self._start_positions(partitions)
        for tp in positions:
            self._queues[(tp.topic, tp.partition)] = ProcessQueue(tp.topic, tp.partition)
        logger.info(
            "push consumer %s: assigned %s",
            self.group,
            [f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in positions],
        )
        return positions

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        consumer.assign(self._take(partitions))

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # Orderly: never let the next owner run a partition while its listener runs here.
        wait_s = self._orderly_wait_s if self.orderly else self.settings.drain_timeout_ms / 1000
        self._release([(tp.topic, tp.partition) for tp in partitions], wait_s)

    def _on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        # The partitions already belong to someone else: stop, commit nothing.
        for tp in partitions:
            pq = self._queues.pop((tp.topic, tp.partition), None)
            if pq is not None:
                pq.release()
            self._paused.discard((tp.topic, tp.partition))
        logger.warning("push consumer %s: lost %d partitions", self.group, len(partitions))

    def _release(self, keys: list[tuple[str, int]], wait_s: float) -> None:
        """Stop new work on ``keys``, give running listeners up to ``wait_s`` seconds (never
        past the shutdown deadline), commit what is done, forget the partitions. Messages
        still in a listener then are abandoned: logged, never committed past (the next owner
        consumes them again), their listeners' late results ignored."""
        queues = [(key, self._queues[key]) for key in keys if key in self._queues]
        for _, pq in queues:
            pq.drop()
        began = time.monotonic()
        deadline = began + wait_s
        while True:
            busy = [(key, pq) for key, pq in queues if pq.running]
            remaining = min(deadline, self._shutdown_deadline) - time.monotonic()
            if not busy or remaining <= 0:
                break
            busy[0][1].wait_idle(min(remaining, _WAIT_SLICE_S))
        for _, pq in queues:
            pq.release()
        if busy:
            logger.warning(
                "push consumer %s: abandoned %s (partition: messages held) with listeners "
                "still running after %.1f s; they will be redelivered, their offsets are not "
                "committed past",
                self.group,
                ", ".join(f"{key[0]}[{key[1]}]: {pq.held}" for key, pq in busy),
                time.monotonic() - began,
            )
        if self._producer is not None and self.message_model is MessageModel.CLUSTERING:
            # Copies still in flight: let them be acknowledged so their offsets can pass.
            try:
                self._producer.flush(self._bounded_ms(self.config.send_msg_timeout_ms))
            except Exception as exc:  # the producer stopped (a shutdown that gave up waiting)
                logger.warning("push consumer %s: copies not flushed: %s", self.group, exc)
        self._commit(keys, asynchronous=False)
        for key in keys:
            self._queues.pop(key, None)
            self._paused.discard(key)

    def _assign_new_partitions(self) -> None:
        """BROADCASTING: take every partition of the subscribed topics not yet taken."""
        self._last_refresh = time.monotonic()
        new: list[TopicPartition] = []
        for kafka_topic in self._topic_names:
            try:
                meta = self._kafka.list_topics(
                    kafka_topic, timeout=self.config.request_timeout_ms / 1000
                )
            except Exception as exc:
                logger.warning("push consumer %s: metadata of %s: %s", self.group, kafka_topic, exc)
                continue
            info = meta.topics.get(kafka_topic)
            if info is None or info.error is not None:
                continue
            new += [
                TopicPartition(kafka_topic, p)
                for p in info.partitions
                if (kafka_topic, p) not in self._queues
            ]
        if new:
            self._kafka.incremental_assign(self._take(new))

    # --- offsets -------------------------------------------------------------------------
    def _commit(self, keys: Iterable[tuple[str, int]], *, asynchronous: bool) -> None:
        self._last_commit = time.monotonic()
        offsets = []
        for key in keys:
            pq = self._queues.get(key)
            if pq is None:
                continue
            offset = pq.commit_offset()
            if offset is not None and offset != pq.last_committed:
                offsets.append(TopicPartition(key[0], key[1], offset))
                pq.last_committed = offset
        if not offsets:
            return
        try:
            self._kafka.commit(offsets=offsets, asynchronous=asynchronous)
        except Exception as exc:
            logger.warning("push consumer %s: offset commit failed: %s", self.group, exc)
            for tp in offsets:
                pq = self._queues.get((tp.topic, tp.partition))
                if pq is not None:
                    pq.last_committed = -1

    # --- deferred work -------------------------------------------------------------------
    def _after(self, delay_ms: int, action: Callable[[], None]) -> None:
        """Run ``action`` on the poll thread after ``delay_ms`` (ms)."""
        item = _Later(time.monotonic() + delay_ms / 1000, next(self._seq), action)
        with self._later_lock:
            heapq.heappush(self._later, item)

    def _run_due(self) -> None:
        now = time.monotonic()
        while True:
            with self._later_lock:
                if not self._later or self._later[0].due > now:
                    return
                item = heapq.heappop(self._later)
            try:
                item.action()
            except Exception:
                logger.exception("push consumer %s: deferred action failed", self.group)

    def _expire_overdue(self) -> None:
        """RocketMQ's ``cleanExpireMsg``: a message in a concurrent listener for longer than
        ``consume_timeout`` is sent back for retry at delay level 3 (dropped, BROADCASTING),
        so its offset can be committed past; its listener's late result will not count."""
        now = time.monotonic()
        if self.orderly or now < self._next_expiry_check:
            return
        timeout_s = self.settings.consume_timeout * 60
        self._next_expiry_check = now + min(_EXPIRY_CHECK_S, timeout_s)
        for pq in list(self._queues.values()):
            if pq.dropped:
                continue
            late = pq.overdue(now, timeout_s)
            if not late:
                continue
            logger.warning(
                "push consumer %s: %d messages of %s[%d] in their listener for more than "
                "consume_timeout (%s min), sending them back; the listener's results for them "
                "will be ignored: %s",
                self.group, len(late), pq.topic, pq.partition, self.settings.consume_timeout,
                [m.msg_id for m in late],
            )  # fmt: skip
            self._count("failed", len(late))
            if self.message_model is MessageModel.BROADCASTING:
                self._count("dropped", len(late))
                pq.remove(m.queue_offset for m in late)
            else:
                self._send_back_async(pq, late, [_CONSUME_TIMEOUT_DELAY_LEVEL] * len(late))

    # --- concurrent consumption ----------------------------------------------------------
    def _dispatch(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        """Cut ``msgs`` into consume requests (up to ``consume_message_batch_max_size``
        messages of one topic each) and hand them to the pool in chunks: the pool's cost is
        paid per chunk, and chunks stay small enough to keep every thread busy."""
        size = self.settings.consume_message_batch_max_size
        requests: list[list[MessageExt]] = []
        batch: list[MessageExt] = []
        for msg in msgs:
            if batch and (len(batch) >= size or batch[0].topic != msg.topic):
                requests.append(batch)
                batch = []
            batch.append(msg)
        if batch:
            requests.append(batch)
        per_task = min(
            _MAX_REQUESTS_PER_TASK, -(-len(requests) // self.settings.consume_thread_count)
        )
        for i in range(0, len(requests), per_task):
            self._pool.submit(self._consume_requests, pq, requests[i : i + per_task])

    def _consume_requests(self, pq: ProcessQueue, requests: list[list[MessageExt]]) -> None:
        """Run the listener on each request, marking what it consumed done at once (so the
        commit follows a slow listener), then send every failed message back together. A
        request whose handling fails unexpectedly is consumed again later and never costs the
        task's other requests."""
        if not pq.begin():
            return  # revoked or stopping: the messages stay uncommitted for the next owner
        try:
            failed: list[MessageExt] = []
            levels: list[int] = []
            for msgs in requests:
                if pq.dropped:
                    break  # what is left stays held: redelivered to the next owner
                self._consume_request(pq, msgs, failed, levels)
            try:
                self._process_result(pq, failed, levels)
            except Exception:
                logger.exception(
                    "push consumer %s: handling %d failed messages; consuming them again later",
                    self.group, len(failed),
                )  # fmt: skip
                self._retry_locally(pq, [m for m in failed if pq.holds(m.queue_offset)])
        except Exception:
            logger.exception("push consumer %s: consume request failed", self.group)
        finally:
            pq.end()

    def _consume_request(
        self, pq: ProcessQueue, msgs: list[MessageExt], failed: list[MessageExt], levels: list[int]
    ) -> None:
        """Run the listener on ``msgs``: mark what it consumed done and add the rest, with
        their delay levels, to ``failed`` and ``levels``. If this goes wrong, the messages not
        yet accounted for are handed back (consumed again after ``send_back_retry_delay_ms``)
        instead of staying held, and in their listener call, for ever."""
        call = object()
        pq.start(call, msgs, time.monotonic())
        settled: set[int] | None = None
        added = 0
        try:
            context = ConsumeConcurrentlyContext(MessageQueue(msgs[0].topic, pq.partition))
            sub = self._subscriptions.get(msgs[0].topic)
            if sub is None:
                # A retry of a topic no longer subscribed to: keep it, in the DLQ.
                logger.warning(
                    "push consumer %s: no subscription for %s; %d messages go to the DLQ",
                    self.group,
                    msgs[0].topic,
                    len(msgs),
                )
                context.delay_level_when_next_consume = -1
                ack_index = -1
            else:
                ack_index = self._call_concurrently(sub.listener, msgs, context)
            head, tail = msgs[: ack_index + 1], msgs[ack_index + 1 :]
            level = self._delay_level(context, msgs) if tail else 0
            settled = pq.settle(call, msgs)
            if len(settled) < len(msgs):
                # Sent back past consume_timeout, or the partition was given up.
                logger.warning(
                    "push consumer %s: ignoring the late listener result for %s",
                    self.group,
                    [m.msg_id for m in msgs if m.queue_offset not in settled],
                )
                head = [m for m in head if m.queue_offset in settled]
                tail = [m for m in tail if m.queue_offset in settled]
            if head:
                self._count("consumed", len(head))
                pq.remove(m.queue_offset for m in head)
            failed += tail
            added = len(tail)
            levels += [level] * len(tail)
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
                self.group, [m.msg_id for m in msgs], len(back),
            )  # fmt: skip
            if back:
                self._retry_locally(pq, back)

    def _delay_level(self, context: ConsumeConcurrentlyContext, msgs: list[MessageExt]) -> int:
        """The listener's ``delay_level_when_next_consume``; the default (0) if not an int."""
        level = checked_delay_level(context.delay_level_when_next_consume)
        if level is None:
            logger.warning(
                "push consumer %s: the listener set delay_level_when_next_consume=%r (not an "
                "int) for %s; using the default level",
                self.group, context.delay_level_when_next_consume, [m.msg_id for m in msgs],
            )  # fmt: skip
            return 0
        return level

    def _call_concurrently(
        self, listener: Listener, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> int:
        """Run the listener; return the index of the last message consumed successfully (-1:
        none). An ``ack_index`` that is not an int fails the whole batch."""
        if isinstance(listener, MessageListenerConcurrently):
            try:
                status = listener.consume_message(msgs, context)
            except Exception:
                logger.warning(
                    "listener raised on %s: RECONSUME_LATER",
                    [m.msg_id for m in msgs],
                    exc_info=True,
                )
                return -1
            if status is ConsumeStatus.CONSUME_SUCCESS:
                index = checked_ack_index(context.ack_index, len(msgs))
                if index is None:
                    logger.warning(
                        "push consumer %s: the listener set ack_index=%r (not an int) for %s: "
                        "RECONSUME_LATER",
                        self.group, context.ack_index, [m.msg_id for m in msgs],
                    )  # fmt: skip
                    return -1
                return index
            if status is None:
                logger.warning("listener returned None for %s: RECONSUME_LATER", msgs[0].msg_id)
            return -1
        return _leading_successes(cast(MessageCallback, listener), msgs) - 1

    def _process_result(
        self, pq: ProcessQueue, failed: list[MessageExt], levels: list[int]
    ) -> None:
        """Send ``failed`` back (CLUSTERING: each is done once its copy is acknowledged) or
        drop them (BROADCASTING)."""
        if failed:
            self._count("failed", len(failed))
            if self.message_model is MessageModel.BROADCASTING:
                for msg in failed:
                    logger.warning("BROADCASTING, the message consume failed, drop it: %s", msg)
                self._count("dropped", len(failed))
                pq.remove(m.queue_offset for m in failed)
            else:
                self._send_back_async(pq, failed, levels)

    def _send_back_async(self, pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        """Copy failed ``msgs`` to the retry topic or DLQ without waiting: each stays held
        until Kafka acknowledges its copy, then is done; a copy that cannot be sent is consumed
        again locally, and one that cannot be built (it never will be) is quarantined. The
        listener threads never wait for the broker. Never raises."""
        for msg, level in zip(msgs, levels, strict=True):
            try:
                route, record = self._copy_of(msg, level)
            except Exception as exc:
                # A copy is built from the message alone: it would fail the same way again.
                logger.warning(
                    "push consumer %s: cannot build the retry copy of %s, quarantining it: %s",
                    self.group, msg.msg_id, exc, exc_info=True,
                )  # fmt: skip
                self._quarantine_held(pq, msg, exc)
                continue
            self._send_copy(pq, msg, route, record)

    def _send_copy(
        self, pq: ProcessQueue, msg: MessageExt, route: RetryRoute, record: PreparedRecord
    ) -> None:
        def delivered(err: KafkaError | None, _: Any) -> None:
            try:
                if err is None:
                    self._sent_back(msg, route)
                    pq.remove([msg.queue_offset])
                else:
                    self._copy_failed(pq, msg, route, err)
            except Exception:
                logger.exception("push consumer %s: send-back report", self.group)

        try:
            self._sender.send_record_async(record, record.partition, delivered)
        except Exception as exc:
            self._copy_failed(pq, msg, route, exc)

    def _copy_failed(
        self, pq: ProcessQueue, msg: MessageExt, route: RetryRoute, error: object
    ) -> None:
        """The retry or DLQ copy of held ``msg`` was not written. A transient failure: consume
        it again later. A refusal for good: the same, a bounded number of times (the listener
        may succeed meanwhile), then quarantine it with the reason, so it no longer pins its
        partition."""
        where = "DLQ" if route.to_dlq else "retry"
        if not _refused_for_good(error):
            logger.warning(
                "%s copy of %s failed, consuming it again later: %s",
                where, msg.msg_id, _error_text(error),
            )  # fmt: skip
            self._retry_locally(pq, [msg])
            return
        refusals = pq.note_refusal(msg.queue_offset)
        if refusals == 0:
            return  # done meanwhile, or the partition was given up
        if refusals < _COPY_ATTEMPTS:
            logger.warning(
                "%s copy of %s refused (%d of %d), consuming it again later: %s",
                where, msg.msg_id, refusals, _COPY_ATTEMPTS, _error_text(error),
            )  # fmt: skip
            delay_ms = self.settings.send_back_retry_delay_ms << (refusals - 1)
            self._retry_locally(pq, [msg], delay_ms)
            return
        self._quarantine_held(pq, msg, self._refusal(msg, where, refusals, error))

    @staticmethod
    def _refusal(msg: MessageExt, where: str, refusals: int, error: object) -> SendError:
        """Why ``msg`` is quarantined: its ``where`` copy was refused ``refusals`` times."""
        return SendError(
            f"the {where} copy of message {msg.msg_id} was refused {refusals} times: "
            f"{_error_text(error)}"
        )

    def _quarantine_held(self, pq: ProcessQueue, msg: MessageExt, reason: Exception) -> None:
        """Quarantine the record of held ``msg`` (its copy cannot be built)."""
        record = pq.record_of(msg.queue_offset)
        if record is None:  # pragma: no cover - every held message has its record
            logger.error("push consumer %s: no record for %s, retrying", self.group, msg.msg_id)
            self._retry_locally(pq, [msg])
            return
        self._quarantine(record, pq, reason)

    def _copy_of(self, msg: MessageExt, level: int) -> tuple[RetryRoute, PreparedRecord]:
        """Where failed ``msg`` goes (its listener's ``level``, 0: the default) and the record
        that takes it there."""
        route = retry_route(msg.reconsume_times, self.max_reconsume_times, level)
        record = send_back_record(
            msg,
            self.group,
            route,
            self.max_reconsume_times,
            config=self.config,
            born_host=self._born_host,
        )
        return route, record

    def _dead_letter(
        self, pq: ProcessQueue, msgs: list[MessageExt]
    ) -> tuple[list[MessageExt], list[MessageExt]]:
        """Copy ``msgs`` to the DLQ and wait for Kafka; return (acknowledged, not). A message
        whose copy cannot be built, or was refused for good ``_COPY_ATTEMPTS`` times, is
        quarantined instead (it is in neither list)."""
        built: list[tuple[MessageExt, RetryRoute, PreparedRecord]] = []
        for msg in msgs:
            try:
                built.append((msg, *self._copy_of(msg, -1)))
            except Exception as exc:
                logger.warning(
                    "push consumer %s: cannot build the DLQ copy of %s, quarantining it: %s",
                    self.group, msg.msg_id, exc, exc_info=True,
                )  # fmt: skip
                self._quarantine_held(pq, msg, exc)
        results = self._sender.send_records_sync([record for _, _, record in built])
        sent: list[MessageExt] = []
        kept: list[MessageExt] = []
        for (msg, route, _), result in zip(built, results, strict=True):
            if isinstance(result, KafkaClientError):
                refusals = pq.note_refusal(msg.queue_offset) if _refused_for_good(result) else 0
                if refusals >= _COPY_ATTEMPTS:
                    # Refused for good each time: quarantined, so the partition goes on.
                    self._quarantine_held(pq, msg, self._refusal(msg, "DLQ", refusals, result))
                    continue
                logger.warning("DLQ copy of %s failed, retrying in place: %s", msg.msg_id, result)
                kept.append(msg)
                continue
            sent.append(msg)
            self._sent_back(msg, route)
        return sent, kept

    def _sent_back(self, msg: MessageExt, route: RetryRoute) -> None:
        if route.to_dlq:
            self._count("dead_lettered")
            logger.warning(
                "message %s (from %s) goes to the DLQ of %s after %d failures",
                msg.msg_id,
                origin_topic(msg),
                self.group,
                route.reconsume_times,
            )
        else:
            self._count("sent_back")
            logger.debug(
                "message %s sent back at level %d (reconsume %d)",
                msg.msg_id,
                route.delay_level,
                route.reconsume_times,
            )

    def _retry_locally(
        self, pq: ProcessQueue, msgs: list[MessageExt], delay_ms: int | None = None
    ) -> None:
        """Consume again after ``delay_ms`` (default ``send_back_retry_delay_ms``), here
        (RocketMQ's ``submitConsumeRequestLater``): the send-back failed, so the messages stay
        held and uncommitted."""
        self._count("retried_locally", len(msgs))
        for msg in msgs:
            msg.put_system_property(MessageConst.RECONSUME_TIME, str(msg.reconsume_times + 1))

        def again() -> None:
            if not pq.dropped:
                self._dispatch(pq, msgs)

        self._after(self.settings.send_back_retry_delay_ms if delay_ms is None else delay_ms, again)

    # --- orderly consumption -------------------------------------------------------------
    def _schedule_orderly(self, pq: ProcessQueue, delay_ms: int = 0) -> None:
        with pq.lock:
            if pq.orderly_scheduled and delay_ms == 0:
                return
            pq.orderly_scheduled = True
        if delay_ms:
            self._after(delay_ms, lambda: self._resubmit_orderly(pq))
        else:
            self._pool.submit(self._consume_orderly, pq)

    def _resubmit_orderly(self, pq: ProcessQueue) -> None:
        self._pool.submit(self._consume_orderly, pq)

    def _consume_orderly(self, pq: ProcessQueue) -> None:
        """Consume ``pq`` in order until it is empty; a failed batch waits and is retried in
        place. Exactly one such task owns a partition at a time (``orderly_scheduled``)."""
        if not pq.begin():
            with pq.lock:
                pq.orderly_scheduled = False
            return
        try:
            self._consume_orderly_slice(pq)
        except Exception:
            logger.exception("push consumer %s: orderly consumption failed", self.group)
            with pq.lock:
                pq.orderly_scheduled = False
            # What is still pending must not wait for new records to be looked at again.
            try:
                self._schedule_orderly(pq, max(self.settings.suspend_current_queue_time_millis, 1))
            except Exception:  # the pool is shut down: the consumer stops
                logger.exception("push consumer %s: orderly rescheduling failed", self.group)
        finally:
            pq.end()

    def _consume_orderly_slice(self, pq: ProcessQueue) -> None:
        size = self.settings.consume_message_batch_max_size
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
                ok = self._call_orderly(self._subscriptions[msgs[0].topic].listener, msgs, context)
                settled = pq.settle(call, msgs)
                if len(settled) < len(msgs):
                    # Given up while the listener ran (see _release): the next owner has them.
                    logger.warning(
                        "push consumer %s: ignoring the late orderly result for %s",
                        self.group,
                        [m.msg_id for m in msgs],
                    )
                    with pq.lock:
                        pq.orderly_scheduled = False
                    return
                done, failed = msgs[:ok], msgs[ok:]
                self._count("consumed", len(done))
                pq.remove(m.queue_offset for m in done)
                if failed:
                    self._count("failed", len(failed))
                    try:
                        retry = self._orderly_failed(pq, failed)
                    except Exception:
                        # Keep the partition's order: retry the batch in place.
                        logger.exception("push consumer %s: orderly failure handling", self.group)
                        retry = failed
                    if retry:
                        suspend = self._suspend_ms(context, retry)
            except Exception:
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
                    self.group, [m.msg_id for m in msgs], len(retry),
                )  # fmt: skip
                suspend = max(self.settings.suspend_current_queue_time_millis, 1)
            if retry:
                pq.put_back(retry)
                self._schedule_orderly(pq, suspend)
                return
            if time.monotonic() > until:
                self._resubmit_orderly(pq)
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
                self.group, context.suspend_current_queue_time_millis, [m.msg_id for m in msgs],
            )  # fmt: skip
            suspend = -1
        if suspend < 0:
            suspend = self.settings.suspend_current_queue_time_millis
        return max(suspend, 1)

    def _call_orderly(
        self, listener: Listener, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> int:
        """Run an orderly listener; return how many leading messages are done."""
        if isinstance(listener, MessageListenerOrderly):
            try:
                status = listener.consume_message(msgs, context)
            except Exception:
                logger.warning(
                    "orderly listener raised on %s: suspending",
                    [m.msg_id for m in msgs],
                    exc_info=True,
                )
                return 0
            return len(msgs) if status is ConsumeOrderlyStatus.SUCCESS else 0
        return _leading_successes(cast(MessageCallback, listener), msgs)

    def _orderly_failed(self, pq: ProcessQueue, failed: list[MessageExt]) -> list[MessageExt]:
        """RocketMQ's ``checkReconsumeTimes``: messages out of retries go to the DLQ (or are
        dropped, BROADCASTING); the rest count one more failure and are returned for retry."""
        limit = self.max_reconsume_times
        spent = [m for m in failed if m.reconsume_times >= limit]
        retry = [m for m in failed if m.reconsume_times < limit]
        if spent:
            if self.message_model is MessageModel.BROADCASTING:
                for msg in spent:
                    logger.warning("BROADCASTING, the message consume failed, drop it: %s", msg)
                self._count("dropped", len(spent))
                pq.remove(m.queue_offset for m in spent)
            else:
                sent, kept = self._dead_letter(pq, spent)
                pq.remove(m.queue_offset for m in sent)
                retry = sorted(retry + kept, key=lambda m: m.queue_offset)
        for msg in retry:
            msg.put_system_property(MessageConst.RECONSUME_TIME, str(msg.reconsume_times + 1))
        return retry
