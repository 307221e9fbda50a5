"""Conversion between messages and Kafka records.

Real, retry and DLQ topics carry plain records (see :mod:`bridge.message`); system topics carry
the Avro ``MessageEnvelope`` (see :mod:`topics.avro`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bridge.message import Message, MessageConst, MessageExt
from topics.avro import default_registry
from topics.catalog import TopicCatalog
from topics.errors import InvalidTopicNameError
from topics.naming import to_kafka_topic

Headers = list[tuple[str, bytes]]

new_tuple = tuple.__new__
"""``new_tuple(SomeNamedTuple, values)`` builds a NamedTuple without its Python-level
``__new__``: for records built once per send or delivery."""


class PreparedRecord(NamedTuple):
    """A message ready for ``confluent_kafka.Producer.produce``."""

    kafka_topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    msg_id: str
    born_timestamp_ms: int
    partition: int = -1
    """The partition to write to; -1 lets the key decide."""


def plain_record(  # noqa: PLR0917 - the fields of the record, in PreparedRecord's order
    msg: Message,
    kafka_topic: str,
    msg_id: str,
    born_timestamp_ms: int,
    born_host: bytes,
    partition: int = -1,
) -> PreparedRecord:
    """``msg`` as a plain record of ``kafka_topic`` (a real, retry or DLQ topic): value = body,
    key from the sharding key or keys, headers = id, born host and every property."""
    headers = msg.wire_headers(
        [
            (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg_id.encode()),
            (MessageConst.BORN_HOST, born_host),
        ]
    )
    return new_tuple(
        PreparedRecord,
        (kafka_topic, msg.kafka_key(), msg.body, headers, msg_id, born_timestamp_ms, partition),
    )


# confluent-kafka's TIMESTAMP_LOG_APPEND_TIME (kept literal to keep this module import-light).
_TIMESTAMP_LOG_APPEND_TIME = 2
ENVELOPE_SCHEMA = "MessageEnvelope"


def encode_headers(properties: Mapping[str, str]) -> Headers:
    """Properties as Kafka headers (UTF-8 values)."""
    return [(name, value.encode("utf-8")) for name, value in properties.items()]


RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


def _header_text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return value.decode("utf-8", "surrogateescape")


def decode_headers(headers: RawHeaders | None) -> dict[str, str]:
    """Kafka headers as properties. Bytes that are not UTF-8 are kept losslessly
    (``surrogateescape``); a null header value becomes ``""``; a repeated name keeps the last."""
    if not headers:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    # Inlined _header_text: this runs for every header of every record consumed.
    return {
        name: (
            value.decode("utf-8", "surrogateescape")
            if type(value) is bytes
            else _header_text(value)
        )
        for name, value in pairs
    }


def message_from_record(record: Any, catalog: TopicCatalog | None = None) -> MessageExt:
    """Decode a consumed ``confluent_kafka.Message`` of a real, retry or DLQ topic.

    Records written by other Kafka producers decode too: their headers become properties and
    the message id is ``<topic>-<partition>-<offset>`` when no ``UNIQ_KEY`` header is present.
    """
    kafka_topic: str = record.topic()
    props = decode_headers(record.headers())
    topic = kafka_topic
    if catalog is not None:
        try:
            topic = catalog.parse(kafka_topic).rocketmq_name
        except InvalidTopicNameError:
            topic = kafka_topic
    ts_type, ts = record.timestamp()
    partition = record.partition()
    offset = record.offset()
    msg_id = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or (
        f"{kafka_topic}-{partition}-{offset}"
    )
    value = record.value()
    return MessageExt.received(
        topic,
        value if value is not None else b"",
        props,
        msg_id=msg_id,
        queue_id=partition,
        queue_offset=offset,
        born_timestamp_ms=ts if ts is not None and ts >= 0 else 0,
        store_timestamp_ms=ts if ts_type == _TIMESTAMP_LOG_APPEND_TIME else None,
        kafka_topic=kafka_topic,
    )


def encode_envelope(
    msg_id: str, body: bytes, properties: Mapping[str, str], born_timestamp_ms: int, born_host: str
) -> bytes:
    """A whole message as a ``MessageEnvelope`` record for a system topic."""
    return default_registry().encode(
        ENVELOPE_SCHEMA,
        {
            "msg_id": msg_id,
            "body": body,
            "properties": dict(properties),
            "born_timestamp_ms": born_timestamp_ms,
            "born_host": born_host,
        },
    )


def decode_envelope(data: bytes | None, topic: str = "") -> MessageExt:
    """A ``MessageEnvelope`` back into a message; ``topic`` defaults to ``REAL_TOPIC``.

    Raises a :class:`~topics.errors.WireFormatError` subclass on bad bytes.
    """
    return envelope_to_message(default_registry().decode(ENVELOPE_SCHEMA, data), topic)


def envelope_to_message(record: Mapping[str, Any], topic: str = "") -> MessageExt:
    """A decoded ``MessageEnvelope`` record as a message (see :func:`decode_envelope`)."""
    props: dict[str, str] = dict(record["properties"])
    return MessageExt(
        topic or props.get(MessageConst.REAL_TOPIC, ""),
        record["body"],
        msg_id=record["msg_id"],
        born_timestamp_ms=record["born_timestamp_ms"],
        born_host=record["born_host"],
        keys=props.get(MessageConst.KEYS),
        tags=props.get(MessageConst.TAGS),
        properties=props,
    )


@dataclass(frozen=True, slots=True)
class RealRecord:
    """A message as the Kafka record written to its real topic."""

    topic: str
    partition: int
    """-1: the key (murmur2) or the partitioner decides."""
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int


def real_record(msg: MessageExt, namespace: str, removed: frozenset[str]) -> RealRecord:
    """The real-topic record of a message leaving a system topic (a committed half message, a
    delayed message whose time came): its ``REAL_TOPIC`` and ``REAL_QID``, key, body and born
    time, and every property but those in ``removed``."""
    real_topic = to_kafka_topic(msg.get_property(MessageConst.REAL_TOPIC) or msg.topic, namespace)
    raw_qid = msg.get_property(MessageConst.REAL_QUEUE_ID) or "-1"
    partition = int(raw_qid) if raw_qid.lstrip("-").isdigit() else -1
    own = (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.BORN_HOST)
    headers = [
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg.msg_id.encode()),
        (MessageConst.BORN_HOST, msg.born_host.encode()),
    ]
    headers += [
        (name, value.encode())
        for name, value in msg.properties.items()
        if name not in removed and name not in own
    ]
    return RealRecord(
        real_topic, max(partition, -1), msg.kafka_key(), msg.body, headers, msg.born_timestamp_ms
    )
