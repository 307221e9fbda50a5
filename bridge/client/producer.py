"""The plain producer: RocketMQ's ``Producer`` API over an idempotent Kafka producer.

Sends are idempotent and acknowledged by all in-sync replicas (``acks=all``), so a retried
send never duplicates a record. Every send is bounded by ``send_msg_timeout_ms``.

:meth:`Producer.prepare` checks what can be checked before sending, each with a typed error
naming the problem: argument types and text that is not valid Unicode, delays, the body size
and the size of properties, keys and tags, Kafka's internal and the bridge's system topics,
and an explicit partition against the topic's partition count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import Enum
from functools import lru_cache
from typing import Any, Final, NamedTuple

from confluent_kafka import KafkaError, KafkaException

from bridge.codec import PreparedRecord, header_bytes, new_tuple, plain_record
from bridge.config import ClientConfig
from bridge.delay.routing import delayed_record, without_delay
from bridge.errors import (
    InvalidArgumentError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicNameError,
    KafkaClientError,
    MessageTooLargeError,
    SendError,
    SendTimeoutError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_producer, translate_error
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageIdGenerator, local_ipv4
from topics.catalog import SystemTopic
from topics.naming import is_kafka_internal, to_kafka_topic, validate_user_group

logger = logging.getLogger(__name__)

OnSuccess = Callable[["SendResult"], None]
OnException = Callable[[Exception], None]

_POLL_INTERVAL_S = 0.02
"""How often the delivery thread checks whether senders went quiet, seconds."""
_REPORTS_EVERY_SENDS = 32
"""Asynchronous sends serve waiting delivery reports every this many sends: each poll hands
the GIL around, so serving after every send costs more than the reports themselves."""
_SYNC_FLUSH_SLICE_S = 0.005
"""A sync send waits in flush() slices this long, seconds (flush skips linger.ms)."""


class SendStatus(Enum):
    """RocketMQ's ``SendStatus``. With ``acks=all`` a stored message is always SEND_OK."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class SendResult(NamedTuple):
    """Where a sent message was stored: ``queue_id`` is the partition, ``offset`` the offset."""

    status: SendStatus
    msg_id: str
    offset: int
    topic: str
    queue_id: int


MAX_PROPERTIES_BYTES: Final = 32_767
"""The largest a message's properties, keys and tags may be together, in bytes, measured as
RocketMQ encodes them (each ``name`` and value in UTF-8, plus 2 separator bytes): RocketMQ's
broker refuses a properties block over ``Short.MAX_VALUE`` bytes. Without this limit a
message with megabytes of properties would only fail at the broker, as a generic send error."""
_OWN_HEADERS_BYTES: Final = 128
"""Room left for what the producer adds (``UNIQ_KEY``, ``BORN_HOST``, ``REAL_TOPIC``, ...)."""
_TAGS_ALWAYS_FIT: Final = (MAX_PROPERTIES_BYTES - _OWN_HEADERS_BYTES) // 4
"""Tags this many characters or fewer (4 UTF-8 bytes at most each) always fit: a message
without properties or keys needs no measuring."""
_PARTITION_COUNT_TTL_S: Final = 30.0
"""How long a topic's partition count is trusted for checking explicit partitions, seconds."""
_PARTITION_COUNT_CACHE_SIZE: Final = 4096

_SYSTEM_TOPIC_NAMES: Final = frozenset(system.value for system in SystemTopic)


@lru_cache(maxsize=4096)
def _kafka_topic(topic: str, namespace: str) -> str:
    """The Kafka topic a message for ``topic`` goes to; raises
    :class:`InvalidTopicNameError` for names that cannot be mapped and for topics no message
    may be sent to: Kafka's internal topics (``__consumer_offsets``, ...) and the bridge's
    system topics, by their RocketMQ name (``SCHEDULE_TOPIC_XXXX``) or their Kafka name
    (``<namespace>.SCHEDULE_TOPIC_XXXX``, refused by :func:`to_kafka_topic`). Cached, so a
    send pays nothing for the checks. ``%RETRY%<group>`` and ``%DLQ%<group>`` are allowed,
    as RocketMQ allows them."""
    if topic in _SYSTEM_TOPIC_NAMES:
        raise InvalidTopicNameError(
            topic,
            "is a system topic of the bridge; delayed and transactional messages get there "
            "by being sent to their real topic",
        )
    kafka_topic = to_kafka_topic(topic, namespace)
    if is_kafka_internal(kafka_topic):
        raise InvalidTopicNameError(
            topic, "names starting with '__' are Kafka's internal topics (__consumer_offsets, ...)"
        )
    return kafka_topic


