"""Where a delayed message waits: the producer side of delayed delivery."""

from __future__ import annotations

from bridge.codec import BORN_TIMESTAMP_HEADER, PreparedRecord, delayed_headers, encode_envelope
from bridge.config import ClientConfig
from bridge.delay.model import InvalidDelayError
from bridge.message import DELAY_PROPERTIES, Message, MessageConst, PropertyValue, property_text
from bridge.message_id import fresh_send_id
from topics.catalog import SystemTopic
from topics.naming import system_topic

TIMER_ROUTING_HEADER = MessageConst.TIMER_DELIVER_MS
"""Timer records carry their delivery time in this header (an envelope record beside its
envelope, a header-format record among its properties), so a hop needs no decoding."""
SEND_ID_HEADER = "BRIDGE_SEND_ID"
"""A Kafka header (never a message property) with a fresh id for each record a producer builds
for SCHEDULE or the timer topic. Two records with one send id are one send stored twice by the
client library, which the delay services deliver once; the coordinator's own copies (hops,
back-offs) are written in Kafka transactions and carry none. In the header format it is the
first header, before :data:`~bridge.codec.BORN_TIMESTAMP_HEADER`: a message property of the
same name comes after that one and is never taken for it."""

SLOTS_HEADER = "BRIDGE_SLOTS"
"""A Kafka header (never a message property) on every SCHEDULE or timer record written past
lane 0 (partition ``>=`` the slot count): the slot count, levels or tiers, its partition was
picked with (decimal). Such a partition serves another slot once levels are appended or
``timer_max_delay_ms`` raised; a coordinator reading a record whose count differs from its
own re-routes it by the slot it was written for
(:meth:`~bridge.delay_policy.DelayPolicy.displaced_slot`). In the header format it comes
before :data:`~bridge.codec.BORN_TIMESTAMP_HEADER`, like the send id."""

__all__ = [
    "BORN_TIMESTAMP_HEADER",
    "SEND_ID_HEADER",
    "SLOTS_HEADER",
    "TIMER_ROUTING_HEADER",
    "delayed_record",
    "slots_header",
]


def _send_id() -> tuple[str, bytes]:
    return (SEND_ID_HEADER, fresh_send_id())


def slots_header(partition: int, slots: int) -> list[tuple[str, bytes | None]]:
    """The :data:`SLOTS_HEADER` of a record written to ``partition`` of a topic of ``slots``
    slots, as a list: empty in lane 0 (whose meaning no count changes)."""
    return [(SLOTS_HEADER, str(slots).encode())] if partition >= slots else []


def delayed_record(
    msg: Message,
    msg_id: str,
    born_ms: int,
    born_host: str,
    *,
    partition: int,
    config: ClientConfig,
) -> PreparedRecord | None:
    """The SCHEDULE or timer record of a delayed message, or None when a timer is already due,
    in one of its level's or tier's partitions (picked by its message id or keys,
    :meth:`~bridge.delay_policy.DelayPolicy.spread_lane`):
    value = the body, key = the message id, headers = the send id, then the message as
    :func:`~bridge.codec.delayed_headers` writes it (its properties with ``REAL_TOPIC``,
    ``REAL_QID`` and the delay level or ``TIMER_DELIVER_MS``).

    With ``config.delay_record_format == "envelope"`` it is the record releases before the
    header format wrote instead, which their coordinators read: value = the Avro
    ``MessageEnvelope`` of the message, headers = ``TIMER_DELIVER_MS`` (timers only), then the
    send id.

    A delay level wins over timer properties (RocketMQ 5's rule). Raises
    :class:`InvalidDelayError` for malformed values or a timer beyond the maximum.
    """
    policy = config.delay_policy
    props = msg.wire_properties()  # text and bytes values alike: the headers keep both
    raw_level = props.get(MessageConst.DELAY_TIME_LEVEL)
    try:
        level = int(raw_level) if raw_level else 0
    except ValueError:
        raise InvalidDelayError(f"delay level must be an integer, got {raw_level!r}") from None
    props.update(
        {
            MessageConst.REAL_TOPIC: msg.topic,
            MessageConst.REAL_QUEUE_ID: str(partition),
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: msg_id,
        }
    )
    if level > 0:
        level = policy.clamp_level(level)
        for name in DELAY_PROPERTIES:
            props.pop(name, None)
        props[MessageConst.DELAY_TIME_LEVEL] = str(level)
        topic = system_topic(SystemTopic.SCHEDULE.value, config.namespace)
        lane = policy.spread_lane(msg_id, msg.kafka_key(), policy.level_partitions)
        target = policy.level_partition(level, lane)
        first = [_send_id(), *slots_header(target, policy.level_count)]
        if config.delay_record_format == "envelope":
            value = encode_envelope(msg_id, msg.body, props, born_ms, born_host)
            return PreparedRecord(topic, msg_id.encode(), value, first, msg_id, born_ms, target)
        headers = delayed_headers(first, msg_id, born_host, props, born_ms)
        return PreparedRecord(topic, msg_id.encode(), msg.body, headers, msg_id, born_ms, target)
    deliver_ms = policy.deliver_time_ms(
        born_ms=born_ms,
        deliver_ms=_text(props.get(MessageConst.TIMER_DELIVER_MS)),
        delay_ms=_text(props.get(MessageConst.TIMER_DELAY_MS)),
        delay_sec=_text(props.get(MessageConst.TIMER_DELAY_SEC)),
    )
    tier = policy.route(deliver_ms, born_ms)
    if tier is None:
        return None
    for name in DELAY_PROPERTIES:
        props.pop(name, None)
    props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
    topic = system_topic(SystemTopic.TIMER.value, config.namespace)
    target = policy.tier_partition(
        tier, policy.spread_lane(msg_id, msg.kafka_key(), policy.tier_partitions)
    )
    slots = slots_header(target, policy.tier_count)
    if config.delay_record_format == "envelope":
        value = encode_envelope(msg_id, msg.body, props, born_ms, born_host)
        envelope_headers = [(TIMER_ROUTING_HEADER, str(deliver_ms).encode()), _send_id(), *slots]
        return PreparedRecord(
            topic, msg_id.encode(), value, envelope_headers, msg_id, born_ms, target
        )
    headers = delayed_headers([_send_id(), *slots], msg_id, born_host, props, born_ms)
    return PreparedRecord(topic, msg_id.encode(), msg.body, headers, msg_id, born_ms, target)


def _text(value: PropertyValue | None) -> str | None:
    return None if value is None else property_text(value)


def without_delay(msg: Message) -> Message:
    """A copy of ``msg`` without delay level and timer properties."""
    copy = Message(msg.topic, msg.body, keys=msg.keys, tags=msg.tags)
    for name, value in msg.properties.items():
        if name not in DELAY_PROPERTIES:
            copy.put_system_property(name, value)
    return copy
