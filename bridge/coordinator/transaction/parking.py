"""Commits applied on their own (poison isolation of the transaction service).

A commit whose real record cannot be written (an internal topic, a topic that does not exist
or was deleted, a partition it does not have, a record larger than the topic takes, no
authorization) never holds the others back. Such a commit is found before it is written (the
target's metadata) or from the delivery reports of a failed Kafka transaction; it is then
tried on its own, in a Kafka transaction of its own, a bounded number of times with back-off,
and finally parked in the check-max topic with ``DELIVERY_ERROR`` (the reason) and
``DELIVERY_ATTEMPTS``, where ``bridge transactions replay`` re-drives it once the cause is
fixed. A commit to a topic outside ``allowed_topics`` (G12) is parked the same way, at its
first attempt (no retry makes it allowed). When the Kafka transaction failed as a whole for a
record's reason that no report names (a topic that denies Write but allows Describe), each of
its commits is tried on its own.
A commit on its own whose outcome is unknown (a commit timeout) re-reads its partition from
Kafka before it is tried again. A failure that names no record (the broker, the network)
rebuilds and retries the whole batch, with back-off: nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError

from bridge.coordinator.transaction.half_batch import (
    DELIVERY_ATTEMPTS,
    DELIVERY_ERROR,
    MAX_DELIVERY_ERROR_CHARS,
    TRANSIENT_BACKOFF_MAX_MS,
    HalfBatch,
    envelope,
)
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings, HalfWriter
from bridge.coordinator.transaction.state import HalfPartition, PendingHalf
from bridge.coordinator.transaction.targets import Targets, delivery_problem
from bridge.errors import BridgeError
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.message import MessageConst, PropertyValue, now_ms
from bridge.transaction.model import OpAction, committed_record
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

ALONE_PER_CYCLE: Final = 20
"""Commits (and checks) tried on their own per iteration (the others wait for the next one)."""


@dataclass(slots=True)
class _Poison:
    """A commit whose real record could not be written with the others: it is applied on its
    own, and parked after ``ServiceConfig.delivery_attempts`` failures that do not go away."""

    half_partition: int
    attempts: int
    """Failed deliveries so far, for a reason that does not go away by itself."""
    reason: str
    next_attempt_ms: int
    transient_failures: int = 0
    park_failures: int = 0
    """Times its parked copy was refused; after one, it is parked without its body."""


class Parking:
    """The commits set aside to be applied on their own, by transaction id (kept across
    rebuilds of the state), and what is done with them: tried through ``writer`` against the
    partitions of ``ledger``, the targets' metadata from ``targets``; ``wait(seconds)`` backs
    off before a failed batch is tried again (it returns early when the service stops)."""

    def __init__(
        self,
        ledger: HalfLedger,
        writer: HalfWriter,
        settings: HalfSettings,
        *,
        targets: Targets,
        wait: Callable[[float], object],
    ) -> None:
        self._ledger = ledger
        self._writer = writer
        self._settings = settings
        self._targets = targets
        self._wait = wait
        self._poison: dict[str, _Poison] = {}
        """Commits applied on their own, by transaction id."""
        self.failures = 0
        """Consecutive failed Kafka transactions that named no record."""

    def __len__(self) -> int:
        return len(self._poison)

    def get(self, tid: str) -> _Poison | None:
        """The set-aside entry of transaction ``tid``, if it has one."""
        return self._poison.get(tid)

    def revoke(self, revoked: set[int]) -> None:
        """Forget the commits of ``revoked`` HALF partitions: the next owner finds them again
        (from its own delivery attempts)."""
        self._poison = {t: x for t, x in self._poison.items() if x.half_partition not in revoked}

    def set_aside(self, state: HalfPartition, tid: str, reason: str, attempts: int) -> _Poison:
        """Set ``tid`` aside to be committed on its own (``attempts`` failed so far)."""
        poison = _Poison(
            state.partition, attempts, reason, now_ms() + self._settings.config.delivery_backoff_ms
        )
        self._poison[tid] = poison
        logger.warning(
            "transaction %s: its message cannot be written with the others (%s); "
            "committing it on its own (attempt %d of %d failed)",
            tid,
            reason,
            attempts,
            self._settings.config.delivery_attempts,
        )
        return poison

    def commit_alone_due(self, now: int) -> None:
        """Try the commits set aside whose next attempt is due, each in its own transaction."""
        tried = 0
        for tid, poison in list(self._poison.items()):
            if tried >= ALONE_PER_CYCLE:
                return
            state = self._ledger.current(poison.half_partition)
            if state is None:
                continue  # being rebuilt: its end request is read again
            pending = state.pending.get(tid)
            if pending is None or not pending.held:
                if state.caught_up:
                    # Its end request was read again and found it decided (or gone).
                    self._poison.pop(tid, None)
                continue
            if poison.next_attempt_ms > now:
                continue
            tried += 1
            self._deliver_alone(state, pending, poison)

    def _deliver_alone(self, state: HalfPartition, pending: PendingHalf, poison: _Poison) -> None:
        tid = pending.transaction_id
        now = now_ms()
        if poison.attempts >= self._settings.config.delivery_attempts:
            self._park(state, pending, poison)
            return
        try:
            real = committed_record(pending.message, self._settings.catalog.namespace)
        except (BridgeError, ValueError) as exc:
            poison.attempts = self._settings.config.delivery_attempts
            poison.reason = f"its real record cannot be built: {exc}"
            self._park(state, pending, poison)
            return
        refusal = self._settings.limits.topics.refusal("topic", real.kafka_topic)
        if refusal is not None:
            # G12: never written there, whatever set it aside first; no retry changes that.
            poison.attempts = self._settings.config.delivery_attempts
            poison.reason = refusal
            self._park(state, pending, poison)
            return
        problem = self._targets.problem(real.kafka_topic, real.partition, fresh=True)
        if problem is None:
            batch = HalfBatch()
            batch.add_real(tid, state.partition, real)
            self._writer.write_op(state, pending, OpAction.COMMIT, batch)
            if self._writer.commit_alone(batch):
                state.resolve(pending)
                self._poison.pop(tid, None)
                self._ledger.checkpoint_moved()
                logger.info("transaction %s: committed on its own", tid)
                return
            if batch.in_doubt:
                self._reread(state, tid)
                return
            err = batch.outcome.get(tid)
            if not is_permanent_delivery_error(err) and is_permanent_delivery_error(batch.error):
                # Alone in its transaction: the transaction's own error (e.g. its topic could
                # not be added to it, not authorized) is this record's.
                err = batch.error
            if err is None or not is_permanent_delivery_error(err):
                # The broker, not this record (as far as anyone can tell): again later, and
                # this does not count towards parking it.
                poison.transient_failures += 1
                poison.next_attempt_ms = now + min(
                    self._settings.config.delivery_backoff_ms * 2**poison.transient_failures,
                    TRANSIENT_BACKOFF_MAX_MS,
                )
                return
            problem = delivery_problem(real.kafka_topic, err)
            self._targets.remember_refusal(real.kafka_topic, err, problem)
        poison.attempts += 1
        poison.reason = problem
        logger.warning(
            "transaction %s: delivery attempt %d of %d failed: %s",
            tid,
            poison.attempts,
            self._settings.config.delivery_attempts,
            problem,
        )
        if poison.attempts >= self._settings.config.delivery_attempts:
            self._park(state, pending, poison)
        else:
            poison.next_attempt_ms = now + self._settings.config.delivery_backoff_ms * 2 ** (
                poison.attempts - 1
            )

    def _reread(self, state: HalfPartition, tid: str) -> None:
        """A transaction of its own for ``tid`` may or may not have committed: rebuild its
        HALF partition from what Kafka holds (the OP records decide) before anything is tried
        again, so the commit is never written twice. Its set-aside entry is kept (uncounted):
        if the commit did not happen, its end request is read again and it is retried."""
        logger.warning(
            "transaction %s: whether its own Kafka transaction committed is unknown; "
            "re-reading HALF partition %d",
            tid,
            state.partition,
        )
        self._ledger.rebuild(state.partition)

    def _park(self, state: HalfPartition, pending: PendingHalf, poison: _Poison) -> None:
        """Move a commit that cannot be delivered to the check-max topic with its reason (an
        operator replays it with ``bridge transactions replay`` once the cause is fixed)."""
        tid = pending.transaction_id
        changes: dict[str, PropertyValue] = {
            MessageConst.TRANSACTION_CHECK_TIMES: str(pending.check_times),
            DELIVERY_ATTEMPTS: str(poison.attempts),
            DELIVERY_ERROR: poison.reason[:MAX_DELIVERY_ERROR_CHARS],
        }
        body = None
        if poison.park_failures:
            # The whole copy was refused (too large for the check-max topic): park it without
            # its body, marked so that it is never replayed as an empty message.
            body = b""
            changes[MessageConst.BODY_OMITTED_BYTES] = str(len(pending.message.body))
            changes[DELIVERY_ERROR] = (
                f"{poison.reason}; parked without its body (the half message is at "
                f"{self._settings.half_topic}[{state.partition}]@{pending.offset})"
            )[:MAX_DELIVERY_ERROR_CHARS]
        parked = envelope(pending, body, **changes)
        batch = HalfBatch()
        batch.put(self._settings.catalog.topic(SystemTopic.CHECK_MAX), parked, key=tid.encode())
        self._writer.write_op(state, pending, OpAction.DISCARD, batch)
        ns = self._settings.config.client.namespace
        self._writer.count(batch, lambda m: m.parked.labels(ns, "undeliverable").inc())
        if not self._writer.commit_alone(batch):
            if batch.in_doubt:
                self._reread(state, tid)
                return
            poison.park_failures += 1
            if poison.park_failures > 1:
                logger.error(
                    "transaction %s: even its body-less parked copy was refused %d times; "
                    "its HALF partition %d cannot move past it until the check-max topic "
                    "takes it",
                    tid,
                    poison.park_failures - 1,
                    state.partition,
                )
            poison.next_attempt_ms = now_ms() + min(
                self._settings.config.delivery_backoff_ms * 2 ** (poison.park_failures - 1),
                TRANSIENT_BACKOFF_MAX_MS,
            )
            return
        state.resolve(pending)
        self._poison.pop(tid, None)
        self._ledger.checkpoint_moved()
        logger.warning(
            "transaction %s (group %s) parked in %s after %d failed deliveries: %s",
            tid,
            pending.producer_group,
            self._settings.catalog.topic(SystemTopic.CHECK_MAX),
            poison.attempts,
            poison.reason,
        )

    def set_aside_culprits(self, batch: HalfBatch) -> None:
        """After a failed transaction: set aside the commits whose real record made it fail
        (a permanent delivery error, or a target the metadata shows is wrong), so the rebuilt
        batch goes through without them. If none is found, back off before the retry."""
        found = 0
        for tid, (half_partition, real) in batch.real.items():
            err = batch.outcome.get(tid)
            if tid in batch.outcome and err is None:
                continue  # stored (and aborted with the rest): not the cause
            if is_permanent_delivery_error(err):
                assert err is not None
                reason: str | None = delivery_problem(real.kafka_topic, err)
            else:
                # Timed out, purged, or the whole transaction refused (a partition could
                # not be added to it): ask the metadata about its target.
                reason = self._targets.problem(real.kafka_topic, real.partition, fresh=True)
            if reason is not None and tid not in self._poison:
                now = now_ms()
                self._poison[tid] = _Poison(
                    half_partition, 1, reason, now + self._settings.config.delivery_backoff_ms
                )
                found += 1
                logger.warning(
                    "transaction %s: its message made the Kafka transaction fail (%s); "
                    "committing it on its own",
                    tid,
                    reason,
                )
        if not found and is_permanent_delivery_error(batch.error):
            found = self._suspect_all(batch)
        if found:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= 2:
            self._set_aside_lone_failures(batch)
        # Transient (the broker, the network): retry the rebuilt batch, not in a tight loop.
        self._wait(min(0.05 * 2**self.failures, 5.0))

    def _suspect_all(self, batch: HalfBatch) -> int:
        """The transaction failed for a record's reason (its own error says so, e.g. a topic
        it was not authorized to add) but no delivery report names the record (all say
        "purged"): every commit not acknowledged is a suspect, committed on its own (uncounted
        at first), so the innocent ones go through and the guilty one fails alone and is
        parked in the end. Returns how many were set aside."""
        assert batch.error is not None
        now = now_ms()
        found = 0
        for tid, (half_partition, _) in batch.real.items():
            if (tid in batch.outcome and batch.outcome[tid] is None) or tid in self._poison:
                continue
            reason = (
                f"the Kafka transaction it was in failed: {batch.error.str()} "
                f"({batch.error.name()})"
            )
            self._poison[tid] = _Poison(half_partition, 0, reason, now)
            found += 1
        if found:
            logger.warning(
                "%s: a Kafka transaction failed (%s) and no record is named: committing its "
                "%d commits on their own",
                self._settings.name,
                batch.error.str(),
                found,
            )
        return found

    def _set_aside_lone_failures(self, batch: HalfBatch) -> None:
        """Transactions keep failing and nothing names a cause: if some real records of the
        batch were stored and others were not, the others are the odd ones out. They are
        committed on their own (retried for as long as it takes: nothing shows their failure
        is permanent), so the rest goes on."""
        stored = any(err is None for err in batch.outcome.values())
        purged = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
        failed = {
            tid: err
            for tid, err in batch.outcome.items()
            if err is not None and err.code() not in purged
        }
        if not stored or not failed:
            return
        now = now_ms()
        for tid, err in failed.items():
            half_partition, real = batch.real[tid]
            if tid not in self._poison:
                reason = delivery_problem(real.kafka_topic, err)
                self._poison[tid] = _Poison(half_partition, 0, reason, now)
                logger.warning("transaction %s: %s; committing it on its own", tid, reason)
