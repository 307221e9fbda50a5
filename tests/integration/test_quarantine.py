"""A malformed system record is quarantined byte for byte with its reason (G8)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewPartitions

from bridge import read_messages
from bridge.codec import decode_envelope, delayed_headers, encode_envelope
from bridge.config import ClientConfig
from bridge.errors import KafkaClientError, WireFormatError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin, new_consumer, new_producer
from bridge.kafka.quarantine import (
    AlreadyReplayedError,
    NotReplayableError,
    QuarantineReplayError,
    ReplayConflictError,
    ReplayedMessage,
    quarantine_copy,
    read_quarantine,
    replay_quarantined,
)
from bridge.message import MessageConst, MessageExt
from tests.conftest import wait_until
from tests.integration.test_cli import run_cli, run_cli_failing
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker


def quarantine(
    producer: Any, catalog: TopicCatalog, record: Any, reason: str, quarantined_by: str
) -> None:
    """Produce the quarantine copy of ``record``, as a service adds it to its transaction."""
    copy = quarantine_copy(catalog, record, reason, quarantined_by)
    producer.produce(
        copy.kafka_topic,
        copy.value,
        copy.key,
        headers=copy.headers,
        timestamp=copy.born_timestamp_ms,
    )


@pytest.mark.check("G8")
def test_malformed_half_record_is_quarantined_with_reason_and_origin(
    client_config: ClientConfig,
) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    TopicAdmin(client_config).ensure_system_topics(catalog)
    half = catalog.topic(SystemTopic.HALF)
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    good = encode_envelope("ID1", b"fine", {"REAL_TOPIC": "orders"}, 1, "h")
    raw.produce(half, b"\x00garbage", b"k1", headers=[("h1", b"v1")])
    raw.produce(half, good)
    raw.flush(10)

    consumer = new_consumer(client_config, "quarantine-test", "test")
    consumer.subscribe([half])
    producer = new_producer(client_config, "quarantine-test")
    decoded: list[MessageExt] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record = consumer.poll(1.0)
        if record is None or record.error() is not None:
            continue
        try:
            decoded.append(decode_envelope(record.value()))
        except WireFormatError as exc:
            quarantine(producer, catalog, record, str(exc), "test-service")
        if record.offset() == 1:
            break
    producer.flush(10)
    consumer.close()

    assert [m.msg_id for m in decoded] == ["ID1"]
    (kept,) = list(read_quarantine(client_config, max_records=1))
    assert kept.value == b"\x00garbage"
    assert kept.key == b"k1"
    assert kept.headers == {"h1": "v1"}
    assert "marker C3 01" in kept.reason
    assert (kept.source_topic, kept.source_partition, kept.source_offset) == (half, 0, 0)
    assert kept.quarantined_by == "test-service"

    cli = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "--namespace", client_config.namespace,
         "quarantine", "-b", client_config.bootstrap_servers],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"from {half}[0]@0 by test-service (8 bytes): expected a MessageEnvelope" in cli.stdout


BORN_MS = int(time.time() * 1000) - 60_000
"""The born time of the quarantined message (and its replayed record's timestamp): recent, as
a born time older than the topic's retention may be deleted right after the replay."""


def _quarantined_delayed_message(
    config: ClientConfig,
    catalog: TopicCatalog,
    target: str,
    queue_id: int,
    *,
    header_format: bool = False,
    born_ms: int = BORN_MS,
) -> int:
    """Quarantine a SCHEDULE record (an Avro envelope as the previous version wrote, or in the
    header format) as the coordinator does after its last delivery attempt; return its
    QUARANTINE offset."""
    schedule = catalog.topic(SystemTopic.SCHEDULE)
    props = {
        MessageConst.REAL_TOPIC: target,
        MessageConst.REAL_QUEUE_ID: str(queue_id),
        MessageConst.DELAY_TIME_LEVEL: "1",
        MessageConst.TAGS: "T",
        "DELIVERY_ATTEMPTS": "2",
        "DELIVERY_ERROR": "partition out of range",
        "color": "red",
    }
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    if header_format:
        # A property named like the quarantine's own headers comes back under its own name.
        props["QUARANTINE_REASON"] = "the user's"
        headers: list[tuple[str, str | bytes | None]] = [
            *delayed_headers([], "ID-R", "h", props, born_ms)
        ]
        raw.produce(schedule, b"late", b"k", partition=0, headers=headers)
    else:
        raw.produce(
            schedule, encode_envelope("ID-R", b"late", props, born_ms, "h"), b"k", partition=0
        )
    assert raw.flush(10) == 0
    consumer = new_consumer(config, f"replay-test-{target}", "test")
    consumer.subscribe([schedule])
    record = None
    deadline = time.monotonic() + 30
    while record is None and time.monotonic() < deadline:
        polled = consumer.poll(0.5)
        record = polled if polled is not None and polled.error() is None else None
    consumer.close()
    assert record is not None
    producer = new_producer(config, "replay-test")
    quarantine(producer, catalog, record, "delivery failed 3 times", "test-service")
    assert producer.flush(10) == 0
    kept = [k for k in read_quarantine(config, timeout_ms=2000) if k.source_topic == schedule]
    return kept[-1].offset


@pytest.fixture()
def catalog(client_config: ClientConfig) -> TopicCatalog:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    TopicAdmin(client_config).ensure_system_topics(catalog)
    return catalog


@pytest.mark.parametrize("header_format", [False, True], ids=["envelope", "headers"])
def test_a_quarantined_delayed_message_is_replayed_once_after_the_cause_is_fixed(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str, header_format: bool
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 1)])
    offset = _quarantined_delayed_message(
        client_config, catalog, topic, queue_id=2, header_format=header_format
    )
    with pytest.raises(KafkaClientError, match="QUARANTINE offset"):
        replay_quarantined(client_config, offset)  # partition 2 does not exist yet
    admin = new_admin(client_config)
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(10)
    TopicAdmin(client_config).wait_for_topics([topic])
    wait_until(lambda: TopicAdmin(client_config).list_topics()[topic] == 3)

    replayed = replay_quarantined(client_config, offset)

    assert (replayed.msg_id, replayed.topic, replayed.partition) == ("ID-R", topic, 2)
    (msg,) = read_messages(client_config, [topic], timeout_ms=3000)
    assert (msg.body, msg.msg_id, msg.queue_id, msg.tags) == (b"late", "ID-R", 2, "T")
    assert (msg.born_timestamp_ms, msg.born_host) == (BORN_MS, "h")
    assert msg.properties["color"] == "red"
    if header_format:
        assert msg.properties["QUARANTINE_REASON"] == "the user's"
        assert not {"QUARANTINE_SOURCE_TOPIC", "QUARANTINED_BY"} & set(msg.properties)
    gone = {"DELIVERY_ATTEMPTS", "DELIVERY_ERROR", MessageConst.DELAY_TIME_LEVEL}
    assert not gone & set(msg.properties), msg.properties
    assert MessageConst.REAL_TOPIC not in msg.properties
    with pytest.raises(AlreadyReplayedError):
        replay_quarantined(client_config, offset)
    assert [k.offset for k in read_quarantine(client_config, timeout_ms=1000)] == [offset]
    assert len(list(read_messages(client_config, [topic], timeout_ms=1000))) == 1


