"""Checking messages and building their Kafka records: :class:`RecordBuilder`, the producers'
one builder (:class:`~bridge.client.producer.Producer`, the asyncio producer and
``TransactionMQProducer``), and :func:`plain_headers`, the one writer of a plain record's
headers (a send, a batch, a retry or DLQ copy, a replay).

A plain record (real, retry and DLQ topics, see :mod:`bridge.message`): value = body, key =
the sharding key or the keys, timestamp = the born time, headers = ``UNIQ_KEY``,
``BORN_HOST``, every property, ``KEYS`` and ``TAGS``. A delayed message becomes a SCHEDULE or
timer record instead (:mod:`bridge.delay.routing`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from bridge.client.send_checks import (
    MAX_PROPERTIES_BYTES,
    OWN_HEADERS_BYTES,
    TAGS_ALWAYS_FIT,
    PartitionCounts,
    kafka_topic_for,
    properties_size,
    properties_too_large,
)
from bridge.codec import PreparedRecord, RecordFields, new_tuple
from bridge.config import ClientConfig
from bridge.delay.routing import delayed_record, without_delay
from bridge.errors import (
    InvalidArgumentError,
    InvalidMessageError,
    InvalidPropertyError,
    MessageTooLargeError,
)
from bridge.kafka_config import apply_kafka_config, pick_hook, read_kafka_config
from bridge.message import Message, MessageConst, MessageIdGenerator, PropertyValue, local_ipv4
from bridge.property_values import is_unicode
from bridge.serialization import Serializer, Serializers
from bridge.tracing import inject_trace_context

_KAFKA_TOPICS_KEPT: Final = 4096
"""Topics whose Kafka name a builder keeps, at most (the map starts again beyond)."""
_UNIQ_KEY: Final = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_BORN_HOST: Final = MessageConst.BORN_HOST
_KEYS: Final = MessageConst.KEYS
_KEY_SEPARATOR: Final = MessageConst.KEY_SEPARATOR
_TAGS: Final = MessageConst.TAGS
_TRACE_PARENT: Final = MessageConst.TRACE_PARENT


_NO_TAGS_YET: Final = object()
"""What no message's tags are (:meth:`RecordBuilder.batch_records`' first plain message)."""

_SHARED_HEADERS_KEPT: Final = 1024
"""Values whose header :func:`_shared_header` keeps, at most, per header name (the map starts
again beyond)."""
_born_host_headers: dict[bytes, tuple[str, bytes]] = {}
_tags_headers: dict[str, tuple[str, bytes]] = {}


def _shared_header(
    kept: dict[Any, tuple[str, bytes]], value: str | bytes, header: tuple[str, bytes]
) -> tuple[str, bytes]:
    """``header`` (of ``value``), kept in ``kept`` to be the one tuple of every record with
    that value: a record's headers live until its report, and fewer objects alive per message
    in flight mean fewer garbage collector passes over a batch of thousands (``python -m
    bench producer``, send_batch's CPU a message)."""
    if len(kept) >= _SHARED_HEADERS_KEPT:
        kept.clear()
    kept[value] = header
    return header


def plain_headers(msg: Message, msg_id: str, born_host: bytes) -> list[tuple[str, bytes]]:
    """The headers of ``msg``'s plain record: ``UNIQ_KEY`` (``msg_id``), ``BORN_HOST``, every
    property (text as UTF-8, bytes as they are), ``KEYS`` and ``TAGS``. The one place they
    are written. Text with a lone surrogate raises ``UnicodeEncodeError``, tags that are not
    a string ``AttributeError`` or ``TypeError`` (the builder names the problem:
    ``Message.check_wire``). The ``BORN_HOST`` and ``TAGS`` headers are shared tuples
    (:func:`_shared_header`). The id's header comes first and the others depend on the
    message alone: a batch writes those of a message without properties or keys once for
    a run of messages with the same tags (:meth:`RecordBuilder.batch_records`)."""
    props, keys, tags = msg._properties, msg._keys, msg.tags
    # The lookups inline, the call on a miss only: this runs once a record.
    host = _born_host_headers.get(born_host) or _shared_header(
        _born_host_headers, born_host, (_BORN_HOST, born_host)
    )
    if not props and not keys:
        # The common message (a body, maybe tags): one list display, no appends.
        if tags:
            return [
                (_UNIQ_KEY, msg_id.encode()),
                host,
                _tags_headers.get(tags)
                or _shared_header(_tags_headers, tags, (_TAGS, tags.encode())),
            ]
        return [(_UNIQ_KEY, msg_id.encode()), host]
    headers = [(_UNIQ_KEY, msg_id.encode()), host]
    for name, value in props.items():
        headers.append((name, value.encode() if isinstance(value, str) else value))
    if keys:
        headers.append((_KEYS, _KEY_SEPARATOR.join(keys).encode()))
    if tags:
        headers.append(
            _tags_headers.get(tags) or _shared_header(_tags_headers, tags, (_TAGS, tags.encode()))
        )
    return headers


def plain_record(  # noqa: PLR0917 - the fields of the record, in PreparedRecord's order
    msg: Message,
    kafka_topic: str,
    msg_id: str,
    born_timestamp_ms: int,
    born_host: bytes,
    partition: int = -1,
) -> PreparedRecord:
    """``msg`` as a plain record of ``kafka_topic`` (a real, retry or DLQ topic): value = body,
    key from the sharding key or keys, headers from :func:`plain_headers`."""
    return new_tuple(
        PreparedRecord,
        (
            kafka_topic,
            msg.kafka_key(),
            msg.body,
            plain_headers(msg, msg_id, born_host),
            msg_id,
            born_timestamp_ms,
            partition,
        ),
    )


def producer_settings(
    *,
    bootstrap_servers: str | None,
    namespace: str | None,
    send_msg_timeout_ms: int | None,
    config: ClientConfig | None,
    kafka_config: Mapping[str, Any] | None,
    key_serializer: Serializer | None,
    value_serializer: Serializer | None,
) -> tuple[ClientConfig, Serializers]:
    """A producer's settings and serializers from its arguments: keyword arguments win over
    ``kafka_config`` (a confluent-kafka config dict, :mod:`bridge.kafka_config`), which wins
    over ``config``."""
    parts = read_kafka_config(kafka_config)
    settings = apply_kafka_config(config or ClientConfig(), parts).replace(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        send_msg_timeout_ms=send_msg_timeout_ms,
    )
    serializers = Serializers(
        pick_hook(parts, "key.serializer", key_serializer),
        pick_hook(parts, "value.serializer", value_serializer),
    )
    return settings, serializers


def message_list(msgs: Iterable[Message]) -> list[Message]:
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


class RecordBuilder:
    """Checks messages and builds their records, each with a new message id.

    ``metadata`` returns the confluent-kafka client whose metadata gives a topic's partition
    count, to check an explicit partition (None before it started: only the partition's
    type is checked then).
    """

    def __init__(
        self, config: ClientConfig, serializers: Serializers, metadata: Callable[[], Any]
    ) -> None:
        self.config = config
        self.serializers = serializers
        self._metadata = metadata
        self._ids = MessageIdGenerator()
        self.born_host = local_ipv4().encode("ascii")
        """This host's address, as ``BORN_HOST`` carries it."""
        self._max_message_bytes = config.max_message_bytes
        self._namespace = config.namespace
        self._partition_counts = PartitionCounts(config)
        self._kafka_topics: dict[str, str] = {}
        """Topic -> Kafka topic of the topics built for (:meth:`kafka_topic`)."""

    def prepare(self, msg: Message, partition: int = -1) -> PreparedRecord:
        """Check ``msg`` and build its record: see :meth:`bridge.Producer.prepare`."""
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
        kafka_topic = self._kafka_topics.get(topic) or self.kafka_topic(topic)
        if partition != -1:
            self._partition_counts.check(self._metadata(), topic, kafka_topic, partition)
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
                        self.born_host.decode(),
                        partition=partition,
                        config=self.config,
                    )
                    if delayed is not None:
                        return delayed
                    msg = without_delay(msg)  # a timer already due: delivered at once
            return plain_record(msg, kafka_topic, msg_id, born_ms, self.born_host, partition)
        except (UnicodeEncodeError, AttributeError, TypeError, InvalidPropertyError):
            # Content that cannot be encoded (a lone surrogate, tags that are not a string):
            # name what it is. Diagnosing only on failure keeps valid sends free of it.
            msg.check_wire()
            raise

    def common_record(self, msg: Message) -> PreparedRecord | None:
        """The record :meth:`prepare` builds for ``msg`` (partition -1, no span) when it is
        the common case, a body and at most short tags to a topic built for before, without
        its checks of what the message does not have; None for any other message (which
        :meth:`prepare` then checks and builds)."""
        if type(msg) is not Message or msg._properties or msg._keys:
            return None
        body, topic, tags = msg._body, msg.topic, msg.tags
        kafka_topic = self._kafka_topics.get(topic) if type(topic) is str else None
        if (
            kafka_topic is None
            or not body
            or len(body) > self._max_message_bytes
            or not (tags is None or (type(tags) is str and len(tags) <= TAGS_ALWAYS_FIT))
        ):
            return None
        born_ms = time.time_ns() // 1_000_000
        msg_id = self._ids.next_id(born_ms)
        try:
            headers = plain_headers(msg, msg_id, self.born_host)
        except UnicodeEncodeError:  # tags with a lone surrogate: prepare names it
            return None
        return new_tuple(PreparedRecord, (kafka_topic, None, body, headers, msg_id, born_ms, -1))

    def serialized(self, msg: Message) -> Message:
        """``msg`` as it is sent: see :meth:`bridge.Producer.serialized`."""
        return self.serializers.apply(msg)

    def kafka_topic(self, topic: str) -> str:
        """:func:`kafka_topic_for` (which raises for a topic no message may go to), kept in
        this builder's own map of the topics it built for (cheaper than the shared cache)."""
        kafka_topic = kafka_topic_for(topic, self._namespace)
        if len(self._kafka_topics) >= _KAFKA_TOPICS_KEPT:
            self._kafka_topics.clear()
        self._kafka_topics[topic] = kafka_topic
        return kafka_topic

    # --- batches ------------------------------------------------------------------------
    def prepare_batch(self, msgs: Iterable[Message], partition: int = -1) -> list[PreparedRecord]:
        """:meth:`prepare` for every message of ``msgs``: see
        :meth:`bridge.Producer.prepare_batch`."""
        batch = message_list(msgs)
        prepared = self.check_batch(batch, partition)
        return [
            new_tuple(PreparedRecord, fields)
            for fields in self.batch_records(batch, prepared, partition)
        ]

    def check_batch(self, batch: list[Message], partition: int) -> list[PreparedRecord | None]:
        """Check every message of ``batch`` as :meth:`prepare` does, raising the first typed
        error, with what they share done once (the trace context looked up, each topic
        mapped and its ``partition`` checked); per message, None for a plain message (a
        body, at most short tags) whose record :meth:`batch_records` builds later, else the
        record :meth:`prepare` built for it."""
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
                kafka_topic = kafka_topics.get(topic) or self.kafka_topic(topic)
                if partition != -1 and topic not in checked:
                    self._partition_counts.check(self._metadata(), topic, kafka_topic, partition)
                    checked.add(topic)
                last_topic = topic
            tags = msg.tags
            if tags and tags is not last_tags:
                if type(tags) is not str or len(tags) > TAGS_ALWAYS_FIT or not is_unicode(tags):
                    prepared[index] = prepare(msg, partition)  # measured, or refused
                    continue
                last_tags = tags
        return prepared

    def batch_records(
        self,
        batch: list[Message],
        prepared: list[PreparedRecord | None],
        partition: int,
        start: int = 0,
        stop: int | None = None,
    ) -> list[RecordFields]:
        """The records of the messages of a checked batch (``prepared``: :meth:`check_batch`)
        from index ``start`` up to ``stop`` (None: the end), in order, built in one loop: the
        record :meth:`prepare` built, or a plain message's fields, with a new id and the clock
        read per record (an old millisecond with the shared 16-bit counter could repeat an
        id). After a hand-over that waited for room in the local queue, the records after it
        are built again, a few at a time, so that they are dated after the wait
        (``BatchSender``).

        A plain record is a plain tuple, not a :class:`PreparedRecord`, and is built here
        rather than by :meth:`prepare`'s path: a batch pays per message only the id, the
        clock and its headers list, :func:`plain_headers` being called once for each run of
        messages with the same tags object, whose headers after the id are the same
        (``python -m bench producer``, send_batch's CPU a message in batches of 100)."""
        next_id = self._ids.next_id
        host = self.born_host
        kafka_topics = self._kafka_topics
        time_ns = time.time_ns
        last_topic: object = None
        kafka_topic = ""
        last_tags: object = _NO_TAGS_YET
        after_id: list[tuple[str, bytes]] = []
        records: list[RecordFields] = []
        append = records.append
        msgs = batch if start == 0 and stop is None else batch[start:stop]
        for index, msg in enumerate(msgs, start):
            record = prepared[index]
            if record is not None:
                append(record)
                continue
            topic = msg.topic
            if topic is not last_topic:
                kafka_topic = kafka_topics.get(topic) or self.kafka_topic(topic)
                last_topic = topic
            born_ms = time_ns() // 1_000_000
            msg_id = next_id(born_ms)
            tags = msg.tags
            if tags is last_tags:
                # A plain message's headers differ from the last one's only by the id, first.
                headers = [(_UNIQ_KEY, msg_id.encode()), *after_id]
            else:
                headers = plain_headers(msg, msg_id, host)
                after_id = headers[1:]
                last_tags = tags
            append((kafka_topic, None, msg._body, headers, msg_id, born_ms, partition))
        return records
