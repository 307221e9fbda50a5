"""``bridge topics create`` run as an operator runs it (a subprocess) against a real broker: a
partition count that is not a count is bad usage, and nothing is created."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bridge.config import ClientConfig
from bridge.kafka.admin import TopicAdmin

pytestmark = pytest.mark.broker

EXIT_USAGE = 2


@pytest.mark.parametrize("partitions", ["0", "-1", "-4"])
def test_creating_a_topic_with_fewer_than_one_partition_is_bad_usage(
    client_config: ClientConfig, topic: str, partitions: str
) -> None:
    """Not Kafka's INVALID_PARTITIONS (exit 1) for 0, nor a topic of the broker's default
    partition count for -1."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": client_config.bootstrap_servers}
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--namespace", client_config.namespace,
         "topics", "create", "--topic", topic, "--partitions", partitions],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip

    assert proc.returncode == EXIT_USAGE, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        f"Error: Invalid value for '--partitions': {partitions} is not in the range x>=1."
    ), last
    assert topic not in TopicAdmin(client_config).list_topics()
