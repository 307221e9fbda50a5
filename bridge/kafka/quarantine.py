"""Quarantine: where a record that cannot be decoded goes, byte for byte, with its reason.

A service that meets a malformed record in a system or retry topic calls :func:`quarantine`
with the producer it is working with (a transactional one, so the copy and the consumed offset
commit together) and moves on: the record is neither dropped nor retried forever. The copy
keeps value, key, timestamp and headers, and adds headers naming the reason and the origin.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from bridge.codec import decode_headers
from bridge.config import ClientConfig
from bridge.kafka.clients import new_consumer
from topics.catalog import SystemTopic, TopicCatalog

logger = logging.getLogger(__name__)

QUARANTINE_REASON: Final = "QUARANTINE_REASON"
QUARANTINE_SOURCE_TOPIC: Final = "QUARANTINE_SOURCE_TOPIC"
QUARANTINE_SOURCE_PARTITION: Final = "QUARANTINE_SOURCE_PARTITION"
QUARANTINE_SOURCE_OFFSET: Final = "QUARANTINE_SOURCE_OFFSET"
QUARANTINED_BY: Final = "QUARANTINED_BY"
QUARANTINED_AT_MS: Final = "QUARANTINED_AT_MS"
_MAX_REASON_CHARS = 2000


@dataclass(frozen=True, slots=True)
class QuarantineCopy:
    """The QUARANTINE record that keeps a consumed record with the reason and its origin."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int
    """The original record's timestamp, or 0 (the producer's clock)."""


def quarantine_copy(
    catalog: TopicCatalog, record: Any, reason: str, quarantined_by: str
) -> QuarantineCopy:
    """The quarantine copy of the consumed ``record`` (logged): services add it to the Kafka
    transaction of the batch the record belonged to."""
    headers: list[tuple[str, bytes | None]] = list(record.headers() or [])
    headers += [
        (QUARANTINE_REASON, reason[:_MAX_REASON_CHARS].encode()),
        (QUARANTINE_SOURCE_TOPIC, record.topic().encode()),
        (QUARANTINE_SOURCE_PARTITION, str(record.partition()).encode()),
        (QUARANTINE_SOURCE_OFFSET, str(record.offset()).encode()),
        (QUARANTINED_BY, quarantined_by.encode()),
        (QUARANTINED_AT_MS, str(time.time_ns() // 1_000_000).encode()),
    ]
    _, timestamp = record.timestamp()
    logger.warning(
        "quarantined %s[%d]@%d: %s",
        record.topic(),
        record.partition(),
        record.offset(),
        reason,
    )
    return QuarantineCopy(
        catalog.topic(SystemTopic.QUARANTINE),
        record.key(),
        record.value(),
        headers,
        timestamp if timestamp and timestamp > 0 else 0,
    )


def quarantine(
    producer: Any, catalog: TopicCatalog, record: Any, reason: str, quarantined_by: str
) -> None:
    """Produce the quarantine copy of the consumed ``record`` with ``producer`` (a
    confluent-kafka producer; in a transaction the copy commits with it)."""
    copy = quarantine_copy(catalog, record, reason, quarantined_by)
    producer.produce(
        copy.topic, copy.value, copy.key, headers=copy.headers, timestamp=copy.timestamp_ms
    )


@dataclass(frozen=True, slots=True)
class QuarantinedRecord:
    """A record read back from the QUARANTINE topic."""

    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    quarantined_by: str
    quarantined_at_ms: int
    value: bytes | None
    key: bytes | None
    headers: dict[str, str]
    """The original record's headers."""
    offset: int
    """Offset in the QUARANTINE topic."""


def read_quarantine(
    config: ClientConfig, *, timeout_ms: int = 5000, max_records: int | None = None
) -> Iterator[QuarantinedRecord]:
    """Every record in the QUARANTINE topic of ``config.namespace``, oldest first."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.QUARANTINE)
    consumer = new_consumer(config, f"bridge-quarantine-reader-{uuid.uuid4().hex[:12]}", "bridge")
    consumer.subscribe([topic])
    count = 0
    try:
        deadline = time.monotonic() + timeout_ms / 1000
        while (max_records is None or count < max_records) and time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is None or record.error() is not None:
                continue
            offset = record.offset()
            if offset is None:
                continue
            props = decode_headers(record.headers())
            ours = {
                QUARANTINE_REASON, QUARANTINE_SOURCE_TOPIC, QUARANTINE_SOURCE_PARTITION,
                QUARANTINE_SOURCE_OFFSET, QUARANTINED_BY, QUARANTINED_AT_MS,
            }  # fmt: skip
            count += 1
            deadline = time.monotonic() + timeout_ms / 1000
            yield QuarantinedRecord(
                reason=props.get(QUARANTINE_REASON, ""),
                source_topic=props.get(QUARANTINE_SOURCE_TOPIC, ""),
                source_partition=int(props.get(QUARANTINE_SOURCE_PARTITION, "-1")),
                source_offset=int(props.get(QUARANTINE_SOURCE_OFFSET, "-1")),
                quarantined_by=props.get(QUARANTINED_BY, ""),
                quarantined_at_ms=int(props.get(QUARANTINED_AT_MS, "0")),
                value=record.value(),
                key=record.key(),
                headers={k: v for k, v in props.items() if k not in ours},
                offset=offset,
            )
    finally:
        consumer.close()
