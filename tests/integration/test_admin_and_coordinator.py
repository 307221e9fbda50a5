"""Topic provisioning and the coordinator shell against a real broker."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka.admin import ConfigResource

from bridge.config import ClientConfig
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import BrokerUnreachableError, TopicProvisioningError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.lifecycle import ServiceState, ServiceThread
from bridge.runtime.local_kafka import free_port
from tests.conftest import wait_until
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker


def test_system_topics_are_created_once_with_the_catalogs_layout(
    client_config: ClientConfig,
) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=3)
    admin = TopicAdmin(client_config)
    created = admin.ensure_system_topics(catalog)
    assert sorted(created) == sorted(catalog.topic(t) for t in SystemTopic)
    assert admin.ensure_system_topics(catalog) == []  # idempotent

    counts = admin.list_topics()
    for spec in catalog.system_specs():
        assert counts[spec.kafka_name] == spec.partitions
    assert counts[catalog.topic(SystemTopic.SCHEDULE)] == 18

    resource = ConfigResource("topic", catalog.topic(SystemTopic.CHECK_MAX))
    raw_admin = new_admin(client_config)
    described = raw_admin.describe_configs([resource])[resource].result(10)
    assert described["retention.ms"].value == "-1"


def test_half_and_op_must_be_co_partitioned(client_config: ClientConfig) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=2)
    admin = TopicAdmin(client_config)
    admin.ensure_topics([TopicSpec(catalog.topic(SystemTopic.OP), 5)])
    with pytest.raises(TopicProvisioningError, match="must be equal"):
        admin.ensure_system_topics(catalog)


def test_an_existing_topic_with_too_few_partitions_is_refused(client_config: ClientConfig) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace)
    admin = TopicAdmin(client_config)
    admin.ensure_topics([TopicSpec(catalog.topic(SystemTopic.SCHEDULE), 2)])
    with pytest.raises(TopicProvisioningError, match="has 2 partitions, 18 needed"):
        admin.ensure_system_topics(catalog)


def test_admin_against_no_broker_fails_within_the_timeout() -> None:
    config = ClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000)
    with pytest.raises(BrokerUnreachableError, match="listing topics"):
        TopicAdmin(config).list_topics()


class _Counting(ServiceThread):
    def __init__(self) -> None:
        super().__init__("test-counting", interval_ms=10)
        self.ran = threading.Event()

    def run_once(self) -> None:
        self.ran.set()


def test_coordinator_provisions_topics_and_runs_its_services(client_config: ClientConfig) -> None:
    service = _Counting()
    config = CoordinatorConfig(client=client_config, coordinator_id="c-test")
    with Coordinator(config, [service]) as coordinator:
        assert service.ran.wait(10)
        assert coordinator.state is ServiceState.RUNNING
        topics = TopicAdmin(client_config).list_topics()
        assert config.catalog.topic(SystemTopic.HALF) in topics
    assert coordinator.wait(0)
    assert service.state is ServiceState.SHUTDOWN_ALREADY


def test_coordinator_start_failure_stops_what_it_started() -> None:
    service = _Counting()
    client = ClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1000)
    coordinator = Coordinator(CoordinatorConfig(client=client), [service])
    with pytest.raises(BrokerUnreachableError):
        coordinator.start()
    assert coordinator.state is ServiceState.SHUTDOWN_ALREADY
    assert service.state is ServiceState.CREATE_JUST


def test_health_says_whether_a_coordinator_runs(client_config: ClientConfig) -> None:
    from click.testing import CliRunner

    from bridge.cli import cli
    from bridge.coordinator.health import coordinator_health

    env = {
        "KAFKA_BOOTSTRAP_SERVERS": client_config.bootstrap_servers,
        "BRIDGE_NAMESPACE": client_config.namespace,
    }
    assert not any(c.healthy for c in coordinator_health(client_config))
    assert CliRunner().invoke(cli, ["health"], env=env).exit_code == 1
    config = CoordinatorConfig(
        client=client_config, coordinator_id="health", transaction_partitions=1
    )
    with Coordinator(config):
        wait_until(lambda: all(c.healthy for c in coordinator_health(client_config)), 60)
        result = CliRunner().invoke(cli, ["health"], env=env)
        assert result.exit_code == 0, result.output
        assert result.output.count("STABLE") == 3
