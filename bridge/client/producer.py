"""The plain producer: RocketMQ's ``Producer`` API over an idempotent Kafka producer.

Sends are idempotent and acknowledged by all in-sync replicas (``acks=all``), so a retried
send never duplicates a record. Every send is bounded by ``send_msg_timeout_ms``.

:class:`Producer` is a front over private collaborators: the
:class:`~bridge.client.records.RecordBuilder` checks each message and builds its record, the
:class:`~bridge.client.sender.RecordSender` hands records to librdkafka (its
:class:`~bridge.client.delivery.DeliveryPump` serves the delivery reports, its
:class:`~bridge.client.resend.AloneResender` sends again the records refused with their
request batch), and the :class:`~bridge.client.batch_send.BatchSender` sends batches.

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
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from bridge.client.batch_send import BatchSender
from bridge.client.recall import Recaller, recall_handle
from bridge.client.records import RecordBuilder, message_list, producer_settings
from bridge.client.send_checks import MAX_PROPERTIES_BYTES
from bridge.client.send_results import (
    OnException,
    OnSuccess,
    SendResult,
    SendStatus,
    async_report,
)
from bridge.client.sender import RecordSender
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import KafkaClientError, SendError
from bridge.lifecycle import ServiceState, Startable
from bridge.message import Message
from bridge.serialization import Serializer, Serializers
from bridge.tracing import TraceSpan, send_span, tracing_active, untraced
from topics.naming import validate_user_group

_NO_SPAN: contextlib.nullcontext[TraceSpan] = contextlib.nullcontext(TraceSpan())
"""What a send runs in without OpenTelemetry (costs nothing)."""


def _span(msg: Message) -> AbstractContextManager[TraceSpan]:
    """The send span of ``msg`` (:func:`bridge.tracing.send_span`) when OpenTelemetry records
    spans, else nothing."""
    return send_span(msg) if tracing_active() else _NO_SPAN


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
        settings, serializers = producer_settings(
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=send_msg_timeout_ms,
            config=config,
            kafka_config=kafka_config,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )
        self.config = settings
        self.serializers: Serializers = serializers
        """The ``key_serializer`` and ``value_serializer`` of messages given ``value=``."""
        self.group = validate_user_group(group, settings.namespace)
        self._sender = sender = RecordSender(settings, self.group)
        self._builder = builder = RecordBuilder(settings, serializers, sender.pump.metadata)
        self._pump = sender.pump
        self._resend = sender.resend
        self._batches = BatchSender(
            sender.pump, sender.resender, builder.batch_records, settings.send_msg_timeout_ms
        )
        self._recaller = Recaller(settings, sender.pump)

    # --- lifecycle --------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._sender.state

    def start(self) -> None:
        """Create the Kafka client and its delivery thread. May be called once."""
        self._sender.start()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) for outstanding sends,
        then stop. Idempotent."""
        self._sender.shutdown(timeout_ms)

    def stop(self) -> None:
        """:meth:`shutdown` with the default timeout (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def flush(self, timeout_ms: int | None = None) -> int:
        """Wait for outstanding sends; return how many are still unacknowledged."""
        return self._sender.flush(timeout_ms)

    def ensure_system_topics(self) -> None:
        """Create the system topics (idempotent) now; otherwise it happens before the first
        record to one of them, so Kafka never auto-creates one with the wrong partition count.
        Concurrent first sends wait for one check instead of each running its own."""
        self._sender.ensure_system_topics()

    # --- checking and building --------------------------------------------------------
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
        return self._builder.prepare(msg, partition)

    def serialized(self, msg: Message) -> Message:
        """``msg`` as it is sent: itself, or for a message given ``value=`` a copy with the
        serialized value as body and the serialized key as record key
        (:meth:`bridge.serialization.Serializers.apply`; :class:`SerializationError` naming
        the topic and field when a serializer fails, before anything is sent)."""
        return self._builder.serialized(msg)

    def prepare_batch(self, msgs: Iterable[Message], partition: int = -1) -> list[PreparedRecord]:
        """:meth:`prepare` for every message of ``msgs``, in order, with what they share done
        once: the trace context looked up, each topic mapped and its ``partition`` checked,
        tags encoded. The first message that is not valid raises its typed error (see
        :meth:`prepare`); nothing is sent here.
        """
        return self._builder.prepare_batch(msgs, partition)

    # --- sending ----------------------------------------------------------------------
    def _prepare_in(self, span: TraceSpan, msg: Message, partition: int) -> PreparedRecord:
        """:meth:`prepare` in the send span ``span``, which it names the message id in."""
        record = self._builder.prepare(msg, partition)
        span.set_attribute("messaging.message.id", record.msg_id)
        return record

    def send_sync(self, msg: Message, *, partition: int = -1) -> SendResult:
        """Send and wait for the broker's acknowledgement (at most ``send_msg_timeout_ms``).

        ``partition`` picks a partition (RocketMQ's queue); -1 lets the key decide.
        Raises :class:`SendError` (:class:`SendTimeoutError` on timeout, including an
        unreachable broker) or :class:`InvalidMessageError`. A message refused with its
        request batch as too large (sends of other threads share batches) is sent again alone
        before this returns, within ``send_msg_timeout_ms`` again; one the topic refuses by
        itself raises :class:`SendError` naming MSG_SIZE_TOO_LARGE.
        """
        sender = self._sender
        if not sender.running:
            sender.require_running()
        with _span(msg) as span:
            record = self._prepare_in(span, msg, partition)
            stored_partition, offset = sender.send_record_sync(record)
        return SendResult(
            SendStatus.SEND_OK,
            record.msg_id,
            offset,
            msg.topic,
            stored_partition,
            recall_handle(record, msg.topic, self.config.namespace),
        )

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
        if not self._sender.running:
            self._sender.require_running()
        # The common case (a body, at most short tags, to a topic sent to before, no span)
        # without prepare's checks of what the message does not have.
        record = self._builder.common_record(msg) if partition == -1 and untraced() else None
        if record is None:
            if tracing_active():
                with send_span(msg) as span:
                    record = self._prepare_in(span, msg, partition)
                    report = async_report(
                        record,
                        msg.topic,
                        on_success,
                        on_exception,
                        self._resend,
                        recall_handle=recall_handle(record, msg.topic, self.config.namespace),
                    )
                    self._pump.produce(record, record.partition, report)
                self._pump.serve_reports()
                return record.msg_id
            record = self._builder.prepare(msg, partition)
            handle = recall_handle(record, msg.topic, self.config.namespace)
        else:
            handle = None  # a plain message's record
        report = async_report(
            record, msg.topic, on_success, on_exception, self._resend, recall_handle=handle
        )
        self._pump.produce(record, record.partition, report, serve=True)
        return record.msg_id

    def send_oneway(self, msg: Message, *, partition: int = -1) -> str:
        """Send without any result; failures are only logged. Return the message id."""
        sender = self._sender
        if not sender.running:
            sender.require_running()
        with _span(msg) as span:
            record = self._prepare_in(span, msg, partition)
            self._pump.produce(record, record.partition, sender.oneway_report(record))
        self._pump.serve_reports()
        return record.msg_id

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
        sender = self._sender
        if not sender.running:
            sender.require_running()
        batch = message_list(msgs)
        if tracing_active():
            prepared: list[PreparedRecord | None] = []
            for msg in batch:
                with send_span(msg) as span:
                    prepared.append(self._prepare_in(span, msg, partition))
        else:
            prepared = self._builder.check_batch(batch, partition)
        sender.pump.refuse_waiting_in_a_callback("send_batch")
        return self._batches.send(batch, prepared, partition)

    # --- recall -----------------------------------------------------------------------
    def recall_message(self, topic: str, recall_handle: str) -> str:
        """Recall the timer message sent to ``topic`` whose :attr:`SendResult.recall_handle`
        is ``recall_handle`` (RocketMQ 5.3's ``recallMessage``); return its message id once
        it is certain never to be delivered (a coordinator skips it at its time, and after
        any restart).

        Raises :class:`~bridge.errors.RecallTooLateError` when the broker stored the recall
        less than ``RECALL_MARGIN_MS`` (1 s) before the message's time:
        the message is delivered exactly once, or was (unless a recall of it from another
        producer applied; this producer's earlier recalls of the handle are remembered and
        answer instead, see ``docs/delays.md``). Raises
        :class:`~bridge.errors.InvalidArgumentError` naming the problem for a handle that is
        malformed, of another namespace or of another topic; :class:`SendError` when the
        recall was not stored (:class:`~bridge.errors.SendTimeoutError`: perhaps stored;
        its outcome is then the one a recall made again with the handle reports while the
        time is not near, see ``docs/delays.md``)."""
        sender = self._sender
        if not sender.running:
            sender.require_running()
        return self._recaller.recall(topic, recall_handle)


def collaborators(producer: Producer) -> tuple[RecordBuilder, RecordSender]:
    """The record builder and the record sender ``producer`` is a front over: the asyncio
    producer checks, builds and sends its records with them on its own thread."""
    return producer._builder, producer._sender


__all__ = ["MAX_PROPERTIES_BYTES", "Producer", "SendError", "SendResult", "SendStatus"]
