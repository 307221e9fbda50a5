"""Conversion between messages and Kafka records.

Real, retry and DLQ topics carry plain records (see :mod:`bridge.message`). SCHEDULE and the
timer topic carry header-format records (the body as the Kafka value, the routing in headers:
see :func:`delayed_headers`), or an Avro ``MessageEnvelope`` (see :mod:`topics.avro`) when
written by an earlier release or with ``ClientConfig.delay_record_format = "envelope"``; both
are read (:func:`is_header_format`). The other system topics carry the envelope or their own
Avro records.

Properties are binary-safe: :func:`header_bytes` writes a property value as a header (text as
UTF-8, bytes as they are) and :func:`header_value` reads one back (text when the bytes are
valid UTF-8, else the bytes), so ``header_bytes(header_value(raw)) == raw`` for any bytes.

Plain records are built by :mod:`bridge.client.records`. This module stays above 500 lines
on purpose: it is the wire format in both directions (the consumed record decoded, lazily for
listeners; the envelope; the delayed header format; the coordinator's delivery records),
whose parts share the header encoding and the property rules, and a reader checks a format's
writer against its reader in one place.

Guarantees kept here (see ``docs/guarantees.md``): G10.
"""

from __future__ import annotations

import io
import logging
import operator
import threading
from collections.abc import Mapping, Sequence
from functools import cache, lru_cache
from typing import Any, Final, NamedTuple, SupportsIndex

from fastavro import schemaless_reader

from bridge.errors import InvalidPropertyError
from bridge.message import (
    Message,
    MessageConst,
    MessageExt,
    PropertyValue,
    is_unicode,
    parse_count,
    property_text,
)
from topics.avro import HEADER_LENGTH, SINGLE_OBJECT_MARKER, default_registry
from topics.catalog import TopicCatalog
from topics.errors import InvalidArgumentError, InvalidTopicNameError, MalformedRecordError
from topics.naming import to_kafka_topic

logger = logging.getLogger(__name__)


new_tuple = tuple.__new__
"""``new_tuple(SomeNamedTuple, values)`` builds a NamedTuple without its Python-level
``__new__``: for records built once per send or delivery."""


class PreparedRecord(NamedTuple):
    """A record ready for ``confluent_kafka.Producer.produce``: the one form of an outgoing
    record, whichever path writes it (a send, a send-back, a system record, a coordinator's
    delivery, a quarantine copy, an operator's replay)."""

    kafka_topic: str
    key: bytes | None
    value: bytes | None
    """None only for a record that carries no value (a quarantine copy kept without it, a
    replay marker)."""
    headers: Sequence[tuple[str, bytes | None]]
    msg_id: str
    """Names the record in errors and logs: the message id, or ``<topic>-<partition>-<offset>``
    of the record it copies."""
    born_timestamp_ms: int
    """The record's timestamp, epoch ms; 0 lets the producer's clock decide (a copy's: see
    :func:`stamped_copy`)."""
    partition: int = -1
    """The partition to write to; -1 lets the key decide."""


RecordFields = tuple[
    str, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], str, int, int
]
"""A record's fields in :class:`PreparedRecord`'s order, as a plain tuple (a PreparedRecord is
one too): a batch's plain records are handed over in this form, since building a NamedTuple
a record costs a copy of its fields (``python -m bench producer``, send_batch's CPU a message);
``new_tuple(PreparedRecord, fields)`` makes the record where one is needed."""


# confluent-kafka's TIMESTAMP_LOG_APPEND_TIME (kept literal to keep this module import-light).
_TIMESTAMP_LOG_APPEND_TIME = 2
ENVELOPE_SCHEMA: Final = "MessageEnvelope"
"""The Avro schema of a whole message on a system topic."""


def header_bytes(value: PropertyValue) -> bytes:
    """A property value as a Kafka header value: text as UTF-8, bytes as they are.

    Text with a lone surrogate raises ``UnicodeEncodeError`` (the producer refuses such text
    before it gets here, see ``Message.check_wire``).
    """
    return value.encode() if isinstance(value, str) else value


