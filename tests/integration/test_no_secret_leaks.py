"""No secret appears anywhere: secured work at DEBUG level (Python logging with librdkafka's
own debug logs forwarded, the CLI with ``-vv`` and ``--command-config``, the Spark ingest
job's output), reprs of every config, and the texts of authorization errors and of a wrong
password. Secrets: a SCRAM password, the key store password, and a password written into a
Java ``sasl.jaas.config``."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.cli.broker import write_client_files
from bridge.coordinator import CoordinatorConfig
from bridge.errors import BridgeError
from bridge.kafka.acls import create_acls
from bridge.kafka.admin import TopicAdmin
from bridge.runtime.local_kafka import BROKER_PRINCIPAL, LocalKafka, LocalKafkaConfig
from spark_jobs.common import kafka_security_options
from spark_jobs.ingest import IngestConfig
from tests.conftest import REPO_ROOT, SPARK_JAVA_OPTIONS
from topics.acls import Deployment, acls_for
from topics.catalog import TopicSpec
from topics.client_security import read_properties_file, to_librdkafka

pytestmark = [pytest.mark.broker, pytest.mark.spark]

PASSWORD = f"leaky-{secrets.token_urlsafe(18)}"
LIBRDKAFKA_DEBUG = "security,broker,conf,protocol"
"""librdkafka's debug contexts: the SASL handshake, connections, the configuration dump."""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(
        LocalKafkaConfig(
            data_dir=tmp_path_factory.mktemp("secret-leaks"),
            secured=True,
            scram_users={"leaky": PASSWORD},
            tls_clients=("leaky",),
        )
    )
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="module")
def files(broker: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("clients")
    made = write_client_files(
        directory, broker.tls, {"leaky": PASSWORD}, (BROKER_PRINCIPAL, "leaky")
    )
    wrong = directory / "wrong.properties"
    wrong.write_text(made["leaky"].read_text().replace(PASSWORD, PASSWORD[::-1]))
    return {**made, "wrong": wrong}


@pytest.fixture(scope="module")
def granted(broker: LocalKafka, files: dict[str, Path]) -> tuple[str, str]:
    """(namespace, topic) on which ``leaky`` may produce, consume and operate."""
    ns = f"ns{uuid.uuid4().hex[:8]}"
    topic = f"leaks-{ns}"
    admin = ClientConfig(
        bootstrap_servers=str(broker.mtls_bootstrap_servers),
        namespace=ns,
        kafka=broker.client_settings(BROKER_PRINCIPAL),
    )
    TopicAdmin(admin).ensure_topics([TopicSpec(topic, 1), TopicSpec(f"forbidden-{ns}", 1)])
    deployment = Deployment(
        ns, (topic,), producer="leaky", consumers={f"g-{ns}": "leaky"}, spark="leaky",
        operator="leaky",
    )  # fmt: skip
    create_acls(admin, acls_for(deployment))
    return ns, topic


def secrets_of(broker: LocalKafka) -> dict[str, str]:
    return {"SCRAM password": PASSWORD, "key store password": broker.tls.password}


def assert_no_secret(texts: dict[str, str], broker: LocalKafka) -> None:
    leaks = [
        f"the {what} appears in {where}"
        for where, text in texts.items()
        for what, secret in secrets_of(broker).items()
        if secret in text
    ]
    assert leaks == []


def test_python_clients_at_debug_level_log_no_secret(
    broker: LocalKafka,
    files: dict[str, Path],
    granted: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # A CLI run in this process earlier (bridge.cli without -v) quiets librdkafka's logger.
    caplog.set_level(logging.DEBUG, logger="bridge.kafka.rdkafka")
    ns, topic = granted
    texts: dict[str, str] = {}
    raised: list[BaseException] = []
    for listener, servers, name in (
        ("sasl_ssl", broker.bootstrap_servers, "leaky"),
        ("mtls", str(broker.mtls_bootstrap_servers), "leaky-mtls"),
    ):
        settings = to_librdkafka(read_properties_file(files[name]))
        config = ClientConfig(
            bootstrap_servers=servers, namespace=ns, kafka={**settings, "debug": LIBRDKAFKA_DEBUG}
        )
        with Producer("leaky_pg", config=config) as producer:
            producer.send_sync(Message(topic, listener.encode()))
            try:  # no ACL on this topic
                producer.send_sync(Message(f"forbidden-{ns}", b"x"))
            except BridgeError as exc:
                raised.append(exc)
        assert len(list(read_messages(config, [topic], timeout_ms=3000))) >= 1
        texts[f"repr(ClientConfig) {listener}"] = repr(config)
        texts[f"repr(CoordinatorConfig) {listener}"] = repr(CoordinatorConfig(client=config))
        security = kafka_security_options(files[name], environ={})
        texts[f"repr(IngestConfig) {listener}"] = repr(
            IngestConfig(servers, "out", "ckpt", security=security)
        )
    wrong = ClientConfig(
        bootstrap_servers=broker.bootstrap_servers,
        namespace=ns,
        send_msg_timeout_ms=3000,
        kafka={**to_librdkafka(read_properties_file(files["wrong"])), "debug": LIBRDKAFKA_DEBUG},
    )
    try:
        with Producer("leaky_wrong", config=wrong) as producer:
            producer.send_sync(Message(topic, b"refused"))
    except BridgeError as exc:
        raised.append(exc)
    assert len(raised) == 3, raised  # two refused sends, one wrong password
    for i, error in enumerate(raised):
        texts[f"error {i}"] = "".join(traceback.format_exception(error)) + repr(error)
    texts["log"] = caplog.text
    texts["repr(LocalKafka config)"] = repr(broker.config)
    for log in sorted((broker.data_dir / "logs").glob("*")):
        texts[f"broker log {log.name}"] = log.read_text(errors="replace")
    # The check means something: librdkafka's debug lines were forwarded, SASL among them.
    assert "bridge.kafka.rdkafka" in caplog.text
    assert "SASL" in caplog.text or "sasl" in caplog.text
    assert_no_secret(texts, broker)


def _cli(files: dict[str, Path], name: str, servers: str, ns: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "KAFKA_"))}
    env["BRIDGE_KAFKA_DEBUG"] = LIBRDKAFKA_DEBUG
    command = [sys.executable, "-m", "bridge.cli", "-vv", "--namespace", ns, *args]
    command += ["-b", servers, "--command-config", str(files[name])]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=180, cwd=REPO_ROOT
    )
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def test_the_cli_at_debug_level_prints_no_secret(
    broker: LocalKafka, files: dict[str, Path], granted: tuple[str, str]
) -> None:
    ns, topic = granted
    mtls = str(broker.mtls_bootstrap_servers)
    texts = {
        "send sasl": _cli(files, "leaky", broker.bootstrap_servers, ns, "send", topic, "cli"),
        "send mtls": _cli(files, "leaky-mtls", mtls, ns, "send", topic, "cli-mtls"),
        "refused": _cli(
            files, "leaky", broker.bootstrap_servers, ns, "send", f"forbidden-{ns}", "x"
        ),
        "consume": _cli(
            files, "leaky", broker.bootstrap_servers, ns, "consume", topic, "--timeout-ms", "2000"
        ),
        "wrong password": _cli(files, "wrong", broker.bootstrap_servers, ns, "send", topic, "no"),
        "transactions": _cli(files, "leaky-mtls", mtls, ns, "transactions", "list"),
    }  # fmt: skip
    assert texts["send sasl"].startswith("exit 0") and "SEND_OK" in texts["send sasl"]
    assert texts["send mtls"].startswith("exit 0")
    assert texts["refused"].startswith("exit 1") and "SendAuthorizationError" in texts["refused"]
    # Refused authentication reaches librdkafka's metadata request as a transport failure:
    # exit 3, BrokerUnreachableError, as for every command.
    assert texts["wrong password"].startswith("exit 3"), texts["wrong password"][-2000:]
    assert "BrokerUnreachableError" in texts["wrong password"]
    assert " DEBUG " in texts["send sasl"]  # -vv logged, librdkafka's debug lines included
    assert "bridge.kafka.rdkafka" in texts["send sasl"]
    assert_no_secret(texts, broker)


