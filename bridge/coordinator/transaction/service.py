"""The coordinator's transaction service: end-transaction handling and check-back.

One consumer (group ``<namespace>.coordinator.transaction``) reads the HALF topic; Kafka's
group protocol spreads its partitions over the running coordinators and moves a dead one's
partitions to the others. For each partition the service keeps a :class:`HalfPartition`.

Every decision is applied in one Kafka transaction that writes the real message (on commit),
the OP record, and the HALF offset from which a restart must read again (the oldest undecided
half message). So a crash at any point either applies a decision completely or not at all,
and a decision is applied at most once: each committed message reaches its real topic exactly
once (G2, G3).

The service is a thin loop over its collaborators, each in a module of its own, each given
what it needs (the :class:`~bridge.coordinator.transaction.ledger.HalfLedger` of the partitions it
owns, the :class:`~bridge.coordinator.transaction.ledger.HalfWriter` of its Kafka transactions,
settings and callbacks), never the service:
:class:`~bridge.coordinator.transaction.decisions.Decisions` (HALF records into state, decisions
into the batch), :class:`~bridge.coordinator.transaction.checks.CheckBack` (checks and put-backs;
those whose outputs fail in :class:`~bridge.coordinator.transaction.failed_checks.FailedChecks`),
:class:`~bridge.coordinator.transaction.parking.Parking` (commits applied on their own, poison
isolation), :class:`~bridge.coordinator.transaction.recovery.Recovery` (rebuilding a partition from
Kafka) and :class:`~bridge.coordinator.transaction.targets.Targets` (what the metadata says of real
topics). Every Kafka transaction goes through
:meth:`~bridge.kafka.service.TransactionalService.write`.

Guarantees kept here (see ``docs/guarantees.md``): G1-G4, G9, G12.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.config import TrustLimits
from bridge.coordinator.transaction.checks import CheckBack
from bridge.coordinator.transaction.decisions import Decisions
from bridge.coordinator.transaction.half_batch import HalfBatch
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings, HalfWriter
from bridge.coordinator.transaction.parking import Parking
from bridge.coordinator.transaction.recovery import Recovery
from bridge.coordinator.transaction.state import CheckPolicy
from bridge.coordinator.transaction.targets import Targets
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.batch_writer import TransactionBatch, is_purge
from bridge.kafka.clients import new_consumer
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.message import now_ms
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

_POLL_TIMEOUT_S = 0.05
_BATCH = 500
_RETRY_BACKOFF_MS: Final = 10
"""``retry.backoff.ms`` of the service's producer (librdkafka's default: 100), unless the
client's Kafka properties set it. The consumed offsets join each Kafka transaction while its
records are in flight, so they can reach the transaction coordinator while the previous
transaction's markers are still being written; the broker then answers
``CONCURRENT_TRANSACTIONS`` and librdkafka asks again after this back-off (registering the
records' partitions retries after 20 ms of its own)."""
_FAILURES: Final = (KafkaException, SystemError)
"""What a failed Kafka transaction of this service raises (see
:func:`~bridge.kafka.batch_writer.as_kafka_exception`)."""


class TransactionService(TransactionalService):
    """End-transaction handling and ``CheckBackService`` for the HALF partitions this
    coordinator owns."""

    def __init__(
        self,
        config: ServiceConfig,
        policy: CheckPolicy | None = None,
        check_topic_partitions: int = 4,
        *,
        limits: TrustLimits | None = None,
    ) -> None:
        super().__init__("transaction", config)
        self.policy = policy or CheckPolicy()
        self.check_topic_partitions = check_topic_partitions
        self.limits = limits or TrustLimits()
        """The real topics it writes and the producer groups it acts for (G12)."""
        self.catalog = config.catalog
        self._half = config.catalog.topic(SystemTopic.HALF)
        self._op = config.catalog.topic(SystemTopic.OP)
        self._partitions = HalfLedger()
        """The owned HALF partitions: their state, those to rebuild from Kafka first."""
        self._committed: dict[int, int] = {}
        """HALF partition -> the checkpoint this service last committed for it (only
        partitions whose last commit it knows: cleared on a rebalance, a recovery and a failed
        Kafka transaction)."""
        self.committed_transactions = 0
        """How many Kafka transactions this service committed (for tests and metrics)."""
        self.targets = Targets(config.client, self.name, lambda: self.timeout_s)
        ledger = self._partitions
        writer = HalfWriter(self._op, self._commit, self._commit_alone, self.count)
        settings = HalfSettings(self.name, config, self.policy, self.limits, self._half, self._op)
        self.recovery = Recovery(ledger, settings, consumer=lambda: self._consumer)
        self.parking = Parking(
            ledger, writer, settings, targets=self.targets, wait=self._stopped.wait
        )
        self.checks = CheckBack(
            ledger, writer, settings, check_topic_partitions=check_topic_partitions
        )
        self.decisions = Decisions(
            ledger,
            writer,
            settings,
            targets=self.targets,
            parking=self.parking,
            checks=self.checks,
            check_fencing=self.check_fencing,
        )

    def renewed(self) -> TransactionService:
        """A new, not started service with the same settings (see
        :meth:`TransactionalService.renewed`)."""
        return TransactionService(
            self.config, self.policy, self.check_topic_partitions, limits=self.limits
        )

    @property
    def parked_for_delivery(self) -> int:
        """Commits being applied on their own (their real record could not be written)."""
        return len(self.parking)

    # --- lifecycle ----------------------------------------------------------------------
    def producer_overrides(self) -> dict[str, Any]:
        """:data:`_RETRY_BACKOFF_MS`, unless the client settings name ``retry.backoff.ms``."""
        if "retry.backoff.ms" in self.client.kafka:
            return {}
        return {"retry_backoff_ms": _RETRY_BACKOFF_MS}

    def on_start(self) -> None:
        client = self.config.client
        self.checks.start(TopicAdmin(client))
        self.targets.start()
        self.start_producer()
        self._consumer = new_consumer(
            client,
            self.group_id,
            client_id=self.name,
            partition_assignment_strategy="range",
            fetch_wait_max_ms=50,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=self.group_instance_id,
        )
        self._consumer.subscribe([self._half], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._partitions.assigned(tp.partition)
        self._committed.clear()
        logger.info(
            "%s: assigned HALF partitions %s", self.name, [tp.partition for tp in partitions]
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        for p in revoked:
            self._partitions.revoked(p)
        self.parking.revoke(revoked)
        self.checks.clear(revoked)
        self._committed.clear()
        logger.info("%s: revoked HALF partitions %s", self.name, sorted(revoked))

    def on_stop(self) -> None:
        super().on_stop()
        self.targets.stop()

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None or not self.producer_ready():
            return
        to_recover = self._partitions.to_recover()
        if to_recover:
            self._committed.clear()
            self.recovery.recover(to_recover)
        first = consumer.poll(_POLL_TIMEOUT_S)
        records = [first] if first is not None else []
        if first is not None:
            records.extend(consumer.consume(_BATCH, 0))
        batch = HalfBatch(dirty=self._partitions.moved)
        for record in records:
            self.decisions.handle(record, batch)
        self._follow_positions(consumer)
        self._commit(batch)
        now = now_ms()
        self.parking.commit_alone_due(now)
        self.checks.run(now)

    def _follow_positions(self, consumer: Consumer) -> None:
        """Move each partition's read position to the consumer's: past the transaction
        markers that end every batch the services write, which no consumer receives (a
        partition whose last record is a marker would otherwise never count as read up to
        its end, and its checks would wait for new traffic)."""
        owned = [TopicPartition(self._half, p) for p in self._partitions]
        if not owned:
            return
        try:
            positions = consumer.position(owned)
        except KafkaException:
            return
        for tp in positions:
            state = self._partitions.get(tp.partition)
            # Negative: nothing returned since the last seek (a recovery).
            if state is not None and tp.error is None and tp.offset >= 0:
                state.on_position(tp.offset)

    # --- Kafka transaction ----------------------------------------------------------------
    def _commit(self, batch: HalfBatch) -> bool:
        """Write ``batch`` and every owned partition's checkpoint in one Kafka transaction.
        False when it failed: the state is rebuilt and the commits that made it fail are set
        aside. The checkpoints are sent while the records are in flight; their delivery
        reports are looked at before the commit, which a lost record prevents.

        A batch without records whose checkpoints are those committed last (half messages
        read, nothing decided: the oldest undecided one holds each checkpoint where it was)
        writes nothing: such a Kafka transaction would commit the same offsets again, and
        while it runs a decision read after it waits."""
        if self._consumer is None:
            return True
        if not batch.dirty:
            self.nothing_to_write(batch)
            return True
        if not batch.records and self._unmoved():
            self._partitions.offsets_written()
            self.nothing_to_write(batch)
            return True
        self._partitions.offsets_written()
        producer = self._producer
        consumer = self._consumer
        timeout_s = self.timeout_s
        sent: list[TopicPartition] = []
        settled = False

        def checkpoints() -> list[TopicPartition]:
            # Sent while the records are in flight: the offsets' two round trips overlap the
            # records' (registering their partitions, producing), instead of following them.
            sent[:] = self._checkpoints()
            return sent

        def settle(_: TransactionBatch) -> None:
            nonlocal settled
            settled = True
            producer.flush(timeout_s)
            failed = next((e for e in batch.outcome.values() if e is not None), None)
            if failed is None:
                return
            if is_purge(failed) and sent:
                # The transaction failed as a whole (e.g. a partition it could not add): a
                # transaction call now raises the transaction's own error, which names the
                # cause (the offsets again change nothing if it does not).
                producer.send_offsets_to_transaction(
                    sent, consumer.consumer_group_metadata(), timeout_s
                )
            raise KafkaException(failed)  # never commit what lost a record

        def failing(exc: KafkaException) -> None:
            if not settled:
                # Failed before the reports were looked at (the offsets, while the records
                # were in flight): serve them first, so that the stored records count as
                # stored rather than purged by the abort (which would make every commit of
                # the batch a suspect, committed on its own).
                with contextlib.suppress(*_FAILURES):
                    producer.flush(timeout_s)
            self._transaction_failed(exc)

        if not self.write(
            batch,
            on_failure=failing,
            offsets=checkpoints,
            before_commit=settle,
            on_refused=batch.refused,
            failures=_FAILURES,
        ):
            self.parking.set_aside_culprits(batch)
            return False
        self._committed = {tp.partition: tp.offset for tp in sent}
        self.committed_transactions += 1
        self.parking.failures = 0
        return True

    def _checkpoints(self) -> list[TopicPartition]:
        """Where a restart must read each owned, recovered HALF partition again."""
        return self._partitions.checkpoints(self._half)

    def _unmoved(self) -> bool:
        """True when every owned, recovered partition's checkpoint is the one this service
        committed last (and no other partition's commit is known)."""
        current = {tp.partition: tp.offset for tp in self._checkpoints()}
        return bool(current) and current == self._committed

    def _commit_alone(self, batch: HalfBatch) -> bool:
        """Write ``batch`` in a Kafka transaction of its own (no offsets). False when it
        failed (:attr:`HalfBatch.in_doubt` says whether it may have committed all the same);
        nothing else is rebuilt (nothing else was in it)."""
        producer = self._producer
        if not self.write(
            batch,
            after_produce=lambda _: producer.flush(self.timeout_s),
            on_refused=batch.refused,
            failures=_FAILURES,
        ):
            return False
        self.committed_transactions += 1
        return True

    def _transaction_failed(self, exc: KafkaException) -> None:
        self.transaction_failed(exc)
        self._committed.clear()
        # State was changed optimistically: rebuild it from what Kafka committed.
        self._partitions.rebuild_all()