def header_value(raw: bytes | str | None) -> PropertyValue:
    """A Kafka header value as a property value: ``str`` when the bytes are valid UTF-8,
    else the ``bytes`` themselves; a null value is ``""``. Inverse of :func:`header_bytes`."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return bytes(raw)


RawHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


def decode_headers(headers: RawHeaders | None) -> dict[str, PropertyValue]:
    """Kafka headers as properties (see :func:`header_value`): text when valid UTF-8, else
    bytes; a null header value becomes ``""``; a repeated name keeps the last."""
    if not headers:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, PropertyValue] = {}
    # header_value inlined for bytes: this runs for every header of every record consumed.
    for name, value in pairs:
        if type(value) is bytes:
            try:
                out[name] = value.decode()
            except UnicodeDecodeError:
                out[name] = value
        else:
            out[name] = header_value(value)
    return out


_call_headers = operator.methodcaller("headers")


def read_headers(record: Any) -> list[tuple[str, bytes | None]] | None:
    """``record.headers()`` of a consumed ``confluent_kafka.Message``, or
    :class:`MalformedRecordError` when confluent-kafka cannot convert them (a header name that
    is not UTF-8).

    Call it once per record and never call ``record.headers()`` again after it failed:
    confluent-kafka then returns a list all the same, with the error still set (CPython's
    specialised call of a C method in a hot loop does not look at it, so it surfaces at a later,
    unrelated call) and a NULL name inside that crashes the process when read. A call through
    ``methodcaller`` is checked and raises here.
    """
    try:
        headers: list[tuple[str, bytes | None]] | None = _call_headers(record)
    except (SystemError, UnicodeDecodeError) as exc:
        cause = exc.__cause__ or exc.__context__ or exc
        raise MalformedRecordError(
            f"the headers of {record.topic()}[{record.partition()}]@{record.offset()} cannot be "
            f"read ({type(cause).__name__}: {cause})"
        ) from exc
    return headers


def message_from_record(
    record: Any, catalog: TopicCatalog | None = None, headers: RawHeaders | None = None
) -> MessageExt:
    """Decode a consumed ``confluent_kafka.Message`` of a real, retry or DLQ topic.

    Records written by other Kafka producers decode too: their headers become properties and
    the message id is ``<topic>-<partition>-<offset>`` when no ``UNIQ_KEY`` header is present
    (or it is empty, or not UTF-8).
    ``headers`` are the record's headers when the caller read them already (see
    :func:`read_headers`); a record whose headers cannot be read decodes without them (logged).
    """
    kafka_topic: str = record.topic()
    if headers is None:
        try:
            headers = read_headers(record)
        except MalformedRecordError as exc:
            logger.warning("%s; shown without its headers", exc)
    topic = kafka_topic
    if catalog is not None:
        try:
            topic = catalog.parse(kafka_topic).rocketmq_name
        except InvalidTopicNameError:
            topic = kafka_topic
    return received_message(record, topic, kafka_topic, record.partition(), headers)


def _header_properties(headers: RawHeaders | None) -> dict[str, PropertyValue]:
    """:func:`decode_headers`, inlined for the list of bytes values confluent-kafka gives:
    this runs for every record consumed."""
    if not headers:
        return {}
    if type(headers) is not list:
        return decode_headers(headers)
    props: dict[str, PropertyValue] = {}
    for name, value in headers:
        if type(value) is bytes:
            try:
                props[name] = value.decode()
            except UnicodeDecodeError:
                props[name] = value
        else:
            props[name] = header_value(value)
    return props


def received_message(
    record: Any, topic: str, kafka_topic: str, partition: int, headers: RawHeaders | None
) -> MessageExt:
    """:func:`message_from_record` once the caller knows the record's RocketMQ ``topic``, its
    ``kafka_topic`` and ``partition`` and read its ``headers`` (the push consumer, which
    knows the first three for a whole partition's share of a poll): one call per record."""
    born = copied_born_timestamp(headers)
    if born is not None and isinstance(headers, list | tuple):
        headers = headers[1:]  # the born time is no property
    props = _header_properties(headers)
    ts_type, ts = record.timestamp()
    offset: int = record.offset()
    uniq = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    # Not UTF-8 (another client's bytes): no id. Its text with U+FFFD for the bad bytes
    # would give distinct records one id, which listeners deduplicating by id would drop.
    msg_id = uniq if uniq and type(uniq) is str else f"{kafka_topic}-{partition}-{offset}"
    value = record.value()
    return MessageExt.received(
        topic,
        value if value is not None else b"",
        props,
        msg_id=msg_id,
        queue_id=partition,
        queue_offset=offset,
        born_timestamp_ms=born if born is not None else ts if ts is not None and ts >= 0 else 0,
        store_timestamp_ms=_store_timestamp(born, ts_type, ts),
        kafka_topic=kafka_topic,
    )


def _store_timestamp(copied_born: int | None, ts_type: int, ts: int | None) -> int | None:
    """When a consumed record was stored, epoch ms, where it can be told: the append time on a
    ``LogAppendTime`` topic, and the timestamp of a copy (:func:`stamped_copy`), which its
    writer stamped when it wrote it. None for a record whose timestamp is its born time."""
    if ts is None or ts < 0:
        return None
    return ts if copied_born is not None or ts_type == _TIMESTAMP_LOG_APPEND_TIME else None


_SLOTS: Final = {
    name: cls.__dict__[name]
    for cls, names in (
        (Message, ("_properties", "_keys", "tags")),
        (MessageExt, ("msg_id", "born_host")),
    )
    for name in names
}
"""The slots of a received message that come from its headers, by name (their descriptors)."""
_DECODE_LOCK: Final = threading.Lock()


def _decoded(name: str) -> property:
    """A slot of :class:`_Undecoded` that decodes the headers on first use."""
    slot = _SLOTS[name]

    # ``_Undecoded._decode``, not ``msg._decode``: another thread may have decoded the message
    # and made it a plain MessageExt (which has no ``_decode``) since this property was found.
    def get(msg: _Undecoded) -> Any:
        _Undecoded._decode(msg)
        return slot.__get__(msg, MessageExt)

    def put(msg: _Undecoded, value: Any) -> None:
        _Undecoded._decode(msg)
        slot.__set__(msg, value)

    return property(get, put, doc=f"``{name}``, decoded from the headers on first use.")


class _Undecoded(MessageExt):
    """A consumed message whose headers are decoded when first read (properties, keys, tags,
    message id, born host), not when it is received: a listener that reads only the body,
    topic and offsets pays nothing for them (:attr:`reconsume_times` reads its one header).
    Until then the ``_properties`` slot holds the record's headers (a list, or None);
    decoding fills every slot as :func:`received_message` would, then makes the message a
    plain :class:`MessageExt` (the same slots, so nothing is copied and later reads cost what
    they cost on any message). Safe when threads read it at once: the slots are filled under
    a lock before the class changes."""

    __slots__ = ()

    _properties = _decoded("_properties")
    _keys = _decoded("_keys")
    tags = _decoded("tags")
    msg_id = _decoded("msg_id")
    born_host = _decoded("born_host")

    @property
    def reconsume_times(self) -> int:
        """:attr:`MessageExt.reconsume_times`, read from its one header while the others
        are not decoded (listeners often look at it first)."""
        headers = _SLOTS["_properties"].__get__(self, MessageExt)
        if type(headers) is dict:  # decoded meanwhile (by another thread)
            return parse_count(headers.get(MessageConst.RECONSUME_TIME)) or 0
        raw: bytes | None = None
        for name, value in headers or ():
            if name == MessageConst.RECONSUME_TIME:
                raw = value  # a repeated header: the last one counts, as decoded
        return parse_count(header_value(raw)) or 0

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        # copy, deepcopy and pickle rebuild a plain MessageExt: decoded first, then as one.
        _Undecoded._decode(self)
        return self.__reduce_ex__(protocol)

    def _decode(self) -> None:
        with _DECODE_LOCK:
            if type(self) is MessageExt:
                return  # another thread decoded it meanwhile
            headers = _SLOTS["_properties"].__get__(self, MessageExt)
            if copied_born_timestamp(headers) is not None:
                headers = headers[1:]  # the born time, read when received
            props = _header_properties(headers)
            raw_keys = props.get(MessageConst.KEYS)
            keys: list[str] = []
            if raw_keys:
                text = raw_keys if type(raw_keys) is str else property_text(raw_keys)
                keys = [k for k in text.split(MessageConst.KEY_SEPARATOR) if k]
            tags = props.get(MessageConst.TAGS)
            host = props.get(MessageConst.BORN_HOST, "")
            uniq = props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            msg_id = (  # see received_message
                uniq
                if uniq and type(uniq) is str
                else f"{self.kafka_topic}-{self.queue_id}-{self.queue_offset}"
            )
            _SLOTS["_properties"].__set__(self, props)
            _SLOTS["_keys"].__set__(self, keys)
            _SLOTS["tags"].__set__(
                self, tags if tags is None or type(tags) is str else property_text(tags)
            )
            _SLOTS["msg_id"].__set__(self, msg_id)
            _SLOTS["born_host"].__set__(self, host if type(host) is str else property_text(host))
            self.__class__ = MessageExt  # type: ignore[assignment]


class _UndecodedFirst(_Undecoded):
    """An :class:`_Undecoded` first delivery: a message of a real topic, whose headers hold
    none that only the retry path writes (the push consumer's intake leaves such headers out
    of a record read there), so :attr:`reconsume_times` is 0 without a look at them (a
    listener reading it first pays nothing per header). Decoded, it is a plain
    :class:`MessageExt` like any other, whose ``RECONSUME_TIME`` is missing: 0 too."""

    __slots__ = ()

    @property
    def reconsume_times(self) -> int:
        """:attr:`MessageExt.reconsume_times`: 0, a first delivery."""
        return 0


_new_undecoded = _Undecoded.__new__
_set_topic: Final = Message.__dict__["topic"].__set__
_set_body: Final = Message.__dict__["_body"].__set__
_set_headers: Final = _SLOTS["_properties"].__set__


def undecoded_message(
    record: Any,
    topic: str,
    kafka_topic: str,
    partition: int,
    headers: RawHeaders | None,
    *,
    first_delivery: bool = False,
) -> MessageExt:
    """:func:`received_message`, with the headers decoded only when the message's properties,
    keys, tags, id or born host are first read (see :class:`_Undecoded`). The push consumer
    hands these to listeners. ``headers`` other than confluent-kafka's list are decoded at
    once. ``first_delivery``: the caller left out of ``headers`` every one that only the retry
    path writes (``RECONSUME_TIME`` among them), as the push consumer's intake does for a
    record of a real topic: the message was never consumed before."""
    if headers is not None and type(headers) is not list:
        return received_message(record, topic, kafka_topic, partition, headers)
    msg = _new_undecoded(_UndecodedFirst if first_delivery else _Undecoded)
    _set_topic(msg, topic)
    value = record.value()
    _set_body(msg, value if value is not None else b"")
    _set_headers(msg, headers)
    msg.kafka_topic = kafka_topic
    msg.queue_id = partition
    msg.queue_offset = record.offset()
    ts_type, ts = record.timestamp()
    # Most records are no copies: the first header's name is looked at before a call.
    born = (
        copied_born_timestamp(headers)
        if headers and headers[0][0] == BORN_TIMESTAMP_HEADER
        else None
    )
    if born is not None:
        msg.born_timestamp_ms = born
        msg.store_timestamp_ms = ts if ts is not None and ts >= 0 else None
    elif ts is not None and ts >= 0:
        msg.born_timestamp_ms = ts
        msg.store_timestamp_ms = ts if ts_type == _TIMESTAMP_LOG_APPEND_TIME else None
    else:
        msg.born_timestamp_ms = 0
        msg.store_timestamp_ms = None
    return msg


ENVELOPE_TEXT_ONLY_VERSION = 1
"""``MessageEnvelope`` v1 holds text properties only; v2 adds ``binary_properties``."""


def encode_envelope(
    msg_id: str,
    body: bytes,
    properties: Mapping[str, PropertyValue],
    born_timestamp_ms: int,
    born_host: str,
) -> bytes:
    """A whole message as a ``MessageEnvelope`` record for a system topic.

    Text values go to ``properties``, bytes values to ``binary_properties`` (v2). A message
    without bytes values is written in v1, which every version of the bridge reads (a rolling
    upgrade keeps working); readers resolve either into the newest version. A text value with
    a lone surrogate raises :class:`InvalidPropertyError` naming the property.
    """
    text: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    for name, value in properties.items():
        if isinstance(value, str):
            text[name] = value
        else:
            binary[name] = bytes(value)
    record: dict[str, Any] = {
        "msg_id": msg_id,
        "body": body,
        "properties": text,
        "born_timestamp_ms": born_timestamp_ms,
        "born_host": born_host,
    }
    registry = default_registry()
    try:
        if binary:
            record["binary_properties"] = binary
            return registry.encode(ENVELOPE_SCHEMA, record)
        return registry.encode(ENVELOPE_SCHEMA, record, version=ENVELOPE_TEXT_ONLY_VERSION)
    except InvalidArgumentError as exc:
        for name, value in text.items():
            if not is_unicode(name) or not is_unicode(value):
                raise InvalidPropertyError(
                    f"property {name!r} is not valid Unicode text (a lone surrogate); "
                    "pass bytes for a binary value"
                ) from exc
        raise


@cache
def _envelope_writers() -> dict[bytes, Any]:
    """Fingerprint -> parsed schema of the ``MessageEnvelope`` versions read without Avro
    schema resolution: v1 and v2, whose fields differ only by v2's ``binary_properties``
    (default empty), which :func:`envelope_to_message` and :func:`delivery_record` read with
    ``get``. A version added later goes through the registry until it is listed here."""
    registry = default_registry()
    return {
        v.fingerprint: v.parsed
        for v in registry.versions(ENVELOPE_SCHEMA)
        if v.version in _UNRESOLVED_ENVELOPE_VERSIONS
    }


_UNRESOLVED_ENVELOPE_VERSIONS: Final = frozenset({1, 2})


def envelope_fields(data: bytes | None) -> dict[str, Any]:
    """The fields of a ``MessageEnvelope`` record (any version; ``binary_properties`` may be
    missing for a v1 record). Raises a :class:`~topics.errors.WireFormatError` subclass on bad
    bytes, the same the schema registry raises.

    A v1 or v2 record is read with its writer schema alone: Avro's resolution into the newest
    version cost more than half of the decoding (11 of 19 us per record on the development
    machine). Anything that does not read cleanly that way (bad bytes, trailing bytes, another
    version) is decoded by the registry, which names the problem.
    """
    if data is not None and data[:2] == SINGLE_OBJECT_MARKER:
        writer = _envelope_writers().get(bytes(data[2:HEADER_LENGTH]))
        if writer is not None:
            stream = io.BytesIO(data)
            stream.seek(HEADER_LENGTH)
            try:
                fields = schemaless_reader(stream, writer, None)
            except Exception:  # the registry's decoding below says what is wrong
                fields = None
            if type(fields) is dict and stream.tell() == len(data):
                return fields
    return default_registry().decode(ENVELOPE_SCHEMA, data)


def decode_envelope(data: bytes | None, topic: str = "") -> MessageExt:
    """A ``MessageEnvelope`` back into a message; ``topic`` defaults to ``REAL_TOPIC``.

    Raises a :class:`~topics.errors.WireFormatError` subclass on bad bytes.
    """
    return envelope_to_message(envelope_fields(data), topic)


def envelope_to_message(record: Mapping[str, Any], topic: str = "") -> MessageExt:
    """A decoded ``MessageEnvelope`` record (any version) as a message, text and bytes
    properties together (see :func:`decode_envelope`)."""
    props: dict[str, PropertyValue] = dict(record["properties"])
    binary = record.get("binary_properties")
    if binary:
        props.update(binary)
    return _waiting_message(
        topic,
        record["body"],
        record["msg_id"],
        record["born_timestamp_ms"],
        record["born_host"],
        props,
    )


def _waiting_message(  # noqa: PLR0917 - the fields of the message, in order
    topic: str,
    body: bytes,
    msg_id: str,
    born_ms: int,
    born_host: str,
    props: dict[str, PropertyValue],
) -> MessageExt:
    """A message read from a system topic (either format), its keys and tags from
    ``props``; with no ``topic``, its ``REAL_TOPIC``."""
    msg = MessageExt(
        topic,
        body,
        msg_id=msg_id,
        born_timestamp_ms=born_ms,
        born_host=born_host,
        keys=_text_or_none(props.get(MessageConst.KEYS)),
        tags=_text_or_none(props.get(MessageConst.TAGS)),
        properties=props,
    )
    if not topic:
        msg.topic = msg.get_property(MessageConst.REAL_TOPIC) or ""
    return msg


def _text_or_none(value: PropertyValue | None) -> str | None:
    return None if value is None else property_text(value)


def real_record(msg: MessageExt, namespace: str, removed: frozenset[str]) -> PreparedRecord:
    """The real-topic record of a message leaving a system topic (a committed half message, a
    delayed message whose time came): its ``REAL_TOPIC`` and ``REAL_QID``, key, body and born
    time, and every property but those in ``removed``."""
    real_topic = to_kafka_topic(msg.get_property(MessageConst.REAL_TOPIC) or msg.topic, namespace)
    # -1 (or anything that is not a partition number) lets the key decide.
    partition = parse_count(msg.get_property(MessageConst.REAL_QUEUE_ID))
    own = (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.BORN_HOST)
    headers = [
        _born_header(msg.born_timestamp_ms),
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg.msg_id.encode()),
        (MessageConst.BORN_HOST, msg.born_host.encode()),
    ]
    headers += [
        (name, header_bytes(value))
        for name, value in msg.properties.items()
        if name not in removed and name not in own
    ]
    return PreparedRecord(
        real_topic,
        msg.kafka_key(),
        msg.body,
        headers,
        msg.msg_id,
        0,
        -1 if partition is None else partition,
    )


