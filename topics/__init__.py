"""Topic catalog: system topic names, partitions and configs, the RocketMQ <-> Kafka name
mapping, and the Avro schemas of system-topic records."""

from topics.catalog import SystemTopic, TopicCatalog, TopicSpec
from topics.naming import (
    DEFAULT_NAMESPACE,
    ParsedTopic,
    TopicKind,
    dlq_topic,
    parse_kafka_topic,
    retry_topic,
    to_kafka_topic,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "ParsedTopic",
    "SystemTopic",
    "TopicCatalog",
    "TopicKind",
    "TopicSpec",
    "dlq_topic",
    "parse_kafka_topic",
    "retry_topic",
    "to_kafka_topic",
]
