"""What the tests of the delay layout (SCHEDULE and the timer topic spread over lanes,
their partitions changed on a live namespace) read of those system topics on the real
broker: how many partitions one has (:func:`partitions`) and how many records each holds
(:func:`written`)."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition

from bridge import ClientConfig
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_reader
from topics.catalog import SystemTopic


def partitions(config: ClientConfig, system: SystemTopic) -> int:
    """How many partitions the system topic ``system`` of ``config``'s namespace has now."""
    return TopicAdmin(config).list_topics()[config.catalog().topic(system)]


def written(config: ClientConfig, system: SystemTopic) -> list[int]:
    """How many records each partition of a system topic holds (high watermarks)."""
    kafka_topic = config.catalog().topic(system)
    reader = new_reader(config, f"layout-check-{time.monotonic_ns()}", "layout-check")
    try:
        return [
            reader.get_watermark_offsets(TopicPartition(kafka_topic, p), timeout=10)[1]
            for p in range(partitions(config, system))
        ]
    finally:
        reader.close()