@pytest.mark.parametrize(
    ("file", "hidden"),
    [("leaky", "sasl.jaas.config = [hidden]"), ("leaky-mtls", "ssl.keystore.password = [hidden]")],
)
def test_the_spark_ingest_job_prints_no_secret(
    broker: LocalKafka,
    files: dict[str, Path],
    granted: tuple[str, str],
    tmp_path: Path,
    file: str,
    hidden: str,
) -> None:
    ns, topic = granted
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRIDGE_", "KAFKA_"))}
    env["BRIDGE_COMMAND_CONFIG"] = str(files[file])
    servers = broker.bootstrap_servers if file == "leaky" else str(broker.mtls_bootstrap_servers)
    # Spark's driver logs at INFO to stderr, Kafka's client configuration dumps included.
    log4j = tmp_path / "log4j2.properties"
    log4j.write_text(
        "rootLogger.level = info\nrootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\nappender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d %p %c: %m%n\n"
        # The shell sets the root logger to WARN; these keep their own level.
        "logger.kafka.name = org.apache.kafka\nlogger.kafka.level = info\n"
        "logger.source.name = org.apache.spark.sql.kafka010\nlogger.source.level = debug\n"
        "logger.streaming.name = org.apache.spark.sql.execution.streaming\n"
        "logger.streaming.level = info\n"
    )
    env["PYSPARK_SUBMIT_ARGS"] = (
        f'--driver-java-options "-Dlog4j2.configurationFile=file:{log4j} {SPARK_JAVA_OPTIONS}" '
        "pyspark-shell"
    )
    command = [
        sys.executable, "-m", "spark_jobs.ingest", "--master", "local[1]",
        "--bootstrap-servers", servers, "--namespace", ns,
        "--topics", topic, "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT
    )
    output = done.stdout + done.stderr
    (tmp_path / "ingest.log").write_text(output)
    assert done.returncode == 0, output[-4000:]
    assert "ingest query" in output  # the job ran and logged
    # Kafka's client printed its configuration (at INFO, Spark's default), the secret hidden.
    assert hidden in output
    landed = list((tmp_path / "out").glob("*.parquet"))
    assert landed, output[-4000:]
    assert_no_secret({"ingest output": output}, broker)
