"""Every entry point against the secured local broker, each principal holding exactly the ACLs
``bridge acls apply`` grants its role: the CLI (with ``--command-config``), the Python clients,
the coordinator and the Spark ingest job, over SASL_SSL (SCRAM-SHA-512) and over mTLS.

One principal per role: ``app`` (producer), ``txp`` (transactional producer), ``coord``
(coordinator), ``cons`` (consumer), ``spark`` (Spark job) and ``ops`` (operator), each both a
SCRAM user and a certificate (``CN=<name>``), so the ACLs hold on both listeners. The ACLs
are created by the CLI as the broker's own identity (a super user); checks read as it too.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

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
from bridge.cli.broker import write_client_files
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import SendAuthorizationError
from bridge.kafka.acls import create_acls
from bridge.kafka.admin import TopicAdmin
from bridge.runtime.local_kafka import BROKER_PRINCIPAL, LocalKafka, LocalKafkaConfig
from spark_jobs import dlq_report, transaction_audit
from spark_jobs.common import kafka_security_options, spark_session
from spark_jobs.ingest import IngestConfig, start_ingest
from tests.conftest import REPO_ROOT, wait_until
from topics.acls import Deployment, Operation, ResourceType, acls_for
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec
from topics.client_security import read_properties_file, to_librdkafka

pytestmark = [pytest.mark.broker, pytest.mark.spark]

ROLES = ("app", "txp", "coord", "cons", "spark", "ops", "app2", "txp2")
PASSWORDS = {name: f"{name}-{secrets.token_urlsafe(18)}" for name in ROLES}
LEVELS = "1s 1s 1s 1s 1s"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(
        LocalKafkaConfig(
            data_dir=tmp_path_factory.mktemp("secured-entry-points"),
            secured=True,
            scram_users=PASSWORDS,
            tls_clients=ROLES,
        )
    )
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def client_files(broker: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A properties file per principal (Java client names): ``<name>`` for SASL_SSL,
    ``<name>-mtls`` for mTLS, as ``bridge broker --secured`` writes them."""
    directory = tmp_path_factory.mktemp("clients")
    return write_client_files(directory, broker.tls, PASSWORDS, (BROKER_PRINCIPAL, *ROLES))


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # One JVM serves every test module's session and the first one fixes its class path:
    # every module asks for the Delta Lake jars too, whichever runs first.
    session = spark_session("bridge-secured-tests", master="local[1]", delta=True)
    session.conf.set("spark.sql.shuffle.partitions", "1")
    yield session
    session.stop()


