"""What the operators' commands share: the client settings of a command, once Kafka answered,
and why a topic cannot take a replayed message."""

from __future__ import annotations

import click
from confluent_kafka import KafkaException

from bridge.cli.common import client_config
from bridge.cli.output import require_broker
from bridge.config import ClientConfig
from bridge.coordinator.transaction.targets import (
    auto_create_allowed,
    partition_problem,
    topic_problem,
)
from bridge.kafka.clients import new_producer


def read_config(ctx: click.Context, bootstrap_servers: str | None) -> ClientConfig:
    """The command's client settings, once Kafka answered (exit 3 within
    ``request_timeout_ms`` if it does not)."""
    config = client_config(ctx, bootstrap_servers)
    require_broker(config)
    return config


def target_problem(config: ClientConfig, topic: str, partition: int) -> str | None:
    """Why ``topic`` / ``partition`` cannot take a replayed message, from the cluster's
    metadata, in the words of ``bridge transactions replay`` (a Kafka internal topic, a topic
    that does not exist, a partition it does not have), or None. Asked before the replay
    writes: Kafka would only say "topic authorization failed" (a transaction's write to an
    internal topic) or "Invalid topic" (a plain send's), and librdkafka ``_INCONSISTENT`` for
    a partition the topic does not have."""
    metadata = new_producer(config, "bridge-replay-metadata")
    # A topic being auto-created answers "unknown" for a moment, as the transaction admin's.
    confirm_s = 1.0 if auto_create_allowed(config) else 0.0
    try:
        problem, count = topic_problem(
            metadata, topic, config.request_timeout_ms / 1000, confirm_s=confirm_s
        )
    except KafkaException:
        return None  # no metadata now: the replay's write finds out
    return problem or partition_problem(topic, partition, count)
