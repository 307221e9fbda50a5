"""End-transaction handling of the transaction service: each HALF record read becomes part of
the state (a half message) or a decision applied in the batch's Kafka transaction: the real
message (on commit), the OP record, and the HALF offset from which a restart must read again.
A record that cannot be decoded is quarantined in the same transaction.

Trust (G12, ``docs/trust-model.md``): an end request or check answer of another producer group
than the half message's changes nothing (logged as a warning naming both groups); a half
message under the id of a pending transaction that is another message is quarantined; a commit
to a topic outside ``allowed_topics``, or of a producer group outside
``allowed_producer_groups``, is never written (parked with the reason)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError

from bridge.codec import ENVELOPE_SCHEMA, PreparedRecord, envelope_to_message
from bridge.coordinator.transaction.checks import CheckBack
from bridge.coordinator.transaction.half_batch import HalfBatch
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings, HalfWriter
from bridge.coordinator.transaction.parking import Parking
from bridge.coordinator.transaction.state import (
    HalfArrival,
    HalfPartition,
    PendingHalf,
    end_refusal,
)
from bridge.coordinator.transaction.targets import Targets
from bridge.errors import BridgeError, WireFormatError
from bridge.kafka.quarantine import quarantine_copy
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.lifecycle import FatalServiceError
from bridge.message import MessageConst, MessageExt, now_ms
from bridge.observability.metrics import BridgeMetrics, active_metrics
from bridge.transaction.model import (
    END_TRANSACTION_SCHEMA,
    EndTransaction,
    OpAction,
    TransactionStatus,
    committed_record,
)
from topics.avro import default_registry

logger = logging.getLogger(__name__)


class Decisions:
    """Reads HALF records into the partitions' state (of ``ledger``) and applies the
    decisions they bring through ``writer``: a commit whose real record cannot go with the
    others is handed to ``parking``, an answer to a check to ``checks``. ``check_fencing``
    stops the service when a consumer error says another coordinator runs with its id."""

    def __init__(
        self,
        ledger: HalfLedger,
        writer: HalfWriter,
        settings: HalfSettings,
        *,
        targets: Targets,
        parking: Parking,
        checks: CheckBack,
        check_fencing: Callable[[KafkaError], None],
    ) -> None:
        self._ledger = ledger
        self._writer = writer
        self._settings = settings
        self._targets = targets
        self._parking = parking
        self._checks = checks
        self._check_fencing = check_fencing
        self._shrink_quarantine: set[tuple[int, int]] = set()
        """HALF (partition, offset) of malformed records whose whole quarantine copy was
        refused: quarantined without their value next time."""

    def handle(self, record: Any, batch: HalfBatch) -> None:
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            self._check_fencing(error)  # another coordinator with this id: stop, say why
            if error.fatal():  # the consumer cannot go on: stop rather than idle unseen
                raise FatalServiceError(
                    f"{self._settings.name}: Kafka consumer failed: {error.str()}"
                )
            logger.warning("%s: consumer error %s", self._settings.name, error.str())
            return
        state = self._ledger.current(record.partition())
        if state is None:
            return  # revoked meanwhile, or replayed after recovery
        offset = record.offset()
        try:
            name, fields = default_registry().decode_any(record.value())
            if name == ENVELOPE_SCHEMA:
                msg = envelope_to_message(fields)
                arrival = state.on_half(
                    offset, record.timestamp()[1], record.value(), msg, now_ms()
                )
                if arrival is HalfArrival.CONFLICT:
                    self._conflict(state, record, msg, batch)
                elif arrival is HalfArrival.DUPLICATE:
                    logger.info(
                        "%s[%d]@%d: a second copy of the half message of pending transaction "
                        "%s; dropped",
                        self._settings.half_topic,
                        state.partition,
                        offset,
                        msg.transaction_id or msg.msg_id,
                    )
                batch.dirty = True
            elif name == END_TRANSACTION_SCHEMA:
                self._on_end(state, offset, EndTransaction.from_record(fields), batch)
            else:
                raise WireFormatError(f"a {name} record does not belong in the HALF topic")
        except (WireFormatError, ValueError, KeyError) as exc:
            self._quarantine(state, record, str(exc), batch)

    def _quarantine(self, state: HalfPartition, record: Any, reason: str, batch: HalfBatch) -> None:
        """Copy the HALF ``record`` to QUARANTINE with ``reason`` in ``batch``: it changes
        nothing else."""
        where = (record.partition(), record.offset())
        copy = quarantine_copy(
            self._settings.catalog,
            record,
            reason,
            self._settings.name,
            keep_value=where not in self._shrink_quarantine,
        )

        def refused(err: KafkaError | None, _: Any, where: tuple[int, int] = where) -> None:
            # Too large for QUARANTINE whole (a record near HALF's limit): the rebuilt
            # batch quarantines it without its value, so the others are not held back.
            if is_permanent_delivery_error(err):
                self._shrink_quarantine.add(where)
            elif err is None:
                self._shrink_quarantine.discard(where)

        batch.add_record(copy, refused)
        ns = self._settings.config.client.namespace
        self._writer.count(batch, lambda m: m.quarantined.labels(ns, "transaction").inc())
        state.on_other(record.offset())

    def _conflict(
        self, state: HalfPartition, record: Any, msg: MessageExt, batch: HalfBatch
    ) -> None:
        """A half message under the id of a pending transaction that is not that message
        (G12): quarantined; the pending one keeps its own message and is decided as before."""
        tid = msg.transaction_id or msg.msg_id
        pending = state.pending[tid]
        reason = (
            f"transaction {tid} is pending already with another half message at "
            f"{self._settings.half_topic}[{state.partition}]@{pending.offset}: this one does "
            "not replace it"
        )
        logger.warning(
            "%s[%d]@%d quarantined: %s",
            self._settings.half_topic,
            state.partition,
            record.offset(),
            reason,
        )
        self._quarantine(state, record, reason, batch)

    def _on_end(
        self, state: HalfPartition, offset: int, end: EndTransaction, batch: HalfBatch
    ) -> None:
        if end.status is TransactionStatus.UNKNOWN:
            state.on_other(offset)
            current = state.pending.get(end.transaction_id)
            if (
                end.from_transaction_check
                and current is not None
                and current.producer_group == end.producer_group
            ):
                # The check counts (once) now that a producer of the group answered it.
                self._checks.answered(state, current, end.check_times, batch)
                metrics = active_metrics()
                if metrics is not None:
                    # Counted only for a pending transaction of that group: any name a HALF
                    # writer puts in an UNKNOWN would otherwise become a series of its own.
                    ns = self._settings.config.client.namespace
                    metrics.check_answers.labels(ns, end.producer_group, end.status.value).inc()
            logger.debug("transaction %s: UNKNOWN from %s", end.transaction_id, end.producer_id)
            return
        current = state.pending.get(end.transaction_id)
        if current is not None:
            refusal = end_refusal(
                current, end.producer_group, end.status.value, self._settings.limits.producer_groups
            )
            if refusal is not None:
                # G12: another group's decision, or a check answer from it, changes nothing.
                state.on_other(offset)
                logger.warning(
                    "%s (%s by producer %s at %s[%d]@%d)",
                    refusal,
                    "check answer" if end.from_transaction_check else "end request",
                    end.producer_id,
                    self._settings.half_topic,
                    state.partition,
                    offset,
                )
                return
        pending = state.on_end(offset, end.transaction_id, end.producer_group)
        if pending is None:
            logger.info(
                "transaction %s: %s from %s ignored (already decided, being committed, or unknown)",
                end.transaction_id,
                end.status.value,
                end.producer_id,
            )
            return
        # Decided by its producer: no check of it is needed any more, on its own or not.
        self._checks.forget(end.transaction_id)
        topic: str | None = None
        if end.status is TransactionStatus.COMMIT:
            topic = self._apply_commit(state, pending, batch)
        else:
            self._writer.write_op(state, pending, OpAction.ROLLBACK, batch)
            state.resolve(pending)
        self._writer.count(
            batch,
            lambda m: _count_decision(
                m,
                self._settings.config.client.namespace,
                end,
                pending,
                self._topic_label(pending) if topic is None else topic,
            ),
        )
        logger.debug("transaction %s: %s", end.transaction_id, end.status.value)

    def _topic_label(self, pending: PendingHalf) -> str:
        """The ``topic`` label of ``pending``'s decision: its real topic, or
        :data:`NOT_ALLOWED_TOPIC` when the coordinator would not write there (outside
        ``allowed_topics``, or no Kafka topic can be named from it), so a HALF writer cannot
        make series of names it chooses."""
        msg = pending.message
        try:
            kafka_topic = committed_record(msg, self._settings.catalog.namespace).kafka_topic
        except (BridgeError, ValueError):
            return NOT_ALLOWED_TOPIC
        if self._settings.limits.topics.refusal("topic", kafka_topic) is not None:
            return NOT_ALLOWED_TOPIC
        return str(msg.get_property(MessageConst.REAL_TOPIC) or msg.topic)

    def _apply_commit(self, state: HalfPartition, pending: PendingHalf, batch: HalfBatch) -> str:
        """Commit ``pending`` in ``batch``, or set it aside to be committed on its own when its
        real record is known not to fit (so the rest of the batch does not fail with it).
        Returns the decision's ``topic`` label (see :meth:`_topic_label`), from the real
        record built here rather than building it twice."""
        tid = pending.transaction_id
        poison = self._parking.get(tid)
        real: PreparedRecord | None = None
        label: str | None = None
        if poison is None:
            label = NOT_ALLOWED_TOPIC
            try:
                real = committed_record(pending.message, self._settings.catalog.namespace)
            except (BridgeError, ValueError) as exc:
                # No retry makes a name or a property that cannot be written writable.
                poison = self._parking.set_aside(
                    state,
                    tid,
                    f"its real record cannot be built: {exc}",
                    self._settings.config.delivery_attempts,
                )
            else:
                refusal = self._settings.limits.topics.refusal("topic", real.kafka_topic)
                if refusal is not None:
                    # G12: the coordinator does not write there; parked with the reason (no
                    # retry makes it allowed), replayed by an operator.
                    poison = self._parking.set_aside(
                        state, tid, refusal, self._settings.config.delivery_attempts
                    )
                else:
                    msg = pending.message
                    label = str(msg.get_property(MessageConst.REAL_TOPIC) or msg.topic)
                    problem = self._targets.problem(real.kafka_topic, real.partition, fresh=False)
                    if problem is not None:
                        poison = self._parking.set_aside(state, tid, problem, 1)
        if label is None:
            label = self._topic_label(pending)
        if poison is not None or real is None:
            state.hold(pending)  # committed on its own by Parking.commit_alone_due
            return label
        batch.add_real(tid, state.partition, real)
        self._writer.write_op(state, pending, OpAction.COMMIT, batch)
        state.resolve(pending)
        return label


NOT_ALLOWED_TOPIC: Final = "(not allowed)"
"""The ``topic`` label of a decision whose real topic the coordinator refuses."""


def _count_decision(
    metrics: BridgeMetrics,
    namespace: str,
    end: EndTransaction,
    pending: PendingHalf,
    topic: str,
) -> None:
    """The metrics of a decision applied: commit or rollback per real topic (``topic``, see
    :meth:`Decisions._topic_label`), the time since the half message was sent (ms), and the
    answer when it answered a check."""
    decided = metrics.commits if end.status is TransactionStatus.COMMIT else metrics.rollbacks
    decided.labels(namespace, topic).inc()
    metrics.finish_latency.labels(namespace).observe(max(now_ms() - pending.born_ms, 0))
    if end.from_transaction_check:
        metrics.check_answers.labels(namespace, end.producer_group, end.status.value).inc()
