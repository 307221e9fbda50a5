"""Config validation and environment parsing; the lifecycle state machine; service threads."""

from __future__ import annotations

import threading

import pytest

from bridge.config import ClientConfig
from bridge.coordinator import CoordinatorConfig
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.lifecycle import TRANSITIONS, Lifecycle, ServiceState, ServiceThread
from topics.catalog import SystemTopic, TopicCatalog


def test_client_config_from_env_reads_kafka_and_bridge_names() -> None:
    config = ClientConfig.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
            "BRIDGE_NAMESPACE": "prod",
            "BRIDGE_SEND_MSG_TIMEOUT_MS": "5000",
            "BRIDGE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "UNRELATED": "x",
        }
    )
    assert config.bootstrap_servers == "k1:9092,k2:9092"
    assert config.namespace == "prod"
    assert config.send_msg_timeout_ms == 5000
    assert dict(config.kafka) == {"security.protocol": "SASL_SSL"}


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"bootstrap_servers": ""}, "bootstrap_servers"),
        ({"bootstrap_servers": "a:1,,b:2"}, "bootstrap_servers"),
        ({"send_msg_timeout_ms": 0}, "send_msg_timeout_ms must be positive"),
        ({"max_message_bytes": -1}, "max_message_bytes"),
        ({"linger_ms": -1}, "linger_ms must be non-negative"),
        ({"namespace": "bad_ns"}, "namespace"),
        ({"kafka": {"enable.idempotence": "false"}}, "set by the client itself"),
    ],
)
def test_invalid_client_config_names_the_field(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        ClientConfig(**kwargs)  # type: ignore[arg-type]


def test_non_integer_env_value_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="BRIDGE_LINGER_MS must be an integer"):
        ClientConfig.from_env({"BRIDGE_LINGER_MS": "soon"})


def test_coordinator_config_from_env() -> None:
    config = CoordinatorConfig.from_env(
        {"BRIDGE_TRANSACTION_PARTITIONS": "3", "BRIDGE_COORDINATOR_ID": "c1"}
    )
    assert config.transaction_partitions == 3
    assert config.coordinator_id == "c1"
    assert config.catalog.spec(SystemTopic.OP).partitions == 3
    with pytest.raises(InvalidArgumentError, match="transaction_partitions"):
        CoordinatorConfig(transaction_partitions=0)


def test_catalog_specs() -> None:
    catalog = TopicCatalog(namespace="ns", delay_level_count=18)
    assert catalog.spec(SystemTopic.SCHEDULE).partitions == 18
    assert catalog.spec(SystemTopic.HALF).partitions == catalog.spec(SystemTopic.OP).partitions
    assert catalog.spec(SystemTopic.CHECK_MAX).configs["retention.ms"] == "-1"
    assert catalog.spec(SystemTopic.HALF).record_schema == "MessageEnvelope"
    assert [s.kafka_name for s in catalog.group_specs("g_1")] == ["ns.RETRY.g__1", "ns.DLQ.g__1"]
    with pytest.raises(InvalidArgumentError, match="72 h"):
        TopicCatalog(half_retention_ms=1000)


def test_lifecycle_follows_the_transition_table() -> None:
    life = Lifecycle("thing")
    assert life.state is ServiceState.CREATE_JUST
    with pytest.raises(IllegalStateError, match="not RUNNING"):
        life.require_running()
    life.transition(ServiceState.RUNNING)
    life.require_running()
    with pytest.raises(IllegalStateError, match="start\\(\\) may be called once"):
        life.transition(ServiceState.RUNNING)
    life.transition(ServiceState.SHUTDOWN_ALREADY)
    for target in ServiceState:
        with pytest.raises(IllegalStateError):
            life.transition(target)
    assert TRANSITIONS[ServiceState.SHUTDOWN_ALREADY] == frozenset()


class _Flaky(ServiceThread):
    def __init__(self) -> None:
        super().__init__("test-flaky", interval_ms=1)
        self.calls = 0
        self.thread_names: set[str] = set()
        self.third_call = threading.Event()

    def run_once(self) -> None:
        self.calls += 1
        self.thread_names.add(threading.current_thread().name)
        if self.calls >= 3:
            self.third_call.set()
        if self.calls % 2:
            raise RuntimeError("boom")


def test_service_thread_survives_exceptions_and_is_named() -> None:
    with _Flaky() as service:
        assert service.third_call.wait(10), "the loop stalled after an exception"
    assert service.state is ServiceState.SHUTDOWN_ALREADY
    assert service.thread_names == {"test-flaky"}
    with pytest.raises(IllegalStateError):
        service.start()


def test_service_interval_must_be_positive() -> None:
    with pytest.raises(InvalidArgumentError, match="interval_ms"):
        _BadInterval()


class _BadInterval(ServiceThread):
    def __init__(self) -> None:
        super().__init__("bad", interval_ms=0)

    def run_once(self) -> None:
        """Never runs."""
