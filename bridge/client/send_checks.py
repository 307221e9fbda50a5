"""The checks a send makes before anything is sent: the topic it may go to, the size of a
message's properties and an explicit partition (see
:meth:`bridge.client.producer.Producer.prepare`)."""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Final

from confluent_kafka import KafkaException

from bridge.codec import header_bytes
from bridge.config import ClientConfig
from bridge.errors import InvalidArgumentError, InvalidTopicNameError, MessageTooLargeError
from bridge.message import Message
from topics.catalog import SystemTopic
from topics.naming import is_kafka_internal, to_kafka_topic

MAX_PROPERTIES_BYTES: Final = 32_767
"""The largest a message's properties, keys and tags may be together, in bytes, measured as
RocketMQ encodes them (each ``name`` and value in UTF-8, plus 2 separator bytes): RocketMQ's
broker refuses a properties block over ``Short.MAX_VALUE`` bytes. Without this limit a
message with megabytes of properties would only fail at the broker, as a generic send error."""
OWN_HEADERS_BYTES: Final = 128
"""Room left for what the producer adds (``UNIQ_KEY``, ``BORN_HOST``, ``REAL_TOPIC``, ...)."""
TAGS_ALWAYS_FIT: Final = (MAX_PROPERTIES_BYTES - OWN_HEADERS_BYTES) // 4
"""Tags this many characters or fewer (4 UTF-8 bytes at most each) always fit: a message
without properties or keys needs no measuring."""
_SYSTEM_TOPIC_NAMES: Final = frozenset(system.value for system in SystemTopic)


@lru_cache(maxsize=4096)
def kafka_topic_for(topic: str, namespace: str) -> str:
    """The Kafka topic a message for ``topic`` goes to; raises
    :class:`InvalidTopicNameError` for names that cannot be mapped and for topics no message
    may be sent to: Kafka's internal topics (``__consumer_offsets``, ...) and the bridge's
    system topics, by their RocketMQ name (``SCHEDULE_TOPIC_XXXX``) or their Kafka name
    (``<namespace>.SCHEDULE_TOPIC_XXXX``, refused by :func:`to_kafka_topic`). Cached, so a
    send pays nothing for the checks. ``%RETRY%<group>`` and ``%DLQ%<group>`` are allowed,
    as RocketMQ allows them."""
    if topic in _SYSTEM_TOPIC_NAMES:
        raise InvalidTopicNameError(
            topic,
            "is a system topic of the bridge; delayed and transactional messages get there "
            "by being sent to their real topic",
        )
    kafka_topic = to_kafka_topic(topic, namespace)
    if is_kafka_internal(kafka_topic):
        raise InvalidTopicNameError(
            topic, "names starting with '__' are Kafka's internal topics (__consumer_offsets, ...)"
        )
    return kafka_topic


def properties_size(msg: Message) -> int:
    """The bytes of ``msg``'s properties, keys and tags as RocketMQ encodes them (see
    :data:`MAX_PROPERTIES_BYTES`)."""
    return sum(
        len(name.encode()) + len(header_bytes(value)) + 2
        for name, value in msg.wire_properties().items()
    )


def properties_too_large(size: int) -> MessageTooLargeError:
    """The error for properties, keys and tags of ``size`` bytes encoded."""
    return MessageTooLargeError(
        size,
        MAX_PROPERTIES_BYTES,
        f"message properties, keys and tags are {size} bytes encoded, more than the "
        f"{MAX_PROPERTIES_BYTES} bytes a RocketMQ broker accepts (Short.MAX_VALUE)",
    )


_PARTITION_COUNT_TTL_S: Final = 30.0
"""How long a topic's partition count is trusted for checking explicit partitions, seconds."""
_PARTITION_COUNT_CACHE_SIZE: Final = 4096


class PartitionCounts:
    """The partition counts of the topics sends name a partition of, for a while."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._counts: dict[str, tuple[float, int]] = {}
        """Kafka topic -> (trusted until, monotonic s; partition count)."""

    def check(self, kafka: Any, topic: str, kafka_topic: str, partition: object) -> None:
        """Refuse a partition the topic does not have. The count comes from the metadata of
        ``kafka`` (the producer's confluent-kafka producer; None before it started), trusted
        for :data:`_PARTITION_COUNT_TTL_S` while partitions below it are asked for; a
        partition at or beyond it is checked against fresh metadata first (partitions may have
        been added). A topic that does not exist (yet) or metadata that does not come is no
        reason to refuse: the send reports what happens. Where the broker creates topics on
        first use, asking for a missing topic's metadata creates it, as the send would, and
        its new partition count is then checked."""
        if type(partition) is not int or partition < -1:
            raise InvalidArgumentError(
                f"partition {partition!r} for {topic}: expected -1 (the key decides) or a "
                "partition number"
            )
        if partition == -1 or kafka is None:
            return
        cached = self._counts.get(kafka_topic)
        if cached is not None and partition < cached[1] and time.monotonic() < cached[0]:
            return
        count = self._count(kafka, kafka_topic)
        if count is not None and partition >= count:
            named = topic if topic == kafka_topic else f"{topic} (Kafka topic {kafka_topic})"
            raise InvalidArgumentError(
                f"partition {partition} of {named} does not exist: the topic has {count} "
                f"partitions (0-{count - 1})"
            )

    def _count(self, kafka: Any, kafka_topic: str) -> int | None:
        """The topic's partition count from fresh metadata (and cache it), or None."""
        try:
            # Bounded like the send itself: a broker that does not answer fails the send anyway.
            timeout_ms = min(self._config.request_timeout_ms, self._config.send_msg_timeout_ms)
            metadata = kafka.list_topics(kafka_topic, timeout=timeout_ms / 1000)
        except KafkaException:
            return None
        info = metadata.topics.get(kafka_topic)
        if info is None or info.error is not None or not info.partitions:
            return None
        count = len(info.partitions)
        if len(self._counts) >= _PARTITION_COUNT_CACHE_SIZE:
            self._counts.clear()
        self._counts[kafka_topic] = (time.monotonic() + _PARTITION_COUNT_TTL_S, count)
        return count
