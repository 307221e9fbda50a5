"""Quarantine: where a record that cannot be decoded or delivered goes, byte for byte, with its
reason; and how an operator re-drives a quarantined delayed message.

A service that meets a malformed record in a system or retry topic, or a delayed message whose
delivery keeps failing for a permanent reason, writes :func:`quarantine_copy` (in the Kafka
transaction of the batch the record belonged to, where it has one) and moves on: the record
is neither dropped nor retried forever. The copy keeps value, key, timestamp and headers, and
adds headers naming the reason and the origin. :func:`replay_quarantined` delivers a
quarantined delayed message to its real topic once the cause is fixed, exactly once.

Guarantees kept here (see ``docs/guarantees.md``): G8, G9.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import PreparedRecord, decode_envelope, decode_headers, real_record
from bridge.codec import read_headers as read_record_headers
from bridge.config import ClientConfig
from bridge.errors import (
    BridgeError,
    BrokerUnreachableError,
    InvalidArgumentError,
    KafkaClientError,
    MalformedRecordError,
    SendError,
    WireFormatError,
)
from bridge.kafka.batch_writer import TransactionBatch, abort_quietly, kafka_error, write_batch
from bridge.kafka.clients import new_consumer, read_record_at, translate_error
from bridge.kafka.transactional import REMOVED_ON_DELIVERY, transactional_producer
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
_UNREACHABLE: Final = frozenset(
    {KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._RESOLVE}
)
_FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})

RecordHeaders = Sequence[tuple[str, bytes | None]]


class QuarantineReplayError(BridgeError):
    """A quarantined record could not be replayed."""


class QuarantineReplayKafkaError(QuarantineReplayError, KafkaClientError):
    """Kafka failed while a replay read the QUARANTINE topic (broker unreachable, ...)."""


class NotReplayableError(QuarantineReplayError, InvalidArgumentError):
    """The QUARANTINE offset holds no quarantined delayed message that can be delivered (no
    record, a marker, a record from another service, an undecodable or targetless one)."""


class AlreadyReplayedError(QuarantineReplayError):
    """The quarantined record was replayed before: it is not delivered again."""


class ReplayConflictError(QuarantineReplayError):
    """Another replay of the same QUARANTINE offset ran at the same time and won."""


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


def _text(value: str | bytes | None, default: str = "") -> str:
    if value is None:
        return default
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _int(value: str | bytes | None, default: int) -> int:
    try:
        return int(_text(value)) if value is not None else default
    except ValueError:
        return default


def is_replay_marker(value: bytes | None, props: dict[str, str | bytes]) -> bool:
    """Whether a QUARANTINE record is a replay's marker: no value and the resolved-offset
    header, which quarantine copies never carry under that name."""
    return value is None and QUARANTINE_RESOLVED_OFFSET in props


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
                reason=_text(props.get(QUARANTINE_REASON)),
                source_topic=_text(props.get(QUARANTINE_SOURCE_TOPIC)),
                source_partition=_int(props.get(QUARANTINE_SOURCE_PARTITION), -1),
                source_offset=_int(props.get(QUARANTINE_SOURCE_OFFSET), -1),
                quarantined_by=_text(props.get(QUARANTINED_BY)),
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


@dataclass(frozen=True, slots=True)
class ReplayedMessage:
    """Where :func:`replay_quarantined` delivered a quarantined message."""

    msg_id: str
    topic: str
    """The Kafka topic."""
    partition: int
    offset: int


def replay_quarantined(
    config: ClientConfig, offset: int, *, timeout_ms: int = 10_000
) -> ReplayedMessage:
    """Deliver the delayed message quarantined at QUARANTINE ``offset`` to its real topic
    (delay and delivery-attempt properties removed), after the cause was fixed.

    Exactly once, even when run twice at the same time: the message and a marker saying
    ``offset`` is resolved commit in one Kafka transaction whose transactional id is derived
    from ``offset``, so concurrent replays fence each other, and the marker is looked for once
    the transactional id is ours. Raises :class:`NotReplayableError` (nothing replayable at
    ``offset``), :class:`AlreadyReplayedError`, :class:`ReplayConflictError` (a concurrent
    replay won), or a :class:`~bridge.errors.KafkaClientError` if the target still refuses
    the message (then nothing was written). ``timeout_ms`` bounds each Kafka call.
    """
    if offset < 0:
        raise NotReplayableError(f"QUARANTINE offset must be 0 or more, got {offset}")
    catalog = TopicCatalog(namespace=config.namespace)
    topic = catalog.topic(SystemTopic.QUARANTINE)
    timeout_s = timeout_ms / 1000
    reader = new_consumer(
        config,
        f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}",
        "bridge-replay",
        enable_partition_eof=True,
    )
    try:
        real = _replayable(reader, catalog, topic, offset, timeout_s)
        try:
            # Fences a replay of this offset still running and waits for its transaction.
            producer = transactional_producer(
                config,
                "bridge-quarantine-replay",
                f"{config.namespace}.quarantine.replay.{offset}",
                timeout_s,
                message_timeout_ms=min(config.send_msg_timeout_ms, timeout_ms),
            )
        except KafkaException as exc:
            raise translate_error(exc, f"replaying QUARANTINE offset {offset}") from exc
        if _resolved(config, topic, offset, timeout_s):
            raise AlreadyReplayedError(f"QUARANTINE offset {offset} was replayed already")
        return _deliver(producer, real, topic, offset, timeout_s)
    finally:
        reader.close()


def _replayable(
    reader: Consumer, catalog: TopicCatalog, topic: str, offset: int, timeout_s: float
) -> PreparedRecord:
    """The real record of the quarantined delayed message at ``offset``."""
    record = read_record_at(reader, TopicPartition(topic, 0, offset), timeout_s)
    if record is None or record.offset() != offset:
        raise NotReplayableError(f"QUARANTINE offset {offset} holds no record")
    raw, unreadable = read_headers(record)
    props = decode_headers(raw)
    if unreadable is not None:
        raise NotReplayableError(f"QUARANTINE offset {offset}: headers unreadable ({unreadable})")
    if is_replay_marker(record.value(), props):
        raise NotReplayableError(f"QUARANTINE offset {offset} is a replay marker")
    source = _text(props.get(QUARANTINE_SOURCE_TOPIC))
    delayed = (catalog.topic(SystemTopic.SCHEDULE), catalog.topic(SystemTopic.TIMER))
    if source not in delayed:
        raise NotReplayableError(
            f"QUARANTINE offset {offset} was quarantined from {source or 'an unknown topic'}, "
            f"not from {' or '.join(delayed)}: only delayed messages can be replayed"
        )
    try:
        return real_record(decode_envelope(record.value()), catalog.namespace, REMOVED_ON_DELIVERY)
    except (WireFormatError, ValueError) as exc:
        raise NotReplayableError(
            f"QUARANTINE offset {offset} holds no deliverable message: {exc}"
        ) from exc


def _resolved(config: ClientConfig, topic: str, offset: int, timeout_s: float) -> bool:
    """True if a committed marker after ``offset`` says it was replayed. Reads up to the high
    watermark, waiting for transactions still open below it to end (a marker committed after
    an unrelated transaction began is not visible before that one ends)."""
    probe = new_consumer(
        config,
        f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}",
        "bridge-replay",
        isolation_level="read_uncommitted",
    )
    try:
        _, high = probe.get_watermark_offsets(
            TopicPartition(topic, 0), timeout=timeout_s, cached=False
        )
    except KafkaException as exc:
        raise translate_error(
            exc, f"reading the end of {topic}", default=QuarantineReplayKafkaError
        ) from exc
    finally:
        probe.close()
    if high <= offset + 1:
        return False
    scanner = new_consumer(
        config,
        f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}",
        "bridge-replay",
        enable_partition_eof=True,
    )
    try:
        scanner.assign([TopicPartition(topic, 0, offset + 1)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = scanner.poll(0.2)
            if record is None:
                continue
            error = record.error()
            if error is None:
                raw, _ = read_headers(record)
                marker = is_replay_marker(record.value(), decode_headers(raw))
                if marker and dict(raw).get(QUARANTINE_RESOLVED_OFFSET) == str(offset).encode():
                    return True
            elif error.code() == KafkaError._PARTITION_EOF:
                if (record.offset() or 0) >= high:
                    return False  # the end of what is committed, at or past the high watermark
            elif error.fatal() or not error.retriable():
                raise translate_error(
                    error, f"reading {topic} after offset {offset}", QuarantineReplayKafkaError
                )
    finally:
        scanner.close()
    raise QuarantineReplayError(
        f"could not read {topic} up to offset {high} within {timeout_s:.0f} s "
        "(a transaction is still open); try again"
    )


def _deliver(
    producer: Any, real: PreparedRecord, topic: str, offset: int, timeout_s: float
) -> ReplayedMessage:
    reports: dict[str, tuple[int, int]] = {}

    def delivered(err: KafkaError | None, kmsg: Any) -> None:
        if err is None and kmsg.topic() == real.kafka_topic:
            reports["real"] = (kmsg.partition(), kmsg.offset())

    marker = [
        (QUARANTINE_RESOLVED_OFFSET, str(offset).encode()),
        (QUARANTINE_REASON, f"replayed to {real.kafka_topic}".encode()),
        (QUARANTINED_BY, b"replay"),
        (QUARANTINED_AT_MS, str(time.time_ns() // 1_000_000).encode()),
    ]
    context = f"replaying QUARANTINE offset {offset} to {real.kafka_topic}"
    batch = TransactionBatch()
    batch.add(real, delivered)
    batch.add(PreparedRecord(topic, None, None, marker, f"{topic}-0-{offset}", 0, 0))

    def failed(exc: KafkaException) -> None:
        error = kafka_error(exc)
        if error is None or error.code() not in _FENCED:  # a fenced producer cannot abort
            abort_quietly(producer, timeout_s, lambda text: logger.info("%s: %s", context, text))

    if not write_batch(
        producer, batch, timeout_s=timeout_s, on_failure=failed, failures=(KafkaException,)
    ):
        assert batch.failure is not None
        if batch.error is not None and batch.error.code() in _FENCED:
            raise ReplayConflictError(
                f"another replay of QUARANTINE offset {offset} ran at the same time"
            ) from batch.failure
        raise translate_error(batch.failure, context, SendError) from batch.failure
    partition, real_offset = reports.get("real", (-1, -1))
    logger.info(
        "replayed QUARANTINE offset %d to %s[%d]@%d",
        offset,
        real.kafka_topic,
        partition,
        real_offset,
    )
    return ReplayedMessage(real.msg_id, real.kafka_topic, partition, real_offset)
