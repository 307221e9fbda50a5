"""Topic provisioning and the coordinator shell against a real broker."""

from __future__ import annotations

import dataclasses
import threading

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

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
    admin.ensure_topics([dataclasses.replace(catalog.spec(SystemTopic.OP), partitions=5)])
    with pytest.raises(TopicProvisioningError, match="must be equal"):
        admin.ensure_system_topics(catalog)


def test_an_existing_topic_with_too_few_partitions_is_refused(client_config: ClientConfig) -> None:
    # HALF: its partitions pair with OP's, so it is never expanded (SCHEDULE and the timer
    # topic are: tests/integration/test_delay_layout.py).
    catalog = TopicCatalog(namespace=client_config.namespace)
    admin = TopicAdmin(client_config)
    admin.ensure_topics([TopicSpec(catalog.topic(SystemTopic.HALF), 2)])
    with pytest.raises(TopicProvisioningError, match=r"has 2 partitions, 8 needed$"):
        admin.ensure_system_topics(catalog)


def test_partitions_another_process_added_meanwhile_are_taken_as_added(
    client_config: ClientConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two coordinators expanding SCHEDULE at once: the one the controller refuses
    # (INVALID_PARTITIONS) finds them in metadata, once, and goes on.
    catalog = TopicCatalog(namespace=client_config.namespace)
    spec = dataclasses.replace(catalog.spec(SystemTopic.SCHEDULE), partitions=4)
    admin = TopicAdmin(client_config)
    admin.ensure_topics([dataclasses.replace(spec, partitions=2)])
    admin.ensure_topics([spec], expand=True)  # the other process
    lookups: list[str] = []
    has_partitions = admin._has_partitions

    def counted(looked_up: TopicSpec) -> bool:
        lookups.append(looked_up.kafka_name)
        return has_partitions(looked_up)

    monkeypatch.setattr(admin, "_has_partitions", counted)
    admin._add_partitions(spec, 2)  # what this process saw before the other one's change
    assert lookups == [spec.kafka_name]
    assert admin.list_topics()[spec.kafka_name] == 4


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


def test_an_existing_system_topic_with_create_time_is_refused_with_the_fix(
    client_config: ClientConfig,
) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    admin = TopicAdmin(client_config)
    schedule = catalog.spec(SystemTopic.SCHEDULE)
    admin.ensure_topics(
        [
            TopicSpec(
                schedule.kafka_name, schedule.partitions, {"message.timestamp.type": "CreateTime"}
            )
        ]
    )
    with pytest.raises(TopicProvisioningError) as info:
        admin.ensure_system_topics(catalog)
    text = str(info.value)
    assert f"{schedule.kafka_name} has message.timestamp.type=CreateTime" in text, text
    assert "LogAppendTime required" in text, text
    fix = (
        f"kafka-configs.sh --bootstrap-server {client_config.bootstrap_servers} --alter "
        f"--entity-type topics --entity-name {schedule.kafka_name} "
        "--add-config message.timestamp.type=LogAppendTime"
    )
    assert fix in text, text
    # What that command does, through the admin API: then the check passes.
    resource = ConfigResource(
        "topic",
        schedule.kafka_name,
        incremental_configs=[
            ConfigEntry(
                "message.timestamp.type",
                "LogAppendTime",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    raw_admin = new_admin(client_config)
    raw_admin.incremental_alter_configs([resource])[resource].result(10)
    wait_until(lambda: _passes(admin, catalog), 30)


def _passes(admin: TopicAdmin, catalog: TopicCatalog) -> bool:
    try:
        admin.ensure_system_topics(catalog)
    except TopicProvisioningError:
        return False  # the new setting may take a moment to show in describe_configs
    return True


def test_a_coordinator_refuses_a_compacted_half_topic(client_config: ClientConfig) -> None:
    config = CoordinatorConfig(client=client_config, transaction_partitions=1)
    half = config.catalog.spec(SystemTopic.HALF)
    compacted = dataclasses.replace(half, configs={**half.configs, "cleanup.policy": "compact"})
    TopicAdmin(client_config).ensure_topics([compacted])
    coordinator = Coordinator(config, [_Counting()])
    with pytest.raises(
        TopicProvisioningError, match=r"has cleanup\.policy=compact, no compact"
    ) as info:
        coordinator.start()
    assert str(info.value).endswith(
        f"--entity-name {half.kafka_name} --add-config cleanup.policy=delete"
    )
    assert coordinator.state is ServiceState.SHUTDOWN_ALREADY


@pytest.mark.parametrize("system", [SystemTopic.CHECK_MAX, SystemTopic.QUARANTINE])
def test_a_parked_or_quarantine_topic_with_more_than_one_partition_is_refused(
    client_config: ClientConfig, system: SystemTopic
) -> None:
    # Replay and the parked and quarantine views read partition 0 only: records in other
    # partitions would be invisible to the operator.
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    admin = TopicAdmin(client_config)
    name = catalog.topic(system)
    admin.ensure_topics([dataclasses.replace(catalog.spec(system), partitions=3)])
    with pytest.raises(TopicProvisioningError) as refused:
        admin.ensure_system_topics(catalog)
    message = str(refused.value)
    assert name in message and "3 partitions" in message and "exactly 1" in message
    assert "kafka-topics.sh" in message and "--delete" in message
    with pytest.raises(TopicProvisioningError):  # whatever strict says
        admin.ensure_topics([catalog.spec(system)], strict=False)
