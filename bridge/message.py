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
properties (:attr:`MessageConst.TRACE_PARENT`); with ``opentelemetry-api`` installed,
:func:`send_span`, :func:`inject_trace_context` and :func:`process_span` make the producer's
and the push consumer's spans (``docs/tracing.md``), and without it nothing of OpenTelemetry
is imported.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, overload

from bridge.errors import InvalidDelayError, InvalidMessageError, InvalidPropertyError
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
    DELAY_PROPERTIES,
    RESERVED_PROPERTIES,
    SYSTEM_PROPERTIES,
    USER_SETTABLE_PROPERTIES,
    SystemPropertyName,
)
from topics.properties import MessageConst as _RocketMQNames

_logger = logging.getLogger(__name__)

__all__ = [
    "DEAD_LETTER_PROPERTIES",
    "DELAY_PROPERTIES",
    "FAILURE_MESSAGE_MAX_BYTES",
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
    "TraceSpan",
    "inject_trace_context",
    "is_unicode",
    "local_ipv4",
    "now_ms",
    "parse_count",
    "process_span",
    "property_text",
    "send_span",
    "trace_carrier",
    "tracing_active",
    "tracing_available",
    "truncate_utf8",
]


class MessageConst(_RocketMQNames):
    """RocketMQ's property names (:class:`topics.properties.MessageConst`) and the ones the
    bridge adds for tracing and dead-letter metadata (``docs/tracing.md``).

    The trace names are W3C Trace Context's header names, lower case as the W3C and
    OpenTelemetry's Kafka propagation write them: a user (or another Kafka client) may set
    them, and every copy of the message (half message, commit, delay, retry, DLQ, replay)
    keeps them byte for byte.

    The dead-letter names are written by a push consumer on each retry and DLQ copy of a
    message its listener failed (:mod:`bridge.consumer.send_back`).
    """

    TRACE_PARENT: Final = "traceparent"
    """W3C ``traceparent``: ``00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>``."""
    TRACE_STATE: Final = "tracestate"
    """W3C ``tracestate``: vendor key-value pairs that travel with ``traceparent``."""

    CONSUME_FAILURE: Final = "CONSUME_FAILURE"
    """How the listener failed the message, last time: ``EXCEPTION`` (it raised; see the two
    ``CONSUME_EXCEPTION_*`` properties), the status it returned without raising
    (``RECONSUME_LATER``, ``SUSPEND_CURRENT_QUEUE_A_MOMENT``, ``NONE`` for ``None``),
    ``ACK_INDEX`` (past the ``ack_index`` of a batch listener that returned
    ``CONSUME_SUCCESS``, or an ``ack_index`` that is not an int), ``CONSUME_TIMEOUT`` (in its
    listener longer than ``consume_timeout``) or ``NO_SUBSCRIPTION`` (a retry of a topic the
    group no longer subscribes to)."""
    CONSUME_EXCEPTION_CLASS: Final = "CONSUME_EXCEPTION_CLASS"
    """The class of the exception the listener raised, ``module.QualifiedName`` (builtins
    without module), at most :data:`FAILURE_MESSAGE_MAX_BYTES` bytes; absent when it did not
    raise."""
    CONSUME_EXCEPTION_MESSAGE: Final = "CONSUME_EXCEPTION_MESSAGE"
    """``str()`` of that exception, at most :data:`FAILURE_MESSAGE_MAX_BYTES` bytes of UTF-8
    (a longer one is cut and ends with ``...``); absent when it did not raise."""
    CONSUMER_GROUP: Final = "CONSUMER_GROUP"
    """The consumer group whose listener failed the message."""
    ORIGIN_KAFKA_TOPIC: Final = "ORIGIN_KAFKA_TOPIC"
    """The Kafka topic of the record the group first failed (the real topic's record, kept
    through later retries; ``RETRY_TOPIC`` has its RocketMQ name)."""
    ORIGIN_QUEUE_ID: Final = "ORIGIN_QUEUE_ID"
    """That record's partition."""
    ORIGIN_QUEUE_OFFSET: Final = "ORIGIN_QUEUE_OFFSET"
    """That record's offset."""
    ORIGIN_TIMESTAMP: Final = "ORIGIN_TIMESTAMP"
    """That record's Kafka timestamp, epoch ms (the broker's append time where the topic keeps
    it, else the born time)."""


TRACE_PROPERTIES: Final = (MessageConst.TRACE_PARENT, MessageConst.TRACE_STATE)
"""The W3C Trace Context properties."""

