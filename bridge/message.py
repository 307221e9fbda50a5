"""The message model: :class:`Message` (what a producer sends), :class:`MessageExt` (what a
consumer receives), RocketMQ's property names, and message ids.

On a real topic a message is a plain Kafka record that any Kafka client reads:

* value = body;
* key = the sharding key if set, else the keys joined by spaces, else no key;
* timestamp = the born timestamp (CreateTime);
* headers = every property under RocketMQ's name as UTF-8: ``UNIQ_KEY`` (message id),
  ``TAGS``, ``KEYS``, ``BORN_HOST``, the user's properties, and the system properties a
  feature adds (``RECONSUME_TIME``, ``ORIGIN_MESSAGE_ID``, ...).
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Final

from bridge.errors import InvalidMessageError, InvalidPropertyError


class MessageConst:
    """RocketMQ's property names (``org.apache.rocketmq.common.message.MessageConst``)."""

    KEYS: Final = "KEYS"
    TAGS: Final = "TAGS"
    WAIT_STORE_MSG_OK: Final = "WAIT"
    DELAY_TIME_LEVEL: Final = "DELAY"
    RETRY_TOPIC: Final = "RETRY_TOPIC"
    REAL_TOPIC: Final = "REAL_TOPIC"
    REAL_QUEUE_ID: Final = "REAL_QID"
    TRANSACTION_PREPARED: Final = "TRAN_MSG"
    PRODUCER_GROUP: Final = "PGROUP"
    ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME: Final = "RECONSUME_TIME"
    UNIQ_CLIENT_MESSAGE_ID_KEYIDX: Final = "UNIQ_KEY"
    MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIMESTAMP: Final = "CONSUME_START_TIME"
    TRANSACTION_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
    TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
    TRANSACTION_ID: Final = "__transactionId__"
    SHARDING_KEY: Final = "__SHARDINGKEY"
    BORN_HOST: Final = "BORN_HOST"
    """Not a RocketMQ property (RocketMQ keeps it in the message header): the sender's host."""

    KEY_SEPARATOR: Final = " "


DELAY_PROPERTIES: Final = (
    MessageConst.DELAY_TIME_LEVEL,
    MessageConst.TIMER_DELIVER_MS,
    MessageConst.TIMER_DELAY_MS,
    MessageConst.TIMER_DELAY_SEC,
)
"""Properties that make a message wait before delivery; removed when it is delivered."""

USER_SETTABLE_PROPERTIES: Final = frozenset({MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS})
"""System names RocketMQ users set through ``putUserProperty`` all the same."""

RESERVED_PROPERTIES: Final = frozenset(
    v
    for k, v in vars(MessageConst).items()
    if k.isupper() and k != "KEY_SEPARATOR" and v not in USER_SETTABLE_PROPERTIES
)
"""Names a user property may not take (RocketMQ's ``putUserProperty`` refuses them too)."""


def now_ms() -> int:
    """Wall-clock time, epoch milliseconds."""
    return time.time_ns() // 1_000_000


