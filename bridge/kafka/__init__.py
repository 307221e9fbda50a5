"""Adapters over confluent-kafka: client configs and error translation (``clients``), topic
admin (``admin``), bounded transactional producers (``transactional``), the one transactional
batch writer (``batch_writer``), the base of the coordinator's transactional services
(``service``) and the quarantine topic (``quarantine``)."""

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
