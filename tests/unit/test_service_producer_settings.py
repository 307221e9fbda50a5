"""The producer settings of the coordinator's transactional services
(``TransactionalService.producer_overrides``).

What it promises: every service's transactional producer asks again after a short back-off
(10 ms, not librdkafka's 100) when the broker answers ``CONCURRENT_TRANSACTIONS`` because the
previous transaction's markers are still being written: that wait sat in the lateness of
timers. A ``retry.backoff.ms`` the user set is kept.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bridge.config import ClientConfig
from bridge.coordinator.delay.service import ScheduleDeliveryService, TimerService
from bridge.coordinator.transaction.service import TransactionService
from bridge.kafka.clients import producer_config
from bridge.kafka.service import ServiceConfig, TransactionalService

SERVICES: list[Callable[[ServiceConfig], TransactionalService]] = [
    TimerService,
    ScheduleDeliveryService,
    TransactionService,
]


def _effective(service: TransactionalService, client: ClientConfig) -> dict[str, object]:
    """The librdkafka settings the service's producer is made with."""
    return producer_config(client, service.name, **service.producer_overrides())


@pytest.mark.parametrize("kind", SERVICES, ids=["timer", "schedule", "transaction"])
def test_each_service_producer_retries_a_concurrent_transaction_after_10_ms(
    kind: Callable[[ServiceConfig], TransactionalService],
) -> None:
    client = ClientConfig(bootstrap_servers="localhost:1", namespace="settings")
    service = kind(ServiceConfig(client, client.catalog(), "unit"))
    assert _effective(service, client)["retry.backoff.ms"] == 10


@pytest.mark.parametrize("kind", SERVICES, ids=["timer", "schedule", "transaction"])
def test_a_retry_backoff_the_user_set_is_kept(
    kind: Callable[[ServiceConfig], TransactionalService],
) -> None:
    client = ClientConfig(
        bootstrap_servers="localhost:1", namespace="settings", kafka={"retry.backoff.ms": "250"}
    )
    service = kind(ServiceConfig(client, client.catalog(), "unit"))
    assert "retry_backoff_ms" not in service.producer_overrides()
    assert _effective(service, client)["retry.backoff.ms"] == "250"
