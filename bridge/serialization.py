"""Kafka's serializer hooks: confluent-kafka's ``Serializer``/``Deserializer`` interface on
the bridge's producers and consumers (``docs/serialization.md``).

A serializer is called as confluent-kafka's are, ``serializer(obj, SerializationContext(topic,
MessageField.VALUE or KEY, headers))``, so Schema Registry's ``AvroSerializer``,
``JSONSerializer`` and ``ProtobufSerializer`` plug in as they are. ``topic`` is the message's
own topic, never a system topic: the producer serializes when the message is sent, before it
becomes a half, delayed or timer record, and the bytes then travel unchanged through the
coordinator, retries, the DLQ and replays (none of which ever needs the serializer). A consumer
deserializes with the topic the message was first sent to (``RETRY_TOPIC`` for a retry or a
dead letter), so Schema Registry's default subject (``<topic>-value``) is the same both ways.

``headers`` is a list of ``(name, bytes)``: a serializer that writes its schema id into the
headers (``header_schema_id_serializer``) appends to it, and what it appends travels as user
properties; a deserializer gets the record's headers as they were read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeAlias

from confluent_kafka.serialization import MessageField, SerializationContext

from bridge.errors import DeserializationError, InvalidArgumentError, SerializationError
from bridge.message import Message, MessageConst, PropertyValue, truncate_utf8

__all__ = [
    "Deserializer",
    "Deserializers",
    "Serializer",
    "Serializers",
    "key_was_serialized",
]

Serializer: TypeAlias = Callable[[Any, SerializationContext], bytes | None]
"""confluent-kafka's ``Serializer`` interface: ``(obj, ctx) -> bytes`` (None for no bytes)."""
Deserializer: TypeAlias = Callable[[bytes | None, SerializationContext], Any]
"""confluent-kafka's ``Deserializer`` interface: ``(data, ctx) -> obj``."""

Headers: TypeAlias = list[tuple[str, str | bytes | None]]


def _check_callable(name: str, hook: object) -> None:
    if hook is not None and not callable(hook):
        raise InvalidArgumentError(
            f"{name} must be callable as (obj, SerializationContext), got {type(hook).__name__}"
        )


def _failure(exc: BaseException) -> str:
    return truncate_utf8(f"{type(exc).__name__}: {exc}")


class Serializers:
    """A producer's ``key_serializer`` and ``value_serializer`` (either may be None)."""

    __slots__ = ("key", "value")

    def __init__(self, key: Serializer | None, value: Serializer | None) -> None:
        _check_callable("key_serializer", key)
        _check_callable("value_serializer", value)
        self.key = key
        self.value = value

    def will_run(self, msg: Message) -> bool:
        """Whether :meth:`apply` would call a serializer for ``msg`` (it has no body, a
        ``value=`` and this producer a serializer), which may block (a Schema Registry's
        HTTP calls): the asyncio producer then serializes on a worker thread."""
        return (
            not msg._body
            and (self.key is not None or self.value is not None)
            and msg.value is not None
        )

    def apply(self, msg: Message) -> Message:
        """``msg`` itself when it has a body (bytes: a consumed message forwarded keeps its
        bytes, whatever value its consumer deserialized) or no ``value=``; else a copy whose
        body is the serialized value and whose sharding key (the record key) is the
        serialized key, with any headers the serializers wrote as properties. ``msg`` is left
        as it is. Every send path serializes through here, so this is the one rule.

        Raises :class:`SerializationError` naming the topic and field when a serializer
        raises, returns something other than bytes, or is missing (nothing is sent then)."""
        if msg._body:
            return msg  # checked first: reading a consumed message's value deserializes it
        value = msg.value
        if value is None:
            return msg
        topic = msg.topic
        headers = properties_as_headers(msg.user_properties)
        start = len(headers)
        copy = Message(topic, keys=msg._keys or None, tags=msg.tags)
        copy._properties = dict(msg._properties)
        key = msg.key
        if key is not None:
            copy._properties[MessageConst.SHARDING_KEY] = self._run(
                self.key, key, topic, MessageField.KEY, headers
            )
        body = self._run(self.value, value, topic, MessageField.VALUE, headers)
        if not body:
            raise SerializationError(
                f"value_serializer returned no bytes for topic {topic!r} (value); a message "
                "needs a body",
                topic,
                "value",
            )
        copy._body = body
        for name, written in headers[start:]:
            self._put_header(copy, name, written, topic)
        return copy

    @staticmethod
    def _run(
        serializer: Serializer | None,
        obj: object,
        topic: str,
        kind: MessageField,
        headers: Headers,
    ) -> bytes:
        field = kind.value
        if serializer is None:
            if isinstance(obj, bytes):  # as Kafka's producer without a serializer: bytes as is
                return obj
            raise SerializationError(
                f"the message to topic {topic!r} has a {field} object "
                f"({type(obj).__name__}) and the producer has no {field}_serializer",
                topic,
                field,
            )
        try:
            data = serializer(obj, SerializationContext(topic, kind, headers))
        except Exception as exc:
            raise SerializationError(
                f"{field}_serializer failed for topic {topic!r} ({field}): {_failure(exc)}",
                topic,
                field,
            ) from exc
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if data is not None and not isinstance(data, bytes):
            raise SerializationError(
                f"{field}_serializer returned {type(data).__name__} for topic {topic!r} "
                f"({field}), not bytes",
                topic,
                field,
            )
        return data or b""

    @staticmethod
    def _put_header(copy: Message, name: object, value: object, topic: str) -> None:
        if isinstance(value, bytearray | memoryview):
            value = bytes(value)
        if not isinstance(name, str) or not isinstance(value, str | bytes):
            raise SerializationError(
                f"a serializer for topic {topic!r} wrote header {name!r} with a "
                f"{type(value).__name__} value; headers are (str, bytes)",
                topic,
                "value",
            )
        try:
            copy.put_user_property(name, value)
        except InvalidArgumentError as exc:
            raise SerializationError(
                f"a serializer for topic {topic!r} wrote header {name!r}, which cannot "
                f"travel: {exc}",
                topic,
                "value",
            ) from exc