DEAD_LETTER_PROPERTIES: Final = (
    MessageConst.CONSUME_FAILURE,
    MessageConst.CONSUME_EXCEPTION_CLASS,
    MessageConst.CONSUME_EXCEPTION_MESSAGE,
    MessageConst.CONSUMER_GROUP,
    MessageConst.ORIGIN_KAFKA_TOPIC,
    MessageConst.ORIGIN_QUEUE_ID,
    MessageConst.ORIGIN_QUEUE_OFFSET,
    MessageConst.ORIGIN_TIMESTAMP,
)
"""What a retry or DLQ copy records about the failure; a replay to the origin topic drops them
(the replayed record is a new first delivery)."""

_DEAD_LETTER_NAMES: Final = frozenset(DEAD_LETTER_PROPERTIES)

FAILURE_MESSAGE_MAX_BYTES: Final = 1024
"""The most bytes (UTF-8) of an exception's class or message kept in a copy: 1 KiB."""


def truncate_utf8(text: str, max_bytes: int = FAILURE_MESSAGE_MAX_BYTES) -> str:
    """``text`` if its UTF-8 encoding fits in ``max_bytes`` bytes, else its longest prefix that
    fits together with ``...`` (never a broken character; a lone surrogate becomes ``?``)."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return encoded.decode("utf-8")
    return encoded[: max(max_bytes - 3, 0)].decode("utf-8", "ignore") + "..."


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


def _delay_number(setter: str, value: float | str) -> int:
    """``value`` (a timer setter's argument) as a whole number, or :class:`InvalidDelayError`
    for what has none (``nan``, ``inf``, ``"soon"``, ``None``)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidDelayError(f"{setter} needs a finite whole number, got {value!r}") from None


class Message:
    """A message to send: RocketMQ's ``Message`` with Pythonic keyword arguments.

    ``body`` is bytes (a ``str`` is encoded as UTF-8). ``keys`` are business keys (a string of
    space-separated keys or a list), ``tags`` one tag used for filtering. ``properties`` are
    user properties, text or bytes; system properties (``MessageConst``) are set through the
    methods.
    """

    __slots__ = ("_body", "_keys", "_properties", "tags", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        keys: str | Iterable[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, PropertyValue] | None = None,
        delay_time_level: int = 0,
        sharding_key: str | None = None,
    ) -> None:
        self.topic = topic
        # The common case (bytes body, no keys, no properties) stays cheap: senders build one
        # Message per send.
        if type(body) is bytes:
            self._body = body
        else:
            self.body = body
        self._keys = _normalise_keys(keys) if keys is not None else []
        if tags is not None and not isinstance(tags, str):
            raise InvalidMessageError(f"tags must be a string, got {type(tags).__name__}")
        self.tags = tags
        self._properties: dict[str, PropertyValue] = {}
        if properties:
            for name, value in properties.items():
                self.put_user_property(name, value)
        if delay_time_level:
            self.set_delay_time_level(delay_time_level)
        if sharding_key is not None:
            if not isinstance(sharding_key, str):
                raise InvalidMessageError(
                    f"the sharding key must be a string, got {type(sharding_key).__name__}"
                )
            self._properties[MessageConst.SHARDING_KEY] = sharding_key

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
        return {
            k: v
            for k, v in self._properties.items()
            if k not in RESERVED_PROPERTIES and k not in _DEAD_LETTER_NAMES
        }

    def put_user_property(self, name: str, value: str | bytes | bytearray | memoryview) -> None:
        """Set a user property: text (valid Unicode) or bytes (kept as they are; a bytearray
        or memoryview is copied to bytes).

        A reserved name, a lone surrogate in a name or text value, or another type raises
        :class:`InvalidPropertyError` naming the property.
        """
        if (
            type(name) is str
            and type(value) is str
            and name.isascii()
            and value.isascii()
            and name
            and name not in RESERVED_PROPERTIES
            and name not in USER_SETTABLE_PROPERTIES
            and name not in _DEAD_LETTER_NAMES
        ):
            self._properties[name] = value  # the common case, valid as it is
        elif name in _DEAD_LETTER_NAMES:
            raise InvalidPropertyError(
                f"the property {name!r} is used by the system; choose another name"
            )
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
        (the producer checks what it sends)."""
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
        """Deliver after delay level ``level``; 0 or below means no delay."""
        if isinstance(level, bool) or not isinstance(level, int):
            raise InvalidMessageError(f"delay level must be an integer, got {level!r}")
        if level <= 0:
            self._properties.pop(MessageConst.DELAY_TIME_LEVEL, None)
        else:
            self._properties[MessageConst.DELAY_TIME_LEVEL] = str(level)

    @property
    def is_delayed(self) -> bool:
        """True if a delay level or a timer property is set."""
        props = self._properties
        return bool(props) and any(name in props for name in DELAY_PROPERTIES)

    def set_deliver_time_ms(self, epoch_ms: int) -> None:
        """RocketMQ 5's ``setDeliverTimeMs``: deliver at ``epoch_ms`` (epoch milliseconds).

        Not a finite number (``nan``, ``inf``, ``"soon"``): :class:`InvalidDelayError`.
        """
        due = _delay_number("set_deliver_time_ms", epoch_ms)
        self._properties[MessageConst.TIMER_DELIVER_MS] = str(due)

    def set_delay_time_ms(self, delay_ms: int) -> None:
        """RocketMQ 5's ``setDelayTimeMs``: deliver ``delay_ms`` milliseconds after sending.

        Not a finite number: :class:`InvalidDelayError`.
        """
        delay = _delay_number("set_delay_time_ms", delay_ms)
        self._properties[MessageConst.TIMER_DELAY_MS] = str(delay)

    def set_delay_time_sec(self, delay_sec: int) -> None:
        """RocketMQ 5's ``setDelayTimeSec``: deliver ``delay_sec`` seconds after sending.

        Not a finite number: :class:`InvalidDelayError`.
        """
        delay = _delay_number("set_delay_time_sec", delay_sec)
        self._properties[MessageConst.TIMER_DELAY_SEC] = str(delay)

    @property
    def sharding_key(self) -> str | None:
        """The key that picks the partition (RocketMQ 5's message group), if any."""
        return self.get_property(MessageConst.SHARDING_KEY)

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

    def wire_headers(self, head: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Append :meth:`wire_properties` to ``head`` as Kafka headers (text as UTF-8, bytes
        as they are); return it.

        The same content as ``encode_headers(wire_properties())``, without the copies: this
        runs once per send (``bridge.codec.header_bytes``, inlined).
        """
        for name, value in self._properties.items():
            head.append((name, value.encode() if isinstance(value, str) else value))
        if self._keys:
            head.append((MessageConst.KEYS, MessageConst.KEY_SEPARATOR.join(self._keys).encode()))
        if self.tags:
            head.append((MessageConst.TAGS, self.tags.encode()))
        return head

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, body={len(self._body)} bytes, keys={self._keys!r}, "
            f"tags={self.tags!r}, properties={self._properties!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.topic == other.topic
            and self._body == other._body
            and self._keys == other._keys
            and self.tags == other.tags
            and self._properties == other._properties
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
            msg._keys = []
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
            f"tags={self.tags!r}, properties={self.properties!r})"
        )


# --- tracing: OpenTelemetry when installed --------------------------------------------------
_otel_modules: tuple[Any, Any] | None = None
"""opentelemetry-api's ``trace`` and ``propagate`` modules, once looked for and found."""
_otel_looked = False
"""True once :func:`_opentelemetry` looked for them (set after ``_otel_modules``)."""


def _opentelemetry() -> tuple[Any, Any] | None:
    """opentelemetry-api's ``trace`` and ``propagate`` modules, or None when it is not
    installed (then nothing of it is imported; looked for once, from any thread)."""
    global _otel_modules, _otel_looked  # noqa: PLW0603 - a cache filled on first use
    if not _otel_looked:
        try:
            from opentelemetry import propagate, trace  # noqa: PLC0415 - optional extra

            _otel_modules = (trace, propagate)
        except ImportError:
            _otel_modules = None
        _otel_looked = True
    return _otel_modules


_provider_set = False
"""True once a tracer provider was found set up (it stays so)."""
_provider_next_look = 0.0
"""While none is set up: when to look again (monotonic seconds)."""
_PROVIDER_LOOK_INTERVAL_S: Final = 1.0
"""How often, at most, a tracer provider set up later is looked for, seconds (looking costs
microseconds on every send and listener call otherwise)."""


def _no_tracer_provider(trace: Any) -> bool:
    """True while no tracer provider is set up (every span would be a no-op); one set up
    later is seen within :data:`_PROVIDER_LOOK_INTERVAL_S`."""
    global _provider_set, _provider_next_look  # noqa: PLW0603 - a cache filled on first use
    if _provider_set:
        return False
    now = time.monotonic()
    if now < _provider_next_look:
        return True
    if isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    ):
        _provider_next_look = now + _PROVIDER_LOOK_INTERVAL_S
        return True
    _provider_set = True
    return False


def tracing_active() -> bool:
    """True if spans would be recorded: opentelemetry-api installed and a tracer provider set
    up. Cheap: senders and listener calls check it before making a span."""
    otel = _opentelemetry()
    return otel is not None and not _no_tracer_provider(otel[0])


def tracing_available() -> bool:
    """True if opentelemetry-api is installed (the ``otel`` extra): producers then make send
    spans and push consumers process spans."""
    return _opentelemetry() is not None


def trace_carrier(props: Mapping[str, PropertyValue]) -> dict[str, str]:
    """The W3C Trace Context properties of ``props`` as text (what a propagator extracts)."""
    out = {}
    for name in TRACE_PROPERTIES:
        value = props.get(name)
        if value is not None:
            out[name] = value if isinstance(value, str) else property_text(value)
    return out


_MESSAGING_SYSTEM: Final = "rocketmq"
"""``messaging.system`` of the bridge's spans (it speaks RocketMQ's model)."""


class TraceSpan:
    """A span the bridge opened, or nothing (OpenTelemetry missing, or not wanted): what the
    caller reports about the work it covers. Tracing never fails the work: an error of the
    tracing library is logged and ignored."""

    __slots__ = ("span",)

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def set_attribute(self, name: str, value: str | int) -> None:
        """Set attribute ``name`` on the span, if there is one."""
        if self.span is not None:
            try:
                self.span.set_attribute(name, value)
            except Exception:
                _logger.debug("tracing: setting %s failed", name, exc_info=True)

    def failed(self, description: str, exc: BaseException | None = None) -> None:
        """Mark the span failed (``description``), recording ``exc`` if given."""
        if self.span is None:
            return
        try:
            from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415 - optional extra

            if exc is not None:
                self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, description))
        except Exception:
            _logger.debug("tracing: marking a span failed failed", exc_info=True)


