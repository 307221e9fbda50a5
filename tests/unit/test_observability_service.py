"""Coordinator services count what Kafka committed: :meth:`TransactionalService.count` runs
once the batch's Kafka transaction commits and never for one that failed; failures count as
aborts. (A stand-in producer plays the transaction calls; no Kafka.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import CollectorRegistry

from bridge.config import ClientConfig
from bridge.kafka.batch_writer import TransactionBatch
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.observability import BridgeMetrics, disable_metrics, enable_metrics


class _Producer:
    """Commits, or fails the commit while :attr:`fail` is set (an abort) or :attr:`in_doubt`
    is (a timeout: the commit may have completed)."""

    def __init__(self) -> None:
        self.fail = False
        self.in_doubt = False
        self.aborts = 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        if self.in_doubt:  # the commit's outcome is unknown
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))
        if self.fail:
            raise KafkaException(
                KafkaError(KafkaError._FENCED, "producer fenced", txn_requires_abort=True)
            )

    def abort_transaction(self, timeout: float) -> None:
        self.aborts += 1


class _Service(TransactionalService):
    def __init__(self) -> None:
        client = ClientConfig(namespace="unitns")
        super().__init__("timer", ServiceConfig(client, client.catalog(), "unit"))
        self.producer = _Producer()
        self._producer = self.producer

    def run_once(self) -> None:
        pass


@pytest.fixture
def metrics() -> Iterator[BridgeMetrics]:
    disable_metrics()
    yield enable_metrics(CollectorRegistry())
    disable_metrics()


def value(metrics: BridgeMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_counted_once_when_the_batch_commits_and_never_when_it_fails(
    metrics: BridgeMetrics,
) -> None:
    service = _Service()
    failed, committed = TransactionBatch(), TransactionBatch()
    service.count(failed, lambda m: m.delay_deliveries.labels("unitns", "timer").inc())
    service.count(committed, lambda m: m.delay_deliveries.labels("unitns", "timer").inc(2))
    service.producer.fail = True
    assert not service.write(failed)
    assert value(metrics, "bridge_delay_deliveries_total", namespace="unitns", kind="timer") == 0
    assert service.producer.aborts == 1
    service.producer.fail = False
    assert service.write(committed)
    assert service.write(committed)  # written again: its actions ran already
    assert value(metrics, "bridge_delay_deliveries_total", namespace="unitns", kind="timer") == 2
    labels = {"namespace": "unitns", "service": "timer"}
    assert value(metrics, "bridge_kafka_transactions_total", **labels) == 2
    assert value(metrics, "bridge_kafka_transaction_aborts_total", **labels) == 1


def test_a_commit_in_doubt_is_not_counted_as_an_abort(metrics: BridgeMetrics) -> None:
    service = _Service()
    batch = TransactionBatch()
    service.count(batch, lambda m: m.delay_deliveries.labels("unitns", "timer").inc())
    service.producer.in_doubt = True
    assert not service.write(batch)
    assert batch.in_doubt
    labels = {"namespace": "unitns", "service": "timer"}
    assert value(metrics, "bridge_kafka_transactions_in_doubt_total", **labels) == 1
    assert value(metrics, "bridge_kafka_transaction_aborts_total", **labels) == 0
    assert value(metrics, "bridge_delay_deliveries_total", namespace="unitns", kind="timer") == 0


def test_nothing_is_kept_while_metrics_are_off() -> None:
    disable_metrics()
    service = _Service()
    batch = TransactionBatch()
    service.count(batch, lambda m: m.delay_deliveries.labels("unitns", "timer").inc())
    assert service._on_commit == {}
    assert service.write(batch)


def test_actions_of_batches_never_written_are_forgotten(metrics: BridgeMetrics) -> None:
    service = _Service()
    batches = [TransactionBatch() for _ in range(100)]
    for batch in batches:
        service.on_commit(batch, lambda: None)
    assert len(service._on_commit) == 64
    assert id(batches[-1]) in service._on_commit and id(batches[0]) not in service._on_commit