def _properties_size(msg: Message) -> int:
    """The bytes of ``msg``'s properties, keys and tags as RocketMQ encodes them (see
    :data:`MAX_PROPERTIES_BYTES`)."""
    return sum(
        len(name.encode()) + len(header_bytes(value)) + 2
        for name, value in msg.wire_properties().items()
    )


def _properties_too_large(size: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        size,
        MAX_PROPERTIES_BYTES,
        f"message properties, keys and tags are {size} bytes encoded, more than the "
        f"{MAX_PROPERTIES_BYTES} bytes a RocketMQ broker accepts (Short.MAX_VALUE)",
    )


class _SyncWaiter:
    __slots__ = ("error", "event", "failure", "offset", "partition")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: KafkaError | None = None
        self.failure: KafkaClientError | None = None
        self.partition = -1
        self.offset = -1

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        if err is not None:
            self.error = err
        else:
            self.partition = kmsg.partition()
            self.offset = kmsg.offset()
        self.event.set()


class _AsyncReport:
    """The delivery report handler of one ``send_async``.

    One small object per message in flight and nothing else: confluent-kafka keeps it until
    the report arrives, and a closure (function, cells, captured record) would keep several
    objects per message alive for the garbage collector to walk through.
    """

    __slots__ = ("kafka_topic", "msg_id", "on_exception", "on_success", "topic")

    def __init__(
        self,
        msg_id: str,
        topic: str,
        kafka_topic: str,
        on_success: OnSuccess | None,
        on_exception: OnException | None,
    ) -> None:
        self.msg_id = msg_id
        self.topic = topic
        self.kafka_topic = kafka_topic
        self.on_success = on_success
        self.on_exception = on_exception

    def __call__(self, err: KafkaError | None, kmsg: Any) -> None:
        try:
            if err is not None:
                error = translate_error(err, f"send of {self.msg_id} to {self.kafka_topic}")
                if self.on_exception is not None:
                    self.on_exception(error)
                else:
                    logger.warning("async send failed: %s", error)
            elif self.on_success is not None:
                stored = (SendStatus.SEND_OK, self.msg_id, kmsg.offset(), self.topic)
                self.on_success(new_tuple(SendResult, (*stored, kmsg.partition())))
        except Exception:
            logger.exception("send callback for %s raised", self.msg_id)


def _log_oneway_failure(err: KafkaError | None, kmsg: Any) -> None:
    if err is not None:
        logger.warning("oneway send to %s failed: %s", kmsg.topic(), err.str())


