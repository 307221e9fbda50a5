"""Check-backs whose outputs cannot be written (a check request, a check copy, a put-back or a
parked copy the broker refuses for good): such a transaction is checked on its own, in a
Kafka transaction of its own, so it does not hold the others' checks back, and after
``ServiceConfig.delivery_attempts`` permanent failures it is parked in the check-max topic with
the reason (without its body once even that copy was refused).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError

from bridge.codec import encode_envelope
from bridge.coordinator.transaction.half_batch import (
    DELIVERY_ATTEMPTS,
    DELIVERY_ERROR,
    MAX_DELIVERY_ERROR_CHARS,
    TRANSIENT_BACKOFF_MAX_MS,
    HalfBatch,
)
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings, HalfWriter
from bridge.coordinator.transaction.state import HalfPartition, PendingHalf
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.message import MessageConst, now_ms
from bridge.transaction.model import OpAction
from topics.catalog import SystemTopic

logger = logging.getLogger("bridge.coordinator.transaction.checks")
"""The check-back's logger: one name for an operator to tune for all of the checks."""

Check = Callable[[HalfPartition, PendingHalf, int, HalfBatch], None]
"""Check (or park) a due transaction at a time (epoch ms), its outputs in a batch."""


@dataclass(slots=True)
class BadCheck:
    """A transaction whose check-back outputs made a Kafka transaction fail: it is checked
    on its own, and parked after ``ServiceConfig.delivery_attempts`` permanent failures."""

    attempts: int = 0
    """Failures for a permanent reason so far (0: only a suspect)."""
    reason: str = ""
    park_failures: int = 0
    """Parked copies refused so far (the next one leaves the body out)."""
    failures: int = 0
    """Failed tries on its own, of any kind: the back-off grows with them."""
    next_attempt_ms: int = 0
    """Not tried on its own again before this (epoch ms): a failure rebuilds the partition,
    and without a wait the rebuilt transaction would be due, and fail, at once."""


