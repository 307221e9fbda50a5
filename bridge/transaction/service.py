"""The coordinator's transaction service: end-transaction handling and check-back.

One consumer (group ``<namespace>.coordinator.transaction``) reads the HALF topic; Kafka's
group protocol spreads its partitions over the running coordinators and moves a dead one's
partitions to the others. For each partition the service keeps a :class:`HalfPartition`.

Every decision is applied in one Kafka transaction that writes the real message (on commit),
the OP record, and the HALF offset from which a restart must read again (the oldest undecided
half message). So a crash at any point either applies a decision completely or not at all,
and a decision is applied at most once: each committed message reaches its real topic exactly
once (G2, G3). Checks run in a transaction of their own that writes a copy of the half message
with ``TRANSACTION_CHECK_TIMES`` + 1 (RocketMQ's put-back) and the check request.

Recovery of a partition: read OP records written since the oldest undecided half message
(found by time: HALF and OP use the broker's clock), then replay HALF from the committed offset.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import encode_envelope, envelope_to_message
from bridge.errors import BridgeError, WireFormatError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer, read_record_at
from bridge.kafka.quarantine import quarantine_copy
from bridge.kafka.transactional import ServiceConfig, TransactionalService
from bridge.message import MessageConst, now_ms
from bridge.transaction.model import (
    END_TRANSACTION_SCHEMA,
    ENVELOPE_SCHEMA,
    CheckRequest,
    EndTransaction,
    OpAction,
    OpEntry,
    TransactionStatus,
    committed_record,
)
from bridge.transaction.state import CheckAction, CheckPolicy, HalfPartition, PendingHalf
from topics.avro import default_registry
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

_POLL_TIMEOUT_S = 0.05
_BATCH = 500
_CHECKS_PER_CYCLE = 1000
_OP_SCAN_SLACK_MS = 60_000
"""Read OP records from this long before the oldest undecided half message (broker clock
differences between partition leaders)."""


@dataclass
class _Batch:
    """What one Kafka transaction writes: records, and callbacks for their delivery reports."""

    records: list[
        tuple[str, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int, Any]
    ] = field(default_factory=list)
    dirty: bool = False

    def add(
        self,
        topic: str,
        value: bytes | None,
        *,
        partition: int = -1,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
        timestamp: int = 0,
        on_delivery: Any = None,
    ) -> None:
        self.records.append((topic, partition, key, value, headers or [], timestamp, on_delivery))
        self.dirty = True


class TransactionService(TransactionalService):
    """End-transaction handling and ``CheckBackService`` for the HALF partitions this
    coordinator owns."""

    def __init__(
        self,
        config: ServiceConfig,
        policy: CheckPolicy | None = None,
        check_topic_partitions: int = 4,
    ) -> None:
        super().__init__("transaction", config)
        self.policy = policy or CheckPolicy()
        self.check_topic_partitions = check_topic_partitions
        self.catalog = config.catalog
        self._half = config.catalog.topic(SystemTopic.HALF)
        self._op = config.catalog.topic(SystemTopic.OP)
        self._partitions: dict[int, HalfPartition] = {}
        self._to_recover: set[int] = set()
        self._known_check_topics: set[str] = set()
        self._admin: TopicAdmin | None = None
        self.committed_transactions = 0
        """How many Kafka transactions this service committed (for tests and metrics)."""

    # --- lifecycle ----------------------------------------------------------------------
    def on_start(self) -> None:
        client = self.config.client
        self._admin = TopicAdmin(client)
        self.start_producer()
        self._consumer = new_consumer(
            client,
            f"{client.namespace}.coordinator.transaction",
            client_id=self.name,
            partition_assignment_strategy="range",
            fetch_wait_max_ms=50,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=f"{self.config.coordinator_id}-transaction",
        )
        self._consumer.subscribe([self._half], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._to_recover.add(tp.partition)
        logger.info(
            "%s: assigned HALF partitions %s", self.name, [tp.partition for tp in partitions]
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._partitions.pop(tp.partition, None)
            self._to_recover.discard(tp.partition)
        logger.info(
            "%s: revoked HALF partitions %s", self.name, [tp.partition for tp in partitions]
        )

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        if self._to_recover:
            self._recover(sorted(self._to_recover))
        first = consumer.poll(_POLL_TIMEOUT_S)
        records = [first] if first is not None else []
        if first is not None:
            records.extend(consumer.consume(_BATCH, 0))
        batch = _Batch()
        for record in records:
            self._handle(record, batch)
        self._commit(batch)
        checks = _Batch()
        now = now_ms()
        for state in list(self._partitions.values()):
            for pending in state.due(now, _CHECKS_PER_CYCLE):
                self._check_or_discard(state, pending, now, checks)
        self._commit(checks)

    def _handle(self, record: Any, batch: _Batch) -> None:
        error = record.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                logger.warning("%s: consumer error %s", self.name, error.str())
            return
        state = self._partitions.get(record.partition())
        if state is None or record.partition() in self._to_recover:
            return  # revoked meanwhile, or replayed after recovery
        offset = record.offset()
        try:
            name, fields = default_registry().decode_any(record.value())
            if name == ENVELOPE_SCHEMA:
                msg = envelope_to_message(fields)
                state.on_half(offset, record.timestamp()[1], record.value(), msg, now_ms())
                batch.dirty = True
            elif name == END_TRANSACTION_SCHEMA:
                self._on_end(state, offset, EndTransaction.from_record(fields), batch)
            else:
                raise WireFormatError(f"a {name} record does not belong in the HALF topic")
        except (WireFormatError, ValueError, KeyError) as exc:
            copy = quarantine_copy(self.catalog, record, str(exc), self.name)
            batch.add(
                copy.topic, copy.value, key=copy.key, headers=copy.headers,
                timestamp=copy.timestamp_ms,
            )  # fmt: skip
            state.on_other(offset)

    def _on_end(
        self, state: HalfPartition, offset: int, end: EndTransaction, batch: _Batch
    ) -> None:
        if end.status is TransactionStatus.UNKNOWN:
            state.on_other(offset)
            logger.debug("transaction %s: UNKNOWN from %s", end.transaction_id, end.producer_id)
            return
        pending = state.on_end(offset, end.transaction_id)
        if pending is None:
            logger.info(
                "transaction %s: %s from %s ignored (already decided or unknown)",
                end.transaction_id, end.status.value, end.producer_id,
            )  # fmt: skip
            return
        if end.status is TransactionStatus.COMMIT:
            self._write_real(pending, batch)
            self._write_op(state, pending, OpAction.COMMIT, batch)
        else:
            self._write_op(state, pending, OpAction.ROLLBACK, batch)
        state.resolve(pending)
        logger.debug("transaction %s: %s", end.transaction_id, end.status.value)

    def _write_real(self, pending: PendingHalf, batch: _Batch) -> None:
        real = committed_record(pending.message, self.catalog.namespace)
        batch.add(
            real.topic, real.value, partition=real.partition, key=real.key,
            headers=real.headers, timestamp=real.timestamp_ms,
        )  # fmt: skip

    def _write_op(
        self, state: HalfPartition, pending: PendingHalf, action: OpAction, batch: _Batch
    ) -> None:
        entry = OpEntry(
            half_partition=state.partition,
            half_offset=pending.offset,
            transaction_id=pending.transaction_id,
            msg_id=pending.message.msg_id,
            producer_group=pending.producer_group,
            action=action,
            decided_at_ms=now_ms(),
        )
        batch.add(
            self._op, entry.encode(), partition=state.partition, key=pending.transaction_id.encode()
        )

    def _check_or_discard(
        self, state: HalfPartition, pending: PendingHalf, now: int, batch: _Batch
    ) -> None:
        action = self.policy.action(pending.check_times, pending.born_ms, now)
        try:
            if action is CheckAction.DISCARD:
                self._discard(state, pending, batch)
            else:
                self._check(state, pending, now, batch)
        except BridgeError:
            # One failing check (e.g. its group's check topic cannot be created) must not
            # stall the others (RocketMQ #9500): it is tried again at the next interval.
            logger.exception("transaction %s: check failed; retrying later", pending.transaction_id)
            state.postpone(pending, now)

    def _with_check_times(self, pending: PendingHalf, check_times: int) -> bytes:
        msg = pending.message
        props = msg.properties
        props[MessageConst.TRANSACTION_CHECK_TIMES] = str(check_times)
        return encode_envelope(msg.msg_id, msg.body, props, msg.born_timestamp_ms, msg.born_host)

    def _discard(self, state: HalfPartition, pending: PendingHalf, batch: _Batch) -> None:
        logger.warning(
            "transaction %s (group %s) parked in %s after %d checks",
            pending.transaction_id, pending.producer_group,
            self.catalog.topic(SystemTopic.CHECK_MAX), pending.check_times,
        )  # fmt: skip
        batch.add(
            self.catalog.topic(SystemTopic.CHECK_MAX),
            self._with_check_times(pending, pending.check_times),
            key=pending.transaction_id.encode(),
        )
        self._write_op(state, pending, OpAction.DISCARD, batch)
        state.resolve(pending)

    def _check(self, state: HalfPartition, pending: PendingHalf, now: int, batch: _Batch) -> None:
        group = pending.producer_group
        topic = self.catalog.check_topic(group)
        if topic not in self._known_check_topics:
            assert_admin(self._admin).ensure_topics(
                [self.catalog.check_topic_spec(group, self.check_topic_partitions)]
            )
            self._known_check_topics.add(topic)
        old_offset = pending.offset
        state.checked(pending, now)
        copy = self._with_check_times(pending, pending.check_times)
        tid = pending.transaction_id

        def copy_delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is None:
                state.copy_written(tid, kmsg.offset())

        batch.add(
            self._half,
            copy,
            partition=state.partition,
            key=tid.encode(),
            on_delivery=copy_delivered,
        )
        request = CheckRequest(
            transaction_id=tid,
            msg_id=pending.message.msg_id,
            half_partition=state.partition,
            half_offset=old_offset,
            check_times=pending.check_times,
            message=copy,
        )
        batch.add(topic, request.encode(), key=tid.encode())
        logger.info(
            "transaction %s (group %s): check %d of %d",
            tid, group, pending.check_times, self.policy.transaction_check_max,
        )  # fmt: skip

    # --- Kafka transaction ----------------------------------------------------------------
    def _commit(self, batch: _Batch) -> None:
        if not batch.dirty or self._consumer is None:
            return
        producer = self._producer
        try:
            producer.begin_transaction()
            for topic, partition, key, value, headers, timestamp, on_delivery in batch.records:
                producer.produce(
                    topic, value, key, partition=partition, headers=headers,
                    timestamp=timestamp, on_delivery=on_delivery,
                )  # fmt: skip
            producer.flush(self.config.client.request_timeout_ms / 1000)
            offsets = [
                TopicPartition(self._half, p, state.checkpoint())
                for p, state in self._partitions.items()
                if p not in self._to_recover
            ]
            if offsets:
                producer.send_offsets_to_transaction(
                    offsets,
                    self._consumer.consumer_group_metadata(),
                    self.config.client.request_timeout_ms / 1000,
                )
            producer.commit_transaction(self.config.client.request_timeout_ms / 1000)
            self.committed_transactions += 1
        except KafkaException as exc:
            self._transaction_failed(exc)

    def _transaction_failed(self, exc: KafkaException) -> None:
        self.transaction_failed(exc)
        # State was changed optimistically: rebuild it from what Kafka committed.
        self._to_recover.update(self._partitions)
        self._partitions.clear()

    # --- recovery -----------------------------------------------------------------------------
    def _recover(self, partitions: list[int]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        timeout_s = self.config.client.request_timeout_ms / 1000
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self._half}
        reader = new_consumer(
            self.config.client, f"{self.name}-recovery-{uuid.uuid4().hex[:8]}", self.name,
            enable_partition_eof=True,
        )  # fmt: skip
        try:
            for p in partitions:
                try:
                    self._recover_partition(consumer, reader, p, p in assigned, timeout_s)
                except KafkaException as exc:
                    # E.g. a leader not elected yet: the partition stays to be recovered and
                    # is tried again on the next iteration.
                    logger.warning("%s: recovering HALF partition %d failed: %s", self.name, p, exc)
        finally:
            reader.close()

    def _recover_partition(
        self, consumer: Consumer, reader: Consumer, p: int, assigned: bool, timeout_s: float
    ) -> None:
        started = time.monotonic()
        if not assigned:
            self._to_recover.discard(p)
            return
        committed = consumer.committed([TopicPartition(self._half, p)], timeout_s)[0].offset
        low, high = consumer.get_watermark_offsets(TopicPartition(self._half, p), timeout_s)
        start = committed if committed >= 0 else low
        state = HalfPartition(p, self.policy, position=start, catch_up_offset=high)
        if start < high:
            self._load_decisions(reader, state, start)
        consumer.seek(TopicPartition(self._half, p, start if start >= 0 else OFFSET_BEGINNING))
        self._partitions[p] = state
        self._to_recover.discard(p)
        logger.info(
            "%s: HALF partition %d recovered in %.2f s: reading from %d (end %d), "
            "%d decisions loaded",
            self.name, p, time.monotonic() - started, start, high, state.decided_count,
        )  # fmt: skip

    def _load_decisions(self, reader: Consumer, state: HalfPartition, start: int) -> None:
        """Mark the transactions decided since the half message at ``start``."""
        first = read_record_at(reader, TopicPartition(self._half, state.partition, start))
        since_ms = (first.timestamp()[1] if first is not None else now_ms()) - _OP_SCAN_SLACK_MS
        tp = reader.offsets_for_times(
            [TopicPartition(self._op, state.partition, max(since_ms, 0))],
            self.config.client.request_timeout_ms / 1000,
        )[0]
        if tp.offset < 0:
            return
        reader.assign([tp])
        while True:
            record = reader.poll(1.0)
            if record is None:
                continue
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(error)
            try:
                entry = OpEntry.decode(record.value())
            except WireFormatError as exc:
                logger.warning(
                    "%s: unreadable OP record at %d: %s", self.name, record.offset(), exc
                )
                continue
            if entry.half_offset >= start:
                state.mark_decided(entry.transaction_id, entry.half_offset)


def assert_admin(admin: TopicAdmin | None) -> TopicAdmin:
    """The admin client, created in ``on_start``."""
    if admin is None:
        raise BridgeError("transaction service used before it started")
    return admin
