"""RocketMQ 5's message to send (:class:`Message`, attributes set one by one, as its Python
client has them) and what a send returns (:class:`SendReceipt`).

A :class:`Message` is a front over the project's :class:`bridge.Message`, which keeps every
field and builds the record; this module only checks RocketMQ 5's rules as attributes are set
(a tag without ``|``, a message either FIFO or timed, no blank key or property) and maps the
names: ``tag`` is ``tags``, ``add_property`` is ``put_user_property``, ``message_group`` the
sharding key, ``delivery_timestamp`` (epoch seconds) a ``TIMER_DELIVER_MS`` timer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from bridge.errors import InvalidDelayError, InvalidMessageError, InvalidPropertyError
from bridge.message import Message as _Message
from bridge.message import MessageConst, PropertyValue

__all__ = ["DELIVERY_TIMESTAMP_MAX_S", "Message", "SendReceipt"]

DELIVERY_TIMESTAMP_MAX_S: Final = 10**11
"""``delivery_timestamp`` is epoch seconds; a value this large (the year 5138) is taken for
milliseconds by mistake and refused, rather than delayed a thousand times too long."""


def _not_blank(what: str, value: object) -> str:
    """``value`` if it is text that is not blank, else :class:`InvalidMessageError`."""
    if not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidMessageError(f"{what} must not be blank, got {value!r}")
    return value


class Message:
    """RocketMQ 5's ``Message``: set ``topic``, ``body`` and the rest as attributes (or as
    keyword arguments here), then ``Producer.send`` it; the same message may be sent again.

    ``tag`` is one tag (not blank, no ``|``); ``keys`` the business keys (a string or an
    iterable; setting them replaces them); ``add_property(key, value)`` a user property;
    ``message_group`` makes the message FIFO (``docs/fifo.md``); ``delivery_timestamp`` delays
    it to that instant, **epoch seconds** as RocketMQ 5's Python client sends it (``int(
    time.time()) + 10``; a float is rounded up to the millisecond). A message is FIFO or
    timed, not both (RocketMQ 5's rule). ``message_id`` is set by each send.

    Every check raises :class:`~bridge.errors.InvalidMessageError` (or its
    :class:`~bridge.errors.InvalidDelayError`, :class:`~bridge.errors.InvalidPropertyError`)
    naming the attribute; the topic's name and the sizes are checked when it is sent."""

    __slots__ = ("_delivery_timestamp", "_message", "message_id")

    def __init__(
        self,
        topic: str | None = None,
        body: bytes | str | None = None,
        *,
        tag: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, PropertyValue] | None = None,
        message_group: str | None = None,
        delivery_timestamp: float | None = None,
    ) -> None:
        self._message = _Message("")
        self._delivery_timestamp: float | None = None
        self.message_id: str | None = None
        """The id the last send gave the message (None before it is sent)."""
        if topic is not None:
            self.topic = topic
        if body is not None:
            self.body = body
        if tag is not None:
            self.tag = tag
        if keys is not None:
            self.keys = keys
        for name, value in (properties or {}).items():
            self.add_property(name, value)
        if message_group is not None:
            self.message_group = message_group
        if delivery_timestamp is not None:
            self.delivery_timestamp = delivery_timestamp

    @property
    def topic(self) -> str | None:
        """The topic it goes to (None before it is set)."""
        return self._message.topic or None

    @topic.setter
    def topic(self, topic: str) -> None:
        self._message.topic = _not_blank("topic", topic)

    @property
    def body(self) -> bytes | None:
        """The payload (None before it is set); text is set as its UTF-8 bytes."""
        return self._message.body or None

    @body.setter
    def body(self, body: bytes | bytearray | memoryview | str) -> None:
        if isinstance(body, bytes | bytearray | memoryview | str) and not body:
            raise InvalidMessageError("body must not be empty")
        self._message.body = body  # bytes, or text as UTF-8; anything else is refused

    @property
    def tag(self) -> str | None:
        """The tag (RocketMQ 4's ``tags``), if any; None removes it."""
        return self._message.tags

    @tag.setter
    def tag(self, tag: str | None) -> None:
        if tag is not None and "|" in _not_blank("tag", tag):
            raise InvalidMessageError(f"tag must not contain '|', got {tag!r}")
        self._message.tags = tag

    @property
    def keys(self) -> list[str]:
        """The business keys (RocketMQ's ``KEYS``)."""
        return self._message.keys

    @keys.setter
    def keys(self, keys: str | Iterable[str]) -> None:
        if isinstance(keys, str):
            _not_blank("a key", keys)
        self._message.keys = keys

    @property
    def properties(self) -> dict[str, PropertyValue]:
        """The user's properties, a copy."""
        return self._message.user_properties

    def add_property(self, key: str, value: PropertyValue) -> None:
        """Set user property ``key`` to ``value`` (text, or bytes): neither blank. A name
        RocketMQ reserves raises :class:`~bridge.errors.InvalidPropertyError`."""
        if not isinstance(key, str) or not key.strip():
            raise InvalidPropertyError(f"a property name must be text, not blank: {key!r}")
        if not value or (isinstance(value, str) and not value.strip()):
            raise InvalidPropertyError(f"property {key!r} must not be blank, got {value!r}")
        self._message.put_user_property(key, value)

    @property
    def message_group(self) -> str | None:
        """The FIFO message group, if any; None removes it."""
        return self._message.message_group

    @message_group.setter
    def message_group(self, group: str | None) -> None:
        if group is not None and self._delivery_timestamp is not None:
            raise InvalidMessageError(
                "message_group and delivery_timestamp cannot both be set: a message is FIFO "
                "or timed (RocketMQ 5's rule)"
            )
        self._message.message_group = group

    @property
    def delivery_timestamp(self) -> float | None:
        """When the message is to be delivered, epoch seconds (as set), if it is timed; None
        removes it."""
        return self._delivery_timestamp

    @delivery_timestamp.setter
    def delivery_timestamp(self, epoch_s: float | None) -> None:
        if epoch_s is None:
            self._delivery_timestamp = None
            self._message.clear_property(MessageConst.TIMER_DELIVER_MS)
            return
        if (
            isinstance(epoch_s, bool)
            or not isinstance(epoch_s, int | float)
            or not math.isfinite(epoch_s)
            or epoch_s <= 0
        ):
            raise InvalidDelayError(
                f"delivery_timestamp must be a positive number of epoch seconds, got {epoch_s!r}"
            )
        if epoch_s >= DELIVERY_TIMESTAMP_MAX_S:
            raise InvalidDelayError(
                f"delivery_timestamp is epoch seconds (RocketMQ 5's Python client sends it so), "
                f"got {epoch_s!r}, which looks like milliseconds: divide it by 1000"
            )
        if self._message.message_group is not None:
            raise InvalidMessageError(
                "delivery_timestamp and message_group cannot both be set: a message is FIFO "
                "or timed (RocketMQ 5's rule)"
            )
        self._message.set_deliver_time_ms(epoch_s * 1000)
        self._delivery_timestamp = epoch_s

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, tag={self.tag!r}, keys={self.keys!r}, "
            f"message_group={self.message_group!r}, "
            f"delivery_timestamp={self.delivery_timestamp!r}, properties={self.properties!r}, "
            f"body={len(self._message.body)} bytes, message_id={self.message_id!r})"
        )


def as_message(message: object) -> _Message:
    """The :class:`bridge.Message` a :class:`Message` is sent as;
    :class:`InvalidMessageError` for anything else."""
    if isinstance(message, Message):
        return message._message
    hint = " (a bridge.Message goes to bridge.Producer)" if isinstance(message, _Message) else ""
    raise InvalidMessageError(f"expected a bridge.v5.Message, got {type(message).__name__}{hint}")


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """What a send returns (RocketMQ 5's ``SendReceipt``).

    ``message_id`` is the message's id (the same on every copy of it, retries and the DLQ
    included); ``transaction_id`` the transaction's, for a message sent in one (else None).
    ``topic`` is the topic it goes to; ``queue_id`` and ``offset`` where Kafka stored the
    record: the topic's partition and offset for a plain message, the place in the timer
    topic of a timed one and in the HALF topic of a transactional one (it reaches its topic
    when due, or once committed). ``recall_handle`` (RocketMQ 5.3's) is a timed message's:
    ``producer.recall_message(topic, recall_handle)`` recalls it before its time; None for
    other messages."""

    message_id: str
    topic: str
    queue_id: int
    offset: int
    transaction_id: str | None = None
    recall_handle: str | None = None
