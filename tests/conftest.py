"""Shared fixtures: one real Kafka broker per test session, a unique topic per test.

The broker is, in order of preference: the one ``KAFKA_BOOTSTRAP_SERVERS`` names; a
testcontainers Kafka where a Docker engine answers; else the project's own local broker
(Apache Kafka jars from Maven Central, KRaft, on a free loopback port).

With pytest-xdist (``-n N``, as ``make test`` runs) the workers share that local broker: the
controlling process starts it in the background as the session begins (the workers run unit
tests meanwhile) and stops it at the end; each test keeps to its own namespace and topics. A
test that restarts, stops or reconfigures a broker starts one of its own. How a test declares
what it needs from the others (``xdist_group``, ``serial``) is in ``pytest_collection_modifyitems``
below and in docs/development.md.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.config import ClientConfig
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig, free_port
from bridge.runtime.node_config import JVM_OPTIONS
from tests.db_fixtures import database_url, db_engine, postgres_server  # noqa: F401

logger = logging.getLogger(__name__)

pytest_plugins = ["tests.suite_timing"]


def _docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


SPARK_JAVA_OPTIONS = " ".join(JVM_OPTIONS)
"""The Spark driver JVM's options in the tests: the local broker's (C1 alone, the serial
collector). The tests' queries are small, the JVM's start and its compiling most of the work:
measured on 2 cores, the Spark tests of two modules took 68-70 s of CPU with these, 108-114 s
with the JVM's defaults. A test that sets ``PYSPARK_SUBMIT_ARGS`` itself, or runs
``spark-submit``, passes them too."""
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{SPARK_JAVA_OPTIONS}" pyspark-shell'
)

SHARED_BROKER_READY = "BRIDGE_TEST_SHARED_BROKER"
"""Set by the controlling process of an xdist run for its workers: the file where it writes the
shared broker's address once the broker is up (or ``<file>.failed`` with why it is not)."""

SHARED_BROKER_WAIT_S = 300.0
"""How long a worker waits for the shared broker to come up (s)."""


class _SharedBroker:
    """The local broker an xdist run's workers share, started in a thread so the workers' unit
    tests run while it comes up."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bridge-tests-kafka-"))
        self.ready = self.root / "bootstrap"
        self.broker = LocalKafka(LocalKafkaConfig(data_dir=self.root / "kafka", port=free_port()))
        self.thread = threading.Thread(target=self._start, name="shared-broker", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            self.broker.start()
        except BaseException as exc:
            self.ready.with_suffix(".failed").write_text(f"{type(exc).__name__}: {exc}")
            return
        ready = self.ready.with_suffix(".tmp")
        ready.write_text(self.broker.bootstrap_servers)
        ready.rename(self.ready)

    def stop(self) -> None:
        self.thread.join(SHARED_BROKER_WAIT_S)
        try:
            self.broker.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _shares_a_broker(config: pytest.Config) -> bool:
    """True in the controlling process of an xdist run that should start the shared broker."""
    return (
        not hasattr(config, "workerinput")
        and bool(getattr(config.option, "numprocesses", 0))
        and not config.option.collectonly
        and not os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        and not os.environ.get(SHARED_BROKER_READY)
        and not _docker_engine_answers()
    )


def pytest_configure(config: pytest.Config) -> None:
    if _shares_a_broker(config):
        shared = _SharedBroker()
        config.stash[_SHARED_KEY] = shared
        os.environ[SHARED_BROKER_READY] = str(shared.ready)


def pytest_unconfigure(config: pytest.Config) -> None:
    shared = config.stash.get(_SHARED_KEY, None)
    if shared is not None:
        os.environ.pop(SHARED_BROKER_READY, None)
        shared.stop()


_SHARED_KEY = pytest.StashKey[_SharedBroker]()


def _await_shared_broker(ready: Path) -> str:
    deadline = time.monotonic() + SHARED_BROKER_WAIT_S
    while not ready.exists():
        failed = ready.with_suffix(".failed")
        if failed.exists():
            pytest.fail(f"the shared broker did not start: {failed.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the shared broker did not start within {SHARED_BROKER_WAIT_S} s")
        time.sleep(0.2)
    bootstrap = ready.read_text()
    logger.info("using the shared broker at %s", bootstrap)
    return bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of the session's broker."""
    shared = os.environ.get(SHARED_BROKER_READY)
    if shared:
        yield _await_shared_broker(Path(shared))
        return
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


UNIT_TESTS = Path(__file__).resolve().parent / "unit"
GUARANTEES = tuple((f"G{n}",) for n in range(1, 14))
"""What ``@pytest.mark.check(...)`` may name: one guarantee of docs/guarantees.md."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test`` (xdist, ``--dist loadgroup``) a test runs on any worker, beside
    others, on the shared broker, in its own namespace and topics (``namespace``, ``topic``,
    ``unique``, ``client_config``): a new test gets that by default and declares only what
    changes it:

    - ``@pytest.mark.spark``: the module's Spark tests run on one worker, one after another,
      so the module's session (and the broker a module of them starts) is built once; the
      modules themselves spread over the workers (one Spark group was the run's longest chain).
      ``xdist_group("spark-<module>")`` is added here.
    - ``@pytest.mark.xdist_group("name")``: tests that share something costly that a module
      builds once (its own cluster or broker, a module-scoped coordinator that many tests
      use) run on one worker, so it is built once: a worker tears a module's fixtures down
      whenever its next test is another module's, and workers run tests of many modules in
      turn. The tests of the ``authorizing_broker`` (a second broker) get one, added here.
    - ``@pytest.mark.serial``: a test that needs the machine to itself (a bound on lateness
      measured against the wall clock) runs after the parallel run, alone (``make test``
      runs ``-m "not serial"`` on the workers, then ``-m serial`` without them).

    Tests under ``tests/unit`` get the ``unit`` marker (``make check`` selects them).
    """
    for item in items:
        for mark in item.iter_markers("check"):
            if mark.args not in GUARANTEES:
                raise pytest.UsageError(
                    f"{item.nodeid}: check takes one guarantee of docs/guarantees.md "
                    f"(G1 ... G13), got {mark.args!r}"
                )
        if item.get_closest_marker("spark") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(f"spark-{item.path.stem}"))
        if "authorizing_broker" in getattr(item, "fixturenames", ()):
            # A session fixture: each worker that ran one of these would start a broker.
            item.add_marker(pytest.mark.xdist_group("authorizing-broker"))
        if UNIT_TESTS in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.unit)


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