_OWN_HEADERS: Final = frozenset(
    {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, MessageConst.BORN_HOST}
)


@lru_cache(maxsize=4096)
def _real_kafka_topic(name: str, namespace: str) -> str:
    """:func:`to_kafka_topic`, remembered: a burst delivers to few topics."""
    return to_kafka_topic(name, namespace)


def _system_text(props: Mapping[str, PropertyValue], name: str) -> str | None:
    """A system property as text, as :meth:`Message.get_property` reads it."""
    value = props.get(name)
    return value.decode("utf-8", "replace") if type(value) is bytes else value  # type: ignore[return-value]


def delivery_record(data: bytes | None, namespace: str, removed: frozenset[str]) -> PreparedRecord:
    """The real-topic record of the ``MessageEnvelope`` ``data``: the same record as
    ``real_record(decode_envelope(data), namespace, removed)``, built from the envelope's
    fields without the message in between (the delay services deliver each record this way).

    Raises a :class:`~topics.errors.WireFormatError` subclass on bad bytes and
    :class:`InvalidTopicNameError` for a ``REAL_TOPIC`` with no Kafka name, as
    :func:`real_record` does.
    """
    fields = envelope_fields(data)
    props: dict[str, PropertyValue] = fields["properties"]
    binary = fields.get("binary_properties")
    if binary:
        props.update(binary)
    real_topic = _real_kafka_topic(_system_text(props, MessageConst.REAL_TOPIC) or "", namespace)
    partition = parse_count(_system_text(props, MessageConst.REAL_QUEUE_ID))
    sharding = props.get(MessageConst.SHARDING_KEY)
    key: bytes | None
    if sharding is not None:
        key = sharding.encode() if type(sharding) is str else sharding  # type: ignore[assignment]
    else:
        keys = props.get(MessageConst.KEYS)
        if keys:
            text = keys if type(keys) is str else property_text(keys)
            joined = MessageConst.KEY_SEPARATOR.join(
                k for k in text.split(MessageConst.KEY_SEPARATOR) if k
            )
            key = joined.encode() if joined else None
        else:
            key = None
    msg_id: str = fields["msg_id"]
    headers: list[tuple[str, bytes | None]] = [
        _born_header(fields["born_timestamp_ms"]),
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg_id.encode()),
        (MessageConst.BORN_HOST, fields["born_host"].encode()),
    ]
    for name, value in props.items():
        if name not in removed and name not in _OWN_HEADERS:
            headers.append((name, value.encode() if isinstance(value, str) else value))
    at = -1 if partition is None else partition
    return new_tuple(PreparedRecord, (real_topic, key, fields["body"], headers, msg_id, 0, at))


