"""The plain producer: RocketMQ's ``Producer`` API over an idempotent Kafka producer.

Sends are idempotent and acknowledged by all in-sync replicas (``acks=all``), so a retried
send never duplicates a record. Every send is bounded by ``send_msg_timeout_ms``.

:meth:`Producer.prepare` checks what can be checked before sending, each with a typed error
naming the problem: argument types and text that is not valid Unicode, delays, the body size
and the size of properties, keys and tags, Kafka's internal and the bridge's system topics,
and an explicit partition against the topic's partition count.

Tracing: a send runs in an OpenTelemetry ``<topic> send`` span when ``opentelemetry-api`` is
installed (the ``otel`` extra) and the message carries no ``traceparent`` yet; the span's
context travels in the message (``docs/tracing.md``). Without it nothing is imported.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

from bridge.client.send_checks import (
    MAX_PROPERTIES_BYTES,
    OWN_HEADERS_BYTES,
    TAGS_ALWAYS_FIT,
    PartitionCounts,
    kafka_topic_for,
    properties_size,
    properties_too_large,
)
from bridge.client.send_results import (
    AsyncReport,
    OnException,
    OnSuccess,
    SendResult,
    SendStatus,
    SyncWaiter,
    log_oneway_failure,
)
from bridge.codec import PreparedRecord, plain_record
from bridge.config import ClientConfig
from bridge.delay.routing import delayed_record, without_delay
from bridge.errors import (
    InvalidMessageError,
    InvalidPropertyError,
    KafkaClientError,
    MessageTooLargeError,
    SendError,
    SendTimeoutError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_producer, translate_error
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageIdGenerator, local_ipv4
from bridge.tracing import TraceSpan, inject_trace_context, send_span, tracing_active
from topics.catalog import SystemTopic
from topics.naming import validate_user_group

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.02
"""How often the delivery thread checks whether senders went quiet, seconds."""
_REPORTS_EVERY_SENDS = 32
"""Asynchronous sends serve waiting delivery reports every this many sends: each poll hands
the GIL around, so serving after every send costs more than the reports themselves."""
_SYNC_FLUSH_SLICE_S = 0.005
"""A sync send waits in flush() slices this long, seconds (flush skips linger.ms)."""
_NO_SPAN: contextlib.nullcontext[TraceSpan] = contextlib.nullcontext(TraceSpan())
"""What a send runs in without OpenTelemetry (costs nothing)."""


def _span(msg: Message) -> AbstractContextManager[TraceSpan]:
    """The send span of ``msg`` (:func:`bridge.tracing.send_span`) when OpenTelemetry records
    spans, else nothing."""
    return send_span(msg) if tracing_active() else _NO_SPAN


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
        self._partition_counts = PartitionCounts(self.config)
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

        With OpenTelemetry installed, a message without ``traceparent`` gets the current trace
        context written into it (``traceparent``/``tracestate``, see ``docs/tracing.md``).
        """
        if not isinstance(msg, Message):
            raise InvalidMessageError(f"expected a Message, got {type(msg).__name__}")
        inject_trace_context(msg)
        body = msg.body
        if not body:
            raise InvalidMessageError("the message body length is zero")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError(len(body), self._max_message_bytes)
        topic = msg.topic
        if type(topic) is not str:
            raise InvalidMessageError(f"the topic must be a string, got {type(topic).__name__}")
        kafka_topic = kafka_topic_for(topic, self._namespace)
        if partition != -1:
            self._partition_counts.check(self._kafka, topic, kafka_topic, partition)
        born_ms = time.time_ns() // 1_000_000
        msg_id = self._ids.next_id(born_ms)
        try:
            props, keys, tags = msg._properties, msg._keys, msg.tags
            if props or keys or (tags and len(tags) > TAGS_ALWAYS_FIT):
                # Characters are 4 UTF-8 bytes at most: only a block that might be too large
                # is measured exactly.
                chars = len(tags or "") + len(keys) + 2 * len(props)
                for key in keys:
                    chars += len(key)
                for name, value in props.items():
                    chars += len(name) + len(value)
                if chars * 4 + OWN_HEADERS_BYTES > MAX_PROPERTIES_BYTES:
                    size = properties_size(msg)
                    if size > MAX_PROPERTIES_BYTES:
                        raise properties_too_large(size)
            if msg.is_delayed:
                delayed = delayed_record(
                    msg,
                    msg_id,
                    born_ms,
                    self._born_host.decode(),
                    partition=partition,
                    config=self.config,
                )
                if delayed is not None:
                    return delayed
                msg = without_delay(msg)  # a timer already due: delivered at once
            return plain_record(msg, kafka_topic, msg_id, born_ms, self._born_host, partition)
        except (UnicodeEncodeError, AttributeError, TypeError, InvalidPropertyError):
            # Content that cannot be encoded (a lone surrogate, tags that are not a string):
            # name what it is. Diagnosing only on failure keeps valid sends free of it.
            msg.check_wire()
            raise

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
        with _span(msg) as span:
            record = self.prepare(msg, partition)
            span.set_attribute("messaging.message.id", record.msg_id)
            stored_partition, offset = self.send_record_sync(record)
        return SendResult(SendStatus.SEND_OK, record.msg_id, offset, msg.topic, stored_partition)

    def send_record_sync(
        self, record: PreparedRecord, partition: int | None = None
    ) -> tuple[int, int]:
        """Send a prepared record and wait for its acknowledgement; return (partition, offset).

        The building block of ``send_sync`` for clients that write system records.
        """
        self._lifecycle.require_running()
        waiter = SyncWaiter()
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
            waiter = SyncWaiter()
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
        with _span(msg) as span:
            record = self.prepare(msg, partition)
            span.set_attribute("messaging.message.id", record.msg_id)
            self._produce(
                record,
                record.partition,
                AsyncReport(record.msg_id, msg.topic, record.kafka_topic, on_success, on_exception),
            )
        self._serve_reports()
        return record.msg_id

    def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id."""
        if not self._running:
            self._lifecycle.require_running()
        with _span(msg) as span:
            record = self.prepare(msg, partition)
            span.set_attribute("messaging.message.id", record.msg_id)
            self._produce(record, record.partition, log_oneway_failure)
        self._serve_reports()
        return record.msg_id


__all__ = ["MAX_PROPERTIES_BYTES", "Producer", "SendError", "SendResult", "SendStatus"]