class MessageIdGenerator:
    """RocketMQ-style unique message ids (``UNIQ_KEY``): 32 upper-case hex characters.

    Layout (16 bytes): IPv4 address (4), process id (2), a random per-generator value (4),
    milliseconds since the start of the current month (4), a counter (2). Ids are unique
    within a process (the counter only repeats after 65,536 ids in one millisecond) and across
    processes (address, pid and the random value).
    """

    def __init__(self) -> None:
        ip = local_ipv4()
        self._prefix = (
            bytes(int(part) for part in ip.split(".")).hex().upper()
            + f"{os.getpid() & 0xFFFF:04X}"
            + secrets.token_hex(4).upper()
        )
        self._counter = itertools.count(secrets.randbelow(0x10000))
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._head: tuple[int, str] = (-1, "")
        """(millisecond, the id's first 28 hex characters for it): ids of one millisecond
        differ only in the counter. One tuple, so a thread never sees half an update."""

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def _head_for(self, now_ms: int) -> str:
        if not self._month_start_ms <= now_ms < self._next_month_ms:
            self._roll_month(now_ms)
        head = "%s%08X" % (self._prefix, (now_ms - self._month_start_ms) & 0xFFFFFFFF)  # noqa: UP031
        self._head = (now_ms, head)
        return head

    def next_id(self, now_ms: int | None = None) -> str:
        """A new unique id; ``now_ms`` (epoch milliseconds) defaults to the clock."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        ms, head = self._head
        if ms != now:
            head = self._head_for(now)
        return "%s%04X" % (head, next(self._counter) & 0xFFFF)  # noqa: UP031 - the fastest


def local_ipv4() -> str:
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = "127.0.0.1"
    parts = addr.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
        return "127.0.0.1"
    return addr


_default_id_generator: MessageIdGenerator | None = None


def new_message_id() -> str:
    """A new unique message id from the process-wide generator."""
    global _default_id_generator  # noqa: PLW0603 - lazily created process-wide generator
    if _default_id_generator is None:
        _default_id_generator = MessageIdGenerator()
    return _default_id_generator.next_id()


def _normalise_keys(keys: str | Iterable[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [k for k in keys.split(MessageConst.KEY_SEPARATOR) if k]
    out = []
    for k in keys:
        if not isinstance(k, str) or not k or MessageConst.KEY_SEPARATOR in k:
            raise InvalidMessageError(f"a key must be a non-empty string without spaces, got {k!r}")
        out.append(k)
    return out


def _check_user_property(name: object, value: object) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidPropertyError(f"a property name must be a non-empty string, got {name!r}")
    if name in RESERVED_PROPERTIES:
        raise InvalidPropertyError(
            f"the property {name!r} is used by the system; choose another name"
        )
    if not isinstance(value, str):
        raise InvalidPropertyError(
            f"property {name!r} must have a string value, got {type(value).__name__}"
        )


class Message:
    """A message to send: RocketMQ's ``Message`` with Pythonic keyword arguments.

    ``body`` is bytes (a ``str`` is encoded as UTF-8). ``keys`` are business keys (a string of
    space-separated keys or a list), ``tags`` one tag used for filtering. ``properties`` are
    user properties; system properties (``MessageConst``) are set through the methods.
    """

    __slots__ = ("_body", "_keys", "_properties", "tags", "topic")

    def __init__(
        self,
        topic: str,
        body: bytes | str = b"",
        *,
        keys: str | Iterable[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, str] | None = None,
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
        self.tags = tags
        self._properties: dict[str, str] = {}
        if properties:
            for name, value in properties.items():
                self.put_user_property(name, value)
        if delay_time_level:
            self.set_delay_time_level(delay_time_level)
        if sharding_key is not None:
            self._properties[MessageConst.SHARDING_KEY] = sharding_key

    # --- body, keys, tags -------------------------------------------------------------
    @property
    def body(self) -> bytes:
        """The payload, bytes."""
        return self._body

    @body.setter
    def body(self, value: bytes | bytearray | memoryview | str) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8")
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
    def properties(self) -> dict[str, str]:
        """All properties (user and system), a copy."""
        return dict(self._properties)

    @property
    def user_properties(self) -> dict[str, str]:
        """The properties the user set."""
        return {k: v for k, v in self._properties.items() if k not in RESERVED_PROPERTIES}

    def put_user_property(self, name: str, value: str) -> None:
        """Set a user property; a reserved name raises :class:`InvalidPropertyError`."""
        _check_user_property(name, value)
        self._properties[name] = value

    set_property = put_user_property
    """The name RocketMQ's Python client uses."""

    def get_property(self, name: str) -> str | None:
        """Any property, user or system."""
        return self._properties.get(name)

    def put_system_property(self, name: str, value: str) -> None:
        """Set a system property (used by the producer and the services)."""
        self._properties[name] = value

    def clear_property(self, name: str) -> None:
        """Remove a property if present."""
        self._properties.pop(name, None)

    # --- delay --------------------------------------------------------------------------
    @property
    def delay_time_level(self) -> int:
        """RocketMQ 4's delay level (0: none)."""
        raw = self._properties.get(MessageConst.DELAY_TIME_LEVEL)
        return int(raw) if raw else 0

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
        """RocketMQ 5's ``setDeliverTimeMs``: deliver at ``epoch_ms`` (epoch milliseconds)."""
        self._properties[MessageConst.TIMER_DELIVER_MS] = str(int(epoch_ms))

    def set_delay_time_ms(self, delay_ms: int) -> None:
        """RocketMQ 5's ``setDelayTimeMs``: deliver ``delay_ms`` milliseconds after sending."""
        self._properties[MessageConst.TIMER_DELAY_MS] = str(int(delay_ms))

    def set_delay_time_sec(self, delay_sec: int) -> None:
        """RocketMQ 5's ``setDelayTimeSec``: deliver ``delay_sec`` seconds after sending."""
        self._properties[MessageConst.TIMER_DELAY_SEC] = str(int(delay_sec))

    @property
    def sharding_key(self) -> str | None:
        """The key that picks the partition (RocketMQ 5's message group), if any."""
        return self._properties.get(MessageConst.SHARDING_KEY)

    def kafka_key(self) -> bytes | None:
        """The Kafka record key: sharding key, else keys joined by spaces, else None."""
        sharding = self._properties.get(MessageConst.SHARDING_KEY)
        if sharding is not None:
            return sharding.encode("utf-8")
        if self._keys:
            return MessageConst.KEY_SEPARATOR.join(self._keys).encode("utf-8")
        return None

    def wire_properties(self) -> dict[str, str]:
        """Every property as it travels, with ``KEYS`` and ``TAGS`` folded in."""
        props = dict(self._properties)
        if self._keys:
            props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(self._keys)
        if self.tags:
            props[MessageConst.TAGS] = self.tags
        return props

    def wire_headers(self, head: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Append :meth:`wire_properties` to ``head`` as Kafka headers (UTF-8); return it.

        The same content as ``encode_headers(wire_properties())``, without the copies: this
        runs once per send.
        """
        for name, value in self._properties.items():
            head.append((name, value.encode()))
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
        properties: Mapping[str, str] | None = None,
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
        properties: dict[str, str],
        *,
        msg_id: str,
        queue_id: int,
        queue_offset: int,
        born_timestamp_ms: int,
        store_timestamp_ms: int | None,
        kafka_topic: str,
    ) -> MessageExt:
        """A consumed message from its decoded parts, without re-validating them: keys and
        tags come from the ``KEYS``/``TAGS`` properties, the born host from ``BORN_HOST``;
        ``properties`` is taken over, not copied."""
        msg = cls.__new__(cls)
        msg.topic = topic
        msg._body = body
        raw_keys = properties.get(MessageConst.KEYS)
        msg._keys = [k for k in raw_keys.split(MessageConst.KEY_SEPARATOR) if k] if raw_keys else []
        msg.tags = properties.get(MessageConst.TAGS)
        msg._properties = properties
        msg.msg_id = msg_id
        msg.queue_id = queue_id
        msg.queue_offset = queue_offset
        msg.born_timestamp_ms = born_timestamp_ms
        msg.born_host = properties.get(MessageConst.BORN_HOST, "")
        msg.store_timestamp_ms = store_timestamp_ms
        msg.kafka_topic = kafka_topic
        return msg

    @property
    def reconsume_times(self) -> int:
        """How many times the message was sent back for retry (``RECONSUME_TIME``)."""
        raw = self.get_property(MessageConst.RECONSUME_TIME)
        return int(raw) if raw and raw.isdigit() else 0

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
