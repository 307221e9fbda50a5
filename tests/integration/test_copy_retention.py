"""A message written to its topic long after it was born is kept for the topic's retention from
then: the copy's record timestamp is when it was written, its born time a header.

Kafka's time retention deletes a segment once its newest record timestamp is older than the
topic's ``retention.ms``. A copy stamped with the born time of a message older than that (a
long-parked transaction, a replayed dead letter or quarantined message, a far timer) could be
deleted by the broker's next retention check, before anyone read it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Producer as RawProducer

from bridge import read_messages
from bridge.codec import BORN_TIMESTAMP_HEADER
from bridge.config import ClientConfig
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.quarantine import replay_quarantined
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig
from tests.conftest import wait_until
from tests.integration.test_quarantine import _quarantined_delayed_message
from topics.catalog import TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker

HOUR_MS = 3_600_000
RETENTION_MS = 600_000
"""The topics' ``retention.ms``: 10 minutes, far less than the message's age (an hour)."""


@pytest.fixture()
def retention_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker that runs its retention check every half second (the default is 5 minutes)."""
    broker = LocalKafka(
        LocalKafkaConfig(
            data_dir=tmp_path / "kafka",
            properties={"log.retention.check.interval.ms": "500"},
        )
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _low_watermark(config: ClientConfig, topic: str) -> int:
    reader = Consumer(
        {"bootstrap.servers": config.bootstrap_servers, "group.id": f"wm-{uuid.uuid4().hex}"}
    )
    try:
        low, _ = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        reader.close()


def test_a_message_replayed_an_hour_after_its_birth_outlives_the_topics_retention_check(
    retention_broker: LocalKafka,
) -> None:
    config = ClientConfig(
        bootstrap_servers=retention_broker.bootstrap_servers,
        namespace=f"ret{uuid.uuid4().hex[:8]}",
    )
    catalog = TopicCatalog(namespace=config.namespace, transaction_partitions=1)
    admin = TopicAdmin(config)
    admin.ensure_system_topics(catalog)
    # A segment rolls once its first record's timestamp is segment.ms old: a copy stamped with
    # its born time then sits alone in its segment (its transaction marker rolls a new one),
    # and nothing newer keeps that segment from the retention check. (With the default
    # segment.ms, 7 days, the same happens to a copy of a message born over a week ago.)
    retained = {"retention.ms": str(RETENTION_MS), "segment.ms": "60000"}
    admin.ensure_topics(
        [TopicSpec("orders", 1, configs=retained), TopicSpec("control", 1, configs=retained)]
    )
    born = int(time.time() * 1000) - HOUR_MS
    offset = _quarantined_delayed_message(
        config, catalog, "orders", 0, header_format=True, born_ms=born
    )

    replayed = replay_quarantined(config, offset)
    # The control: a record stamped an hour ago, as the replayed copy used to be, is deleted by
    # the broker's retention check (which shows the check ran since the replay).
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce("control", b"stamped an hour ago", timestamp=born)
    assert raw.flush(10) == 0
    wait_until(lambda: _low_watermark(config, "control") == 1, timeout_s=60)

    assert _low_watermark(config, "orders") == 0
    (msg,) = read_messages(config, ["orders"], timeout_ms=5000)
    assert (msg.msg_id, msg.body, replayed.msg_id) == ("ID-R", b"late", "ID-R")
    assert msg.born_timestamp_ms == born  # read from the copy's header
    assert msg.store_timestamp_ms is not None and msg.store_timestamp_ms >= born + HOUR_MS - 60_000
    assert BORN_TIMESTAMP_HEADER not in msg.properties
