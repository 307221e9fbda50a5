"""A broker away for longer than the coordinator's session timeout: each service's consumer
gives up its static membership, and its next request under the old one is fenced. That is not
another coordinator with the same id, and the coordinator must go on (with fresh services)
instead of stopping as a duplicate. Runs on a broker of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.service import TransactionalService
from bridge.lifecycle import ServiceState
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig
from tests.conftest import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SESSION_TIMEOUT_MS = 6000
"""The broker's smallest allowed session timeout (``group.min.session.timeout.ms``)."""


@pytest.fixture()
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    broker = LocalKafka(LocalKafkaConfig(data_dir=tmp_path / "kafka"))
    broker.start()
    yield broker
    broker.stop()


def _member_ids(coordinator: Coordinator) -> list[str | None]:
    ids = []
    for service in coordinator.services:
        consumer = getattr(service, "_consumer", None)
        ids.append(None if consumer is None else consumer.memberid())
    return ids


def test_a_broker_away_past_the_session_timeout_does_not_stop_the_coordinator(
    own_broker: LocalKafka, namespace: str
) -> None:
    config = ClientConfig(
        bootstrap_servers=own_broker.bootstrap_servers,
        namespace=namespace,
        message_delay_level="1s 2s",
        send_msg_timeout_ms=30_000,
    )
    coordinator_config = CoordinatorConfig(
        client=config, coordinator_id="away", transaction_partitions=2,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    )  # fmt: skip
    topic = "away-orders"
    with Coordinator(coordinator_config) as coordinator:
        wait_until(lambda: all(_member_ids(coordinator)), timeout_s=60)
        with Producer("away_before", config=config) as producer:
            producer.send_sync(Message(topic, "before", delay_time_level=1))
        own_broker.stop()
        # Every service's consumer notices its session expired and drops its member id.
        wait_until(
            lambda: not any(_member_ids(coordinator)), timeout_s=SESSION_TIMEOUT_MS / 1000 + 30
        )
        own_broker.start()
        with Producer("away_after", config=config) as producer:
            producer.send_sync(Message(topic, "after", delay_time_level=2))
        bodies = sorted(
            m.body.decode()
            for m in read_messages(config, [topic], max_messages=2, timeout_ms=90_000)
        )
        assert bodies == ["after", "before"]
        assert coordinator.failure is None, coordinator.failure
        assert coordinator.state is ServiceState.RUNNING
        services = coordinator.services
        assert all(s.state is ServiceState.RUNNING for s in services), [
            (s.name, s.state) for s in services
        ]
        assert all(isinstance(s, TransactionalService) for s in services)
