"""Check-back of the transaction service (RocketMQ's ``CheckBackService``).

Checks run in a Kafka transaction of their own that writes the check requests; a half message
whose check is more than an interval away is put back unchanged once per interval. A check
counts when a producer of the group answers it (UNKNOWN included): the answer is read from the
HALF partition and a copy of the half message with ``TRANSACTION_CHECK_TIMES`` + 1 is written
(RocketMQ's put-back, which RocketMQ writes when it sends the check). A check also counts when
its group has no live producer (:mod:`bridge.coordinator.transaction.liveness`): then no request is
sent, and one sent that no answer followed within a check interval counts too. One unanswered while
the group has a live producer is asked again, not counted (and counts when that goes
unanswered too while the group answers no check: a live producer can take none). After
``transaction_check_max`` checks that count (or the retention) a half message is parked in the
check-max topic.

Pacing (:mod:`bridge.coordinator.transaction.pacing`): each group is sent no more checks than its
window of unanswered ones; the others wait, due, in the order they fell due, so a storm of checks
drains at the pace the group's producers answer instead of being counted unasked.

Isolation: a check that cannot be made (its group's check topic cannot be created) counts as a
check, and a transaction whose check outputs cannot be written is checked on its own and
parked with the reason (:mod:`bridge.coordinator.transaction.failed_checks`).

Trust (G12): a half message whose producer group is outside ``allowed_producer_groups`` is
never checked (its group's check topic is never created): at its first check time it is parked
with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError

from bridge.coordinator.transaction.check_topics import CheckTopics
from bridge.coordinator.transaction.failed_checks import FailedChecks
from bridge.coordinator.transaction.half_batch import (
    DELIVERY_ATTEMPTS,
    DELIVERY_ERROR,
    MAX_DELIVERY_ERROR_CHARS,
    HalfBatch,
    envelope,
    with_check_times,
)
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings, HalfWriter
from bridge.coordinator.transaction.liveness import ProducerLiveness
from bridge.coordinator.transaction.pacing import UNANSWERED_ASKS_MAX, CheckPacing
from bridge.coordinator.transaction.parking import ALONE_PER_CYCLE
from bridge.coordinator.transaction.state import CheckAction, HalfPartition, PendingHalf
from bridge.errors import BridgeError
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst, PropertyValue, now_ms
from bridge.transaction.model import CheckRequest, OpAction
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

CHECKS_PER_CYCLE: Final = 1000
"""Checks (and put-backs) per HALF partition and iteration, at most."""


class CheckBack:
    """Checks and put-backs of the undecided half messages of the HALF partitions of
    ``ledger``, written through ``writer``, and the transactions whose check outputs cannot be
    written (:class:`~bridge.coordinator.transaction.failed_checks.FailedChecks`)."""

    def __init__(
        self,
        ledger: HalfLedger,
        writer: HalfWriter,
        settings: HalfSettings,
        *,
        check_topic_partitions: int,
    ) -> None:
        self._ledger = ledger
        self._writer = writer
        self._config = settings.config
        self._catalog = settings.catalog
        self._policy = policy = settings.policy
        self._limits = settings.limits
        self._half = settings.half_topic
        self._topics = CheckTopics(settings.catalog, check_topic_partitions)
        self._failed = FailedChecks(ledger, writer, settings)
        self.pacing = CheckPacing(policy.check_interval_ms)
        """The checks awaiting an answer, and each group's window."""
        self._liveness = ProducerLiveness(self._config.client, absent_ms=policy.check_interval_ms)

    def start(self, admin: TopicAdmin) -> None:
        """Use ``admin`` to create check topics."""
        self._topics.start(admin)

    def forget(self, tid: str) -> None:
        """Transaction ``tid`` was decided by its producer: no check of it is needed any more,
        on its own or not."""
        self._failed.forget(tid)
        self.pacing.forget(tid)

    def clear(self, revoked: set[int]) -> None:
        """After a revocation of the HALF partitions ``revoked``: the transactions checked on
        their own are found again (if still bad) by whoever owns them next, and the answers
        to their checks are awaited there."""
        self._failed.clear()
        self.pacing.forget_partitions(revoked)

    def answered(
        self, state: HalfPartition, pending: PendingHalf, check_times: int, batch: HalfBatch
    ) -> None:
        """A producer of ``pending``'s group answered UNKNOWN to its check ``check_times``
        (0: a producer that does not say which): the check counts, once. A copy of the half
        message with the new ``TRANSACTION_CHECK_TIMES`` is written in ``batch`` (so the count
        survives a restart, and the copy moves the checkpoint on); the next check is a check
        interval later. An answer to a check counted already (a check asked twice, or before
        a restart), or to no check, changes nothing."""
        tid = pending.transaction_id
        now = now_ms()
        awaited = self.pacing.answered(tid, check_times, now)
        counted = pending.check_times + 1
        if check_times != counted and not (check_times == 0 and awaited is not None):
            return
        if pending.held:
            return
        try:
            copy = with_check_times(pending, counted)
        except BridgeError:
            logger.exception("transaction %s: check %d answered, not counted", tid, counted)
            return
        state.checked(pending, now)
        pending.check_error = None
        self._add_half_copy(state, tid, copy, batch)

    def run(self, now: int) -> None:
        """Write the put-backs and checks due at ``now`` (epoch ms) in one Kafka transaction;
        then check those that failed before, each on its own."""
        checks = HalfBatch()
        alone: list[tuple[HalfPartition, PendingHalf]] = []
        # Checks sent three intervals ago and neither answered nor due since: their
        # transactions left this view (decided meanwhile); they hold no room any more.
        self.pacing.forget_older(now - 3 * self._policy.check_interval_ms)
        self._liveness.forget_older(now - 3 * self._policy.check_interval_ms)
        admit = self._admission(now)
        for state in self._ledger.values():
            for pending in state.put_backs_due(now, CHECKS_PER_CYCLE):
                checks.current = pending.transaction_id
                checks.about[pending.transaction_id] = state.partition
                self._put_back(state, pending, checks)
            for pending in state.due(now, CHECKS_PER_CYCLE, admit):
                bad = self._failed.get(pending.transaction_id)
                if bad is not None:
                    if bad.next_attempt_ms > now:
                        state.postpone(pending, now, bad.next_attempt_ms - now)
                    else:
                        alone.append((state, pending))
                    continue
                checks.current = pending.transaction_id
                checks.about[pending.transaction_id] = state.partition
                self._check_or_discard(state, pending, now, checks)
        checks.current = None
        if not self._writer.commit(checks):
            # A check topic deleted meanwhile is created again by the next check.
            self._topics.forget_known()
            for tid in checks.about:  # their requests were not written: none is awaited
                self.pacing.forget(tid)
            self._failed.set_aside(checks)
        for state, pending in alone[:ALONE_PER_CYCLE]:
            if self._ledger.get(state.partition) is state:
                self._failed.check_alone(state, pending, now, self._check_or_discard)
        for state, pending in alone[ALONE_PER_CYCLE:]:
            state.postpone(pending, now, self._config.delivery_backoff_ms)

    def _admission(self, now: int) -> Callable[[PendingHalf], bool]:
        """Whether a due transaction is handed out now: always, unless what it needs is a
        check request its group's window has no room for (then it waits, due)."""
        policy = self._policy
        taken: dict[str, int] = {}

        def admit(pending: PendingHalf) -> bool:
            tid = pending.transaction_id
            if tid in self._failed or self.pacing.awaited(tid) is not None:
                return True  # checked on its own; or asked again in the room it holds
            if policy.action(pending.check_times, pending.born_ms, now) is CheckAction.DISCARD:
                return True
            group = pending.producer_group
            if self._limits.producer_groups.refusal("producer group", group) is not None:
                return True
            if self._liveness.live(group, now) is False:
                return True  # counted, no request sent
            if self.pacing.room(group) <= taken.get(group, 0):
                return False
            taken[group] = taken.get(group, 0) + 1
            return True

        return admit

    def _check_or_discard(
        self, state: HalfPartition, pending: PendingHalf, now: int, batch: HalfBatch
    ) -> None:
        refusal = self._limits.producer_groups.refusal("producer group", pending.producer_group)
        if refusal is not None:
            # G12: no check topic is created for the group, and the message is never committed:
            # parked with the reason, for an operator to replay or drop.
            self._discard(state, pending, batch, f"not checked: {refusal}")
            return
        action = self._policy.action(pending.check_times, pending.born_ms, now)
        try:
            if action is CheckAction.DISCARD:
                self._discard(state, pending, batch)
            else:
                self._check_live(state, pending, now, batch)
        except BridgeError as exc:
            # One failing check (e.g. its group's check topic cannot be created) must not
            # stall the others (RocketMQ #9500). It counts as a check, so a check that can
            # never be made ends with the message parked (with the reason), not pinning the
            # checkpoint for ever.
            self._check_failed(state, pending, now, f"check-back failed: {exc}", batch)

    def _check_live(
        self, state: HalfPartition, pending: PendingHalf, now: int, batch: HalfBatch
    ) -> None:
        """Check ``pending`` when its group has a live producer (or that is not known); count
        the check when it has none. A check sent and unanswered for an interval is asked again
        while the group has a live producer, and counts when it has none (or that is not
        known, as RocketMQ counts every check), or when it was asked
        :data:`UNANSWERED_ASKS_MAX` times already and the group answered no check for an
        interval (a live producer that takes no checks)."""
        group = pending.producer_group
        tid = pending.transaction_id
        live = self._liveness.live(group, now)
        awaited = self.pacing.unanswered(tid, now, live=live is True)
        wedged = (
            awaited is not None
            and awaited.asks >= UNANSWERED_ASKS_MAX
            and not self.pacing.answering(group, now)
        )
        if awaited is not None and (live is not True or wedged):
            if live is True:
                # Its producers are live but answer no checks (every check thread in a call
                # that never returns, say): counted, or the message would wait for ever.
                known = f"a live producer that answered none of {awaited.asks} requests"
            else:
                known = "no live producer" if live is False else "no producer known to be live"
            reason = (
                f"check {awaited.check_times} was not answered within the check interval and "
                f"producer group {group!r} has {known}"
            )
            self._check_failed(state, pending, now, reason, batch)
            return
        if live is False:
            self._check_failed(
                state, pending, now, f"producer group {group!r} has no live producer", batch
            )
            return
        if awaited is not None:
            logger.info(
                "transaction %s (group %s): check %d not answered within the check interval; "
                "asked again",
                tid,
                group,
                awaited.check_times,
            )
        self._check(state, pending, now, batch, asks=1 if awaited is None else awaited.asks + 1)

    def _check_failed(
        self, state: HalfPartition, pending: PendingHalf, now: int, reason: str, batch: HalfBatch
    ) -> None:
        """Count a check of ``pending`` that could not be made: a copy with
        ``TRANSACTION_CHECK_TIMES`` + 1 is written (as for a check, without the request), so
        the count survives a restart and the copy moves the checkpoint on."""
        tid = pending.transaction_id
        try:
            copy = with_check_times(pending, pending.check_times + 1)
        except BridgeError:
            logger.exception("transaction %s: check failed (%s); retrying later", tid, reason)
            state.postpone(pending, now)
            return
        state.check_failed(pending, now, reason)
        logger.warning(
            "transaction %s (group %s): check %d of %d could not be made: %s",
            tid,
            pending.producer_group,
            pending.check_times,
            self._policy.transaction_check_max,
            reason,
        )
        self._add_half_copy(state, tid, copy, batch)

    def _add_half_copy(self, state: HalfPartition, tid: str, copy: bytes, batch: HalfBatch) -> None:
        """Write ``copy`` of transaction ``tid``'s half message at the end of its partition;
        its offset is noted once Kafka acknowledged it."""

        def copy_delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is None:
                state.copy_written(tid, kmsg.offset())

        batch.put(
            self._half,
            copy,
            partition=state.partition,
            key=tid.encode(),
            on_delivery=copy_delivered,
        )

    def _discard(
        self,
        state: HalfPartition,
        pending: PendingHalf,
        batch: HalfBatch,
        refused: str | None = None,
    ) -> None:
        """Park ``pending`` in the check-max topic: after its checks, or at once when it is
        ``refused`` (why, in its ``DELIVERY_ERROR``)."""
        if refused is not None:
            logger.warning(
                "transaction %s (group %s) parked in %s: %s",
                pending.transaction_id,
                pending.producer_group,
                self._catalog.topic(SystemTopic.CHECK_MAX),
                refused,
            )
        else:
            logger.warning(
                "transaction %s (group %s) parked in %s after %d checks%s",
                pending.transaction_id,
                pending.producer_group,
                self._catalog.topic(SystemTopic.CHECK_MAX),
                pending.check_times,
                f" ({pending.check_error})" if pending.check_error else "",
            )
        changes: dict[str, PropertyValue] = {
            MessageConst.TRANSACTION_CHECK_TIMES: str(pending.check_times)
        }
        if refused is not None:
            changes[DELIVERY_ERROR] = refused[:MAX_DELIVERY_ERROR_CHARS]
        elif pending.check_error is not None:
            # Its last check could not be made: the operator sees why.
            changes[DELIVERY_ATTEMPTS] = str(pending.check_failures)
            changes[DELIVERY_ERROR] = pending.check_error[:MAX_DELIVERY_ERROR_CHARS]
        batch.put(
            self._catalog.topic(SystemTopic.CHECK_MAX),
            envelope(pending, **changes),
            key=pending.transaction_id.encode(),
        )
        self._writer.write_op(state, pending, OpAction.DISCARD, batch)
        state.resolve(pending)
        self.pacing.forget(pending.transaction_id)
        if refused is not None:
            reason = "refused"
        elif pending.check_times >= self._policy.transaction_check_max:
            reason = "check_max"
        else:
            reason = "too_old"
        ns = self._config.client.namespace
        self._writer.count(batch, lambda m: m.parked.labels(ns, reason).inc())

    def _put_back(self, state: HalfPartition, pending: PendingHalf, batch: HalfBatch) -> None:
        """Copy ``pending`` unchanged to the end of its partition (no check request), so its
        old offset stops holding the checkpoint back."""
        tid = pending.transaction_id
        self._add_half_copy(state, tid, pending.envelope, batch)
        logger.debug("transaction %s: put back (next check at %d)", tid, pending.next_check_ms)

    def _check(
        self, state: HalfPartition, pending: PendingHalf, now: int, batch: HalfBatch, *, asks: int
    ) -> None:
        """Send a check request of ``pending`` to its group, for the ``asks``-th time; it
        counts once answered (:meth:`answered`)."""
        group = pending.producer_group
        topic = self._topics.ensure(group, now)
        number = pending.check_times + 1
        tid = pending.transaction_id
        # The half message as read: the producer gives its listener the message with
        # TRANSACTION_CHECK_TIMES set to this check's number (RocketMQ's put-back copy).
        request = CheckRequest(
            transaction_id=tid,
            msg_id=pending.message.msg_id,
            half_partition=state.partition,
            half_offset=pending.offset,
            check_times=number,
            message=pending.envelope,
        )
        batch.put(topic, request.encode(), key=tid.encode())
        state.asked(pending, now)
        self.pacing.sent(tid, state.partition, group, number, now, asks=asks)
        ns = self._config.client.namespace
        self._writer.count(batch, lambda m: m.checks_sent.labels(ns, group).inc())
        logger.info(
            "transaction %s (group %s): check %d of %d",
            tid,
            group,
            number,
            self._policy.transaction_check_max,
        )