# --- SCHEDULE and timer records in the header format -------------------------------------------
# A delayed message waits as the record it becomes, as RocketMQ stores one: value = the body,
# key as on its real topic, and headers = the coordinator's own (a producer's send id, then the
# born time) followed by the message's (its id, born host, every property with REAL_TOPIC,
# REAL_QID and the delay level or TIMER_DELIVER_MS among them). Delivery is a header rewrite.
# Records written before (an Avro MessageEnvelope as value) are told apart by their headers:
# they never carry BORN_TIMESTAMP_HEADER or REAL_TOPIC (see is_header_format).

BORN_TIMESTAMP_HEADER: Final = "BRIDGE_BORN_MS"
"""A Kafka header (never a message property) holding a message's born time, epoch ms, as ASCII
digits, where the record's timestamp is not that time:

- on a SCHEDULE or timer record in the header format (those topics keep LogAppendTime, so the
  record's timestamp is when it was stored), where the first header of that name ends the
  coordinator's headers: every header after it is the message's;
- as the first header of a copy written to a real, retry or DLQ topic later than the message
  was born (a committed half message, a delayed message or retry delivered, a dead letter, a
  replay: :func:`stamped_copy`). The copy's timestamp is when it was written, so a topic's
  time retention counts from then, as RocketMQ keeps a message for its commit log file's
  time from when it is stored, and the consumers read the born time from this header."""