class Producer(Startable):
    """Sends messages to real topics: ``send_sync``, ``send_async`` and ``send_oneway``.

    ``Producer("group", bootstrap_servers="host:9092")`` or ``Producer("group",
    config=ClientConfig.from_env())``; keyword arguments win over ``config``. Call
    :meth:`start` (or use ``with``) before sending and :meth:`shutdown` after.
    """

    def __init__(
        self,
        group: str,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        send_msg_timeout_ms: int | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        self.config = (config or ClientConfig()).replace(
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=send_msg_timeout_ms,
        )
        self.group = validate_user_group(group, self.config.namespace)
        self._lifecycle = Lifecycle(f"producer {group}")
        self._ids = MessageIdGenerator()
        self._born_host = local_ipv4().encode("ascii")
        self._kafka: Any = None
        self._poller: threading.Thread | None = None
        self._stop_polling = threading.Event()
        self._senders_active = False
        catalog = self.config.catalog()
        self._system_topics = frozenset(
            catalog.topic(t) for t in (SystemTopic.HALF, SystemTopic.SCHEDULE, SystemTopic.TIMER)
        )
        self._system_topics_ready = False
        self._max_message_bytes = self.config.max_message_bytes
        self._namespace = self.config.namespace
        self._partition_counts: dict[str, tuple[float, int]] = {}
        """Kafka topic -> (monotonic time until which it is trusted, partition count)."""
        self._sends_unserved = 0
        """Asynchronous sends since reports were last served (approximate across threads)."""
        self._running = False
        """Mirrors ``state is RUNNING`` for a cheap check on every send."""

    # --- lifecycle --------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._lifecycle.state

    def start(self) -> None:
        """Create the Kafka client and its delivery thread. May be called once."""
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            self._kafka = new_producer(self.config, client_id=self.group)
        except Exception:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        self._poller = threading.Thread(
            target=self._poll_loop, name=f"bridge-producer-{self.group}", daemon=True
        )
        self._poller.start()
        self._running = True
        logger.info("producer %s started (bootstrap %s)", self.group, self.config.bootstrap_servers)

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) for outstanding sends,
        then stop. Idempotent."""
        if self._lifecycle.state in (ServiceState.SHUTDOWN_ALREADY, ServiceState.CREATE_JUST):
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        self._running = False
        timeout = timeout_ms if timeout_ms is not None else self.config.send_msg_timeout_ms
        remaining = self._kafka.flush(timeout / 1000)
        if remaining:
            logger.warning(
                "producer %s: %d messages still unacknowledged at shutdown", self.group, remaining
            )
        self._stop_polling.set()
        if self._poller is not None:
            self._poller.join()
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        logger.info("producer %s shut down", self.group)

    def stop(self) -> None:
        """:meth:`shutdown` with the default timeout (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def flush(self, timeout_ms: int | None = None) -> int:
        """Wait for outstanding sends; return how many are still unacknowledged."""
        self._lifecycle.require_running()
        timeout = timeout_ms if timeout_ms is not None else self.config.send_msg_timeout_ms
        return int(self._kafka.flush(timeout / 1000))

    def _poll_loop(self) -> None:
        # Delivery reports are served on the sending threads every few sends (confluent-kafka
        # takes the GIL once per report, so serving each as it arrives here would hand the GIL
        # back and forth for every message); while senders are busy this thread serves what
        # waits once per interval, so no report waits longer than that for the next sends.
        kafka = self._kafka
        while not self._stop_polling.is_set():
            if self._senders_active:
                self._senders_active = False
                self._stop_polling.wait(_POLL_INTERVAL_S)
                kafka.poll(0)
            else:
                kafka.poll(_POLL_INTERVAL_S)

    # --- sending ----------------------------------------------------------------------
    def prepare(self, msg: Message, partition: int = -1) -> PreparedRecord:
        """Validate ``msg`` and build its Kafka record (topic, partition, key, value, headers,
        id). A delayed message (delay level or timer) becomes a record of the SCHEDULE or
        timer topic, its real topic and ``partition`` kept in ``REAL_TOPIC``/``REAL_QID``.

        Raises, before anything is sent, a typed error naming the problem:

        * :class:`InvalidMessageError`: not a Message, an empty body, a topic, tags or keys
          that are not strings or hold a lone surrogate;
        * :class:`InvalidPropertyError`: a property that is not valid Unicode text or bytes;
        * ``InvalidDelayError``: a malformed delay or a timer beyond ``timer_max_delay_ms``;
        * :class:`MessageTooLargeError`: a body over ``max_message_bytes``, or properties,
          keys and tags over :data:`MAX_PROPERTIES_BYTES` encoded;
        * :class:`InvalidTopicNameError`: a name Kafka cannot take, Kafka's internal topics
          (``__*``) and the bridge's system topics;
        * :class:`InvalidArgumentError`: a ``partition`` other than -1 that the (existing)
          topic does not have, for delayed messages too.
        """
        if not isinstance(msg, Message):
            raise InvalidMessageError(f"expected a Message, got {type(msg).__name__}")
        body = msg.body
        if not body:
            raise InvalidMessageError("the message body length is zero")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError(len(body), self._max_message_bytes)
        topic = msg.topic
        if type(topic) is not str:
            raise InvalidMessageError(f"the topic must be a string, got {type(topic).__name__}")
        kafka_topic = _kafka_topic(topic, self._namespace)
        if partition != -1:
            self._check_partition(topic, kafka_topic, partition)
        born_ms = time.time_ns() // 1_000_000
        msg_id = self._ids.next_id(born_ms)
        try:
            props, keys, tags = msg._properties, msg._keys, msg.tags
            if props or keys or (tags and len(tags) > _TAGS_ALWAYS_FIT):
                # Characters are 4 UTF-8 bytes at most: only a block that might be too large
                # is measured exactly.
                chars = len(tags or "") + len(keys) + 2 * len(props)
                for key in keys:
                    chars += len(key)
                for name, value in props.items():
                    chars += len(name) + len(value)
                if chars * 4 + _OWN_HEADERS_BYTES > MAX_PROPERTIES_BYTES:
                    size = _properties_size(msg)
                    if size > MAX_PROPERTIES_BYTES:
                        raise _properties_too_large(size)
            if msg.is_delayed:
                delayed = delayed_record(
                    msg, msg_id, born_ms, self._born_host.decode(), partition=partition,
                    config=self.config,
                )  # fmt: skip
                if delayed is not None:
                    return delayed
                msg = without_delay(msg)  # a timer already due: delivered at once
            return plain_record(msg, kafka_topic, msg_id, born_ms, self._born_host, partition)
        except (UnicodeEncodeError, AttributeError, TypeError, InvalidPropertyError):
            # Content that cannot be encoded (a lone surrogate, tags that are not a string):
            # name what it is. Diagnosing only on failure keeps valid sends free of it.
            msg.check_wire()
            raise

    def _check_partition(self, topic: str, kafka_topic: str, partition: object) -> None:
        """Refuse a partition the topic does not have. The count comes from the producer's
        metadata, trusted for :data:`_PARTITION_COUNT_TTL_S` while partitions below it are
        asked for; a partition at or beyond it is checked against fresh metadata first
        (partitions may have been added). A topic that does not exist (yet) or metadata that
        does not come is no reason to refuse: the send reports what happens. Where the broker
        creates topics on first use, asking for a missing topic's metadata creates it, as
        the send would, and its new partition count is then checked."""
        if type(partition) is not int or partition < -1:
            raise InvalidArgumentError(
                f"partition {partition!r} for {topic}: expected -1 (the key decides) or a "
                "partition number"
            )
        if partition == -1 or self._kafka is None:
            return
        cached = self._partition_counts.get(kafka_topic)
        if cached is not None and partition < cached[1] and time.monotonic() < cached[0]:
            return
        count = self._partition_count(kafka_topic)
        if count is not None and partition >= count:
            named = topic if topic == kafka_topic else f"{topic} (Kafka topic {kafka_topic})"
            raise InvalidArgumentError(
                f"partition {partition} of {named} does not exist: the topic has {count} "
                f"partitions (0-{count - 1})"
            )

    def _partition_count(self, kafka_topic: str) -> int | None:
        """The topic's partition count from fresh metadata (and cache it), or None."""
        try:
            # Bounded like the send itself: a broker that does not answer fails the send anyway.
            timeout_ms = min(self.config.request_timeout_ms, self.config.send_msg_timeout_ms)
            metadata = self._kafka.list_topics(kafka_topic, timeout=timeout_ms / 1000)
        except KafkaException:
            return None
        info = metadata.topics.get(kafka_topic)
        if info is None or info.error is not None or not info.partitions:
            return None
        count = len(info.partitions)
        if len(self._partition_counts) >= _PARTITION_COUNT_CACHE_SIZE:
            self._partition_counts.clear()
        self._partition_counts[kafka_topic] = (time.monotonic() + _PARTITION_COUNT_TTL_S, count)
        return count

    def _ensure_system_topics(self) -> None:
        """Create the system topics (idempotent) before the first record to one of them, so
        Kafka never auto-creates one with the wrong partition count."""
        catalog = self.config.catalog()
        admin = TopicAdmin(self.config)
        # Levels and tiers are partitions: their counts must be right. Any HALF partition
        # count works for writing; the coordinator owns that choice.
        admin.ensure_topics([catalog.spec(SystemTopic.SCHEDULE), catalog.spec(SystemTopic.TIMER)])
        admin.ensure_topics(
            [catalog.spec(SystemTopic.HALF), catalog.spec(SystemTopic.OP)], strict=False
        )
        self._system_topics_ready = True

    def _serve_reports(self) -> None:
        """Serve waiting delivery reports on this (sending) thread every
        ``_REPORTS_EVERY_SENDS`` sends; the delivery thread serves the rest (``_poll_loop``)."""
        self._sends_unserved += 1
        if self._sends_unserved >= _REPORTS_EVERY_SENDS:
            self._sends_unserved = 0
            self._kafka.poll(0)

    def _produce(self, record: PreparedRecord, partition: int, callback: Any) -> None:
        if not self._system_topics_ready and record.kafka_topic in self._system_topics:
            self._ensure_system_topics()
        deadline = 0.0
        while True:
            try:
                self._kafka.produce(
                    record.kafka_topic,
                    record.value,
                    record.key,
                    partition=partition,
                    on_delivery=callback,
                    timestamp=record.born_timestamp_ms,
                    headers=record.headers,
                )
                self._senders_active = True
                return
            except BufferError:
                # The local queue is full: let deliveries drain, within the send timeout.
                now = time.monotonic()
                if not deadline:
                    deadline = now + self.config.send_msg_timeout_ms / 1000
                elif now >= deadline:
                    raise SendTimeoutError(
                        f"send of {record.msg_id} to {record.kafka_topic}: local queue full for "
                        f"{self.config.send_msg_timeout_ms} ms"
                    ) from None
                self._kafka.poll(0.01)
            except Exception as exc:  # KafkaException: unknown partition, bad config, ...
                raise translate_error(
                    exc, f"send of {record.msg_id} to {record.kafka_topic}"
                ) from exc

    def send_sync(self, msg: Message, *, partition: int = -1) -> SendResult:
        """Send and wait for the broker's acknowledgement (at most ``send_msg_timeout_ms``).

        ``partition`` picks a partition (RocketMQ's queue); -1 lets the key decide.
        Raises :class:`SendError` (:class:`SendTimeoutError` on timeout, including an
        unreachable broker) or :class:`InvalidMessageError`.
        """
        if not self._running:
            self._lifecycle.require_running()
        record = self.prepare(msg, partition)
        stored_partition, offset = self.send_record_sync(record)
        return SendResult(SendStatus.SEND_OK, record.msg_id, offset, msg.topic, stored_partition)

    def send_record_sync(
        self, record: PreparedRecord, partition: int | None = None
    ) -> tuple[int, int]:
        """Send a prepared record and wait for its acknowledgement; return (partition, offset).

        The building block of ``send_sync`` for clients that write system records.
        """
        self._lifecycle.require_running()
        waiter = _SyncWaiter()
        self._produce(record, record.partition if partition is None else partition, waiter)
        # flush() sends at once instead of waiting linger.ms, and serves delivery reports
        # (ours among them) on this thread. librdkafka fails the message after
        # message.timeout.ms; the extra second is for its report to arrive.
        deadline = time.monotonic() + self.config.send_msg_timeout_ms / 1000 + 1.0
        while not waiter.event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SendTimeoutError(
                    f"send of {record.msg_id} to {record.kafka_topic}: no acknowledgement "
                    f"within {self.config.send_msg_timeout_ms} ms"
                )
            self._kafka.flush(min(remaining, _SYNC_FLUSH_SLICE_S))
        if waiter.error is not None:
            raise translate_error(waiter.error, f"send of {record.msg_id} to {record.kafka_topic}")
        return waiter.partition, waiter.offset

    def send_records_sync(
        self, records: list[PreparedRecord]
    ) -> list[tuple[int, int] | KafkaClientError]:
        """Send prepared records together and wait for every acknowledgement (at most
        ``send_msg_timeout_ms``); return (partition, offset) or the error, per record."""
        self._lifecycle.require_running()
        waiters = []
        for record in records:
            waiter = _SyncWaiter()
            try:
                self._produce(record, record.partition, waiter)
            except KafkaClientError as exc:
                waiter.failure = exc
                waiter.event.set()
            waiters.append(waiter)
        deadline = time.monotonic() + self.config.send_msg_timeout_ms / 1000 + 1.0
        results: list[tuple[int, int] | KafkaClientError] = []
        for record, waiter in zip(records, waiters, strict=True):
            while not waiter.event.is_set() and time.monotonic() < deadline:
                self._kafka.flush(min(max(deadline - time.monotonic(), 0), _SYNC_FLUSH_SLICE_S))
            context = f"send of {record.msg_id} to {record.kafka_topic}"
            if waiter.failure is not None:
                results.append(waiter.failure)
            elif not waiter.event.is_set():
                results.append(
                    SendTimeoutError(
                        f"{context}: no acknowledgement within {self.config.send_msg_timeout_ms} ms"
                    )
                )
            elif waiter.error is not None:
                results.append(translate_error(waiter.error, context))
            else:
                results.append((waiter.partition, waiter.offset))
        return results

    def send_record_async(self, record: PreparedRecord, partition: int, callback: Any) -> None:
        """Send a prepared record; ``callback(err, kafka_message)`` gets the delivery report."""
        self._lifecycle.require_running()
        self._produce(record, partition, callback)
        self._serve_reports()

    def send_async(
        self,
        msg: Message,
        on_success: OnSuccess | None = None,
        on_exception: OnException | None = None,
        *,
        partition: int = -1,
    ) -> str:
        """Send without waiting; return the message id.

        ``on_success(SendResult)`` or ``on_exception(SendError)`` is called exactly once,
        on a thread that is sending (delivery reports are served as sends go) or, once
        sends stop, on the producer's delivery thread; keep callbacks short. Invalid
        messages raise here, before anything is sent.
        """
        if not self._running:
            self._lifecycle.require_running()
        record = self.prepare(msg, partition)
        self._produce(
            record,
            record.partition,
            _AsyncReport(record.msg_id, msg.topic, record.kafka_topic, on_success, on_exception),
        )
        self._serve_reports()
        return record.msg_id

    def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id."""
        if not self._running:
            self._lifecycle.require_running()
        record = self.prepare(msg, partition)
        self._produce(record, record.partition, _log_oneway_failure)
        self._serve_reports()
        return record.msg_id


__all__ = ["Producer", "SendError", "SendResult", "SendStatus"]
