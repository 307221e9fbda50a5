"""Records a consumer writes for a failed message, and what a dead letter is replayed as.

A failed message is copied, body, keys, tags and properties kept, under the same message id:

* to the group's retry topic ``%RETRY%<group>`` through the delay levels (a SCHEDULE record
  whose ``REAL_TOPIC`` is the retry topic), or straight there (a route of level 0: a
  :class:`~bridge.SimpleConsumer`'s message whose invisible duration passed, which served as
  its back-off already), or
* to the group's dead-letter queue ``%DLQ%<group>`` once its retries are spent,

with RocketMQ's properties: ``RETRY_TOPIC`` (the topic it was first sent to),
``RECONSUME_TIME`` (failures so far), ``ORIGIN_MESSAGE_ID`` (the first id) and
``MAX_RECONSUME_TIMES``; and with the dead-letter metadata (``docs/tracing.md``):
``CONSUMER_GROUP``, how the listener failed it last (``CONSUME_FAILURE``, and
``CONSUME_EXCEPTION_CLASS``/``CONSUME_EXCEPTION_MESSAGE`` when it raised, noted by the
consumption strategy) and where the group first failed it (``ORIGIN_KAFKA_TOPIC``,
``ORIGIN_QUEUE_ID``, ``ORIGIN_QUEUE_OFFSET``, ``ORIGIN_TIMESTAMP``, kept through later
retries).

Property values are copied as they are, text or bytes, so headers another Kafka client wrote
(binary trace contexts, schema ids) reach the retry topic, the DLQ and a replay byte for byte;
no property value can make building a copy fail.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from bridge.client.records import plain_record
from bridge.codec import PreparedRecord, stamped_copy
from bridge.config import ClientConfig
from bridge.consumer.model import RetryRoute
from bridge.delay.routing import delayed_record
from bridge.message import (
    DEAD_LETTER_PROPERTIES,
    DELAY_PROPERTIES,
    Message,
    MessageConst,
    MessageExt,
    copied_message,
    now_ms,
)
from topics.naming import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    dlq_topic,
    retry_topic,
    to_kafka_topic,
)

_NOT_COPIED: Final = frozenset(
    {
        MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        MessageConst.BORN_HOST,
        MessageConst.KEYS,
        MessageConst.TAGS,
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QUEUE_ID,
        *DELAY_PROPERTIES,
    }
)
"""Properties a copy does not take over: id and host travel apart, keys and tags are fields,
and the routing ones would send the copy elsewhere."""
RETRY_PROPERTIES: Final = frozenset(
    {
        MessageConst.RETRY_TOPIC,
        MessageConst.RECONSUME_TIME,
        MessageConst.ORIGIN_MESSAGE_ID,
        MessageConst.MAX_RECONSUME_TIMES,
    }
)
"""What the retry path adds; a message replayed to its origin topic loses them."""
_REPLAY_TO_ORIGIN_DROPS: Final = RETRY_PROPERTIES | frozenset(DEAD_LETTER_PROPERTIES)
"""A dead letter replayed to its origin topic is a new first delivery: it loses the retry
properties and the dead-letter metadata."""


class ReplayTarget(Enum):
    """Where a dead letter is replayed: its origin topic (every group subscribed to it sees
    it again) or the group's retry topic (only that group does)."""

    ORIGIN = "origin"
    RETRY = "retry"


def origin_topic(msg: MessageExt) -> str:
    """The topic the message was first sent to."""
    return msg.get_property(MessageConst.RETRY_TOPIC) or msg.topic


def _copy(msg: MessageExt, topic: str, dropped: frozenset[str] = frozenset()) -> Message:
    # Any body, empty included: unlike a send, a copy is never refused.
    return copied_message(msg, topic, _NOT_COPIED | dropped if dropped else _NOT_COPIED)