def _born_header(born_timestamp_ms: int) -> tuple[str, bytes]:
    return (BORN_TIMESTAMP_HEADER, str(born_timestamp_ms).encode())


def stamped_copy(record: PreparedRecord) -> PreparedRecord:
    """``record`` (a plain record copying a message born earlier) with its born time moved to
    a first :data:`BORN_TIMESTAMP_HEADER` and its timestamp left to the writer's clock. A
    Kafka topic's time retention reads the record timestamp: a copy that kept the born time
    of a message older than the topic's ``retention.ms`` could be deleted soon after it was
    written."""
    if record.born_timestamp_ms <= 0:  # no born time known: the copy's time is all there is
        return record._replace(born_timestamp_ms=0)
    headers = [_born_header(record.born_timestamp_ms), *record.headers]
    return record._replace(headers=headers, born_timestamp_ms=0)


def copied_born_timestamp(headers: RawHeaders | None) -> int | None:
    """The born time a copy's first header holds (see :func:`stamped_copy`), epoch ms; None
    for a record that is not such a copy (its timestamp is its born time, or it is another
    client's whose first header is not 1 to 18 ASCII digits above 0 under that name) and for
    headers given as a mapping (no order: no first header)."""
    if not headers or not isinstance(headers, list | tuple):
        return None
    name, raw = headers[0]
    if name != BORN_TIMESTAMP_HEADER or raw is None:
        return None
    return parse_count(raw) or None  # 0 is no born time (the Spark jobs read it so too)