class Deserializers:
    """A consumer's ``key_deserializer`` and ``value_deserializer`` (either may be None)."""

    __slots__ = ("key", "value")

    def __init__(self, key: Deserializer | None, value: Deserializer | None) -> None:
        _check_callable("key_deserializer", key)
        _check_callable("value_deserializer", value)
        self.key = key
        self.value = value

    def __bool__(self) -> bool:
        return self.key is not None or self.value is not None

    def defer(
        self,
        msg: Message,
        record_key: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """Make ``msg``'s :attr:`~Message.value` and :attr:`~Message.key` with the
        deserializers when either is first read (:meth:`apply`), on the reader's thread: the
        poll never waits for a deserializer (a Schema Registry's HTTP calls), and a failure
        raises in the listener, which retries the message."""
        given: Headers = list(headers) if headers is not None else []
        # A partial, not a closure: a consumed message still pickles (with picklable hooks).
        msg._pending = partial(_apply_later, self, record_key, given)

    def apply(
        self,
        msg: Message,
        record_key: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | None,
    ) -> None:
        """Set ``msg``'s :attr:`~Message.value` (from its body) and :attr:`~Message.key` (from
        ``record_key``) with the deserializers, with the topic the message was first sent to
        (``RETRY_TOPIC`` of a retry or dead letter, else its topic). The key is deserialized
        only where a key serializer may have written it (:func:`key_was_serialized`); else
        :attr:`~Message.key` stays None. Raises :class:`DeserializationError` naming the
        topic and field when one raises (nothing is set then)."""
        properties = msg._properties
        origin = properties.get(MessageConst.RETRY_TOPIC) if properties else None
        topic = origin if isinstance(origin, str) and origin else msg.topic
        given: Headers = list(headers) if headers is not None else []
        key: object = None
        if self.key is not None and record_key is not None and key_was_serialized(properties):
            key = self._run(self.key, record_key, topic, MessageField.KEY, given)
        value: object = None
        if self.value is not None:
            value = self._run(self.value, msg._body, topic, MessageField.VALUE, given)
        msg._key, msg._value = key, value

    @staticmethod
    def _run(
        deserializer: Deserializer, data: bytes, topic: str, kind: MessageField, headers: Headers
    ) -> object:
        field = kind.value
        try:
            return deserializer(data, SerializationContext(topic, kind, headers))
        except Exception as exc:
            raise DeserializationError(
                f"{field}_deserializer failed for topic {topic!r} ({field}): {_failure(exc)}",
                topic,
                field,
            ) from exc


def _apply_later(
    deserializers: Deserializers, record_key: bytes | None, headers: Headers, msg: Message
) -> None:
    """:meth:`Deserializers.apply`, as :meth:`Deserializers.defer` leaves it for later."""
    deserializers.apply(msg, record_key, headers)


def key_was_serialized(properties: dict[str, PropertyValue] | None) -> bool:
    """Whether a consumed record's key is one a key serializer may have written: its record
    key came from a sharding key (``key=`` or ``sharding_key=``; the record carries
    ``__SHARDINGKEY``), or the record is another Kafka client's (no ``UNIQ_KEY``). A bridge
    message's key otherwise comes from its ``keys`` (business keys, text), which no key
    serializer wrote."""
    if not properties:
        return True
    return (
        MessageConst.SHARDING_KEY in properties
        or MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX not in properties
    )


def properties_as_headers(properties: dict[str, PropertyValue]) -> Headers:
    """``properties`` as Kafka headers (text as UTF-8)."""
    return [(n, v.encode() if isinstance(v, str) else v) for n, v in properties.items()]