def _put_origin(copy: Message, msg: MessageExt) -> None:
    """Note on ``copy`` where ``msg`` was read (the first failure of this message in the
    group): Kafka topic, partition, offset and record timestamp (ms)."""
    if msg.kafka_topic:
        copy.put_system_property(MessageConst.ORIGIN_KAFKA_TOPIC, msg.kafka_topic)
    if msg.queue_id >= 0:
        copy.put_system_property(MessageConst.ORIGIN_QUEUE_ID, str(msg.queue_id))
    if msg.queue_offset >= 0:
        copy.put_system_property(MessageConst.ORIGIN_QUEUE_OFFSET, str(msg.queue_offset))
    stamp = msg.store_timestamp_ms if msg.store_timestamp_ms is not None else msg.born_timestamp_ms
    if stamp:
        copy.put_system_property(MessageConst.ORIGIN_TIMESTAMP, str(stamp))


def send_back_record(
    msg: MessageExt,
    group: str,
    route: RetryRoute,
    max_reconsume_times: int,
    *,
    config: ClientConfig,
    born_host: bytes,
    record_key: bytes | None = None,
) -> PreparedRecord:
    """The record that takes failed ``msg`` to ``route`` (retry topic or DLQ).

    ``record_key``: the Kafka key of the record ``msg`` was read from. A record another Kafka
    client wrote has its key there and not in ``KEYS``: the copy keeps it as its
    ``SHARDING_KEY`` (whence a record's key comes, through SCHEDULE too), so the retry, the
    dead letter and a replay to the origin topic are keyed as the original was."""
    target = f"{DLQ_GROUP_TOPIC_PREFIX if route.to_dlq else RETRY_GROUP_TOPIC_PREFIX}{group}"
    copy = _copy(msg, target)
    if record_key is not None and copy.kafka_key() != record_key:
        copy.put_system_property(MessageConst.SHARDING_KEY, record_key)
    copy.put_system_property(MessageConst.RETRY_TOPIC, origin_topic(msg))
    copy.put_system_property(MessageConst.RECONSUME_TIME, str(route.reconsume_times))
    copy.put_system_property(
        MessageConst.ORIGIN_MESSAGE_ID,
        msg.get_property(MessageConst.ORIGIN_MESSAGE_ID) or msg.msg_id,
    )
    copy.put_system_property(MessageConst.MAX_RECONSUME_TIMES, str(max_reconsume_times))
    copy.put_system_property(MessageConst.CONSUMER_GROUP, group)
    if MessageConst.ORIGIN_KAFKA_TOPIC not in copy.properties:
        _put_origin(copy, msg)
    born_ms = msg.born_timestamp_ms or now_ms()
    if route.to_dlq:
        return stamped_copy(
            plain_record(copy, dlq_topic(group, config.namespace), msg.msg_id, born_ms, born_host)
        )
    if route.delay_level == 0:  # visible again at once (a SimpleConsumer's expired message)
        return stamped_copy(
            plain_record(copy, retry_topic(group, config.namespace), msg.msg_id, born_ms, born_host)
        )
    copy.set_delay_time_level(route.delay_level)
    record = delayed_record(
        copy, msg.msg_id, born_ms, born_host.decode(), partition=-1, config=config
    )
    if record is None:  # pragma: no cover - a positive level always waits
        raise AssertionError("a delay level always makes a SCHEDULE record")
    return record


def replay_record(
    msg: MessageExt, group: str, target: ReplayTarget, *, namespace: str
) -> PreparedRecord:
    """The record that replays dead letter ``msg`` (same id and born time): to its origin
    topic without the retry properties and the dead-letter metadata, or to the group's retry
    topic with its failures reset to zero."""
    born_host = msg.born_host.encode()
    if target is ReplayTarget.ORIGIN:
        copy = _copy(msg, origin_topic(msg), _REPLAY_TO_ORIGIN_DROPS)
        kafka_topic = to_kafka_topic(copy.topic, namespace)
    else:
        copy = _copy(
            msg, f"{RETRY_GROUP_TOPIC_PREFIX}{group}", frozenset({MessageConst.RECONSUME_TIME})
        )
        copy.put_system_property(MessageConst.RETRY_TOPIC, origin_topic(msg))
        kafka_topic = retry_topic(group, namespace)
    return stamped_copy(
        plain_record(copy, kafka_topic, msg.msg_id, msg.born_timestamp_ms, born_host)
    )
