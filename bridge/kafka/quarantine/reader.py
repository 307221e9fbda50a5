"""Reading the QUARANTINE topic back (see :mod:`bridge.kafka.quarantine`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, KafkaException

from bridge.codec import decode_headers
from bridge.config import ClientConfig
from bridge.errors import BrokerUnreachableError, KafkaClientError
from bridge.kafka.clients import new_consumer, translate_error
from bridge.kafka.quarantine.copy import (
    _OURS,
    ORIGINAL_HEADER_PREFIX,
    QUARANTINE_OMITTED_BYTES,
    QUARANTINE_REASON,
    QUARANTINE_SOURCE_OFFSET,
    QUARANTINE_SOURCE_PARTITION,
    QUARANTINE_SOURCE_TOPIC,
    QUARANTINED_AT_MS,
    QUARANTINED_BY,
    header_text,
    is_replay_marker,
    read_headers,
)
from topics.catalog import SystemTopic, TopicCatalog

_UNREACHABLE: Final = frozenset(
    {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
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
    headers: dict[str, str | bytes]
    """The original record's headers (text when UTF-8, else bytes)."""
    offset: int
    """Offset in the QUARANTINE topic."""
    omitted_bytes: int = 0
    """Size of the value and headers left out because the full copy did not fit, bytes (0:
    kept whole)."""


def _int(value: str | bytes | None, default: int) -> int:
    try:
        return int(header_text(value)) if value is not None else default
    except ValueError:
        return default


def _original_headers(props: dict[str, str | bytes]) -> dict[str, str | bytes]:
    out: dict[str, str | bytes] = {}
    for name, value in props.items():
        if name.startswith(ORIGINAL_HEADER_PREFIX):
            out[name[len(ORIGINAL_HEADER_PREFIX) :]] = value
        elif name not in _OURS:
            out[name] = value
    return out


def read_quarantine(
    config: ClientConfig, *, timeout_ms: int = 5000, max_records: int | None = None
) -> Iterator[QuarantinedRecord]:
    """Every record in the QUARANTINE topic of ``config.namespace``, oldest first (replay
    markers left out). Raises :class:`~bridge.errors.KafkaClientError` (e.g.
    :class:`~bridge.errors.BrokerUnreachableError`) when the consumer fails for good, or
    when no broker answered and nothing was read within ``timeout_ms``."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.QUARANTINE)
    consumer = new_consumer(config, f"bridge-quarantine-reader-{uuid.uuid4().hex[:12]}", "bridge")
    consumer.subscribe([topic])
    count = 0
    seen = False
    unreachable: KafkaError | None = None
    try:
        try:  # an unreachable broker is an error, not an empty quarantine
            consumer.list_topics(topic, timeout=timeout_ms / 1000)
        except KafkaException as exc:
            raise translate_error(exc, f"reading {topic}", BrokerUnreachableError) from exc
        deadline = time.monotonic() + timeout_ms / 1000
        while (max_records is None or count < max_records) and time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.fatal():
                    raise translate_error(error, f"reading {topic}", KafkaClientError)
                if error.code() in _UNREACHABLE:
                    unreachable = error
                continue
            seen = True
            offset = record.offset()
            if offset is None:
                continue
            raw, _ = read_headers(record)
            props = decode_headers(raw)
            deadline = time.monotonic() + timeout_ms / 1000
            if is_replay_marker(record.value(), props):
                continue
            count += 1
            yield QuarantinedRecord(
                reason=header_text(props.get(QUARANTINE_REASON)),
                source_topic=header_text(props.get(QUARANTINE_SOURCE_TOPIC)),
                source_partition=_int(props.get(QUARANTINE_SOURCE_PARTITION), -1),
                source_offset=_int(props.get(QUARANTINE_SOURCE_OFFSET), -1),
                quarantined_by=header_text(props.get(QUARANTINED_BY)),
                quarantined_at_ms=_int(props.get(QUARANTINED_AT_MS), 0),
                value=record.value(),
                key=record.key(),
                headers=_original_headers(props),
                offset=offset,
                omitted_bytes=_int(props.get(QUARANTINE_OMITTED_BYTES), 0),
            )
        if not seen and unreachable is not None:
            # Not "nothing quarantined": the broker could not be asked.
            raise translate_error(unreachable, f"reading {topic}", KafkaClientError)
    finally:
        consumer.close()
