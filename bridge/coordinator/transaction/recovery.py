"""Recovery of the transaction service's HALF partitions after an assignment or a failed
Kafka transaction: read the OP records written since the oldest undecided half message (found
by time: HALF and OP use the broker's clock), then replay HALF from the committed offset.

An OP record that cannot be decoded (a newer schema during a rolling upgrade) still marks its
transaction (its Kafka key) decided; a recovery that cannot read what it needs fails and is
tried again rather than guessing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings
from bridge.coordinator.transaction.state import HalfPartition
from bridge.errors import KafkaClientError, UnknownSchemaError, WireFormatError
from bridge.kafka.clients import new_reader, read_record_at, translate_error
from bridge.message import now_ms
from bridge.transaction.model import OpEntry
from topics.naming import reader_group

logger = logging.getLogger(__name__)

_OP_SCAN_SLACK_MS = 60_000
"""Read OP records from this long before the oldest undecided half message (broker clock
differences between partition leaders)."""


_QUIET_FAILURES = 3
"""Retriable failures in a row of one partition's recovery logged at info level before they
are warned of: a HALF topic created a moment ago (a first start) has no leader for a second or
so, which a new user should not read as a fault."""


class Recovery:
    """Rebuilds the state of the service's HALF partitions from what Kafka committed, into
    its ``ledger``; ``consumer`` gives the service's consumer (None before it started)."""

    def __init__(
        self,
        ledger: HalfLedger,
        settings: HalfSettings,
        *,
        consumer: Callable[[], Consumer | None],
    ) -> None:
        self._ledger = ledger
        self._name = settings.name
        self._client = settings.config.client
        self._policy = settings.policy
        self._half = settings.half_topic
        self._op = settings.op_topic
        self._consumer = consumer
        self._timeout_s = self._client.request_timeout_ms / 1000
        self._failures: dict[int, int] = {}
        """Failed recoveries in a row, per HALF partition."""

    def recover(self, partitions: list[int]) -> None:
        """Rebuild the state of HALF ``partitions`` (those still assigned) from Kafka: the
        decisions in OP since the oldest undecided half message, then HALF from the committed
        offset. A partition whose recovery fails stays to be recovered (tried again on the
        next iteration)."""
        consumer = self._consumer()
        if consumer is None:
            return
        timeout_s = self._timeout_s
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self._half}
        reader = new_reader(
            self._client, reader_group("recovery", uuid.uuid4().hex[:12]), self._name
        )
        try:
            for p in partitions:
                try:
                    self._recover_partition(consumer, reader, p, p in assigned, timeout_s)
                except (KafkaException, KafkaClientError) as exc:
                    # E.g. a leader not elected yet: the partition stays to be recovered and
                    # is tried again on the next iteration.
                    failures = self._failures.get(p, 0) + 1
                    self._failures[p] = failures
                    typed = (
                        translate_error(exc, "recovery", KafkaClientError)
                        if isinstance(exc, KafkaException)
                        else exc
                    )
                    quiet = failures < _QUIET_FAILURES and typed.retriable
                    logger.log(
                        logging.INFO if quiet else logging.WARNING,
                        "%s: recovering HALF partition %d failed (%d in a row; tried again): %s",
                        self._name,
                        p,
                        failures,
                        exc,
                    )
                else:
                    self._failures.pop(p, None)
        finally:
            reader.close()

    def _recover_partition(
        self, consumer: Consumer, reader: Consumer, p: int, assigned: bool, timeout_s: float
    ) -> None:
        started = time.monotonic()
        if not assigned:
            self._ledger.recovered(p, None)
            return
        committed = consumer.committed([TopicPartition(self._half, p)], timeout_s)[0].offset
        # Asked with the service's consumer (its fetches wait at most 50 ms at the broker): a
        # new reader's first lookup can take most of a second, which a partition read up to
        # its end (the usual rebalance) would then pay for nothing.
        low, high = consumer.get_watermark_offsets(TopicPartition(self._half, p), timeout_s)
        start = committed if committed >= 0 else low
        state = HalfPartition(p, self._policy, position=start, catch_up_offset=high)
        if start < high:
            self._load_decisions(reader, state, start)
        consumer.seek(TopicPartition(self._half, p, start if start >= 0 else OFFSET_BEGINNING))
        self._ledger.recovered(p, state)
        logger.info(
            "%s: HALF partition %d recovered in %.2f s: reading from %d (end %d), "
            "%d decisions loaded",
            self._name,
            p,
            time.monotonic() - started,
            start,
            high,
            state.decided_count,
        )

    def _load_decisions(self, reader: Consumer, state: HalfPartition, start: int) -> None:
        """Mark the transactions decided since the half message at ``start``."""
        # A read that times out raises: the recovery is tried again, never guessed (a guess
        # too recent misses decisions and commits them twice).
        first = read_record_at(
            reader, TopicPartition(self._half, state.partition, start), self._timeout_s
        )
        since_ms = (first.timestamp()[1] if first is not None else now_ms()) - _OP_SCAN_SLACK_MS
        tp = reader.offsets_for_times(
            [TopicPartition(self._op, state.partition, max(since_ms, 0))], self._timeout_s
        )[0]
        if tp.error is not None:
            # The lookup failed (e.g. a leader moving): read as "no decisions", it would apply
            # them again. The recovery is tried again instead.
            raise KafkaException(tp.error)
        if tp.offset < 0:
            return
        reader.assign([tp])
        deadline = time.monotonic() + self._timeout_s
        while True:
            record = reader.poll(0.2)
            if record is None:
                if time.monotonic() > deadline:
                    raise KafkaClientError(
                        f"OP partition {state.partition}: no record nor its end within "
                        f"{self._client.request_timeout_ms} ms"
                    )
                continue
            deadline = time.monotonic() + self._timeout_s
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(error)
            try:
                entry = OpEntry.decode(record.value())
            except UnknownSchemaError as exc:
                self._undecodable_decision(state, record, exc)
                continue
            except WireFormatError as exc:
                # Not an OP record of any version (garbage, empty, a tombstone: written by
                # something else than a coordinator): it decides nothing. Read as a decision, it
                # would drop the transaction its key names, committed or not, unseen.
                logger.warning(
                    "%s: OP record at %d of partition %d is no decision, ignored: %s",
                    self._name,
                    record.offset(),
                    state.partition,
                    exc,
                )
                continue
            # Every decision read counts, even one naming a copy before ``start``: a second
            # half message under its id (a send stored twice, or forged; G12) written before
            # the decision but read after it is then known decided, not a new transaction.
            state.mark_decided(entry.transaction_id, max(entry.half_offset, start))

    def _undecodable_decision(self, state: HalfPartition, record: Any, exc: Exception) -> None:
        """An OP record of a schema this version does not know (a newer one, during a rolling
        upgrade) still decides its transaction: its Kafka key is the transaction id. Which copy it
        names is unknown, so it counts for every copy read during this recovery."""
        key = record.key()
        if not key:
            logger.warning(
                "%s: OP record at %d of partition %d cannot be read and has no key (%s)",
                self._name,
                record.offset(),
                state.partition,
                exc,
            )
            return
        tid = key.decode("utf-8", "replace")
        state.mark_decided(tid, state.catch_up_offset)
        logger.warning(
            "%s: OP record at %d of partition %d cannot be read (%s); transaction %s counts "
            "as decided",
            self._name,
            record.offset(),
            state.partition,
            exc,
            tid,
        )
