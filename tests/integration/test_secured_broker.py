"""The bridge against the local secured broker: SASL_SSL (SCRAM-SHA-512) and mTLS listeners,
``StandardAuthorizer`` allowing only what an ACL allows.

Client security settings reach every client through ``BRIDGE_KAFKA_*`` (``ClientConfig.from_env``),
as they would in a deployment: the producer, the push consumer, the transactional producer
and the coordinator all connect as the same principal. Each flow runs over SASL_SSL (user
``alice``) and over mTLS (certificate ``CN=carol``).
"""

from __future__ import annotations

import logging
import secrets
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.consumer.admin import read_dead_letters
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import AuthorizationError, BridgeError, KafkaClientError, SendAuthorizationError
from bridge.kafka.acls import await_acls_shown
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.runtime.local_kafka import BROKER_PRINCIPAL, LocalKafka, LocalKafkaConfig
from tests.conftest import wait_until
from topics.catalog import TopicSpec

# One worker runs the module: its secured broker (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_secured_broker")]

# Passwords made per run: a leak cannot be mistaken for a fixed string in the code base.
ALICE_PASSWORD = f"alice-{secrets.token_urlsafe(18)}"
MALLORY_PASSWORD = f"mallory-{secrets.token_urlsafe(18)}"
LEVELS = "1s 1s 1s 1s 1s"
"""Delay level 1 and every retry level wait 1 s."""


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A secured broker: ``alice`` (SCRAM) and ``carol`` (certificate) may do anything through
    ACLs; ``mallory`` (SCRAM) may only write and read ``mallory-*`` topics."""
    broker = LocalKafka(
        LocalKafkaConfig(
            data_dir=tmp_path_factory.mktemp("secured-kafka"),
            secured=True,
            scram_users={"alice": ALICE_PASSWORD, "mallory": MALLORY_PASSWORD},
            tls_clients=("carol",),
        )
    )
    broker.start()
    try:
        grant_acls(broker)
        yield broker
    finally:
        broker.stop()


def grant_acls(broker: LocalKafka) -> None:
    """ACLs made with the broker's own identity (a super user)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {
            "bootstrap.servers": str(broker.mtls_bootstrap_servers),
            **broker.client_settings(BROKER_PRINCIPAL),
        }
    )
    allow, any_host = AclPermissionType.ALLOW, "*"
    bindings = [
        AclBinding(kind, name, pattern, f"User:{user}", any_host, AclOperation.ALL, allow)
        for user in ("alice", "carol")
        for kind, name, pattern in (
            (ResourceType.TOPIC, "*", ResourcePatternType.LITERAL),
            (ResourceType.GROUP, "*", ResourcePatternType.LITERAL),
            (ResourceType.TRANSACTIONAL_ID, "*", ResourcePatternType.LITERAL),
            (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL),
        )
    ]
    bindings += [
        AclBinding(
            ResourceType.TOPIC, "mallory-", ResourcePatternType.PREFIXED, "User:mallory",
            any_host, AclOperation.ALL, allow,
        ),
        AclBinding(
            ResourceType.GROUP, "*", ResourcePatternType.LITERAL, "User:mallory", any_host,
            AclOperation.ALL, allow,
        ),
    ]  # fmt: skip
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result()
    await_acls_shown(admin, bindings, 30_000)


def security_env(broker: LocalKafka, protocol: str) -> dict[str, str]:
    """The environment a deployment would set: where Kafka is and ``BRIDGE_KAFKA_*``."""
    if protocol == "sasl_ssl":
        servers = broker.bootstrap_servers
        settings = broker.client_settings("alice", ALICE_PASSWORD)
    else:
        servers = str(broker.mtls_bootstrap_servers)
        settings = broker.client_settings("carol")
    env = {"KAFKA_BOOTSTRAP_SERVERS": servers, "BRIDGE_MESSAGE_DELAY_LEVEL": LEVELS}
    for key, value in settings.items():
        env["BRIDGE_KAFKA_" + key.upper().replace(".", "_")] = value
    return env


@pytest.fixture(params=["sasl_ssl", "mtls"])
def secured_config(
    request: pytest.FixtureRequest,
    secured_broker: LocalKafka,
    monkeypatch: pytest.MonkeyPatch,
    namespace: str,
) -> ClientConfig:
    """Client settings read from the environment, in this test's own namespace."""
    for key, value in security_env(secured_broker, request.param).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("BRIDGE_NAMESPACE", namespace)
    config = ClientConfig.from_env()
    assert config.kafka["security.protocol"] == request.param.replace("mtls", "ssl").upper()
    return config


