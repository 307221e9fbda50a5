"""Config validation and environment parsing; the lifecycle state machine; service threads."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from bridge.cli.output import JsonLogFormatter
from bridge.config import ClientConfig, is_secret_property
from bridge.coordinator import CoordinatorConfig
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.kafka.clients import (
    consumer_config,
    new_admin,
    new_consumer,
    new_producer,
    producer_config,
)
from bridge.lifecycle import TRANSITIONS, Lifecycle, ServiceState, ServiceThread
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec


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
        ({"kafka": {"enable.idempotence": "false"}}, "'enable.idempotence'"),
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


def test_settings_an_existing_system_topic_must_have() -> None:
    catalog = TopicCatalog(namespace="ns")
    schedule = catalog.spec(SystemTopic.SCHEDULE)
    good = {
        "message.timestamp.type": "LogAppendTime", "cleanup.policy": "delete",
        "retention.ms": "-1", "retention.bytes": "-1", "segment.bytes": "1000",
    }  # fmt: skip
    assert schedule.config_mismatches(good) == []
    bad = {
        "message.timestamp.type": "CreateTime", "cleanup.policy": "compact,delete",
        "retention.ms": "60000", "retention.bytes": "1000000",
    }  # fmt: skip
    found = {m.setting: m for m in schedule.config_mismatches(bad)}
    assert sorted(found) == sorted(bad)
    assert (found["message.timestamp.type"].actual, found["message.timestamp.type"].fix) == (
        "CreateTime", "LogAppendTime",
    )  # fmt: skip
    assert found["cleanup.policy"].fix == "delete"
    assert found["retention.ms"].fix == schedule.configs["retention.ms"]
    assert found["retention.bytes"].fix == "-1"
    # Parked and quarantined records: how long to keep them is the operator's choice.
    quarantine = catalog.spec(SystemTopic.QUARANTINE)
    assert quarantine.config_mismatches({**good, "retention.ms": "60000"}) == []
    assert [m.setting for m in quarantine.config_mismatches(bad)] == ["cleanup.policy"]
    assert TopicSpec("orders", 4).config_mismatches(bad) == []  # a user's topic is theirs


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


# --- client properties the design relies on --------------------------------------------------

# Every protected property, with a fragment of what its error says to use instead.
PROTECTED_PROPERTIES = [
    ("bootstrap.servers", "KAFKA_BOOTSTRAP_SERVERS"),
    ("metadata.broker.list", "KAFKA_BOOTSTRAP_SERVERS"),
    ("group.id", "PushConsumer(group)"),
    ("group.instance.id", "BRIDGE_COORDINATOR_ID"),
    ("auto.offset.reset", "consume_from_where"),
    ("enable.partition.eof", "sets it per consumer"),
    ("isolation.level", "always read_committed"),
    ("enable.auto.commit", "commits itself"),
    ("auto.commit.enable", "commits itself"),
    ("enable.idempotence", "always idempotent"),
    ("acks", "always acks=all"),
    ("request.required.acks", "always acks=all"),
    ("transactional.id", "BRIDGE_COORDINATOR_ID"),
    ("transaction.timeout.ms", "BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS"),
    ("partition.assignment.strategy", "eager"),
    ("group.protocol", "eager"),
    ("message.timeout.ms", "BRIDGE_SEND_MSG_TIMEOUT_MS"),
    ("delivery.timeout.ms", "BRIDGE_SEND_MSG_TIMEOUT_MS"),
    ("message.max.bytes", "BRIDGE_MAX_MESSAGE_BYTES"),
    ("linger.ms", "BRIDGE_LINGER_MS"),
    ("queue.buffering.max.ms", "BRIDGE_LINGER_MS"),
    ("partitioner", "murmur2"),
]


@pytest.mark.parametrize(("name", "instead"), PROTECTED_PROPERTIES)
def test_a_protected_kafka_property_is_refused_with_what_to_use_instead(
    name: str, instead: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ClientConfig(kafka={name: "x"})
    text = str(info.value)
    assert repr(name) in text and instead in text, text


@pytest.mark.parametrize(("name", "instead"), PROTECTED_PROPERTIES)
def test_a_protected_property_from_the_environment_names_the_variable(
    name: str, instead: str
) -> None:
    variable = "BRIDGE_KAFKA_" + name.upper().replace(".", "_")
    if name == "transaction.timeout.ms":
        return  # the coordinator's own setting: see the next test
    with pytest.raises(InvalidArgumentError) as info:
        ClientConfig.from_env({variable: "x"})
    assert variable in str(info.value) and instead in str(info.value)


def test_bridge_kafka_transaction_timeout_ms_is_only_the_coordinators_setting() -> None:
    env = {"BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS": "20000", "BRIDGE_KAFKA_CLIENT_RACK": "r1"}
    client = ClientConfig.from_env(env)
    assert dict(client.kafka) == {"client.rack": "r1"}
    assert CoordinatorConfig.from_env(env).kafka_transaction_timeout_ms == 20000
    assert "transaction.timeout.ms" not in producer_config(client, "p")
    assert "transaction.timeout.ms" not in consumer_config(client, "g", "c")


def test_consumers_look_their_topics_up_every_30_s_unless_the_user_says_otherwise() -> None:
    """RocketMQ's route polling interval: a topic created after the subscription is found
    within it (librdkafka's own default, 5 minutes, left such a consumer idle)."""
    assert consumer_config(ClientConfig(), "g", "c")["topic.metadata.refresh.interval.ms"] == 30_000
    env = {"BRIDGE_KAFKA_TOPIC_METADATA_REFRESH_INTERVAL_MS": "5000"}
    conf = consumer_config(ClientConfig.from_env(env), "g", "c")
    assert conf["topic.metadata.refresh.interval.ms"] == "5000"


def test_the_bridge_still_sets_protected_properties_itself() -> None:
    conf = consumer_config(
        ClientConfig(), "g", "c", enable_partition_eof=True, group_instance_id="c1-timer",
        auto_offset_reset="latest",
    )  # fmt: skip
    assert (conf["enable.partition.eof"], conf["group.instance.id"]) == (True, "c1-timer")
    assert conf["auto.offset.reset"] == "latest"
    producer = producer_config(ClientConfig(), "p", transactional_id="t", transaction_timeout_ms=5)
    assert (producer["transactional.id"], producer["transaction.timeout.ms"]) == ("t", 5)


@pytest.mark.parametrize(
    ("kafka", "fragment"),
    [
        ({"no.such.property": "1"}, "'no.such.property' (BRIDGE_KAFKA_NO_SUCH_PROPERTY)"),
        ({"socket.timeout.ms": "soon"}, "'socket.timeout.ms' (BRIDGE_KAFKA_SOCKET_TIMEOUT_MS)"),
    ],
)
def test_a_property_librdkafka_refuses_is_a_typed_error_naming_it(
    kafka: dict[str, str], fragment: str
) -> None:
    config = ClientConfig(kafka=kafka)
    for make in (
        lambda: new_producer(config, "p"),
        lambda: new_consumer(config, "g", "c"),
        lambda: new_admin(config),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            make()
        assert fragment in str(info.value), str(info.value)


def test_invalid_delay_error_is_public() -> None:
    import bridge
    import bridge.delay.model
    import bridge.errors

    assert bridge.InvalidDelayError is bridge.errors.InvalidDelayError
    assert bridge.delay.model.InvalidDelayError is bridge.errors.InvalidDelayError
    assert issubclass(bridge.errors.InvalidDelayError, bridge.errors.InvalidMessageError)
    assert "InvalidDelayError" in bridge.errors.__all__ and "InvalidDelayError" in bridge.__all__
    assert "InvalidDelayError" in (bridge.errors.__doc__ or "")


def test_group_names_of_the_bridge_itself_are_refused_for_users() -> None:
    from bridge.client.reader import read_messages
    from bridge.transaction.producer import TransactionMQProducer
    from topics.errors import InvalidTopicNameError

    config = ClientConfig(namespace="ns")
    with pytest.raises(InvalidTopicNameError, match="reserved"):
        next(read_messages(config, ["t"], group="ns.coordinator.schedule"))
    with pytest.raises(InvalidTopicNameError, match="reserved"):
        TransactionMQProducer("ns.transaction-check.g", None, config=config)


def test_secret_kafka_properties_never_appear_in_a_config_repr() -> None:
    secrets = {
        "sasl.password": "pw-1",
        "ssl.key.password": "pw-2",
        "sasl.oauthbearer.client.secret": "pw-3",
        "ssl.key.pem": "pw-4",
        "sasl.oauthbearer.config": "pw-5",
    }
    config = ClientConfig(kafka={"sasl.username": "alice", **secrets})
    for text in (repr(config), str(config), repr(CoordinatorConfig(client=config))):
        assert "alice" in text and "sasl.password" in text
        for value in secrets.values():
            assert value not in text
    assert "bootstrap_servers='127.0.0.1:9092'" in repr(config)


def test_the_jwt_bearer_assertion_s_private_key_and_passphrase_are_secrets() -> None:
    # librdkafka 2.10+ signs a JWT bearer assertion with a private key given inline, under a
    # passphrase: neither may be printed (config reprs, the console's health page).
    secrets = {
        "sasl.oauthbearer.assertion.private.key.pem": "-----BEGIN PRIVATE KEY----- pw-6",
        "sasl.oauthbearer.assertion.private.key.passphrase": "pw-7",
    }
    config = ClientConfig(kafka={"sasl.oauthbearer.assertion.private.key.file": "/k", **secrets})
    for text in (repr(config), str(config), repr(CoordinatorConfig(client=config))):
        assert "/k" in text
        for value in secrets.values():
            assert value not in text
    assert not is_secret_property("ssl.certificate.pem")
    assert not is_secret_property("ssl.ca.pem")


# --- JSON log lines ---------------------------------------------------------------------------


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        return "<Unprintable>"


def _json_line(msg: str, *args: object, **kwargs: Any) -> dict[str, object]:
    """What :class:`JsonLogFormatter` writes for one warning logged with ``kwargs``."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    logger = logging.getLogger("test.json_logs")
    handler = Collect()
    handler.setFormatter(JsonLogFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(msg, *args, **kwargs)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    (line,) = lines
    out = json.loads(line)
    assert isinstance(out, dict)
    return out


def test_a_json_log_line_keeps_the_stack_of_stack_info() -> None:
    out = _json_line("where am I", stack_info=True)
    assert out["message"] == "where am I"
    stack = out["stack"]
    assert isinstance(stack, str) and stack.startswith("Stack (most recent call last):")
    assert "test_a_json_log_line_keeps_the_stack_of_stack_info" in stack


def test_a_json_log_line_is_written_whatever_the_values_hold() -> None:
    cycle: list[object] = []
    cycle.append(cycle)
    out = _json_line(
        "order %s",
        "o-1",
        extra={"cycle": cycle, "keys": {(1, 2): "tuple key"}, "odd": _Unprintable(), "n": 3},
    )
    assert out["message"] == "order o-1" and out["n"] == 3  # what JSON holds stays as it is
    assert out["cycle"] == "[[...]]"
    assert out["keys"] == "{(1, 2): 'tuple key'}"
    assert out["odd"] == "<Unprintable>"
    bad_args = _json_line("%d items", "many")
    assert bad_args["message"] == "%d items % ('many',)"
