"""Thin adapters over confluent-kafka: client configs, error translation, topic admin."""

from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import (
    consumer_config,
    new_admin,
    new_consumer,
    new_producer,
    producer_config,
    translate_error,
)

__all__ = [
    "TopicAdmin",
    "consumer_config",
    "new_admin",
    "new_consumer",
    "new_producer",
    "producer_config",
    "translate_error",
]