class CommitOnCheck(TransactionListener):
    """Leaves the transaction undecided; commits it when the coordinator checks."""

    def __init__(self) -> None:
        self.checks = 0

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        self.checks += 1
        return TransactionStatus.COMMIT


def bodies(config: ClientConfig, topic: str, count: int) -> list[str]:
    return sorted(
        m.body.decode()
        for m in read_messages(config, [topic], max_messages=count, timeout_ms=30_000)
    )


def test_plain_producer_and_push_consumer(
    secured_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic, group = unique("t"), unique("g")
    TopicAdmin(secured_config).ensure_topics([TopicSpec(topic, 1)])
    received: list[str] = []
    consumer = PushConsumer(
        group, config=secured_config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )  # fmt: skip

    def record(msg: MessageExt) -> ConsumeStatus:
        received.append(msg.body.decode())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer.subscribe(topic, record)
    with Producer("secured_pg", config=secured_config) as producer:
        result = producer.send_sync(Message(topic, b"over TLS", keys="k1"))
    assert result.offset == 0
    with consumer:
        wait_until(lambda: received == ["over TLS"], timeout_s=60)


def test_transaction_delay_and_retry_to_dlq_through_the_coordinator(
    secured_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic, group = unique("t"), unique("g")
    coordinator_config = CoordinatorConfig(
        client=secured_config, coordinator_id=f"c-{uuid.uuid4().hex[:8]}",
        transaction_partitions=1, transaction_timeout_ms=1500, check_interval_ms=1000,
        session_timeout_ms=6000,
    )  # fmt: skip
    deliveries: list[int] = []

    def always_later(msg: MessageExt) -> ConsumeStatus:
        deliveries.append(msg.reconsume_times)
        return ConsumeStatus.RECONSUME_LATER

    consumer = PushConsumer(
        group, config=secured_config, max_reconsume_times=1,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        send_back_retry_delay_ms=300, persist_consumer_offset_interval_ms=200,
    )  # fmt: skip
    # Created up front: a consumer sees a topic made later only at its next metadata refresh.
    TopicAdmin(secured_config).ensure_topics([TopicSpec(f"{topic}-retry", 1)])
    consumer.subscribe(f"{topic}-retry", always_later)
    listener = CommitOnCheck()
    with Coordinator(coordinator_config), consumer:
        # A transaction decided by a check: the check goes through the group's check topic,
        # the commit through the coordinator's Kafka transaction.
        with TransactionMQProducer("secured_tx", listener, config=secured_config) as tx:
            tx.send_message_in_transaction(Message(topic, b"committed"), None)
            wait_until(lambda: listener.checks >= 1, timeout_s=60)
        sent = time.monotonic()
        with Producer("secured_pg", config=secured_config) as producer:
            producer.send_sync(Message(topic, b"delayed", delay_time_level=1))
            producer.send_sync(Message(f"{topic}-retry", b"doomed"))
        assert bodies(secured_config, topic, 2) == ["committed", "delayed"]
        assert time.monotonic() - sent >= 1.0 - 0.2  # not before its level's delay
        # RECONSUME_LATER twice: once retried through the retry topic, then dead-lettered.
        wait_until(lambda: consumer.stats().dead_lettered == 1, timeout_s=60)
    assert deliveries == [0, 1]
    [letter] = read_dead_letters(secured_config, group)
    assert letter.body == b"doomed"
    assert letter.topic == f"%DLQ%{group}"


@pytest.fixture()
def mallory_config(secured_broker: LocalKafka, namespace: str) -> ClientConfig:
    """``mallory`` over SASL_SSL: may use ``mallory-*`` topics only."""
    return ClientConfig(
        bootstrap_servers=secured_broker.bootstrap_servers,
        namespace=namespace,
        kafka=secured_broker.client_settings("mallory", MALLORY_PASSWORD),
    )


def test_a_principal_without_an_acl_on_a_topic_gets_a_typed_error_naming_it(
    mallory_config: ClientConfig, secured_broker: LocalKafka, unique: Callable[[str], str]
) -> None:
    forbidden, own = unique("orders"), unique("mallory")
    with Producer("mallory_pg", config=mallory_config) as producer:
        # Allowed: the principal and the connection work.
        assert producer.send_sync(Message(own, b"mine")).offset == 0
        with pytest.raises(SendAuthorizationError) as refused:
            producer.send_sync(Message(forbidden, b"not mine"))
    error = refused.value
    assert isinstance(error, AuthorizationError) and isinstance(error, KafkaClientError)
    assert isinstance(error.kafka_error, KafkaError)
    assert error.kafka_error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "authorization failed" in str(error).lower()
    assert "TOPIC_AUTHORIZATION_FAILED" in str(error)
    assert forbidden in str(error)  # what it lacks: that topic
    # Nothing was written: the topic was not even created.
    admin = new_admin(
        ClientConfig(
            bootstrap_servers=secured_broker.bootstrap_servers,
            kafka=secured_broker.client_settings("alice", ALICE_PASSWORD),
        )
    )
    assert forbidden not in admin.list_topics(timeout=10).topics


def _secured_session(
    broker: LocalKafka, mallory: ClientConfig, unique: Callable[[str], str]
) -> tuple[ClientConfig, list[BaseException]]:
    """A SASL_SSL session as alice, plus mallory's refused send and a wrong password: every
    exception raised is returned."""
    env = security_env(broker, "sasl_ssl")
    config = ClientConfig.from_env({**env, "BRIDGE_NAMESPACE": mallory.namespace})
    raised: list[BaseException] = []
    topic = unique("t")
    with Producer("secrets_pg", config=config) as producer:
        producer.send_sync(Message(topic, b"hello"))
    assert [m.body for m in read_messages(config, [topic], max_messages=1)] == [b"hello"]
    with Producer("secrets_mallory", config=mallory) as producer:
        try:
            producer.send_sync(Message(unique("orders"), b"x"))
        except BridgeError as exc:
            raised.append(exc)
    wrong = config.replace(
        kafka={**config.kafka, "sasl.password": ALICE_PASSWORD[::-1]}, send_msg_timeout_ms=3000
    )
    try:
        with Producer("secrets_wrong", config=wrong) as producer:
            producer.send_sync(Message(topic, b"refused"))
    except BridgeError as exc:
        raised.append(exc)
    try:  # librdkafka refuses a property: the error quotes the settings it names
        with Producer("secrets_bad", config=ClientConfig.from_env(
            {**env, "BRIDGE_KAFKA_SASL_MECHANISM": "NO-SUCH-MECHANISM"}
        )):  # fmt: skip
            pass
    except BridgeError as exc:
        raised.append(exc)
    return config, raised


def test_the_scram_password_never_appears_in_logs_or_exception_texts(
    secured_broker: LocalKafka,
    mallory_config: ClientConfig,
    unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    _config, raised = _secured_session(secured_broker, mallory_config, unique)
    assert len(raised) == 3, raised  # mallory refused, wrong password, bad mechanism
    texts = [caplog.text]
    for exc in raised:
        texts.append(str(exc))
        texts.append(repr(exc))
        texts.append("".join(traceback.format_exception(exc)))
    texts.append(repr(secured_broker.config))
    texts.append(repr(secured_broker))
    for log in sorted((secured_broker.data_dir / "logs").glob("*")):
        texts.append(log.read_text(errors="replace"))
    for password in (ALICE_PASSWORD, MALLORY_PASSWORD):
        leaks = [i for i, text in enumerate(texts) if password in text]
        assert leaks == [], f"the SCRAM password appears in texts {leaks}"
    assert caplog.text  # something was captured to search


def test_the_scram_password_never_appears_in_a_client_config_repr(
    secured_broker: LocalKafka,
) -> None:
    config = ClientConfig.from_env(security_env(secured_broker, "sasl_ssl"))
    assert config.kafka["sasl.password"] == ALICE_PASSWORD  # it is there to leak
    assert ALICE_PASSWORD not in repr(config)
    assert ALICE_PASSWORD not in str(config)


def test_certificates_stay_in_the_data_dir_and_the_broker_refuses_plaintext(
    secured_broker: LocalKafka,
) -> None:
    tls = secured_broker.tls
    assert tls.directory == secured_broker.data_dir / "tls"
    assert (tls.directory.stat().st_mode & 0o777) == 0o700
    assert ((tls.directory / "secrets.json").stat().st_mode & 0o777) == 0o600
    assert ((secured_broker.data_dir / "server.properties").stat().st_mode & 0o777) == 0o600
    assert {p.name for p in tls.directory.iterdir()} >= {
        "ca.pem", "truststore.p12", f"{BROKER_PRINCIPAL}.p12", "carol.p12",
    }  # fmt: skip
    # No PLAINTEXT client may talk to either listener.
    for servers in (secured_broker.bootstrap_servers, secured_broker.mtls_bootstrap_servers):
        plain = ClientConfig(bootstrap_servers=str(servers), request_timeout_ms=3000)
        with pytest.raises(KafkaException):
            new_admin(plain).list_topics(timeout=3)
    assert Path(tls.ca_pem).read_text().startswith("-----BEGIN CERTIFICATE-----")
