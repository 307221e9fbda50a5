"""Headers another Kafka client wrote, binary or text, survive every copy byte for byte: the
retry copy through SCHEDULE and the coordinator, the dead-letter copy, and its replay."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer

from bridge import ClientConfig, MessageConst
from bridge.client.sender import RecordSender
from bridge.codec import message_from_record
from bridge.consumer.model import retry_route
from bridge.consumer.send_back import ReplayTarget, replay_record, send_back_record
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageExt

pytestmark = pytest.mark.broker

GROUP = "binary-group"
FOREIGN_HEADERS: list[tuple[str, str | bytes | None]] = [
    ("trace-bin", b"\xff\xfe\x00\x01"),
    ("text", "naïve ünïcode".encode()),
    ("schema-id", b"\x00\x00\x00\x00\x2a"),
    ("empty", b""),
]


@pytest.fixture()
def delay_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, message_delay_level="1s 2s"
    )


@pytest.fixture()
def coordinator(delay_config: ClientConfig) -> Iterator[Coordinator]:
    config = CoordinatorConfig(
        client=delay_config,
        coordinator_id="binary",
        transaction_partitions=1,
        session_timeout_ms=6000,
    )
    with Coordinator(config) as running:
        yield running


def raw_records(config: ClientConfig, kafka_topic: str, count: int) -> list[Any]:
    """The first ``count`` records of ``kafka_topic``, read by a plain Kafka consumer."""
    consumer = RawConsumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([kafka_topic])
    out: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                out.append(record)
    finally:
        consumer.close()
    assert len(out) == count, f"{len(out)} of {count} records in {kafka_topic} within 60 s"
    return out


def assert_foreign_headers_kept(record: Any) -> None:
    headers = dict(record.headers() or [])
    for name, raw in FOREIGN_HEADERS:
        assert headers.get(name) == raw, f"{name}: {headers.get(name)!r} != {raw!r}"


def written_by_another_client(config: ClientConfig, topic: str) -> MessageExt:
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce(topic, b"foreign body", b"foreign-key", headers=FOREIGN_HEADERS)
    assert raw.flush(30) == 0
    (record,) = raw_records(config, topic, 1)
    return message_from_record(record, config.catalog())


def assert_decoded_as_text_or_bytes(msg: MessageExt) -> None:
    assert msg.get_property("trace-bin") == b"\xff\xfe\x00\x01"
    assert msg.get_property("text") == "naïve ünïcode"
    assert msg.get_property("empty") == ""


@pytest.mark.check("G10")
def test_a_retry_copy_keeps_binary_headers_through_schedule_and_the_coordinator(
    delay_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    TopicAdmin(delay_config).ensure_topics(delay_config.catalog().group_specs(GROUP))
    msg = written_by_another_client(delay_config, topic)
    record = send_back_record(
        msg, GROUP, retry_route(0, 16, 1), 16, config=delay_config, born_host=b"10.0.0.9"
    )
    with RecordSender(delay_config, "pg") as sender:
        sender.send_record_sync(record)
    (retried,) = raw_records(delay_config, delay_config.catalog().retry_topic(GROUP), 1)
    assert_foreign_headers_kept(retried)
    assert retried.value() == b"foreign body"
    headers = dict(retried.headers())
    assert headers[MessageConst.RECONSUME_TIME] == b"1"
    assert headers[MessageConst.RETRY_TOPIC] == topic.encode()
    assert MessageConst.DELAY_TIME_LEVEL not in headers
    assert_decoded_as_text_or_bytes(msg)


def test_a_dead_letter_and_its_replays_keep_binary_headers(
    delay_config: ClientConfig, topic: str
) -> None:
    catalog = delay_config.catalog()
    TopicAdmin(delay_config).ensure_topics(catalog.group_specs(GROUP))
    msg = written_by_another_client(delay_config, topic)
    letter = send_back_record(
        msg, GROUP, retry_route(16, 16), 16, config=delay_config, born_host=b"10.0.0.9"
    )
    with RecordSender(delay_config, "pg") as sender:
        sender.send_record_sync(letter)
        (dead,) = raw_records(delay_config, catalog.dlq_topic(GROUP), 1)
        assert_foreign_headers_kept(dead)
        dead_msg = message_from_record(dead, catalog)
        for target in ReplayTarget:
            sender.send_record_sync(
                replay_record(dead_msg, GROUP, target, namespace=delay_config.namespace)
            )
    _, replayed = raw_records(delay_config, topic, 2)  # the original, then its replay
    assert_foreign_headers_kept(replayed)
    assert MessageConst.RETRY_TOPIC not in dict(replayed.headers())
    (to_retry,) = raw_records(delay_config, catalog.retry_topic(GROUP), 1)
    assert_foreign_headers_kept(to_retry)
    assert dict(to_retry.headers())[MessageConst.RETRY_TOPIC] == topic.encode()
    assert_decoded_as_text_or_bytes(dead_msg)