@dataclass(frozen=True)
class Listener:
    """One of the broker's client listeners and the principals' files for it."""

    name: str
    servers: str
    files: dict[str, Path]
    super_servers: str

    def file(self, principal: str) -> Path:
        return self.files[principal if self.name == "sasl_ssl" else f"{principal}-mtls"]

    def config(self, principal: str, namespace: str) -> ClientConfig:
        """What an application of ``principal`` runs with (the file read as the CLI does)."""
        return ClientConfig(
            bootstrap_servers=self.servers,
            namespace=namespace,
            message_delay_level=LEVELS,
            kafka=to_librdkafka(read_properties_file(self.file(principal))),
        )

    def super_config(self, namespace: str) -> ClientConfig:
        """The broker's own identity (a super user) over mTLS: setting up and checking."""
        return ClientConfig(
            bootstrap_servers=self.super_servers,
            namespace=namespace,
            message_delay_level=LEVELS,
            kafka=to_librdkafka(read_properties_file(self.files[f"{BROKER_PRINCIPAL}-mtls"])),
        )

    def cli(self, principal: str, namespace: str, *args: str, ok: bool = True) -> str:
        """``bridge --namespace NS ARGS -b SERVERS --command-config FILE`` as a user runs it."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("BRIDGE_", "KAFKA_BOOTSTRAP_SERVERS"))
        }
        env["BRIDGE_MESSAGE_DELAY_LEVEL"] = LEVELS
        servers = self.super_servers if principal == BROKER_PRINCIPAL else self.servers
        config = (
            self.files[f"{BROKER_PRINCIPAL}-mtls"]
            if principal == BROKER_PRINCIPAL
            else self.file(principal)
        )
        command = [sys.executable, "-m", "bridge.cli", "--namespace", namespace, *args]
        command += ["-b", servers, "--command-config", str(config)]
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, env=env, timeout=180,
            cwd=REPO_ROOT,
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert (done.returncode == 0) == ok, output
        return output


@pytest.fixture(params=["sasl_ssl", "mtls"])
def listener(
    request: pytest.FixtureRequest, broker: LocalKafka, client_files: dict[str, Path]
) -> Listener:
    servers = (
        broker.bootstrap_servers if request.param == "sasl_ssl" else broker.mtls_bootstrap_servers
    )
    return Listener(request.param, str(servers), client_files, str(broker.mtls_bootstrap_servers))


class CommitOnCheck(TransactionListener):
    """Leaves the transaction undecided; commits it when the coordinator checks."""

    def __init__(self) -> None:
        self.executed = 0
        self.checks = 0

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        self.executed += 1
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        self.checks += 1
        return TransactionStatus.COMMIT


def bodies(config: ClientConfig, topic: str, count: int) -> list[str]:
    found = read_messages(config, [topic], max_messages=count, timeout_ms=3000)
    return sorted(m.body.decode() for m in found)


def test_every_feature_with_exactly_the_acls_bridge_acls_apply_grants(
    listener: Listener, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = f"ns{uuid.uuid4().hex[:8]}"
    topic, txg, cg = f"orders-{ns}", f"txg-{ns}", f"cg-{ns}"
    applied = listener.cli(
        BROKER_PRINCIPAL, ns, "acls", "apply", "--topic", topic, "--producer", "app",
        "--transactional", f"{txg}=txp", "--coordinator", "coord", "--consumer", f"{cg}=cons",
        "--spark", "spark", "--operator", "ops",
    )  # fmt: skip
    assert "ACLs applied" in applied
    # The operator provisions the real topic and the consumer group's retry and DLQ topics.
    created = listener.cli("ops", ns, "topics", "create", "--topic", topic, "--group", cg)
    assert f"created {topic}" in created
    coordinator = Coordinator(
        CoordinatorConfig(
            client=listener.config("coord", ns), coordinator_id=f"c-{ns}",
            transaction_partitions=1, transaction_timeout_ms=1500, check_interval_ms=1000,
            session_timeout_ms=6000,
        )
    )  # fmt: skip
    received: list[str] = []

    def consume(msg: MessageExt) -> ConsumeStatus:
        received.append(msg.body.decode())
        if msg.body == b"doomed":
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        cg, config=listener.config("cons", ns), max_reconsume_times=1,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        send_back_retry_delay_ms=300, persist_consumer_offset_interval_ms=200,
    )  # fmt: skip
    consumer.subscribe(topic, consume)
    listener_tx = CommitOnCheck()
    with coordinator:
        with consumer:
            # Plain, from the command line.
            sent = listener.cli("app", ns, "send", topic, "plain", "--keys", "k1")
            assert sent.startswith("SEND_OK")
            started = time.monotonic()
            with Producer("app_pg", config=listener.config("app", ns)) as producer:
                producer.send_sync(Message(topic, b"delayed", delay_time_level=1))
                timer = Message(topic, b"timer")
                timer.set_deliver_time_ms(int(time.time() * 1000) + 1500)
                producer.send_sync(timer)
                # A timer recalled by the producer's principal: never delivered.
                recalled = Message(topic, b"recalled")
                recalled.set_deliver_time_ms(int(time.time() * 1000) + 2500)
                handle = producer.send_sync(recalled).recall_handle
                assert handle is not None
                producer.recall_message(topic, handle)
                producer.send_sync(Message(topic, b"doomed"))
            # Transactional, decided by a check-back.
            with TransactionMQProducer(txg, listener_tx, config=listener.config("txp", ns)) as tx:
                tx.send_message_in_transaction(Message(topic, b"committed"), None)
                wait_until(lambda: listener_tx.checks >= 1, timeout_s=60)
            # Everything arrives; the doomed message once more through the retry topic, then
            # into the group's DLQ.
            wait_until(lambda: consumer.stats().dead_lettered == 1, timeout_s=90)
            wanted = ["committed", "delayed", "doomed", "doomed", "plain", "timer"]
            wait_until(lambda: sorted(received) == wanted, timeout_s=60)
            assert time.monotonic() - started >= 1.0 - 0.2
        # The operator's commands, while the coordinator runs.
        assert "transaction" in listener.cli("ops", ns, "health")
        listed = listener.cli("ops", ns, "transactions", "list")
        assert "0 undecided" in listed
        letters = listener.cli("ops", ns, "dlq", "list", "--group", cg)
        assert "1 dead letters" in letters and f"from={topic}" in letters
        consumed = listener.cli("ops", ns, "consume", topic, "--timeout-ms", "3000")
        assert consumed.count(f"{topic}[") == 5
        assert "waiting" in listener.cli("ops", ns, "delays", "status")
    # Nothing was refused along the way: the real topic holds the five, once each.
    check = listener.super_config(ns)
    assert bodies(check, topic, 10) == ["committed", "delayed", "doomed", "plain", "timer"]
    # Spark lands the committed messages, reading as the Spark job's principal.
    security = kafka_security_options(listener.file("spark"), environ={})
    assert security["kafka.security.protocol"] == listener.name.upper().replace("MTLS", "SSL")
    table = tmp_path / "table"
    query = start_ingest(
        spark,
        IngestConfig(
            bootstrap_servers=listener.servers, output=str(table),
            checkpoint=str(tmp_path / "ckpt"), topics=(topic,), security=security,
        ),
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    landed = sorted(bytes(r["body"]).decode() for r in spark.read.parquet(str(table)).collect())
    assert landed == ["committed", "delayed", "doomed", "plain", "timer"]
    # The reports read the system, retry and DLQ topics with the settings of the environment.
    monkeypatch.setenv("BRIDGE_COMMAND_CONFIG", str(listener.file("spark")))
    dead = [r for r in dlq_report.dlq_report(spark, listener.servers, ns) if r.kind == "dlq"]
    assert [(r.group, r.origin_topic, r.count) for r in dead] == [(cg, topic, 1)]
    [audited] = transaction_audit.transaction_audit(spark, listener.servers, ns)
    assert (audited.producer_group, audited.committed, audited.pending) == (txg, 1, 0)


def test_a_principal_missing_one_acl_gets_a_typed_error_naming_it_and_nothing_is_lost(
    listener: Listener, unique: Callable[[str], str]
) -> None:
    ns = f"ns{uuid.uuid4().hex[:8]}"
    topic, txg = unique("orders"), f"txg-{ns}"
    check = listener.super_config(ns)
    admin = TopicAdmin(check)
    admin.ensure_topics([TopicSpec(topic, 1)])
    catalog = TopicCatalog(namespace=ns)
    admin.ensure_topics([check.catalog().spec(s) for s in SystemTopic])
    half = catalog.topic(SystemTopic.HALF)
    grants = acls_for(
        Deployment(ns, (topic,), producer="app2", transactional_producers={txg: "txp2"})
    )
    missing_write = next(
        a
        for a in grants
        if a.principal == "User:app2" and a.name == topic and a.operation is Operation.WRITE
    )
    missing_half = next(
        a
        for a in grants
        if a.principal == "User:txp2" and a.name == half and a.operation is Operation.WRITE
    )
    # txp2 may still see HALF (DESCRIBE): only the write is missing.
    describe_half = type(missing_half)(
        missing_half.principal, missing_half.role, ResourceType.TOPIC, half, missing_half.pattern,
        Operation.DESCRIBE, "see it",
    )  # fmt: skip
    create_acls(check, [a for a in grants if a not in (missing_write, missing_half)])
    create_acls(check, [describe_half])

    # The CLI: one error line, the typed error naming the topic and what is missing.
    refused = listener.cli("app2", ns, "send", topic, "not yet", ok=False)
    assert "Error: SendAuthorizationError:" in refused
    assert topic in refused and "TOPIC_AUTHORIZATION_FAILED" in refused
    assert bodies(check, topic, 1) == []
    # A transactional send: refused before the local transaction runs, so no business state
    # exists without its message.
    listener_tx = CommitOnCheck()
    txp2 = listener.config("txp2", ns)
    with (
        TransactionMQProducer(txg, listener_tx, config=txp2) as tx,
        pytest.raises(SendAuthorizationError) as error,
    ):
        tx.send_message_in_transaction(Message(topic, b"half"), None)
    assert half in str(error.value)
    assert "TOPIC_AUTHORIZATION_FAILED" in str(error.value)
    assert listener_tx.executed == 0
    # Once granted, the same sends go through, once each.
    create_acls(check, [missing_write])
    assert listener.cli("app2", ns, "send", topic, "now").startswith("SEND_OK")
    assert bodies(check, topic, 2) == ["now"]


def test_bridge_broker_secured_from_the_command_line(tmp_path: Path) -> None:
    """``bridge broker --secured``: users from a file and the environment, never the command
    line; the printed client files grant ACLs, send over SASL_SSL and consume over mTLS."""
    alice, bob = f"alice-{secrets.token_urlsafe(12)}", f"bob-{secrets.token_urlsafe(12)}"
    users = tmp_path / "users.properties"
    users.write_text(f"alice={alice}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "KAFKA_"))}
    env["BRIDGE_SCRAM_USERS"] = f"bob={bob}"
    command = [
        sys.executable, "-m", "bridge.cli", "broker", "--secured", "--port", "0",
        "--data-dir", str(tmp_path / "kafka"), "--scram-users-file", str(users),
        "--tls-client", "carol",
    ]  # fmt: skip
    log = tmp_path / "broker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
        )
    try:
        wait_until(lambda: "client properties" in log.read_text(), timeout_s=180, interval_s=0.5)
        printed = log.read_text()
        sasl = printed.split("SASL_SSL (SCRAM-SHA-512)")[1].split()[0]
        mtls = printed.split("SSL (mTLS)")[1].split()[0]
        clients = tmp_path / "kafka" / "clients"
        assert str(clients) in printed and str(tmp_path / "kafka" / "tls" / "ca.pem") in printed
        files = {p.stem: p for p in clients.glob("*.properties")}
        assert set(files) == {"alice", "bob", "carol-mtls", f"{BROKER_PRINCIPAL}-mtls"}
        ns = f"ns{uuid.uuid4().hex[:8]}"
        topic = f"cli-{ns}"
        via = Listener("sasl_ssl", sasl, files, mtls)
        via.cli(
            BROKER_PRINCIPAL, ns, "acls", "apply", "--topic", topic, "--producer", "bob",
            "--consumer", f"cg-{ns}=carol", "--operator", "alice",
        )  # fmt: skip
        assert f"created {topic}" in via.cli("alice", ns, "topics", "create", "--topic", topic)
        assert via.cli("bob", ns, "send", topic, "hello").startswith("SEND_OK")
        by_cert = Listener("mtls", mtls, files, mtls)
        read = by_cert.cli("carol", ns, "consume", topic, "--group", f"cg-{ns}", "--count", "1")
        assert "body=b'hello'" in read
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    text = log.read_text()
    for password in (alice, bob):
        assert password not in text
        assert password not in " ".join(command)
