"""Records a consumer writes for a failed message, and what a dead letter is replayed as.

A failed message is copied, body, keys, tags and properties kept, under the same message id:

* to the group's retry topic ``%RETRY%<group>`` through the delay levels (a SCHEDULE record
  whose ``REAL_TOPIC`` is the retry topic), or
* to the group's dead-letter queue ``%DLQ%<group>`` once its retries are spent,

with RocketMQ's properties: ``RETRY_TOPIC`` (the topic it was first sent to),
``RECONSUME_TIME`` (failures so far), ``ORIGIN_MESSAGE_ID`` (the first id) and
``MAX_RECONSUME_TIMES``.

Property values are copied as they are, text or bytes, so headers another Kafka client wrote
(binary trace contexts, schema ids) reach the retry topic, the DLQ and a replay byte for byte;
no property value can make building a copy fail.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from bridge.codec import PreparedRecord, plain_record
from bridge.config import ClientConfig
from bridge.consumer.model import RetryRoute
from bridge.delay.routing import delayed_record
from bridge.message import DELAY_PROPERTIES, Message, MessageConst, MessageExt, now_ms
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
    copy = Message(topic, msg.body, keys=msg.keys, tags=msg.tags)
    for name, value in msg.properties.items():
        if name not in _NOT_COPIED and name not in dropped:
            copy.put_system_property(name, value)
    return copy


def send_back_record(
    msg: MessageExt,
    group: str,
    route: RetryRoute,
    max_reconsume_times: int,
    *,
    config: ClientConfig,
    born_host: bytes,
) -> PreparedRecord:
    """The record that takes failed ``msg`` to ``route`` (retry topic or DLQ)."""
    target = f"{DLQ_GROUP_TOPIC_PREFIX if route.to_dlq else RETRY_GROUP_TOPIC_PREFIX}{group}"
    copy = _copy(msg, target)
    copy.put_system_property(MessageConst.RETRY_TOPIC, origin_topic(msg))
    copy.put_system_property(MessageConst.RECONSUME_TIME, str(route.reconsume_times))
    copy.put_system_property(
        MessageConst.ORIGIN_MESSAGE_ID,
        msg.get_property(MessageConst.ORIGIN_MESSAGE_ID) or msg.msg_id,
    )
    copy.put_system_property(MessageConst.MAX_RECONSUME_TIMES, str(max_reconsume_times))
    born_ms = msg.born_timestamp_ms or now_ms()
    if route.to_dlq:
        return plain_record(
            copy, dlq_topic(group, config.namespace), msg.msg_id, born_ms, born_host
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
    topic without the retry properties, or to the group's retry topic with its failures
    reset to zero."""
    born_host = msg.born_host.encode()
    if target is ReplayTarget.ORIGIN:
        copy = _copy(msg, origin_topic(msg), RETRY_PROPERTIES)
        kafka_topic = to_kafka_topic(copy.topic, namespace)
    else:
        copy = _copy(
            msg, f"{RETRY_GROUP_TOPIC_PREFIX}{group}", frozenset({MessageConst.RECONSUME_TIME})
        )
        copy.put_system_property(MessageConst.RETRY_TOPIC, origin_topic(msg))
        kafka_topic = retry_topic(group, namespace)
    return plain_record(copy, kafka_topic, msg.msg_id, msg.born_timestamp_ms, born_host)
