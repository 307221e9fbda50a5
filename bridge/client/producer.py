"""The plain producer: RocketMQ's ``Producer`` API over an idempotent Kafka producer.

Sends are idempotent and acknowledged by all in-sync replicas (``acks=all``), so a retried
send never duplicates a record. Every send is bounded by ``send_msg_timeout_ms``.

:meth:`Producer.prepare` checks what can be checked before sending, each with a typed error
naming the problem: argument types and text that is not valid Unicode, delays, the body size
and the size of properties, keys and tags, Kafka's internal and the bridge's system topics,
and an explicit partition against the topic's partition count. :meth:`Producer.send_batch`
(RocketMQ's batch send) checks every message of a batch first (:meth:`Producer.prepare_batch`,
which does what the messages share once), then hands them all to librdkafka and waits once.

Tracing: a send runs in an OpenTelemetry ``<topic> send`` span when ``opentelemetry-api`` is
installed (the ``otel`` extra) and the message carries no ``traceparent`` yet; the span's
context travels in the message (``docs/tracing.md``). Without it nothing is imported.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

from confluent_kafka import KafkaError

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
    BatchReports,
    OnException,
    OnSuccess,
    Report,
    ResendAlone,
    SendResult,
    SendStatus,
    SyncWaiter,
    async_report,
    log_oneway_failure,
    not_resent,
    record_send_failure,
    refused_with_its_batch,
    report_async,
    report_oneway,
)
from bridge.codec import PreparedRecord, new_tuple, plain_record
from bridge.config import ClientConfig
from bridge.delay.routing import delayed_record, without_delay
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidPropertyError,
    KafkaClientError,
    MessageTooLargeError,
    SendError,
    SendTimeoutError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_producer, produce_record, translate_error
from bridge.kafka_config import apply_kafka_config, pick_hook, read_kafka_config
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageConst, MessageIdGenerator, PropertyValue, local_ipv4
from bridge.observability.metrics import active_metrics
from bridge.property_values import is_unicode
from bridge.serialization import Serializer, Serializers
from bridge.tracing import TraceSpan, inject_trace_context, send_span, tracing_active, untraced
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
_KAFKA_TOPICS_KEPT = 4096
"""Topics whose Kafka name a producer keeps, at most (the map starts again beyond)."""
_BATCH_REPORTS_KEPT = 4
"""Report stores of finished batches a producer keeps for its next batches (one per thread
sending batches at once), at most."""
_REPORT_GRACE_S = 1.0
"""A sync or batch send waits this long past ``send_msg_timeout_ms`` for librdkafka's report
of a message it failed at that timeout, seconds."""
_UNIQ_KEY = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_BORN_HOST = MessageConst.BORN_HOST
_TAGS = MessageConst.TAGS
_TRACE_PARENT = MessageConst.TRACE_PARENT
_NO_SPAN: contextlib.nullcontext[TraceSpan] = contextlib.nullcontext(TraceSpan())
"""What a send runs in without OpenTelemetry (costs nothing)."""


def _message_list(msgs: Iterable[Message]) -> list[Message]:
    """The messages of a batch as a list; :class:`InvalidArgumentError` for one message or
    something that is not iterable (each item is checked by ``prepare``)."""
    if type(msgs) is list:
        return msgs
    if isinstance(msgs, Message) or not isinstance(msgs, Iterable):
        raise InvalidArgumentError(
            f"a batch is an iterable of Messages, got {type(msgs).__name__}"
            + (" (send one message with send_sync)" if isinstance(msgs, Message) else "")
        )
    return list(msgs)


def _trace_carrier() -> dict[str, PropertyValue]:
    """What :func:`bridge.tracing.inject_trace_context` writes into a message now (the
    current trace context; nothing without a valid current span)."""
    probe = Message("-", b"-")
    inject_trace_context(probe)
    return probe._properties


def _span(msg: Message) -> AbstractContextManager[TraceSpan]:
    """The send span of ``msg`` (:func:`bridge.tracing.send_span`) when OpenTelemetry records
    spans, else nothing."""
    return send_span(msg) if tracing_active() else _NO_SPAN


def _sends_alone(config: ClientConfig) -> bool:
    """True if a producer made with ``config`` puts every record in a request batch of its
    own (``batch.num.messages=1``), so a refusal of its batch is the record's own."""
    return str(config.kafka.get("batch.num.messages", "")).strip() == "1"


class _Serving(threading.local):
    """Per thread: whether this thread is serving the producer's delivery reports now (in
    librdkafka's ``poll`` or ``flush``), so inside one of its report callbacks."""

    active = False


