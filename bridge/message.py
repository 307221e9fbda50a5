"""The message model: :class:`Message` (what a producer sends), :class:`MessageExt` (what a
consumer receives).

RocketMQ's property names live in :mod:`topics.properties`, property values and their checks in
:mod:`bridge.property_values`, message ids in :mod:`bridge.message_id`; this module re-exports
them, so ``from bridge.message import MessageConst`` keeps working. The module stays above
400 lines on purpose: :class:`Message` is RocketMQ's whole ``Message`` API (body, keys, tags,
properties, delay levels and timers, the record it becomes) in one class, and
:class:`MessageExt` extends it; split, a reader would have to hop between files for one type.

On a real topic a message is a plain Kafka record that any Kafka client reads:

* value = body;
* key = the sharding key if set, else the keys joined by spaces, else no key;
* timestamp = the born timestamp (CreateTime);
* headers = every property under RocketMQ's name: ``UNIQ_KEY`` (message id), ``TAGS``,
  ``KEYS``, ``BORN_HOST``, the user's properties, and the system properties a feature adds
  (``RECONSUME_TIME``, ``ORIGIN_MESSAGE_ID``, ...).

A property value is :data:`PropertyValue`, ``str | bytes`` (binary-safe properties): text is
written as UTF-8 and bytes as they are; a header read back is ``str`` when its bytes are valid
UTF-8 and ``bytes`` otherwise, so whatever another Kafka client wrote in its headers (binary
trace contexts, schema ids) is kept byte for byte through every copy (retry, DLQ, delay,
transactions, replay). System properties are always text (:meth:`Message.get_property`).

A message's trace context travels the same way, as W3C ``traceparent``/``tracestate``
properties (:attr:`MessageConst.TRACE_PARENT`); :mod:`bridge.tracing` makes the spans.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Final, overload

from bridge.errors import InvalidDelayError, InvalidMessageError
from bridge.message_id import MessageIdGenerator, local_ipv4, now_ms
from bridge.property_values import (
    PropertyValue,
    check_property_name,
    check_property_value,
    check_user_property,
    is_unicode,
    lone_surrogate,
    parse_count,
    property_text,
)
from topics.properties import (
    DEAD_LETTER_PROPERTIES,
    DELAY_PROPERTIES,
    RESERVED_PROPERTIES,
    SYSTEM_PROPERTIES,
    TRACE_PROPERTIES,
    USER_SETTABLE_PROPERTIES,
    MessageConst,
    SystemPropertyName,
)

__all__ = [
    "DEAD_LETTER_PROPERTIES",
    "DELAY_PROPERTIES",
    "FAILURE_MESSAGE_MAX_BYTES",
    "MESSAGE_GROUP_MAX_BYTES",
    "RESERVED_PROPERTIES",
    "SYSTEM_PROPERTIES",
    "TRACE_PROPERTIES",
    "USER_SETTABLE_PROPERTIES",
    "Message",
    "MessageConst",
    "MessageExt",
    "MessageIdGenerator",
    "PropertyValue",
    "SystemPropertyName",
    "checked_message_group",
    "is_unicode",
    "local_ipv4",
    "now_ms",
    "parse_count",
    "property_text",
    "truncate_utf8",
]


FAILURE_MESSAGE_MAX_BYTES: Final = 1024
"""The most bytes (UTF-8) of an exception's class or message kept in a copy: 1 KiB."""


def truncate_utf8(text: str, max_bytes: int = FAILURE_MESSAGE_MAX_BYTES) -> str:
    """``text`` if its UTF-8 encoding fits in ``max_bytes`` bytes, else its longest prefix that
    fits together with ``...`` (never a broken character; a lone surrogate becomes ``?``).
    Only the first ``max_bytes + 1`` characters are encoded (each is at least a byte): a huge
    text costs no more than a short one."""
    encoded = text[: max(max_bytes, 0) + 1].encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return encoded.decode("utf-8")
    return encoded[: max(max_bytes - 3, 0)].decode("utf-8", "ignore") + "..."


