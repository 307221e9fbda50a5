"""The operators' replay and drop commands, run as an operator runs them (a subprocess) against
a real broker: what they say when the message's real topic cannot take it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bridge import read_messages
from bridge.config import ClientConfig
from bridge.kafka.admin import TopicAdmin
from tests.integration.test_quarantine import _quarantined_delayed_message, catalog
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker

__all__ = ["catalog"]  # the fixture, used by name

EXIT_ERROR = 1


def bridge_cli(config: ClientConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
    }
    return subprocess.run(
        [sys.executable, "-m", "bridge.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line of a failed command."""
    lines = proc.stderr.strip().splitlines()
    assert lines, (proc.returncode, proc.stdout)
    return lines[-1]


def test_replaying_a_quarantined_message_to_a_kafka_internal_topic_names_it(
    client_config: ClientConfig, catalog: TopicCatalog
) -> None:
    """Not the Kafka transaction's "topic authorization failed"."""
    offset = _quarantined_delayed_message(client_config, catalog, "__consumer_offsets", queue_id=0)

    proc = bridge_cli(client_config, "quarantine", "replay", str(offset))

    assert proc.returncode == EXIT_ERROR, (proc.stdout, proc.stderr)
    line = error_line(proc)
    assert line.startswith("Error: ReplayTargetError: "), line
    assert "__consumer_offsets is a Kafka internal topic" in line, line
    assert "authoriz" not in line.lower(), line
    assert "it stays quarantined" in line, line


def test_replaying_a_quarantined_message_to_a_partition_the_topic_lacks_names_both(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str
) -> None:
    """Not librdkafka's ``_INCONSISTENT``; nothing is written, and the message is still
    replayable once the partition exists."""
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 3)])
    offset = _quarantined_delayed_message(client_config, catalog, topic, queue_id=7)

    proc = bridge_cli(client_config, "quarantine", "replay", str(offset))

    assert proc.returncode == EXIT_ERROR, (proc.stdout, proc.stderr)
    line = error_line(proc)
    assert line.startswith("Error: ReplayTargetError: "), line
    assert f"partition 7 of topic {topic} does not exist (it has 3)" in line, line
    assert "_INCONSISTENT" not in line, line
    assert list(read_messages(client_config, [topic], timeout_ms=1000)) == []
    listed = bridge_cli(client_config, "quarantine")
    assert f"@{offset} from {catalog.topic(SystemTopic.SCHEDULE)}[0]" in listed.stdout, listed