def inject_trace_context(msg: Message) -> None:
    """Write the current trace context into ``msg`` as ``traceparent`` (and ``tracestate``)
    if OpenTelemetry is installed, a valid span is current and ``msg`` has no
    ``traceparent`` yet (one the user or another client set is kept as it is)."""
    if MessageConst.TRACE_PARENT in msg._properties:
        return
    otel = _opentelemetry()
    if otel is None:
        return
    trace, propagate = otel
    carrier: dict[str, str] = {}
    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return  # nothing to write (the common case without a span): skip the propagator
        propagate.inject(carrier)
    except Exception:
        _logger.warning("tracing: writing the trace context failed", exc_info=True)
        return
    for name in TRACE_PROPERTIES:
        value = carrier.get(name)
        if isinstance(value, str):
            msg.put_system_property(name, value)


@contextlib.contextmanager
def _current_span(start: Callable[[], Any]) -> Iterator[TraceSpan]:
    """Run the block in the span context manager ``start()`` makes; if making or entering it
    fails, without a span (logged): tracing never fails the work."""
    with contextlib.ExitStack() as stack:
        try:
            span = stack.enter_context(start())
        except Exception:
            _logger.warning("tracing: starting a span failed", exc_info=True)
            span = None
        yield TraceSpan(span)