_NO_KEYS: Final[list[str]] = []
"""The keys of every message without keys: one list, never changed (``_keys`` is replaced,
never changed in place), instead of an empty list per message for the garbage collector to
count and walk through."""


def _normalise_keys(keys: str | Iterable[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [k for k in keys.split(MessageConst.KEY_SEPARATOR) if k]
    if isinstance(keys, bytes | bytearray | memoryview) or not isinstance(keys, Iterable):
        raise InvalidMessageError(
            f"keys must be a string or an iterable of strings, got {type(keys).__name__}"
        )
    out = []
    for k in keys:
        if not isinstance(k, str) or not k or MessageConst.KEY_SEPARATOR in k:
            raise InvalidMessageError(f"a key must be a non-empty string without spaces, got {k!r}")
        out.append(k)
    return out


def _check_objects(body: object, key: object, value: object, sharding_key: object) -> None:
    """:class:`InvalidMessageError` for a message given ``key=``/``value=`` (objects for the
    producer's serializers) together with what they stand for: a body, or a sharding key."""
    if value is None:
        raise InvalidMessageError(
            "key= needs value= (the object the producer's value_serializer writes as the body)"
        )
    if body:
        raise InvalidMessageError(
            "give either body (bytes) or value= (an object for the producer's "
            "value_serializer), not both"
        )
    if key is not None and sharding_key is not None:
        raise InvalidMessageError(
            "give either sharding_key (the record key as text or bytes) or key= (an object "
            "for the producer's key_serializer), not both"
        )


MESSAGE_GROUP_MAX_BYTES: Final = 64
"""A message group's UTF-8 encoding must be shorter than this (RocketMQ 5's proxy refuses a
group of ``maxMessageGroupSize``, 64, bytes or more)."""


def checked_message_group(group: object) -> str:
    """``group`` if it can be a message group (RocketMQ 5's rules: text that is not blank,
    shorter than :data:`MESSAGE_GROUP_MAX_BYTES` bytes of UTF-8, without control characters),
    else :class:`InvalidMessageError` saying why."""
    if not isinstance(group, str):
        raise InvalidMessageError(f"a message group must be text, got {type(group).__name__}")
    if not group.strip():
        raise InvalidMessageError(f"a message group must not be blank, got {group!r}")
    if not is_unicode(group):
        raise InvalidMessageError(
            f"the message group {group!r} is not valid Unicode text ({lone_surrogate(group)})"
        )
    size = len(group.encode())
    if size >= MESSAGE_GROUP_MAX_BYTES:
        raise InvalidMessageError(
            f"the message group {group[:16]!r}... takes {size} bytes of UTF-8; it must take "
            f"fewer than {MESSAGE_GROUP_MAX_BYTES}"
        )
    for index, char in enumerate(group):
        if ord(char) < 0x20 or 0x7F <= ord(char) <= 0x9F:
            raise InvalidMessageError(
                f"the message group {group!r} holds the control character U+{ord(char):04X} "
                f"at index {index}"
            )
    return group


def _delay_number(setter: str, value: object) -> int:
    """``value`` (a delay level) if it is an ``int``, else :class:`InvalidDelayError` naming
    the setter: a ``bool`` is refused though Python counts it an int (``True`` is no delay
    anyone means), and so are a float (a level is an index), text and None, as RocketMQ's
    ``int`` parameter and :func:`bridge.settings.require_int` do."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDelayError(f"{setter} needs an integer, got {value!r}")
    return int(value)  # an int subclass (an IntEnum) as the plain number


def _timer_number(setter: str, value: object) -> int:
    """``value`` (a timer setter's argument, in the setter's unit) as a whole number of that
    unit: an ``int`` as it is, a finite float rounded up (``time.time() * 1000 + 5000`` is the
    usual way to name an instant, and rounding down would deliver up to a unit early); a
    ``bool``, ``nan``, an infinity, text or None is :class:`InvalidDelayError` naming the setter."""
    if isinstance(value, float) and math.isfinite(value):
        return math.ceil(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDelayError(f"{setter} needs an integer or a finite float, got {value!r}")
    return int(value)


class Message:
    """A message to send: RocketMQ's ``Message`` with Pythonic keyword arguments.

    ``body`` is bytes (a ``str`` is encoded as UTF-8). ``keys`` are business keys (a string of
    space-separated keys or a list), ``tags`` one tag used for filtering. ``properties`` are
    user properties, text or bytes; system properties (``MessageConst``) are set through the
    methods. ``sharding_key`` (text or bytes) is the Kafka record key, which picks the
    partition. ``message_group`` (text) is RocketMQ 5's FIFO message group: the same
    property as the sharding key (``__SHARDINGKEY``, as RocketMQ 5's proxy stores it), so a
    group's messages share a partition, and a FIFO consumer (``PushConsumer(fifo=True)``)
    consumes them one at a time, in send order (``docs/fifo.md``).

    With a producer made with a ``value_serializer`` (and ``key_serializer``), pass the
    objects instead: ``value=`` (in place of ``body``) and ``key=`` (in place of
    ``sharding_key``); the producer serializes them when the message is sent
    (``docs/serialization.md``). A consumer with deserializers gives them back in
    :attr:`value` and :attr:`key`, while ``body`` stays the bytes.
    """

    __slots__ = ("_body", "_key", "_keys", "_pending", "_properties", "_value", "tags", "topic")
    _pending: Callable[[Message], None] | None
    """On a consumed message, the consumer's deserializers until :attr:`value` or :attr:`key`
    is first read (:meth:`bridge.serialization.Deserializers.defer`)."""

    def __init__(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        keys: str | Iterable[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, PropertyValue] | None = None,
        delay_time_level: int = 0,
        sharding_key: str | bytes | None = None,
        key: object = None,
        value: object = None,
        message_group: str | None = None,
    ) -> None:
        self.topic = topic
        if key is not None or value is not None:
            _check_objects(body, key, value, sharding_key)
            self._key = key
            self._value = value
        # The common case (bytes body, no keys, no properties) stays cheap: senders build one
        # Message per send.
        if type(body) is bytes:
            self._body = body
        else:
            self.body = body
        self._keys = _normalise_keys(keys) if keys is not None else _NO_KEYS
        if tags is not None and not isinstance(tags, str):
            raise InvalidMessageError(f"tags must be a string, got {type(tags).__name__}")
        self.tags = tags
        self._properties: dict[str, PropertyValue] = {}
        if properties:
            for name, given in properties.items():
                self.put_user_property(name, given)
        if delay_time_level:
            self.set_delay_time_level(delay_time_level)
        if sharding_key is not None:
            if isinstance(sharding_key, bytearray | memoryview):
                sharding_key = bytes(sharding_key)
            if not isinstance(sharding_key, str | bytes):
                raise InvalidMessageError(
                    "the sharding key must be text or bytes, got "
                    f"{type(sharding_key).__name__} (an object goes in key=, with a "
                    "producer's key_serializer)"
                )
            self._properties[MessageConst.SHARDING_KEY] = sharding_key
        if message_group is not None:
            if sharding_key is not None or key is not None:
                raise InvalidMessageError(
                    "give either message_group or sharding_key / key= (the message group is "
                    "the sharding key: it becomes the record key), not both"
                )
            self._properties[MessageConst.SHARDING_KEY] = checked_message_group(message_group)

    # --- body, keys, tags -------------------------------------------------------------
    @property
    def body(self) -> bytes:
        """The payload, bytes."""
        return self._body

    @body.setter
    def body(self, value: bytes | bytearray | memoryview | str) -> None:
        if isinstance(value, str):
            try:
                encoded = value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidMessageError(
                    f"the body is not valid Unicode text ({lone_surrogate(value)}); "
                    "pass bytes for a binary body"
                ) from None
            value = encoded
        elif isinstance(value, bytearray | memoryview):
            value = bytes(value)
        elif not isinstance(value, bytes):
            raise InvalidMessageError(f"body must be bytes or str, got {type(value).__name__}")
        self._body = value

    @property
    def value(self) -> object:
        """The value object: the one given as ``value=`` (serialized by the producer into the
        body), or on a consumed message the one the consumer's ``value_deserializer`` makes
        of the body on this first read (then kept); None otherwise (the payload is
        :attr:`body`). On a consumed message it raises
        :class:`~bridge.errors.DeserializationError` when a deserializer does: in a listener,
        a failure to consume (the message is retried, then dead-lettered)."""
        if getattr(self, "_pending", None) is not None:
            self._deserialize()
        return getattr(self, "_value", None)

    @property
    def key(self) -> object:
        """The key object: the one given as ``key=`` (serialized by the producer into the
        record key), or on a consumed message the one the consumer's ``key_deserializer``
        makes of the record key on the first read of :attr:`key` or :attr:`value` (raising
        as :attr:`value` does); None otherwise (the raw key is :meth:`kafka_key`)."""
        if getattr(self, "_pending", None) is not None:
            self._deserialize()
        return getattr(self, "_key", None)

    def _deserialize(self) -> None:
        """Run the consumer's deserializers set on this message (they set ``_key`` and
        ``_value``); kept once they succeed, tried again on the next read if they raise."""
        pending = self._pending
        if pending is not None:
            pending(self)
            self._pending = None

    @property
    def keys(self) -> list[str]:
        """Business keys (RocketMQ's ``KEYS``, space-separated on the wire)."""
        return list(self._keys)

    @keys.setter
    def keys(self, value: str | Iterable[str] | None) -> None:
        self._keys = _normalise_keys(value)

    def set_keys(self, keys: str | Iterable[str]) -> None:
        """RocketMQ's ``setKeys``."""
        self.keys = keys

    def set_tags(self, tags: str) -> None:
        """RocketMQ's ``setTags``."""
        self.tags = tags

    def set_body(self, body: bytes | str) -> None:
        """RocketMQ's ``setBody``."""
        self.body = body

    # --- properties -------------------------------------------------------------------
    @property
    def properties(self) -> dict[str, PropertyValue]:
        """All properties (user and system), a copy; values as they travel (text or bytes)."""
        return dict(self._properties)

    @property
    def user_properties(self) -> dict[str, PropertyValue]:
        """The properties the user set (not RocketMQ's system properties nor the bridge's
        dead-letter metadata; ``traceparent``/``tracestate`` are the user's)."""
        return {k: v for k, v in self._properties.items() if k not in RESERVED_PROPERTIES}

    def put_user_property(self, name: str, value: str | bytes | bytearray | memoryview) -> None:
        """Set a user property: text (valid Unicode) or bytes (kept as they are; a bytearray
        or memoryview is copied to bytes).

        A reserved name, a name holding NUL (a Kafka header name ends at it), a lone surrogate
        in a name or text value, or another type raises :class:`InvalidPropertyError` naming
        the property.
        """
        if (
            type(name) is str
            and type(value) is str
            and name.isascii()
            and value.isascii()
            and name
            and name not in RESERVED_PROPERTIES
            and name not in USER_SETTABLE_PROPERTIES
            and "\x00" not in name  # a header name ends at NUL: "UNIQ_KEY\x00" is UNIQ_KEY
        ):
            self._properties[name] = value  # the common case, valid as it is
        else:
            self._properties[name] = check_user_property(name, value)

    set_property = put_user_property
    """The name RocketMQ's Python client uses."""

    @overload
    def get_property(self, name: SystemPropertyName) -> str | None: ...
    @overload
    def get_property(self, name: str) -> PropertyValue | None: ...
    def get_property(self, name: str) -> PropertyValue | None:
        """Any property, user or system: ``str``, or ``bytes`` for a value that is not text.

        System properties (:data:`SYSTEM_PROPERTIES`) always read as text: one that arrived
        as bytes that are not UTF-8 (another client's header under a reserved name) reads
        with U+FFFD for the bad bytes, while :attr:`properties` keeps the bytes.
        """
        value = self._properties.get(name)
        if type(value) is bytes and name in SYSTEM_PROPERTIES:
            return value.decode("utf-8", "replace")
        return value

    def put_system_property(self, name: str, value: PropertyValue) -> None:
        """Set a system property (used by the producer and the services); not validated
        (the producer checks what it sends). The copies of messages already in Kafka go
        through here, so it never refuses a name: a name check here would turn a record
        written before the checks into one no service can copy."""
        if type(value) is not str and type(value) is not bytes:
            value = bytes(value) if isinstance(value, bytearray | memoryview) else value
        self._properties[name] = value

    def clear_property(self, name: str) -> None:
        """Remove a property if present."""
        self._properties.pop(name, None)

    # --- delay --------------------------------------------------------------------------
    @property
    def delay_time_level(self) -> int:
        """RocketMQ 4's delay level (0: none, or not a number)."""
        return parse_count(self._properties.get(MessageConst.DELAY_TIME_LEVEL)) or 0

    def set_delay_time_level(self, level: int) -> None:
        """Deliver after delay level ``level``; 0 or below means no delay.

        Not an ``int`` (a ``bool``, a float, text): :class:`InvalidDelayError`.
        """
        level = _delay_number("set_delay_time_level", level)
        if level <= 0:
            self._properties.pop(MessageConst.DELAY_TIME_LEVEL, None)
        else:
            self._properties[MessageConst.DELAY_TIME_LEVEL] = str(level)

    @property
    def is_delayed(self) -> bool:
        """True if a delay level or a timer property is set."""
        props = self._properties
        return bool(props) and any(name in props for name in DELAY_PROPERTIES)

    def set_deliver_time_ms(self, epoch_ms: int | float) -> None:
        """RocketMQ 5's ``setDeliverTimeMs``: deliver at ``epoch_ms`` (epoch milliseconds).

        A float is rounded up to a whole unit (never early); a ``bool``, ``nan``, an
        infinity or text (``"soon"``): :class:`InvalidDelayError`.
        """
        due = _timer_number("set_deliver_time_ms", epoch_ms)
        self._properties[MessageConst.TIMER_DELIVER_MS] = str(due)

    def set_delay_time_ms(self, delay_ms: int | float) -> None:
        """RocketMQ 5's ``setDelayTimeMs``: deliver ``delay_ms`` milliseconds after sending.

        A float is rounded up to a whole unit (never early); a ``bool``, ``nan``, an
        infinity or text (``"soon"``): :class:`InvalidDelayError`.
        """
        delay = _timer_number("set_delay_time_ms", delay_ms)
        self._properties[MessageConst.TIMER_DELAY_MS] = str(delay)

    def set_delay_time_sec(self, delay_sec: int | float) -> None:
        """RocketMQ 5's ``setDelayTimeSec``: deliver ``delay_sec`` seconds after sending.

        A float is rounded up to a whole unit (never early); a ``bool``, ``nan``, an
        infinity or text (``"soon"``): :class:`InvalidDelayError`.
        """
        delay = _timer_number("set_delay_time_sec", delay_sec)
        self._properties[MessageConst.TIMER_DELAY_SEC] = str(delay)

    @property
    def sharding_key(self) -> str | bytes | None:
        """The key that picks the partition (RocketMQ 5's message group), if any: text, or
        bytes as given (a binary key, or one a ``key_serializer`` wrote)."""
        return self._properties.get(MessageConst.SHARDING_KEY)

    @property
    def message_group(self) -> str | None:
        """RocketMQ 5's FIFO message group, if any: the sharding key as text (RocketMQ 5 keeps
        the group in ``__SHARDINGKEY``; a binary sharding key reads with U+FFFD for bytes
        that are not UTF-8). A FIFO consumer runs a group's messages one at a time, in order.

        Setting it checks RocketMQ 5's rules (text, not blank, fewer than 64 bytes of UTF-8,
        no control characters: else :class:`InvalidMessageError`); None removes it.
        """
        group = self._properties.get(MessageConst.SHARDING_KEY)
        return None if group is None else property_text(group)

    @message_group.setter
    def message_group(self, group: str | None) -> None:
        if group is None:
            self._properties.pop(MessageConst.SHARDING_KEY, None)
            return
        if getattr(self, "_key", None) is not None:
            # The key serializer's bytes would replace the group at send time.
            raise InvalidMessageError(
                "a message with key= cannot take a message_group (the message group is the "
                "sharding key: it becomes the record key)"
            )
        self._properties[MessageConst.SHARDING_KEY] = checked_message_group(group)

    def kafka_key(self) -> bytes | None:
        """The Kafka record key: sharding key, else keys joined by spaces, else None."""
        sharding = self._properties.get(MessageConst.SHARDING_KEY)
        if sharding is not None:
            return sharding.encode() if isinstance(sharding, str) else sharding
        if self._keys:
            return MessageConst.KEY_SEPARATOR.join(self._keys).encode("utf-8")
        return None

    def check_wire(self) -> None:
        """Raise the typed error for content that cannot travel: tags or a sharding key that
        are not strings, text with a lone surrogate in tags, keys or a property
        (:class:`InvalidMessageError`, :class:`InvalidPropertyError` naming the property).

        Building a record fails on such content anyway; the producer calls this only then,
        so valid messages pay nothing for the diagnosis.
        """
        tags = self.tags
        if tags is not None:
            if not isinstance(tags, str):
                raise InvalidMessageError(f"tags must be a string, got {type(tags).__name__}")
            if not is_unicode(tags):
                raise InvalidMessageError(
                    f"tags {tags!r} are not valid Unicode text ({lone_surrogate(tags)})"
                )
        for key in self._keys:
            if not is_unicode(key):
                raise InvalidMessageError(
                    f"keys {self._keys!r} are not valid Unicode text ({lone_surrogate(key)})"
                )
        for name, value in self._properties.items():
            if name == MessageConst.SHARDING_KEY:
                if not isinstance(value, str | bytes):
                    raise InvalidMessageError(
                        f"the sharding key must be a string, got {type(value).__name__}"
                    )
                if isinstance(value, str) and not is_unicode(value):
                    raise InvalidMessageError(
                        f"the sharding key {value!r} is not valid Unicode text "
                        f"({lone_surrogate(value)})"
                    )
                continue
            check_property_value(check_property_name(name), value)

    def wire_properties(self) -> dict[str, PropertyValue]:
        """Every property as it travels, with ``KEYS`` and ``TAGS`` folded in."""
        props = dict(self._properties)
        if self._keys:
            props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(self._keys)
        if self.tags:
            props[MessageConst.TAGS] = self.tags
        return props

    def _objects_repr(self) -> str:
        """``, key=<type>, value=<type>`` for the objects set (never deserializing: a repr
        neither blocks nor raises), ``value=<not yet deserialized>`` before the first read."""
        if getattr(self, "_pending", None) is not None:
            return ", value=<not yet deserialized>"
        out = ""
        for name in ("_key", "_value"):
            obj = getattr(self, name, None)
            if obj is not None:
                out += f", {name[1:]}=<{type(obj).__name__}>"
        return out

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, body={len(self._body)} bytes, keys={self._keys!r}, "
            f"tags={self.tags!r}, properties={self._properties!r}{self._objects_repr()})"
        )

    def __eq__(self, other: object) -> bool:
        """Same topic, body, keys, tags, properties and key and value objects (a consumed
        message's are deserialized for it, if not yet)."""
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.topic == other.topic
            and self._body == other._body
            and self._keys == other._keys
            and self.tags == other.tags
            and self._properties == other._properties
            and self.value == other.value
            and self.key == other.key
        )

    __hash__ = None  # type: ignore[assignment]  # mutable


class MessageExt(Message):
    """A received message: a :class:`Message` plus where and when it was stored.

    ``topic`` is the RocketMQ name (``%RETRY%g`` rather than ``rmq.RETRY.g``), ``kafka_topic``
    the Kafka topic the record was read from, ``queue_id`` its partition and ``queue_offset``
    its offset. ``born_timestamp_ms`` is when the producer created it (epoch ms);
    ``store_timestamp_ms`` the broker's append time where the topic records it, else None.
    """

    __slots__ = (
        "born_host",
        "born_timestamp_ms",
        "kafka_topic",
        "msg_id",
        "queue_id",
        "queue_offset",
        "store_timestamp_ms",
    )

    def __init__(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        msg_id: str = "",
        queue_id: int = -1,
        queue_offset: int = -1,
        born_timestamp_ms: int = 0,
        born_host: str = "",
        store_timestamp_ms: int | None = None,
        kafka_topic: str = "",
        keys: str | Iterable[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        super().__init__(topic, body, keys=keys, tags=tags)
        # Received properties are taken as they are, system ones included.
        self._properties = dict(properties or {})
        self.msg_id = msg_id
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.born_timestamp_ms = born_timestamp_ms
        self.born_host = born_host
        self.store_timestamp_ms = store_timestamp_ms
        self.kafka_topic = kafka_topic

    @classmethod
    def received(
        cls,
        topic: str,
        body: bytes,
        properties: dict[str, PropertyValue],
        *,
        msg_id: str,
        queue_id: int,
        queue_offset: int,
        born_timestamp_ms: int,
        store_timestamp_ms: int | None,
        kafka_topic: str,
    ) -> MessageExt:
        """A consumed message from its decoded parts, without re-validating them: keys and
        tags come from the ``KEYS``/``TAGS`` properties, the born host from ``BORN_HOST``
        (as text, see :meth:`get_property`); ``properties`` is taken over, not copied.

        It fills the slots itself instead of calling ``__init__``: this runs once per consumed
        record, and ``python -m bench consumer`` measured the push consumer 10-30% slower with
        the same fields set through ``__init__`` (four alternating runs each)."""
        msg = cls.__new__(cls)
        msg.topic = topic
        msg._body = body
        raw_keys = properties.get(MessageConst.KEYS)
        if raw_keys:
            text = raw_keys if type(raw_keys) is str else property_text(raw_keys)
            msg._keys = [k for k in text.split(MessageConst.KEY_SEPARATOR) if k]
        else:
            msg._keys = _NO_KEYS
        tags = properties.get(MessageConst.TAGS)
        msg.tags = tags if tags is None or type(tags) is str else property_text(tags)
        msg._properties = properties
        msg.msg_id = msg_id
        msg.queue_id = queue_id
        msg.queue_offset = queue_offset
        msg.born_timestamp_ms = born_timestamp_ms
        host = properties.get(MessageConst.BORN_HOST, "")
        msg.born_host = host if type(host) is str else property_text(host)
        msg.store_timestamp_ms = store_timestamp_ms
        msg.kafka_topic = kafka_topic
        return msg

    @property
    def reconsume_times(self) -> int:
        """How many times the message was sent back for retry (``RECONSUME_TIME``); 0 when
        the property is missing or not ASCII digits (see :func:`parse_count`)."""
        return parse_count(self._properties.get(MessageConst.RECONSUME_TIME)) or 0

    @property
    def transaction_id(self) -> str | None:
        """The transaction id of a transactional message, if any."""
        return self.get_property(MessageConst.TRANSACTION_ID)

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, msg_id={self.msg_id!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, body={len(self.body)} bytes, keys={self.keys!r}, "
            f"tags={self.tags!r}, properties={self.properties!r}{self._objects_repr()})"
        )


def copied_message(msg: Message, topic: str, dropped: frozenset[str]) -> Message:
    """A plain :class:`Message` for ``topic`` with ``msg``'s body, keys, tags and its
    properties except those named in ``dropped``, each as
    :meth:`Message.put_system_property` would set it (never refused). The services' copies of
    failed and dead messages: one dict built at once, not a call per property. Not part of
    the public API."""
    copy = Message(topic, msg._body, tags=msg.tags)
    copy._keys = msg._keys  # replaced, never changed in place: the list can be shared
    copy._properties = {
        name: value
        if type(value) is str or type(value) is bytes
        else bytes(value)
        if isinstance(value, bytearray | memoryview)
        else value
        for name, value in msg._properties.items()
        if name not in dropped
    }
    return copy