class Producer(Startable):
    """Sends messages to real topics: ``send_sync``, ``send_async``, ``send_oneway`` and
    ``send_batch``.

    ``Producer("group", bootstrap_servers="host:9092")`` or ``Producer("group",
    config=ClientConfig.from_env())``; keyword arguments win over ``kafka_config`` (a
    confluent-kafka config dict, :mod:`bridge.kafka_config`), which wins over ``config``. Call
    :meth:`start` (or use ``with``) before sending and :meth:`shutdown` after.

    ``key_serializer`` and ``value_serializer`` take confluent-kafka's ``Serializer``
    interface (Schema Registry's serializers as they are): a message given ``value=`` (and
    ``key=``) is sent with their bytes as body (and record key), serialized with the
    message's topic (``docs/serialization.md``).

    librdkafka puts several records of a partition in one request batch, and a broker
    refuses a batch larger than the topic's ``max.message.bytes`` as a whole
    (MSG_SIZE_TOO_LARGE for every record in it; librdkafka does not split it, as the Java
    client does). A record of a send, oneway or batch refused that way is sent again once,
    alone, through a second Kafka producer that puts each record in a batch of its own
    (``batch.num.messages=1``, made on the first such refusal): only a record the topic
    refuses alone fails, and its sender learns the outcome of that second send.
    """

    def __init__(
        self,
        group: str,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        send_msg_timeout_ms: int | None = None,
        config: ClientConfig | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ) -> None:
        parts = read_kafka_config(kafka_config)
        self.config = apply_kafka_config(config or ClientConfig(), parts).replace(
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=send_msg_timeout_ms,
        )
        self.serializers = Serializers(
            pick_hook(parts, "key.serializer", key_serializer),
            pick_hook(parts, "value.serializer", value_serializer),
        )
        """The ``key_serializer`` and ``value_serializer`` of messages given ``value=``."""
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
        self._system_topics_lock = threading.Lock()
        self._max_message_bytes = self.config.max_message_bytes
        self._namespace = self.config.namespace
        self._partition_counts = PartitionCounts(self.config)
        self._kafka_topics: dict[str, str] = {}
        """Topic -> Kafka topic of the topics sent to (:meth:`_kafka_topic`)."""
        self._sends_unserved = 0
        """Asynchronous sends since reports were last served (approximate across threads)."""
        self._batches_waiting = 0
        """Batches being sent (``send_batch``) whose threads serve the reports."""
        self._batches_lock = threading.Lock()
        self._idle_batch_reports: list[BatchReports] = []
        """Report stores (with their handlers) of finished batches, for the next ones."""
        self._running = False
        """Mirrors ``state is RUNNING`` for a cheap check on every send."""
        self._alone: Producer | None = None
        """The producer of records sent again alone (:meth:`_alone_sender`), once made."""
        self._alone_lock = threading.Lock()
        self._alone_closed = False
        self._alone_topics: set[str] = set()
        """Kafka topics a refusal of a request batch was logged for (once each)."""
        self._resend: ResendAlone | None = None if _sends_alone(self.config) else self._send_alone
        self._serving = _Serving()

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
        self._refuse_waiting_in_a_callback("shutdown")
        self._running = False
        timeout = timeout_ms if timeout_ms is not None else self.config.send_msg_timeout_ms
        deadline = time.monotonic() + timeout / 1000
        remaining = self._flush(timeout / 1000)
        # Reports served by that flush may have sent records again alone: they are waited for
        # within the same timeout.
        with self._alone_lock:
            self._alone_closed = True
            alone = self._alone
        if alone is not None:
            alone.shutdown(max(0, int((deadline - time.monotonic()) * 1000)))
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
        deadline = time.monotonic() + timeout / 1000
        remaining = self._flush(timeout / 1000)
        alone = self._alone
        if alone is not None:  # records sent again alone by the reports served above
            remaining += alone._flush(max(0.0, deadline - time.monotonic()))
        return remaining

    # --- serving delivery reports -------------------------------------------------------
    # confluent-kafka aborts the process (a failed C assertion, no exception) when a thread
    # serving a client's delivery reports calls that client's poll() or flush() again from
    # one of them: a callback that sends (the push consumer's copy reports send copies on),
    # every few sends, would serve reports. On such a thread reports are left to the next
    # poll, and what must wait for reports is refused.
    def _poll(self, timeout_s: float) -> None:
        """Serve delivery reports for up to ``timeout_s`` (s); inside one of this producer's
        report callbacks on this thread, only wait."""
        serving = self._serving
        if serving.active:
            if timeout_s > 0:
                time.sleep(timeout_s)
            return
        serving.active = True
        try:
            self._kafka.poll(timeout_s)
        finally:
            serving.active = False

    def _flush(self, timeout_s: float) -> int:
        """librdkafka's flush for up to ``timeout_s`` (s): how many records are still
        unacknowledged. :class:`IllegalStateError` inside a report callback of this producer."""
        self._refuse_waiting_in_a_callback("a send waiting for its acknowledgement, or flush")
        serving = self._serving
        serving.active = True
        try:
            return int(self._kafka.flush(timeout_s))
        finally:
            serving.active = False

    def _wait_for_room(self) -> None:
        """Let deliveries drain a full local queue for a moment. Inside one of this
        producer's report callbacks the thread may be the only one serving the reports that
        free room: :class:`SendTimeoutError` at once rather than a wait of
        ``send_msg_timeout_ms`` with every report behind it held."""
        if self._serving.active:
            raise SendTimeoutError(
                f"producer {self.group}: the local queue is full, and a send in one of its "
                "own delivery callbacks cannot wait for room"
            )
        self._poll(0.01)

    def _refuse_waiting_in_a_callback(self, what: str) -> None:
        if self._serving.active:
            raise IllegalStateError(
                f"producer {self.group}: {what} in one of its own delivery callbacks: it "
                "would wait for reports only this thread serves (send_async or send_oneway "
                "can be called there)"
            )

    # --- records refused with their request batch ------------------------------------
    @property
    def alone_resend(self) -> ResendAlone | None:
        """How a record refused with its request batch as too large is sent again alone
        (``resend(record, report)``, raising when it cannot hand it over); None for a producer
        that sends each record alone already."""
        return self._resend

    def _alone_sender(self) -> Producer:
        """The producer that puts each record in a request batch of its own, made when first
        asked for. Raises :class:`IllegalStateError` once this producer is shut down."""
        with self._alone_lock:
            if self._alone_closed:
                raise IllegalStateError(f"producer {self.group} is shut down")
            if self._alone is None:
                # A client.id of its own (the user's, or the group, then "-alone"): the two
                # clients' librdkafka statistics would otherwise write the same series.
                client_id = str(self.config.kafka.get("client.id") or self.group)
                kafka = {
                    **self.config.kafka,
                    "batch.num.messages": "1",
                    "client.id": f"{client_id}-alone",
                }
                alone = Producer(self.group, config=self.config.replace(kafka=kafka))
                alone.start()
                self._alone = alone
            return self._alone

    def _refused_batch(self, kafka_topic: str) -> Producer:
        """The producer to send a record of ``kafka_topic`` again alone with, after the
        broker refused its request batch as too large (:meth:`_alone_sender`)."""
        self._note_refused_batch(kafka_topic)
        return self._alone_sender()

    def _note_refused_batch(self, kafka_topic: str) -> None:
        """Log the first refusal of a request batch as too large on ``kafka_topic``: it says
        the topic takes less than librdkafka puts in one batch."""
        if kafka_topic not in self._alone_topics:
            self._alone_topics.add(kafka_topic)
            logger.warning(
                "producer %s: %s refused a request batch as too large (its max.message.bytes "
                "is below what librdkafka put in one batch); its records refused that way are "
                "sent again one per batch",
                self.group,
                kafka_topic,
            )

    def _send_alone(self, record: PreparedRecord, report: Report) -> None:
        """Send ``record``, refused with its request batch as too large, again in a batch of
        its own; ``report`` gets that send's delivery report. Raises when the record is not
        taken (this producer is shut down, the local queue stayed full)."""
        self._refused_batch(record.kafka_topic).send_record_async(record, record.partition, report)

    def oneway_report(self, record: PreparedRecord) -> Report:
        """The delivery report handler of a oneway send of ``record``: a failure is logged,
        after the record is sent again alone if its request batch was refused as too
        large."""
        resend = self._resend
        if resend is None:
            return log_oneway_failure
        return partial(report_oneway, resend, record)

    def _poll_loop(self) -> None:
        # Delivery reports are served on the sending threads every few sends (confluent-kafka
        # takes the GIL once per report, so serving each as it arrives here would hand the GIL
        # back and forth for every message); while senders are busy this thread serves what
        # waits once per interval, so no report waits longer than that for the next sends.
        # While a batch waits for its reports, its thread serves every report (flush()):
        # this thread serving some too would only hand the GIL back and forth.
        poll = self._poll
        while not self._stop_polling.is_set():
            try:
                if self._batches_waiting:
                    self._stop_polling.wait(_POLL_INTERVAL_S)
                elif self._senders_active:
                    self._senders_active = False
                    self._stop_polling.wait(_POLL_INTERVAL_S)
                    if not self._batches_waiting:
                        poll(0)
                else:
                    poll(_POLL_INTERVAL_S)
            except BaseException:
                # Report callbacks catch Exception; what they let through (a SystemExit, say)
                # must not end this thread. The reports not served yet wait for the next poll.
                logger.exception("producer %s: a delivery report callback raised", self.group)

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
        body = msg._body
        if not body:
            msg = self.serialized(msg)  # a value= object becomes the body here
            body = msg._body
            if not body:
                raise InvalidMessageError("the message body length is zero")
        if len(body) > self._max_message_bytes:
            raise MessageTooLargeError(len(body), self._max_message_bytes)
        topic = msg.topic
        if type(topic) is not str:
            raise InvalidMessageError(f"the topic must be a string, got {type(topic).__name__}")
        kafka_topic = self._kafka_topics.get(topic)
        if kafka_topic is None:
            kafka_topic = self._kafka_topic(topic)
        if partition != -1:
            self._partition_counts.check(self._kafka, topic, kafka_topic, partition)
        born_ms = time.time_ns() // 1_000_000
        msg_id = self._ids.next_id(born_ms)
        try:
            props, keys, tags = msg._properties, msg._keys, msg.tags
            if not props and not keys and (not tags or len(tags) <= TAGS_ALWAYS_FIT):
                # The common case (no properties, so no delay, nor keys), built here: the
                # record plain_record would build, without its calls.
                headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, self._born_host)]
                if tags:
                    headers.append((_TAGS, tags.encode()))
                return new_tuple(
                    PreparedRecord, (kafka_topic, None, body, headers, msg_id, born_ms, partition)
                )
            # Properties, keys or long tags. Characters are 4 UTF-8 bytes at most: only a
            # block that might be too large is measured exactly.
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

    def serialized(self, msg: Message) -> Message:
        """``msg`` as it is sent: itself, or for a message given ``value=`` a copy with the
        serialized value as body and the serialized key as record key
        (:meth:`bridge.serialization.Serializers.apply`; :class:`SerializationError` naming
        the topic and field when a serializer fails, before anything is sent)."""
        return self.serializers.apply(msg)

    def _kafka_topic(self, topic: str) -> str:
        """:func:`kafka_topic_for` (which raises for a topic no message may go to), kept in
        this producer's own map of the topics it sent to (cheaper than the shared cache)."""
        kafka_topic = kafka_topic_for(topic, self._namespace)
        if len(self._kafka_topics) >= _KAFKA_TOPICS_KEPT:
            self._kafka_topics.clear()
        self._kafka_topics[topic] = kafka_topic
        return kafka_topic

    def prepare_batch(self, msgs: Iterable[Message], partition: int = -1) -> list[PreparedRecord]:
        """:meth:`prepare` for every message of ``msgs``, in order, with what they share done
        once: the trace context looked up, each topic mapped and its ``partition`` checked,
        tags encoded. The first message that is not valid raises its typed error (see
        :meth:`prepare`); nothing is sent here.
        """
        batch = _message_list(msgs)
        return list(self._records(batch, self._check_batch(batch, partition), partition))

    def _check_batch(self, batch: list[Message], partition: int) -> list[PreparedRecord | None]:
        """Check every message of ``batch`` as :meth:`prepare` does, raising the first typed
        error; per message, None for a plain message (a body, at most short tags) that
        :meth:`_records` builds, else the record :meth:`prepare` built for it."""
        if not batch:
            return []
        carrier = _trace_carrier()
        if carrier:  # a valid span is current: its context goes into every message, as one by one
            for msg in batch:
                if isinstance(msg, Message) and _TRACE_PARENT not in msg._properties:
                    for name, value in carrier.items():
                        msg.put_system_property(name, value)
        prepared: list[PreparedRecord | None] = [None] * len(batch)
        prepare = self.prepare
        max_bytes = self._max_message_bytes
        kafka_topics = self._kafka_topics
        last_topic: object = None
        last_tags: object = None
        checked: set[str] = set()
        for index, msg in enumerate(batch):
            # Anything else (properties, keys, a delay, a subclass, a value to refuse) is
            # prepared one by one; prepare raises the error naming a problem.
            if type(msg) is not Message or msg._properties or msg._keys:
                prepared[index] = prepare(msg, partition)
                continue
            body = msg._body
            if not body or len(body) > max_bytes:
                prepared[index] = prepare(msg, partition)
                continue
            topic = msg.topic
            if topic is not last_topic:
                if type(topic) is not str:
                    prepared[index] = prepare(msg, partition)
                    continue
                kafka_topic = kafka_topics.get(topic) or self._kafka_topic(topic)
                if partition != -1 and topic not in checked:
                    self._partition_counts.check(self._kafka, topic, kafka_topic, partition)
                    checked.add(topic)
                last_topic = topic
            tags = msg.tags
            if tags and tags is not last_tags:
                if type(tags) is not str or len(tags) > TAGS_ALWAYS_FIT or not is_unicode(tags):
                    prepared[index] = prepare(msg, partition)  # measured, or refused
                    continue
                last_tags = tags
        return prepared

    def _records(
        self, batch: list[Message], prepared: list[PreparedRecord | None], partition: int
    ) -> Iterator[PreparedRecord]:
        """The record of each message of a checked batch (:meth:`_check_batch`), in order,
        each built when asked for (:meth:`prepare_batch`). :meth:`_hand_over_and_wait` builds
        a plain message's record the same way, inline, and hands it over without a
        ``PreparedRecord``: per message, a generator step and two tuples less (``python -m
        bench producer``: 0.2-0.5 us less CPU a message in batches of 1,000)."""
        next_id = self._ids.next_id
        host = self._born_host
        kafka_topics = self._kafka_topics
        last_topic: object = None
        kafka_topic = ""
        last_tags: object = None
        tags_header = ("", b"")
        for index, msg in enumerate(batch):
            # The clock for every record: a hand-over may have waited for room in the local
            # queue meanwhile, and an old millisecond with the shared 16-bit counter could
            # repeat an id (and date the record too early).
            born_ms = time.time_ns() // 1_000_000
            record = prepared[index]
            if record is not None:
                yield record
                continue
            topic = msg.topic
            if topic is not last_topic:
                kafka_topic = kafka_topics.get(topic) or self._kafka_topic(topic)
                last_topic = topic
            tags = msg.tags
            msg_id = next_id(born_ms)
            if not tags:
                headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, host)]
            else:
                if tags is not last_tags:
                    tags_header = (_TAGS, tags.encode())
                    last_tags = tags
                headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, host), tags_header]
            yield new_tuple(
                PreparedRecord, (kafka_topic, None, msg._body, headers, msg_id, born_ms, partition)
            )

    def ensure_system_topics(self) -> None:
        """Create the system topics (idempotent) now; otherwise it happens before the first
        record to one of them, so Kafka never auto-creates one with the wrong partition count.
        Concurrent first sends wait for one check instead of each running its own."""
        with self._system_topics_lock:
            if self._system_topics_ready:
                return
            catalog = self.config.catalog()
            admin = TopicAdmin(self.config)
            # Levels and tiers are partitions: their counts must be right. Any HALF partition
            # count works for writing; the coordinator owns that choice.
            admin.ensure_topics(
                [catalog.spec(SystemTopic.SCHEDULE), catalog.spec(SystemTopic.TIMER)]
            )
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
            self._poll(0)

    def _produce(self, record: PreparedRecord, partition: int, callback: Any) -> None:
        if not self._system_topics_ready and record.kafka_topic in self._system_topics:
            self.ensure_system_topics()
        # A full local queue: let deliveries drain, within the send timeout.
        produce_record(
            self._kafka,
            record,
            partition,
            callback,
            timeout_ms=self.config.send_msg_timeout_ms,
            wait_full=self._wait_for_room,
        )
        self._senders_active = True

    def send_sync(self, msg: Message, *, partition: int = -1) -> SendResult:
        """Send and wait for the broker's acknowledgement (at most ``send_msg_timeout_ms``).

        ``partition`` picks a partition (RocketMQ's queue); -1 lets the key decide.
        Raises :class:`SendError` (:class:`SendTimeoutError` on timeout, including an
        unreachable broker) or :class:`InvalidMessageError`. A message refused with its
        request batch as too large (sends of other threads share batches) is sent again alone
        before this returns, within ``send_msg_timeout_ms`` again; one the topic refuses by
        itself raises :class:`SendError` naming MSG_SIZE_TOO_LARGE.
        """
        if not self._running:
            self._lifecycle.require_running()
        with _span(msg) as span:
            record = self.prepare(msg, partition)
            span.set_attribute("messaging.message.id", record.msg_id)
            stored_partition, offset = self.send_record_sync(record)
        return SendResult(SendStatus.SEND_OK, record.msg_id, offset, msg.topic, stored_partition)

    def send_record_sync(
        self, record: PreparedRecord, partition: int | None = None, *, started: float | None = None
    ) -> tuple[int, int]:
        """Send a prepared record and wait for its acknowledgement; return (partition, offset).
        ``started``: when the send began, monotonic s (default now), for its cost in metrics.

        The building block of ``send_sync`` for clients that write system records.
        """
        self._lifecycle.require_running()
        self._refuse_waiting_in_a_callback("send_sync")
        waiter = SyncWaiter(started, resends=self._resend is not None)
        self._produce(record, record.partition if partition is None else partition, waiter)
        # flush() sends at once instead of waiting linger.ms, and serves delivery reports
        # (ours among them) on this thread. librdkafka fails the message after
        # message.timeout.ms; the extra second is for its report to arrive.
        deadline = time.monotonic() + self.config.send_msg_timeout_ms / 1000 + 1.0
        while not waiter.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SendTimeoutError(
                    f"send of {record.msg_id} to {record.kafka_topic}: no acknowledgement "
                    f"within {self.config.send_msg_timeout_ms} ms"
                )
            self._flush(min(remaining, _SYNC_FLUSH_SLICE_S))
        error = waiter.error
        if error is not None:
            context = f"send of {record.msg_id} to {record.kafka_topic}"
            if self._resend is not None and refused_with_its_batch(error):
                # Its batch may have been refused for its neighbours' size: its own send tells.
                try:
                    alone = self._refused_batch(record.kafka_topic)
                except IllegalStateError as exc:
                    record_send_failure(waiter.started, record.kafka_topic)
                    raise not_resent(error, context, exc) from exc
                return alone.send_record_sync(record, partition, started=waiter.started)
            raise translate_error(error, context)
        return waiter.partition, waiter.offset

    def send_records_sync(
        self, records: list[PreparedRecord], *, started: float | None = None
    ) -> list[tuple[int, int] | KafkaClientError]:
        """Send prepared records together and wait for every acknowledgement (at most
        ``send_msg_timeout_ms``); return (partition, offset) or the error, per record.
        ``started``: when the sends began, monotonic s (default now), for their cost in
        metrics."""
        self._lifecycle.require_running()
        self._refuse_waiting_in_a_callback("send_records_sync")
        if started is None:
            started = time.monotonic()
        resends = self._resend is not None
        waiters = []
        for record in records:
            waiter = SyncWaiter(started, resends=resends)
            try:
                self._produce(record, record.partition, waiter)
            except KafkaClientError as exc:
                waiter.fail(exc)
            waiters.append(waiter)
        deadline = time.monotonic() + self.config.send_msg_timeout_ms / 1000 + 1.0
        results: list[tuple[int, int] | KafkaClientError] = []
        refused: list[tuple[int, KafkaError]] = []
        """The records refused with their request batch as too large: index, error."""
        for record, waiter in zip(records, waiters, strict=True):
            while not waiter.done and time.monotonic() < deadline:
                self._flush(min(max(deadline - time.monotonic(), 0), _SYNC_FLUSH_SLICE_S))
            context = f"send of {record.msg_id} to {record.kafka_topic}"
            if waiter.failure is not None:
                results.append(waiter.failure)
            elif not waiter.done:
                results.append(
                    SendTimeoutError(
                        f"{context}: no acknowledgement within {self.config.send_msg_timeout_ms} ms"
                    )
                )
            elif waiter.error is not None:
                if self._resend is not None and refused_with_its_batch(waiter.error):
                    refused.append((len(results), waiter.error))
                results.append(translate_error(waiter.error, context))
            else:
                results.append((waiter.partition, waiter.offset))
        if refused:
            # Their batches may have been refused for their neighbours' size: their own
            # sends tell (in their order, so a partition keeps them in order).
            again = self._send_alone_sync(
                [(records[index], error) for index, error in refused], started
            )
            for (index, _), result in zip(refused, again, strict=True):
                results[index] = result
        return results

    def _send_alone_sync(
        self, refused: list[tuple[PreparedRecord, KafkaError]], started: float
    ) -> list[tuple[int, int] | KafkaClientError]:
        """Send the records of ``refused`` (each with the refusal of its request batch as too
        large) again each in a batch of its own, in order, and wait for them: (partition,
        offset) or the error, per record. ``started``: when their first sends began,
        monotonic s; each send's cost in metrics runs from there to its last outcome."""
        for record, _ in refused:
            self._note_refused_batch(record.kafka_topic)
        try:
            alone = self._alone_sender()
        except IllegalStateError as exc:
            for record, _ in refused:
                record_send_failure(started, record.kafka_topic)
            return [
                not_resent(error, f"send of {record.msg_id} to {record.kafka_topic}", exc)
                for record, error in refused
            ]
        return alone.send_records_sync([record for record, _ in refused], started=started)

    def send_batch(
        self, msgs: Iterable[Message], *, partition: int = -1
    ) -> list[SendResult | KafkaClientError]:
        """Send ``msgs`` together and wait once for every acknowledgement; return, in order,
        each one's :class:`SendResult` or the error it failed with (:class:`SendError`,
        :class:`SendTimeoutError`, ``BrokerUnreachableError``, ...). RocketMQ's
        ``send(Collection<Message>)``, with these rules:

        * Every message is checked first (:meth:`prepare_batch`): one that is not valid raises
          its typed error and none is sent.
        * The messages may go to several topics, and may be delayed (delay level or timer):
          each goes where a single send of it goes. (RocketMQ refuses several topics, delays
          and ``%RETRY%`` topics in a batch because it stores a batch as one message in one
          queue; here each message is a Kafka record of its own.)
        * Each message has its own outcome: one that fails does not stop the others. Each is
          placed by its key as a single send is; ``partition`` puts all of them in that
          partition (-1: the key decides), in order, as RocketMQ's one queue does.
        * No bound on the batch's total size (RocketMQ's is ``maxMessageSize``, 4 MiB, the
          size of its one message): each message is bounded by ``max_message_bytes``, and
          librdkafka makes its own requests.
        * Bounded by ``send_msg_timeout_ms``: a message handed to librdkafka is acknowledged
          or failed within it (plus a second for the report); if librdkafka's local queue
          stays full that long, that message and those after it fail with
          :class:`SendTimeoutError` without being sent.
        * A message refused with its request batch as larger than the topic's
          ``max.message.bytes`` is sent again alone, in the batch's order, once the others
          have their reports (and within ``send_msg_timeout_ms`` again): only one the topic
          refuses by itself fails (:class:`SendError` naming MSG_SIZE_TOO_LARGE). A message
          sent again is stored after those of its partition that librdkafka had already
          sent in other request batches.

        Transactional messages are sent one by one with
        ``TransactionMQProducer.send_message_in_transaction``.
        """
        if not self._running:
            self._lifecycle.require_running()
        batch = _message_list(msgs)
        if tracing_active():
            prepared: list[PreparedRecord | None] = []
            for msg in batch:
                with send_span(msg) as span:
                    record = self.prepare(msg, partition)
                    span.set_attribute("messaging.message.id", record.msg_id)
                prepared.append(record)
        else:
            prepared = self._check_batch(batch, partition)
        self._refuse_waiting_in_a_callback("send_batch")
        return self._send_batch(batch, prepared, partition)

    def _send_batch(
        self, batch: list[Message], prepared: list[PreparedRecord | None], partition: int
    ) -> list[SendResult | KafkaClientError]:
        """Hand the records of ``batch`` (checked: ``prepared``) to librdkafka and wait for
        their reports: see :meth:`send_batch`."""
        if not batch:
            return []
        if not self._system_topics_ready and any(
            record is not None and record.kafka_topic in self._system_topics for record in prepared
        ):
            self.ensure_system_topics()
        timeout_ms = self.config.send_msg_timeout_ms
        try:
            reports = self._idle_batch_reports.pop()
        except IndexError:
            reports = BatchReports()
        reports.begin(batch, time.monotonic() if active_metrics() is not None else None)
        with self._batches_lock:
            self._batches_waiting += 1
        try:
            complete = self._hand_over_and_wait(batch, prepared, partition, reports)
        finally:
            with self._batches_lock:
                self._batches_waiting -= 1
        if reports.too_large:
            if self._resend is not None:
                self._send_batch_alone(prepared, partition, reports)
            elif reports.started is not None:  # their reports were not recorded
                for index in reports.too_large:
                    record_send_failure(reports.started, reports.kafka_topics[index])
        results = reports.results(timeout_ms)
        # Every message has its outcome: no report of this batch can come any more, so its
        # handlers serve the next batch. (Reports that did not come may still come: those
        # handlers stay with this batch.)
        if complete and len(self._idle_batch_reports) < _BATCH_REPORTS_KEPT:
            reports.begin((), None)
            self._idle_batch_reports.append(reports)
        return results

    def _send_batch_alone(
        self, prepared: list[PreparedRecord | None], partition: int, reports: BatchReports
    ) -> None:
        """Send the messages of a batch refused with their request batches as too large
        (``reports.too_large``) again each in a batch of its own, in the batch's order, and
        wait: their outcomes replace the refusals."""
        refused: list[tuple[int, PreparedRecord, KafkaError]] = []
        for index in sorted(reports.too_large):
            error = reports.outcomes[index]
            if not isinstance(error, KafkaError):
                continue
            record = prepared[index]
            key: bytes | None
            value: bytes | None
            if record is None:  # a plain message: the record _hand_over_and_wait built
                key, value, record_partition = None, reports.msgs[index]._body, partition
            else:
                key, value, record_partition = record.key, record.value, record.partition
            record = new_tuple(
                PreparedRecord,
                (
                    reports.kafka_topics[index],
                    key,
                    value,
                    reports.headers[index],
                    reports.msg_ids[index],
                    reports.born_ms[index],
                    record_partition,
                ),
            )
            refused.append((index, record, error))
        if not refused:
            return
        again = self._send_alone_sync(
            [(record, error) for _, record, error in refused],
            time.monotonic() if reports.started is None else reports.started,
        )
        outcomes, msgs = reports.outcomes, reports.msgs
        for (index, record, _), result in zip(refused, again, strict=True):
            if isinstance(result, KafkaClientError):
                outcomes[index] = result
            else:
                stored_partition, offset = result
                outcomes[index] = new_tuple(
                    SendResult,
                    (
                        SendStatus.SEND_OK,
                        record.msg_id,
                        offset,
                        msgs[index].topic,
                        stored_partition,
                    ),
                )

    def _hand_over_and_wait(
        self,
        batch: list[Message],
        prepared: list[PreparedRecord | None],
        partition: int,
        reports: BatchReports,
    ) -> bool:
        """Hand each record of a batch to librdkafka, then serve reports until every one
        came or ``send_msg_timeout_ms`` (plus the grace) passed since the last hand-over;
        True if every message has its outcome."""
        timeout_ms = self.config.send_msg_timeout_ms
        outcomes, handlers = reports.outcomes, reports.handlers
        kept = len(handlers)
        msg_ids, kafka_topics = reports.msg_ids, reports.kafka_topics
        sent_headers, sent_born_ms = reports.headers, reports.born_ms
        produce = self._kafka.produce
        stalled: SendTimeoutError | None = None
        next_id = self._ids.next_id
        host = self._born_host
        topics_kept = self._kafka_topics
        # The plain messages' own topic and tags (a prepared record's never overwrite them).
        plain_topic: object = None
        plain_kafka_topic = ""
        plain_tags: object = None
        tags_header = ("", b"")
        key: bytes | None
        value: bytes | None
        headers: Sequence[tuple[str, bytes | None]]
        for index, msg in enumerate(batch):
            # Each record built here, as _records builds it, with the clock read per record: a
            # hand-over that waited for room dates the next one afterwards, and an old
            # millisecond with the shared 16-bit counter could repeat an id.
            born_ms = time.time_ns() // 1_000_000
            record = prepared[index]
            if record is None:  # a plain message (a body, at most short tags)
                topic = msg.topic
                if topic is not plain_topic:
                    plain_kafka_topic = topics_kept.get(topic) or self._kafka_topic(topic)
                    plain_topic = topic
                kafka_topic, key, value = plain_kafka_topic, None, msg._body
                record_partition = partition
                msg_id = next_id(born_ms)
                tags = msg.tags
                if not tags:
                    headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, host)]
                else:
                    if tags is not plain_tags:
                        tags_header = (_TAGS, tags.encode())
                        plain_tags = tags
                    headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, host), tags_header]
            else:
                kafka_topic, key, value, headers, msg_id, born_ms, record_partition = record
            msg_ids[index] = msg_id
            kafka_topics[index] = kafka_topic
            sent_headers[index] = headers
            sent_born_ms[index] = born_ms
            if stalled is not None:
                outcomes[index] = SendTimeoutError(
                    f"send of {msg_id} to {kafka_topic}: not handed to Kafka, never sent (the "
                    f"local queue stayed full for {timeout_ms} ms)"
                )
                continue
            callback = handlers[index] if index < kept else reports.handler(index)
            try:
                produce(
                    kafka_topic,
                    value,
                    key,
                    partition=record_partition,
                    on_delivery=callback,
                    timestamp=born_ms,
                    headers=headers,
                )
            except BufferError:  # the local queue is full: wait for room, as a single send
                if record is None:
                    record = new_tuple(
                        PreparedRecord,
                        (kafka_topic, key, value, headers, msg_id, born_ms, record_partition),
                    )
                try:
                    self._produce(record, record_partition, callback)
                except SendTimeoutError as exc:
                    outcomes[index] = stalled = exc
                except KafkaClientError as exc:
                    outcomes[index] = exc
            except Exception as exc:  # KafkaException: unknown partition, ...
                outcomes[index] = translate_error(exc, f"send of {msg_id} to {kafka_topic}")
        # flush() sends at once instead of waiting linger.ms, and serves delivery reports on
        # this thread (the delivery thread serves some too).
        flush = self._flush
        deadline = time.monotonic() + timeout_ms / 1000 + _REPORT_GRACE_S
        count = len(batch)
        done = 0
        while True:
            done = reports.reported(done)
            if done == count:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            flush(min(remaining, _SYNC_FLUSH_SLICE_S))

    def send_record_async(
        self,
        record: PreparedRecord,
        partition: int,
        callback: Any,
        *,
        resend_alone: bool = False,
    ) -> None:
        """Send a prepared record; ``callback(err, kafka_message)`` gets the delivery report.
        Raises only when the record was not taken: a callback that raises while reports are
        served here is logged, since its record, taken already, still gets its own report.

        ``resend_alone``: a record the broker refuses with its request batch as too large is
        sent again alone first, as a ``send_async`` is, and ``callback`` gets that send's
        report, so a MSG_SIZE_TOO_LARGE it gets is the record's own; when the record cannot
        be sent again (this producer is shut down, the local queue stayed full), ``callback``
        gets the exception saying why instead of a :class:`KafkaError`, and None. Off by
        default for callers whose ``callback`` sends again itself (``alone_resend``)."""
        self._lifecycle.require_running()
        if resend_alone and self._resend is not None:
            callback = partial(self._report_or_resend, record, partition, callback)
        self._produce(record, partition, callback)
        try:
            self._serve_reports()
        except Exception:
            logger.exception("producer %s: a delivery report callback raised", self.group)

    def _report_or_resend(
        self,
        record: PreparedRecord,
        partition: int,
        callback: Any,
        err: KafkaError | None,
        kmsg: Any,
    ) -> None:
        """The delivery report of a :meth:`send_record_async` with ``resend_alone``: one
        refused with its request batch as too large sends ``record`` again alone, with
        ``callback`` for that send's report; any other goes to ``callback``."""
        if err is None or not refused_with_its_batch(err):
            callback(err, kmsg)
            return
        if partition < 0 and kmsg is not None:
            # Again in the partition its batch was in: the record stays in its key's order.
            placed = kmsg.partition()
            partition = placed if placed is not None and placed >= 0 else -1
        try:
            self._refused_batch(record.kafka_topic).send_record_async(record, partition, callback)
        except Exception as exc:  # not taken: the callback learns why
            callback(exc, None)

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

        A message refused with its request batch as larger than the topic's
        ``max.message.bytes`` is sent again alone first (within ``send_msg_timeout_ms``
        again), and the callback gets that send's outcome: it is then stored after the
        messages of its partition sent after it that were stored meanwhile.
        """
        if not self._running:
            self._lifecycle.require_running()
        if (
            type(msg) is Message
            and not msg._properties
            and not msg._keys
            and partition == -1
            and untraced()
        ):
            # The common case (a body, at most short tags, to a topic sent to before), built
            # here: the record prepare() would build, without its calls and objects.
            body, topic, tags = msg._body, msg.topic, msg.tags
            kafka_topic = self._kafka_topics.get(topic) if type(topic) is str else None
            if (
                kafka_topic is not None
                and body
                and len(body) <= self._max_message_bytes
                and (tags is None or (type(tags) is str and len(tags) <= TAGS_ALWAYS_FIT))
            ):
                born_ms = time.time_ns() // 1_000_000
                msg_id = self._ids.next_id(born_ms)
                try:
                    headers = [(_UNIQ_KEY, msg_id.encode()), (_BORN_HOST, self._born_host)]
                    if tags:
                        headers.append((_TAGS, tags.encode()))
                except UnicodeEncodeError:  # tags with a lone surrogate: prepare names it
                    return self._send_async(msg, on_success, on_exception, partition)
                report = partial(
                    report_async,
                    self._resend,
                    headers,
                    born_ms,
                    msg_id,
                    topic,
                    kafka_topic,
                    on_success,
                    on_exception,
                    time.monotonic(),
                )
                try:
                    self._kafka.produce(
                        kafka_topic,
                        body,
                        None,
                        partition=-1,
                        on_delivery=report,
                        timestamp=born_ms,
                        headers=headers,
                    )
                except Exception:  # a full queue waited for, or the error translated
                    self._produce(
                        new_tuple(
                            PreparedRecord,
                            (kafka_topic, None, body, headers, msg_id, born_ms, -1),
                        ),
                        -1,
                        report,
                    )
                self._senders_active = True
                # _serve_reports, inlined
                unserved = self._sends_unserved + 1
                if unserved >= _REPORTS_EVERY_SENDS:
                    unserved = 0
                    self._poll(0)
                self._sends_unserved = unserved
                return msg_id
        return self._send_async(msg, on_success, on_exception, partition)

    def _send_async(
        self,
        msg: Message,
        on_success: OnSuccess | None,
        on_exception: OnException | None,
        partition: int,
    ) -> str:
        """:meth:`send_async` of any message: checked and built by :meth:`prepare`."""
        if tracing_active():
            with send_span(msg) as span:
                record = self.prepare(msg, partition)
                span.set_attribute("messaging.message.id", record.msg_id)
                self._produce(
                    record,
                    record.partition,
                    async_report(record, msg.topic, on_success, on_exception, self._resend),
                )
        else:
            record = self.prepare(msg, partition)
            report = async_report(record, msg.topic, on_success, on_exception, self._resend)
            self._produce(record, record.partition, report)
        self._serve_reports()
        return record.msg_id

    def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id."""
        if not self._running:
            self._lifecycle.require_running()
        with _span(msg) as span:
            record = self.prepare(msg, partition)
            span.set_attribute("messaging.message.id", record.msg_id)
            self._produce(record, record.partition, self.oneway_report(record))
        self._serve_reports()
        return record.msg_id


__all__ = ["MAX_PROPERTIES_BYTES", "Producer", "SendError", "SendResult", "SendStatus"]