def delayed_headers(
    head: list[tuple[str, bytes | None]],
    msg_id: str,
    born_host: str,
    properties: Mapping[str, PropertyValue],
    born_timestamp_ms: int,
) -> list[tuple[str, bytes | None]]:
    """The headers of a SCHEDULE or timer record in the header format: ``head`` (the
    coordinator's own, e.g. a send id), the born time (:data:`BORN_TIMESTAMP_HEADER`), then
    the message: its id, born host and ``properties`` (text first, then bytes: the order the
    envelope delivered them in), each written as a plain record's header
    (:func:`bridge.client.records.plain_headers`). Properties
    named like the id or born host are left out (the message's own fields win, as before).
    ``head`` is extended and returned.

    A text value with a lone surrogate raises ``UnicodeEncodeError``.
    """
    head += (
        (BORN_TIMESTAMP_HEADER, str(born_timestamp_ms).encode()),
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, msg_id.encode()),
        (MessageConst.BORN_HOST, born_host.encode()),
    )
    binary: list[tuple[str, bytes | None]] = []
    # ``type() is`` before ``isinstance``: this runs for each property of each retry copy.
    append = head.append
    for name, value in properties.items():
        if name in _OWN_HEADERS:
            continue
        if type(value) is str or isinstance(value, str):
            append((name, value.encode()))
        else:
            binary.append((name, value if type(value) is bytes else bytes(value)))
    head += binary
    return head