class FailedChecks:
    """The transactions whose check-back outputs made a Kafka transaction fail, by id: each is
    checked on its own through ``writer``; a failure rebuilds its partition (of ``ledger``)."""

    def __init__(self, ledger: HalfLedger, writer: HalfWriter, settings: HalfSettings) -> None:
        self._ledger = ledger
        self._writer = writer
        self._config = settings.config
        self._catalog = settings.catalog
        self._half = settings.half_topic
        self._bad_checks: dict[str, BadCheck] = {}
        """Transactions checked on their own (their check-back outputs failed), by id."""

    def __contains__(self, tid: str) -> bool:
        return tid in self._bad_checks

    def get(self, tid: str) -> BadCheck | None:
        """The entry of transaction ``tid``, if it is checked on its own."""
        return self._bad_checks.get(tid)

    def forget(self, tid: str) -> None:
        """Transaction ``tid`` was decided: it is not checked any more."""
        self._bad_checks.pop(tid, None)

    def clear(self) -> None:
        """Forget them all (after a revocation: whoever owns them next finds them again)."""
        self._bad_checks.clear()

    def set_aside(self, batch: HalfBatch) -> None:
        """After a failed checks transaction: the transactions whose outputs (check copy,
        check request, put-back or parked copy) failed for a permanent reason are checked on
        their own from now on, and parked after ``delivery_attempts`` such failures; when the
        transaction's own error is permanent and no report names an output, every
        transaction of the batch is a suspect, checked on its own (uncounted) to find it."""
        named = {
            tid: err
            for tid, err in batch.side.items()
            if err is not None and is_permanent_delivery_error(err)
        }
        suspects: list[str] = []
        if not named and is_permanent_delivery_error(batch.error):
            assert batch.error is not None
            unacknowledged = [t for t in batch.about if batch.side.get(t, batch.error) is not None]
            if len(unacknowledged) == 1:
                named[unacknowledged[0]] = batch.error
            else:
                suspects = unacknowledged
        for tid, err in named.items():
            bad = self._bad_checks.setdefault(tid, BadCheck())
            bad.attempts += 1
            self._refused(tid, bad, err, "; checked on its own")
        for tid in suspects:
            self._bad_checks.setdefault(tid, BadCheck())

    def check_alone(
        self, state: HalfPartition, pending: PendingHalf, now: int, check: Check
    ) -> None:
        """Check (or park) one transaction whose check-back outputs made a transaction fail,
        in a Kafka transaction of its own; parked with the reason after
        ``delivery_attempts`` permanent failures; ``check`` checks it (or parks it when it
        is due to be)."""
        tid = pending.transaction_id
        bad = self._bad_checks[tid]
        batch = HalfBatch(current=tid)
        batch.about[tid] = state.partition
        parking = bad.attempts >= self._config.delivery_attempts
        if parking:
            self._park(state, pending, bad, batch)
        else:
            check(state, pending, now, batch)
        if self._writer.commit_alone(batch):
            self._bad_checks.pop(tid, None)
            self._ledger.checkpoint_moved()
            return
        err = batch.side.get(tid)
        if not is_permanent_delivery_error(err):
            err = batch.error
        if err is not None and is_permanent_delivery_error(err) and not batch.in_doubt:
            if parking:
                bad.park_failures += 1
            else:
                bad.attempts += 1
            self._refused(tid, bad, err)
        bad.failures += 1
        bad.next_attempt_ms = now_ms() + min(
            self._config.delivery_backoff_ms * 2 ** (bad.failures - 1), TRANSIENT_BACKOFF_MAX_MS
        )
        # The state was changed optimistically (or the outcome is unknown): rebuild the
        # partition from Kafka before this is tried again.
        self._ledger.rebuild(state.partition)

    def _refused(self, tid: str, bad: BadCheck, err: KafkaError, then: str = "") -> None:
        """Note that ``tid``'s check-back outputs were refused for good (``err``), and say so
        (``then``: what follows)."""
        bad.reason = f"its check-back output could not be written: {err.str()} ({err.name()})"
        logger.warning(
            "transaction %s: %s (attempt %d of %d)%s",
            tid,
            bad.reason,
            bad.attempts,
            self._config.delivery_attempts,
            then,
        )

    def _park(
        self, state: HalfPartition, pending: PendingHalf, bad: BadCheck, batch: HalfBatch
    ) -> None:
        """Park a transaction whose check-back cannot be written, with the reason. When even
        its parked copy was refused, the copy leaves the body out (its size and where the
        half message is are in the reason; it stays there until the HALF retention)."""
        reason = bad.reason
        body: bytes | None = None
        if bad.park_failures:
            body = b""
            reason += (
                f"; parked without its body of {len(pending.message.body)} bytes (the half "
                f"message is at {self._half}[{state.partition}]@{pending.offset})"
            )
        msg = pending.message
        props = msg.properties
        if body is not None:  # replaying this copy would deliver an empty message
            props[MessageConst.BODY_OMITTED_BYTES] = str(len(msg.body))
        props[MessageConst.TRANSACTION_CHECK_TIMES] = str(pending.check_times)
        props[DELIVERY_ATTEMPTS] = str(bad.attempts)
        props[DELIVERY_ERROR] = reason[:MAX_DELIVERY_ERROR_CHARS]
        parked = encode_envelope(
            msg.msg_id,
            msg.body if body is None else body,
            props,
            msg.born_timestamp_ms,
            msg.born_host,
        )
        logger.warning(
            "transaction %s (group %s) parked in %s: %s",
            pending.transaction_id,
            pending.producer_group,
            self._catalog.topic(SystemTopic.CHECK_MAX),
            reason,
        )
        batch.put(
            self._catalog.topic(SystemTopic.CHECK_MAX),
            parked,
            key=pending.transaction_id.encode(),
        )
        self._writer.write_op(state, pending, OpAction.DISCARD, batch)
        state.resolve(pending)
        ns = self._config.client.namespace
        self._writer.count(batch, lambda m: m.parked.labels(ns, "check_failed").inc())