@contextlib.contextmanager
def send_span(msg: Message) -> Iterator[TraceSpan]:
    """A producer span (``<topic> send``, child of the current span) around a send of
    ``msg``, current while it runs so that :func:`inject_trace_context` writes its context
    into the message; only when OpenTelemetry is installed and ``msg`` has no ``traceparent``
    yet (a message that already carries one is sent in its trace, without a span). Without a
    tracer provider set up there is no span (a valid current context, say one a framework
    took from an incoming request, is still written by :func:`inject_trace_context`)."""
    otel = _opentelemetry()
    if otel is None or MessageConst.TRACE_PARENT in msg._properties or _no_tracer_provider(otel[0]):
        yield TraceSpan()
        return
    trace = otel[0]

    def start() -> Any:
        return trace.get_tracer("bridge").start_as_current_span(
            f"{msg.topic} send",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": _MESSAGING_SYSTEM,
                "messaging.operation.type": "send",
                "messaging.destination.name": str(msg.topic),
            },
        )

    with _current_span(start) as span:
        yield span


@contextlib.contextmanager
def process_span(msgs: list[MessageExt], group: str) -> Iterator[TraceSpan]:
    """A consumer span (``<topic> process``) around a listener call on ``msgs``, whose parent
    is the trace context the first message carries (a new trace if none) and which links the
    others' contexts; nothing when OpenTelemetry is not installed or no tracer provider is
    set up (every span would be a no-op: listener calls skip the cost)."""
    otel = _opentelemetry()
    if otel is None or not msgs:
        yield TraceSpan()
        return
    trace, propagate = otel
    if _no_tracer_provider(trace):
        yield TraceSpan()
        return

    def start() -> Any:
        parent = propagate.extract(trace_carrier(msgs[0]._properties))
        links = []
        for msg in msgs[1:]:
            carrier = trace_carrier(msg._properties)
            if carrier:
                context = trace.get_current_span(propagate.extract(carrier)).get_span_context()
                if context.is_valid:
                    links.append(trace.Link(context))
        first = msgs[0]
        attributes: dict[str, str | int] = {
            "messaging.system": _MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": str(first.topic),
            "messaging.consumer.group.name": group,
            "messaging.batch.message_count": len(msgs),
            "messaging.message.id": first.msg_id,
            "messaging.destination.partition.id": str(first.queue_id),
            "messaging.kafka.offset": first.queue_offset,
        }
        return trace.get_tracer("bridge").start_as_current_span(
            f"{first.topic} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    with _current_span(start) as span:
        yield span
