"""The operators' replay and drop commands, run as an operator runs them (a subprocess) against
a real broker: what they say when the message's real topic cannot take it, and the exit
status 4 (not found) for a record or message that does not exist."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer as RawProducer

from bridge import read_messages
from bridge.client.records import plain_record
from bridge.config import ClientConfig
from bridge.kafka.admin import TopicAdmin
from bridge.message import Message, MessageConst
from tests.integration.test_quarantine import _quarantined_delayed_message, catalog
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec
from topics.naming import dlq_topic

pytestmark = pytest.mark.broker

__all__ = ["catalog"]  # the fixture, used by name

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 4


def bridge_cli(
    config: ClientConfig, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        **variables,
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


def test_replaying_a_quarantine_offset_that_holds_no_record_exits_4(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str
) -> None:
    offset = _quarantined_delayed_message(client_config, catalog, topic, queue_id=0)

    proc = bridge_cli(client_config, "quarantine", "replay", "999999")

    assert proc.returncode == EXIT_NOT_FOUND, (proc.stdout, proc.stderr)
    quarantine = catalog.topic(SystemTopic.QUARANTINE)
    assert error_line(proc) == f"Error: no quarantined record at offset 999999 of {quarantine}"
    # The offset after the record is its transaction's commit marker: no record either.
    proc = bridge_cli(client_config, "quarantine", "replay", str(offset + 1))
    assert proc.returncode == EXIT_NOT_FOUND, (proc.stdout, proc.stderr)
    negative = bridge_cli(client_config, "quarantine", "replay", "--", "-1")
    assert negative.returncode == EXIT_USAGE, (negative.stdout, negative.stderr)
    assert "-1 is not in the range x>=0" in negative.stderr, negative.stderr


def test_replaying_in_a_namespace_that_quarantined_nothing_exits_4_at_once(
    client_config: ClientConfig,
) -> None:
    # No QUARANTINE topic: the reader waited BRIDGE_REQUEST_TIMEOUT_MS for it, then exit 1.
    # A long request timeout here, so that waiting for it shows whatever the machine's load
    # adds to the CLI's start-up (12 s once, in a full parallel run).
    empty = client_config.replace(namespace=f"none{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    proc = bridge_cli(empty, "quarantine", "replay", "3", BRIDGE_REQUEST_TIMEOUT_MS="60000")
    assert proc.returncode == EXIT_NOT_FOUND, (proc.stdout, proc.stderr)
    assert error_line(proc) == (
        f"Error: no quarantined record at offset 3: {empty.namespace}.QUARANTINE does not exist "
        f"(nothing was quarantined in namespace {empty.namespace})"
    )
    # The CLI's start-up and one metadata request, not the request timeout.
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("command", ["replay", "drop"])
def test_replaying_or_dropping_a_transaction_that_is_not_parked_exits_4(
    client_config: ClientConfig, catalog: TopicCatalog, command: str
) -> None:
    proc = bridge_cli(client_config, "transactions", command, "NO-SUCH-ID")

    assert proc.returncode == EXIT_NOT_FOUND, (proc.stdout, proc.stderr)
    assert error_line(proc) == (
        "Error: no parked, unresolved message with id 'NO-SUCH-ID' "
        "(replayed or dropped already, or never parked)"
    )


def test_replaying_a_dead_letter_id_the_group_does_not_have_exits_4_and_replays_nothing(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    group, origin = unique("g"), unique("t")
    dlq = dlq_topic(group, client_config.namespace)
    TopicAdmin(client_config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    letter = Message(f"%DLQ%{group}", b"dead")
    letter.put_system_property(MessageConst.RETRY_TOPIC, origin)
    record = plain_record(letter, dlq, "ID-DEAD", 1, b"h")
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    raw.produce(dlq, record.value, record.key, headers=list(record.headers))
    assert raw.flush(10) == 0

    proc = bridge_cli(
        client_config, "dlq", "replay", "--group", group, "--id", "ID-DEAD", "--id", "NO-SUCH"
    )

    assert proc.returncode == EXIT_NOT_FOUND, (proc.stdout, proc.stderr)
    assert error_line(proc) == (
        f"Error: consumer group '{group}' has no dead letter with id NO-SUCH; nothing replayed"
    )
    assert list(read_messages(client_config, [origin], timeout_ms=1000)) == []
    done = bridge_cli(client_config, "dlq", "replay", "--group", group, "--id", "ID-DEAD")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "replayed 1" in done.stdout, done.stdout
    (replayed,) = read_messages(client_config, [origin], timeout_ms=3000)
    assert (replayed.msg_id, replayed.body) == ("ID-DEAD", b"dead")


def test_replaying_dead_letters_to_a_kafka_internal_topic_names_it_and_replays_nothing(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """Not the send's "Broker: Invalid topic"; the letter bound for a good topic is not
    written either."""
    group, origin = unique("g"), unique("t")
    dlq = dlq_topic(group, client_config.namespace)
    TopicAdmin(client_config).ensure_topics([TopicSpec(dlq, 1), TopicSpec(origin, 1)])
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    for msg_id, topic in (("ID-GOOD", origin), ("ID-INTERNAL", "__consumer_offsets")):
        letter = Message(f"%DLQ%{group}", b"dead")
        letter.put_system_property(MessageConst.RETRY_TOPIC, topic)
        record = plain_record(letter, dlq, msg_id, 1, b"h")
        raw.produce(dlq, record.value, record.key, headers=list(record.headers))
    assert raw.flush(10) == 0

    proc = bridge_cli(client_config, "dlq", "replay", "--group", group)

    assert proc.returncode == EXIT_ERROR, (proc.stdout, proc.stderr)
    assert error_line(proc) == (
        f"Error: ReplayTargetError: replaying dead letters of {group}: __consumer_offsets is a "
        "Kafka internal topic (only the broker writes to it) (dead letters ID-INTERNAL); "
        "nothing replayed"
    )
    assert list(read_messages(client_config, [origin], timeout_ms=1000)) == []
