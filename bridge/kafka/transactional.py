"""Base of the coordinator services that consume, transform and produce in Kafka transactions."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from bridge.config import ClientConfig
from bridge.kafka.clients import new_producer
from bridge.lifecycle import ServiceThread
from topics.catalog import TopicCatalog

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What every coordinator service needs (see ``CoordinatorConfig``)."""

    client: ClientConfig
    catalog: TopicCatalog
    coordinator_id: str
    kafka_transaction_timeout_ms: int = 10_000
    """How long an unfinished Kafka transaction of a crashed coordinator blocks readers, ms."""
    session_timeout_ms: int = 10_000
    """How long a crashed coordinator keeps its partitions, ms."""


class TransactionalService(ServiceThread):
    """A service whose every batch is one Kafka transaction: its outputs and the offsets of the
    inputs they came from commit together, so a crash applies a batch completely or not at all.

    ``transactional_id`` should be stable per coordinator and service: a restarted process
    with the same id fences its predecessor and aborts what it left open.
    """

    def __init__(self, kind: str, config: ServiceConfig) -> None:
        super().__init__(f"bridge-{kind}-{config.coordinator_id}", interval_ms=1)
        self.config = config
        self.client = config.client
        self._transactional_id = (
            f"{config.client.namespace}.coordinator.{kind}.{config.coordinator_id}"
        )
        self._kafka_transaction_timeout_ms = config.kafka_transaction_timeout_ms
        self._consumer: Consumer | None = None
        self._producer: Any = None

    @property
    def timeout_s(self) -> float:
        """Bound on each Kafka call, seconds."""
        return self.client.request_timeout_ms / 1000

    def start_producer(self) -> None:
        """Create the transactional producer and register its id with the broker."""
        producer = new_producer(
            self.client,
            self.name,
            transactional_id=self._transactional_id,
            transaction_timeout_ms=self._kafka_transaction_timeout_ms,
            # librdkafka requires a message to time out within its transaction.
            message_timeout_ms=min(
                self.client.send_msg_timeout_ms, self._kafka_transaction_timeout_ms
            ),
            linger_ms=1,
        )
        producer.init_transactions(self.timeout_s)
        self._producer = producer

    def on_stop(self) -> None:
        """Close the consumer and flush the producer (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(5)

    def transaction_failed(self, exc: KafkaException) -> None:
        """Abort the failed transaction, or replace a fenced or broken producer. The caller
        then re-reads its inputs from the committed offsets."""
        error = exc.args[0] if exc.args else None
        logger.warning("%s: Kafka transaction failed (%s); re-reading", self.name, exc)
        fatal = isinstance(error, KafkaError) and error.fatal()
        if not fatal:
            try:
                self._producer.abort_transaction(self.timeout_s)
            except KafkaException:
                fatal = True
        if fatal:
            self.start_producer()
