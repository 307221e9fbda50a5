"""The local broker runtime: restarts keep data, clear errors when tools are missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.errors import BrokerStartError, MissingToolError
from bridge.runtime.jars import require_tool
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig

# One worker runs the module: its broker (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.xdist_group("test_runtime")]


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker of this module's own, so restarting it disturbs no other test."""
    broker = LocalKafka(LocalKafkaConfig(data_dir=tmp_path_factory.mktemp("own-kafka")))
    broker.start()
    yield broker
    broker.stop()


def test_clean_restart_keeps_topics_and_records(own_broker: LocalKafka) -> None:
    config = ClientConfig(bootstrap_servers=own_broker.bootstrap_servers)
    with Producer("pg", config=config) as producer:
        sent = [producer.send_sync(Message("durable", f"m{i}")).msg_id for i in range(20)]
    port = own_broker.port
    own_broker.restart()
    assert own_broker.port == port
    received = [m.msg_id for m in read_messages(config, ["durable"], max_messages=20)]
    assert received == sent


def test_acknowledged_records_survive_a_sigkill_of_the_broker(own_broker: LocalKafka) -> None:
    config = ClientConfig(bootstrap_servers=own_broker.bootstrap_servers)
    with Producer("pg", config=config) as producer:
        sent = [producer.send_sync(Message("after-kill", f"m{i}")).msg_id for i in range(20)]
    own_broker.kill()
    assert not own_broker.is_running
    own_broker.start()
    received = [m.msg_id for m in read_messages(config, ["after-kill"], max_messages=20)]
    assert received == sent


def test_a_second_broker_on_a_taken_port_is_a_clear_error(
    own_broker: LocalKafka, tmp_path: Path
) -> None:
    other = LocalKafka(LocalKafkaConfig(data_dir=tmp_path / "other", port=own_broker.port))
    with pytest.raises(BrokerStartError, match=f"127.0.0.1:{own_broker.port} \\(port\\) is in use"):
        other.start()


def test_missing_java_or_maven_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MissingToolError, match="'mvn' was not found on PATH: install Apache Maven"):
        require_tool("mvn", "Apache Maven 3.6+ (Debian: apt-get install maven)")
    broker = LocalKafka(LocalKafkaConfig(data_dir=Path("/nonexistent-dir-for-test")))
    with pytest.raises(MissingToolError, match="'java' was not found"):
        broker.start()
