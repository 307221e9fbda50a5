"""The quarantine copy of a consumed record: byte for byte, with headers naming the reason and
the origin (see :mod:`bridge.kafka.quarantine`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from bridge.codec import PreparedRecord
from bridge.codec import read_headers as read_record_headers
from bridge.errors import MalformedRecordError
from topics.catalog import SystemTopic, TopicCatalog

logger = logging.getLogger(__name__)

QUARANTINE_REASON: Final = "QUARANTINE_REASON"
QUARANTINE_SOURCE_TOPIC: Final = "QUARANTINE_SOURCE_TOPIC"
QUARANTINE_SOURCE_PARTITION: Final = "QUARANTINE_SOURCE_PARTITION"
QUARANTINE_SOURCE_OFFSET: Final = "QUARANTINE_SOURCE_OFFSET"
QUARANTINED_BY: Final = "QUARANTINED_BY"
QUARANTINED_AT_MS: Final = "QUARANTINED_AT_MS"
QUARANTINE_RESOLVED_OFFSET: Final = "QUARANTINE_RESOLVED_OFFSET"
"""On a marker record (no value): the QUARANTINE offset it resolves (replayed). Only a replay
writes it: a quarantined record's own headers of these names are kept renamed (see
:data:`ORIGINAL_HEADER_PREFIX`)."""
QUARANTINE_OMITTED_BYTES: Final = "QUARANTINE_OMITTED_BYTES"
"""On a copy kept without its value and headers (they did not fit): their size, bytes."""
ORIGINAL_HEADER_PREFIX: Final = "QUARANTINE_ORIGINAL:"
"""A quarantined record's own header whose name is one the quarantine topic uses (a record
quarantined twice, or a foreign one) is kept under this prefix, so that nothing it carries
passes for the bridge's (a replay marker above all); readers give it its own name back."""
_OURS: Final = frozenset(
    {
        QUARANTINE_REASON,
        QUARANTINE_SOURCE_TOPIC,
        QUARANTINE_SOURCE_PARTITION,
        QUARANTINE_SOURCE_OFFSET,
        QUARANTINED_BY,
        QUARANTINED_AT_MS,
        QUARANTINE_OMITTED_BYTES,
    }
)
_MAX_REASON_CHARS = 2000
_MAX_REASON_CHARS = 2000

RecordHeaders = Sequence[tuple[str, bytes | None]]


def read_headers(record: Any) -> tuple[list[tuple[str, bytes | None]], str | None]:
    """The headers of a consumed record and None, or ``[]`` and why they cannot be read (see
    :func:`bridge.codec.read_headers`: call it once per record, before anything else reads
    its headers)."""
    try:
        return list(read_record_headers(record) or []), None
    except MalformedRecordError as exc:
        return [], str(exc)


def _ours(name: str) -> bool:
    return name.startswith(("QUARANTINE", "QUARANTINED"))


def quarantine_copy(
    catalog: TopicCatalog,
    record: Any,
    reason: str,
    quarantined_by: str,
    *,
    headers: RecordHeaders | None = None,
    keep_value: bool = True,
) -> PreparedRecord:
    """The quarantine copy of the consumed ``record`` (logged): services add it to the Kafka
    transaction of the batch the record belonged to. Its ``msg_id`` is
    ``<topic>-<partition>-<offset>`` of ``record``; its timestamp is the record's, or 0 (the
    producer's clock).

    ``headers``: the record's headers when the caller has read them already (see
    :func:`read_headers`); otherwise they are read here. Headers that cannot be read are left
    out and the reason says so. Headers named like the quarantine topic's own are kept
    under :data:`ORIGINAL_HEADER_PREFIX`.

    ``keep_value=False`` makes the smallest copy, for a record whose full copy the topic
    refused (too large): no value and none of its headers, with their size in bytes in
    ``QUARANTINE_OMITTED_BYTES`` and the reason; its key and origin are kept.
    """
    if headers is None:
        kept, unreadable = read_headers(record)
        if unreadable is not None:
            reason = f"{reason}; copied without its headers, which could not be read ({unreadable})"
    else:
        kept = list(headers)
    kept = [(f"{ORIGINAL_HEADER_PREFIX}{k}" if _ours(k) else k, v) for k, v in kept]
    value = record.value()
    if not keep_value:
        omitted = len(value or b"") + sum(len(k) + len(v or b"") for k, v in kept)
        reason = (
            f"{reason[: _MAX_REASON_CHARS // 2]}; its value and headers ({omitted} bytes) are "
            "left out: the full copy did not fit"
        )
        kept = [(QUARANTINE_OMITTED_BYTES, str(omitted).encode())]
        value = None
    kept += [
        (QUARANTINE_REASON, reason[:_MAX_REASON_CHARS].encode()),
        (QUARANTINE_SOURCE_TOPIC, record.topic().encode()),
        (QUARANTINE_SOURCE_PARTITION, str(record.partition()).encode()),
        (QUARANTINE_SOURCE_OFFSET, str(record.offset()).encode()),
        (QUARANTINED_BY, quarantined_by.encode()),
        (QUARANTINED_AT_MS, str(time.time_ns() // 1_000_000).encode()),
    ]
    _, timestamp = record.timestamp()
    logger.warning(
        "quarantined %s[%d]@%d: %s", record.topic(), record.partition(), record.offset(), reason
    )
    return PreparedRecord(
        catalog.topic(SystemTopic.QUARANTINE),
        record.key(),
        value,
        kept,
        f"{record.topic()}-{record.partition()}-{record.offset()}",
        timestamp if timestamp and timestamp > 0 else 0,
    )


def is_replay_marker(value: bytes | None, props: dict[str, str | bytes]) -> bool:
    """Whether a QUARANTINE record is a replay's marker: no value and the resolved-offset
    header, which quarantine copies never carry under that name."""
    return value is None and QUARANTINE_RESOLVED_OFFSET in props


def header_text(value: str | bytes | None, default: str = "") -> str:
    """A header value as text (``default`` when missing; bytes decoded, bad bytes replaced)."""
    if value is None:
        return default
    return value if isinstance(value, str) else value.decode("utf-8", "replace")