def is_header_format(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    """Whether a SCHEDULE or timer record with these headers is in the header format: it has
    a :data:`BORN_TIMESTAMP_HEADER` or ``REAL_TOPIC`` header. An envelope record never had
    either among its headers (only the send id and ``TIMER_DELIVER_MS``), and no message
    property can be read from those of an envelope record, so user bytes cannot decide it."""
    for name, _ in headers:
        if name == BORN_TIMESTAMP_HEADER or name == MessageConst.REAL_TOPIC:  # noqa: PLR1714
            return True
    return False


def message_headers_start(headers: Sequence[tuple[str, bytes | None]]) -> int:
    """The index of the first of the message's headers of a header-format record (the one
    after :data:`BORN_TIMESTAMP_HEADER`); :class:`MalformedRecordError` without that header."""
    for at, (name, _) in enumerate(headers):
        if name == BORN_TIMESTAMP_HEADER:
            return at + 1
    raise MalformedRecordError(f"no {BORN_TIMESTAMP_HEADER} header (the born time)")


def _header_text(name: str, raw: bytes | None) -> str:
    """A routing header's value as text; :class:`MalformedRecordError` if it is not UTF-8."""
    if raw is None:
        return ""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise MalformedRecordError(f"header {name} is not UTF-8: {raw[:64]!r}") from None


def born_timestamp(headers: Sequence[tuple[str, bytes | None]], start: int) -> int:
    """The born time of a header-format record (``start``: see :func:`message_headers_start`),
    epoch ms; :class:`MalformedRecordError` unless it is 1 to 18 ASCII digits."""
    raw = headers[start - 1][1]
    born = parse_count(_header_text(BORN_TIMESTAMP_HEADER, raw))
    if born is None:
        raise MalformedRecordError(f"header {BORN_TIMESTAMP_HEADER} is not a time: {raw!r}")
    return born


def last_message_header(
    headers: Sequence[tuple[str, bytes | None]], name: str, start: int = 0
) -> bytes | None:
    """The value of the last header ``name`` at or after ``start`` (None when there is none):
    a property of a header-format record, read as :func:`decode_headers` would."""
    for at in range(len(headers) - 1, start - 1, -1):
        if headers[at][0] == name:
            return headers[at][1]
    return None


def header_delivery_record(
    headers: Sequence[tuple[str, bytes | None]],
    value: bytes | None,
    namespace: str,
    removed: frozenset[str],
) -> PreparedRecord:
    """The real-topic record of a header-format SCHEDULE or timer record with ``headers`` and
    ``value``: the record :func:`delivery_record` builds from the envelope of the same message
    (same topic, partition, key, value, headers in the same order, born time), by leaving out
    the coordinator's headers and those in ``removed``. The value is passed through; a null
    value is delivered as ``b""`` (an empty body, what the bridge's consumers read it as): an
    envelope never made a tombstone, and one must not delete a key of a compacted real topic
    through the coordinator.

    Raises :class:`MalformedRecordError` for a record without the born time, ``UNIQ_KEY`` (the
    first of the message's headers; a null or empty one counts as missing) or ``REAL_TOPIC``,
    a ``REAL_QID`` that is not a partition number or -1, or one of these that is not UTF-8;
    :class:`InvalidTopicNameError` for a ``REAL_TOPIC`` with no Kafka name. Of a repeated
    ``UNIQ_KEY`` (or other header) the last one counts, as consumers read the delivered record
    (:func:`decode_headers`).
    """
    start = message_headers_start(headers)
    born_timestamp(headers, start)  # checked here, copied as it is
    if start >= len(headers) or headers[start][0] != MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX:
        raise MalformedRecordError(
            f"no {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX} header after {BORN_TIMESTAMP_HEADER}"
        )
    uniq: bytes | None = None
    real_topic: bytes | None = None
    queue_id: bytes | None = None
    sharding: bytes | None = None
    has_sharding = False
    keys: bytes | None = None
    out: list[tuple[str, bytes | None]] = [headers[start - 1]]  # the born time, first
    for at in range(start, len(headers)):
        header = headers[at]
        name = header[0]
        if name == MessageConst.REAL_TOPIC:
            real_topic = header[1]
        elif name == MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX:
            uniq = header[1]
        elif name == MessageConst.REAL_QUEUE_ID:
            queue_id = header[1]
        elif name == MessageConst.SHARDING_KEY:
            sharding, has_sharding = header[1], True
        elif name == MessageConst.KEYS:
            keys = header[1]
        if name not in removed:
            out.append(header)
    msg_id = _header_text(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq)
    if not msg_id:
        raise MalformedRecordError(
            f"{MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX} header is "
            f"{'null' if uniq is None else 'empty'} (no message id)"
        )
    if real_topic is None:
        raise MalformedRecordError(f"no {MessageConst.REAL_TOPIC} header")
    topic = _real_kafka_topic(_header_text(MessageConst.REAL_TOPIC, real_topic), namespace)
    partition = -1
    if queue_id is not None:
        text = _header_text(MessageConst.REAL_QUEUE_ID, queue_id)
        count = parse_count(text)
        if count is None and text != "-1":
            raise MalformedRecordError(
                f"header {MessageConst.REAL_QUEUE_ID} is not a partition number: {text[:64]!r}"
            )
        partition = -1 if count is None else count
    key: bytes | None
    if has_sharding:
        key = sharding if sharding is not None else b""
    elif keys:
        joined = MessageConst.KEY_SEPARATOR.join(
            k for k in keys.decode("utf-8", "replace").split(MessageConst.KEY_SEPARATOR) if k
        )
        key = joined.encode() if joined else None
    else:
        key = None
    body = value if value is not None else b""
    return new_tuple(PreparedRecord, (topic, key, body, out, msg_id, 0, partition))


def header_format_message(
    headers: Sequence[tuple[str, bytes | None]], value: bytes | None, topic: str = ""
) -> MessageExt:
    """A header-format SCHEDULE or timer record as the message it holds (properties with
    ``REAL_TOPIC``, ``REAL_QID`` and the delay ones, as :func:`decode_envelope` gives them);
    ``topic`` defaults to ``REAL_TOPIC``; a null value is an empty body. Raises
    :class:`MalformedRecordError` as :func:`header_delivery_record` does for the born time and
    id (a null or empty ``UNIQ_KEY`` is missing; of repeated ones the last counts)."""
    start = message_headers_start(headers)
    born = born_timestamp(headers, start)
    props = decode_headers(list(headers[start:]))
    uniq = props.pop(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, None)
    if type(uniq) is not str or not uniq:
        raise MalformedRecordError(
            f"no UTF-8 {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX} header after "
            f"{BORN_TIMESTAMP_HEADER}"
            + ("" if uniq is None or uniq else " (it is null or empty: no message id)")
        )
    host = props.pop(MessageConst.BORN_HOST, "")
    props[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
    return _waiting_message(
        topic, value if value is not None else b"", uniq, born, property_text(host), props
    )


def delayed_message(
    headers: Sequence[tuple[str, bytes | None]], value: bytes | None, topic: str = ""
) -> MessageExt:
    """The message a SCHEDULE or timer record holds, in either format (see
    :func:`is_header_format`): :func:`header_format_message` or :func:`decode_envelope`."""
    if is_header_format(headers):
        return header_format_message(headers, value, topic)
    return decode_envelope(value, topic)
