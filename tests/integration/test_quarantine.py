"""A malformed system record is quarantined byte for byte with its reason (G8)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer as RawProducer

from bridge.codec import decode_envelope, encode_envelope
from bridge.config import ClientConfig
from bridge.errors import WireFormatError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer, new_producer
from bridge.kafka.quarantine import quarantine, read_quarantine
from bridge.message import MessageExt
from topics.catalog import SystemTopic, TopicCatalog

pytestmark = pytest.mark.broker


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