def test_concurrent_replays_of_one_offset_deliver_it_once(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str
) -> None:
    offset = _quarantined_delayed_message(client_config, catalog, topic, queue_id=-1)
    start = threading.Barrier(3)
    outcomes: list[object] = []

    def replay() -> None:
        start.wait()
        try:
            outcomes.append(replay_quarantined(client_config, offset))
        except QuarantineReplayError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=replay) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 3
    assert sum(isinstance(o, ReplayedMessage) for o in outcomes) == 1, outcomes
    assert all(
        isinstance(o, (ReplayedMessage, AlreadyReplayedError, ReplayConflictError))
        for o in outcomes
    )
    assert [m.body for m in read_messages(client_config, [topic], timeout_ms=3000)] == [b"late"]


def test_what_cannot_be_replayed_is_refused_with_a_typed_error(
    client_config: ClientConfig, catalog: TopicCatalog
) -> None:
    half = catalog.topic(SystemTopic.HALF)
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    raw.produce(half, b"\x00garbage")
    assert raw.flush(10) == 0
    consumer = new_consumer(client_config, "replay-refusal", "test")
    consumer.subscribe([half])
    record = None
    while record is None:
        polled = consumer.poll(1.0)
        record = polled if polled is not None and polled.error() is None else None
    consumer.close()
    producer = new_producer(client_config, "replay-refusal")
    quarantine(producer, catalog, record, "undecodable", "test-service")
    assert producer.flush(10) == 0
    (kept,) = read_quarantine(client_config, timeout_ms=2000)
    with pytest.raises(NotReplayableError, match="only delayed messages"):
        replay_quarantined(client_config, kept.offset)
    with pytest.raises(NotReplayableError, match="holds no record"):
        replay_quarantined(client_config, kept.offset + 1)
    with pytest.raises(NotReplayableError):
        replay_quarantined(client_config, -1)


