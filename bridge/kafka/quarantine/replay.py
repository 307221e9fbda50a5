"""An operator's replay of a quarantined delayed message to its real topic, exactly once (see
:mod:`bridge.kafka.quarantine`)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import (
    PreparedRecord,
    decode_envelope,
    decode_headers,
    header_delivery_record,
    is_header_format,
    real_record,
)
from bridge.config import ClientConfig
from bridge.errors import (
    AlreadyReplayedError,
    InvalidArgumentError,
    NotReplayableError,
    QuarantineReplayError,
    QuarantineReplayKafkaError,
    ReplayConflictError,
    SendError,
    WireFormatError,
)
from bridge.kafka.batch_writer import TransactionBatch, abort_quietly, kafka_error, write_batch
from bridge.kafka.clients import new_consumer, new_reader, read_record_at, translate_error
from bridge.kafka.quarantine.copy import (
    ORIGINAL_HEADER_PREFIX,
    QUARANTINE_REASON,
    QUARANTINE_RESOLVED_OFFSET,
    QUARANTINE_SOURCE_TOPIC,
    QUARANTINED_AT_MS,
    QUARANTINED_BY,
    header_text,
    is_replay_marker,
    read_headers,
)
from bridge.kafka.transactional import REMOVED_ON_DELIVERY, transactional_producer
from topics.catalog import SystemTopic, TopicCatalog

logger = logging.getLogger(__name__)

_FENCED: Final = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


@dataclass(frozen=True, slots=True)
class ReplayedMessage:
    """Where :func:`replay_quarantined` delivered a quarantined message."""

    msg_id: str
    topic: str
    """The Kafka topic."""
    partition: int
    offset: int


def read_quarantined(config: ClientConfig, offset: int, *, timeout_ms: int = 10_000) -> Any:
    """The QUARANTINE record at ``offset`` (a consumed ``confluent_kafka.Message``), or None
    when there is none there (past the end, or the offset of a transaction's commit marker).
    ``timeout_ms`` bounds the read."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.QUARANTINE)
    reader = _reader(config)
    try:
        return _read_at(reader, topic, offset, timeout_ms / 1000)
    finally:
        reader.close()


def replay_quarantined(
    config: ClientConfig,
    offset: int,
    *,
    timeout_ms: int = 10_000,
    record: Any = None,
    check: Callable[[PreparedRecord], None] | None = None,
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

    ``record``: the record at ``offset`` when the caller read it already
    (:func:`read_quarantined`), so it is not read again. ``check`` is called with the real
    record (:func:`quarantined_delivery`) before anything is written; what it raises stops
    the replay (``bridge quarantine replay`` refuses a target the topic's metadata says
    cannot take it).
    """
    if offset < 0:
        raise NotReplayableError(f"QUARANTINE offset must be 0 or more, got {offset}")
    catalog = TopicCatalog(namespace=config.namespace)
    topic = catalog.topic(SystemTopic.QUARANTINE)
    timeout_s = timeout_ms / 1000
    if record is None:
        reader = _reader(config)
        try:
            record = _read_at(reader, topic, offset, timeout_s)
        finally:
            reader.close()
    if record is None or record.topic() != topic or record.offset() != offset:
        raise NotReplayableError(f"QUARANTINE offset {offset} holds no record")
    real = quarantined_delivery(record, catalog)
    if check is not None:
        check(real)
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


def _reader(config: ClientConfig) -> Consumer:
    return new_reader(config, f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}", "bridge-replay")


def _read_at(reader: Consumer, topic: str, offset: int, timeout_s: float) -> Any:
    record = read_record_at(reader, TopicPartition(topic, 0, offset), timeout_s)
    return record if record is not None and record.offset() == offset else None


def quarantined_delivery(record: Any, catalog: TopicCatalog) -> PreparedRecord:
    """The real-topic record of the delayed message quarantined as ``record`` (a QUARANTINE
    record): what :func:`replay_quarantined` writes, its topic and partition those it is
    delivered to. Raises :class:`NotReplayableError` when it holds none: unreadable headers,
    a replay marker, a record quarantined from another topic than SCHEDULE or the timer
    topic, or one the codec cannot decode or route."""
    offset = record.offset()
    raw, unreadable = read_headers(record)
    props = decode_headers(raw)
    if unreadable is not None:
        raise NotReplayableError(f"QUARANTINE offset {offset}: headers unreadable ({unreadable})")
    if is_replay_marker(record.value(), props):
        raise NotReplayableError(f"QUARANTINE offset {offset} is a replay marker")
    source = header_text(props.get(QUARANTINE_SOURCE_TOPIC))
    delayed = (catalog.topic(SystemTopic.SCHEDULE), catalog.topic(SystemTopic.TIMER))
    if source not in delayed:
        raise NotReplayableError(
            f"QUARANTINE offset {offset} was quarantined from {source or 'an unknown topic'}, "
            f"not from {' or '.join(delayed)}: only delayed messages can be replayed"
        )
    try:
        original = _original_headers(raw)
        if is_header_format(original):
            return header_delivery_record(
                original, record.value(), catalog.namespace, REMOVED_ON_DELIVERY
            )
        return real_record(decode_envelope(record.value()), catalog.namespace, REMOVED_ON_DELIVERY)
    except (WireFormatError, InvalidArgumentError) as exc:  # what the codec raises for it
        raise NotReplayableError(
            f"QUARANTINE offset {offset} holds no deliverable message: {exc}"
        ) from exc


def _original_headers(
    headers: list[tuple[str, bytes | None]],
) -> list[tuple[str, bytes | None]]:
    """The headers the quarantined record had: the quarantine's own left out, those kept under
    :data:`ORIGINAL_HEADER_PREFIX` given their names back (see
    :func:`~bridge.kafka.quarantine.copy.quarantine_copy`)."""
    out: list[tuple[str, bytes | None]] = []
    for name, value in headers:
        if name.startswith(ORIGINAL_HEADER_PREFIX):
            out.append((name[len(ORIGINAL_HEADER_PREFIX) :], value))
        elif not name.startswith(("QUARANTINE", "QUARANTINED")):
            out.append((name, value))
    return out


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
    scanner = new_reader(
        config,
        f"bridge-quarantine-replay-{uuid.uuid4().hex[:12]}",
        "bridge-replay",
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
            elif not QuarantineReplayKafkaError.retriable_kafka_error(error):
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
