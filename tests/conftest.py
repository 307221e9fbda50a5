"""Shared fixtures: one real Kafka broker per test session, a unique topic per test.

The broker is, in order of preference: the one ``KAFKA_BOOTSTRAP_SERVERS`` names; a
testcontainers Kafka where a Docker engine answers; else the project's own local broker
(Apache Kafka jars from Maven Central, KRaft, on a free loopback port).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ClientConfig
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig
from tests.db_fixtures import database_url, db_engine, postgres_server  # noqa: F401

logger = logging.getLogger(__name__)


def _docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of the session's broker."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        logger.info("using the broker at %s (KAFKA_BOOTSTRAP_SERVERS)", given)
        yield given
        return
    if _docker_engine_answers():
        from testcontainers.community.kafka import KafkaContainer

        container = (
            KafkaContainer()
            .with_kraft()
            # Transactions on a single node need these (the image defaults to 3).
            .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        )
        with container:
            yield container.get_bootstrap_server()
        return
    broker = LocalKafka(LocalKafkaConfig(data_dir=tmp_path_factory.mktemp("kafka")))
    broker.start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def authorizing_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of its own with an authorizer (``StandardAuthorizer``) that allows what no ACL
    mentions: tests deny what they need on topics only they use."""
    broker = LocalKafka(
        LocalKafkaConfig(
            data_dir=tmp_path_factory.mktemp("kafka-acl"),
            properties={
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "true",
            },
        )
    )
    broker.start()
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture()
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Make a name unique to this test: ``unique("orders")`` -> ``orders-test_x-1a2b3c4d``."""
    test = re.sub(r"[^a-zA-Z0-9-]", "-", request.node.name)[:60]

    def make(prefix: str) -> str:
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture()
def topic(unique: Callable[[str], str]) -> str:
    """A topic name no other test uses."""
    return unique("t")


@pytest.fixture()
def namespace() -> str:
    """A namespace no other test uses (system topics are per namespace)."""
    return f"ns{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def client_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    """Client settings for the session broker, in this test's own namespace."""
    return ClientConfig(bootstrap_servers=kafka_bootstrap, namespace=namespace)


def wait_until(
    condition: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


REPO_ROOT = Path(__file__).resolve().parents[1]