def test_operators_replay_a_quarantined_message_from_the_command_line(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 1)])
    offset = _quarantined_delayed_message(client_config, catalog, topic, queue_id=0)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": client_config.bootstrap_servers,
        "BRIDGE_NAMESPACE": client_config.namespace,
    }
    listed = run_cli("quarantine", env=env)
    assert f"@{offset} from {catalog.topic(SystemTopic.SCHEDULE)}[0]" in listed, listed

    out = run_cli("quarantine", "replay", str(offset), env=env)

    assert f"replayed ID-R from quarantine offset {offset} to {topic}[0]@0" in out, out
    (msg,) = read_messages(client_config, [topic], timeout_ms=3000)
    assert (msg.body, msg.msg_id) == (b"late", "ID-R")
    again = run_cli_failing("quarantine", "replay", str(offset), env=env)
    assert "AlreadyReplayedError" in again.stderr, again.stderr
    assert len(list(read_messages(client_config, [topic], timeout_ms=1000))) == 1


@pytest.mark.parametrize("count", ["0", "-1"])
def test_listing_at_most_none_of_the_quarantine_is_bad_usage(
    client_config: ClientConfig, catalog: TopicCatalog, topic: str, count: str
) -> None:
    """Not "no quarantined records" and exit status 0 while a record is quarantined."""
    offset = _quarantined_delayed_message(client_config, catalog, topic, queue_id=0)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": client_config.bootstrap_servers,
        "BRIDGE_NAMESPACE": client_config.namespace,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bridge.cli", "quarantine", "--count", count],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stdout}{proc.stderr}"
    assert proc.stdout == "", proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"Error: Invalid value for '--count': {count} is not in the range x>=1.", last
    listed = run_cli("quarantine", "--count", "1", env=env)
    assert f"@{offset} from {catalog.topic(SystemTopic.SCHEDULE)}[0]" in listed, listed


def test_a_poison_record_carrying_quarantine_headers_is_listed_not_taken_for_a_marker(
    client_config: ClientConfig,
) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    TopicAdmin(client_config).ensure_system_topics(catalog)
    half = catalog.topic(SystemTopic.HALF)
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    foreign: list[tuple[str, str | bytes | None]] = [
        ("QUARANTINE_RESOLVED_OFFSET", b"0"),
        ("QUARANTINE_REASON", b"not ours"),
        ("QUARANTINED_BY", b"replay"),
    ]
    raw.produce(half, b"\x00poison", b"k", headers=foreign)
    assert raw.flush(10) == 0
    consumer = new_consumer(client_config, "quarantine-foreign", "test")
    consumer.assign([TopicPartition(half, 0, 0)])
    record = wait_until(lambda: (r := consumer.poll(0.5)) is not None and r, timeout_s=20)
    consumer.close()
    producer = new_producer(client_config, "quarantine-foreign")
    quarantine(producer, catalog, record, "undecodable", "test-service")
    assert producer.flush(10) == 0

    (kept,) = list(read_quarantine(client_config, timeout_ms=2000))
    assert kept.value == b"\x00poison"
    assert kept.reason == "undecodable" and kept.quarantined_by == "test-service"
    assert kept.source_topic == half
    # The original's headers come back under their own names, untouched.
    assert kept.headers == {k: v.decode() for k, v in foreign if isinstance(v, bytes)}
    # It is a quarantined record, not a marker: replay looks at it (and refuses it for what
    # it is: not a delayed message), and offset 0 does not count as replayed.
    with pytest.raises(NotReplayableError, match="not from"):
        replay_quarantined(client_config, kept.offset)


def test_replay_against_an_unreachable_broker_raises_a_typed_error() -> None:
    from bridge.kafka.quarantine.replay import _resolved
    from bridge.runtime.local_kafka import free_port

    config = ClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1500)
    with pytest.raises(KafkaClientError):
        _resolved(config, "rmq.QUARANTINE", 0, 1.5)


def test_listing_the_quarantine_of_an_unreachable_broker_raises_a_typed_error() -> None:
    from bridge.runtime.local_kafka import free_port

    config = ClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=1500)
    with pytest.raises(KafkaClientError, match="QUARANTINE"):
        list(read_quarantine(config, timeout_ms=3000))
