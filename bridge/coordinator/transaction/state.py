"""The coordinator's view of one HALF partition: which transactions are undecided, when each is
due for a check, and how far the partition is safely processed. Pure logic, no I/O.

The rules are RocketMQ's (``TransactionalMessageServiceImpl#check``):

* a half message is first checked once it is older than ``transaction_timeout_ms``, or than its
  own ``CHECK_IMMUNITY_TIME_IN_SECONDS`` when set; then every ``check_interval_ms``;
* each check that counts increments ``TRANSACTION_CHECK_TIMES``; a message whose count has
  reached ``transaction_check_max`` is discarded (parked) instead of checked again. Unlike
  RocketMQ, which counts a check when it sends it, a check counts once its producer answered
  it or once it found no live producer (:mod:`bridge.coordinator.transaction.pacing`);
* a message older than the retention is discarded too, but (unlike RocketMQ, #8311) never
  before it was checked at least once;
* a message whose next check is more than an interval away (a long immunity) is put back at the
  end of the HALF partition once per interval (RocketMQ's ``putImmunityMsgBackToHalfQueue``),
  so it never pins the checkpoint; its immunity is capped at the retention.

The checkpoint (where a restart reads again) never passes a record that is not processed yet:
a checked or put-back half message keeps its old copy's offset until the new copy is read back,
so an end request written between the two copies is read again after a restart.

Duplicates are decided by transaction id: once a transaction is committed, rolled back or
discarded, any later decision for it (a second commit, a commit racing a check answer, a commit
after a rollback; RocketMQ #5574, #8158) changes nothing.

Trust (``docs/trust-model.md``): a transaction is decided only by an end request of the
producer group its half message names (``PGROUP``; RocketMQ's broker checks the group too); a
half message without one, as another client may write, is decided by the first end request of
any group. A half message whose transaction is pending already is taken as a newer copy only
when it is the same message (a check or put-back copy differs in ``TRANSACTION_CHECK_TIMES``
alone; a send stored twice not at all) counting no fewer checks than the copy the pending one
is read from (else it is a :attr:`HalfArrival.DUPLICATE`, dropped); a different one never
replaces the pending message (:attr:`HalfArrival.CONFLICT`: the service quarantines it).

Guarantees kept here (see ``docs/guarantees.md``): G3 (decisions by transaction id), G4, G12.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.coordinator.transaction.pending import (
    COPY_CHANGES,
    CheckAction,
    CheckPolicy,
    HalfArrival,
    PendingHalf,
    asked_due_ms,
    check_count,
    copy_due_ms,
    end_refusal,
    same_message,
)
from bridge.message import MessageExt

__all__ = [
    "COPY_CHANGES",
    "CheckAction",
    "CheckPolicy",
    "HalfArrival",
    "HalfPartition",
    "PendingHalf",
    "end_refusal",
    "same_message",
]


@dataclass
class HalfPartition:
    """State of one HALF partition as the coordinator that owns it sees it."""

    partition: int
    policy: CheckPolicy
    position: int = 0
    """The next offset to read."""
    catch_up_offset: int = 0
    """Checks wait until the partition has been read this far (so a replay after a restart
    sees every newer copy of a half message before checking it)."""
    pending: dict[str, PendingHalf] = field(default_factory=dict)
    _decided: dict[str, int] = field(default_factory=dict)
    _schedule: list[tuple[int, str, int]] = field(default_factory=list)
    _put_backs: list[tuple[int, str, int]] = field(default_factory=list)
    """(when, transaction id, offset of the copy to put back), a heap."""
    _by_offset: list[tuple[int, str]] = field(default_factory=list)
    """(offset, transaction id) of each pending transaction's copy, a heap (stale entries
    included): the checkpoint without a look at every pending transaction."""
    _decided_kept: int = 0
    """Decisions kept when they were last forgotten up to the checkpoint."""
    _decided_from: int = 0
    """The checkpoint they were last forgotten up to."""
    _pinned: set[str] = field(default_factory=set)
    """Pending transactions with :attr:`PendingHalf.pins` (some may have none left)."""
    _waiting: dict[str, deque[tuple[int, str, int]]] = field(default_factory=dict)
    """Producer group -> schedule entries that fell due while the group's window of
    unanswered checks was full, oldest first (see :meth:`due`)."""

    @property
    def caught_up(self) -> bool:
        """True once the partition was read up to where it ended when recovery began."""
        return self.position >= self.catch_up_offset

    @property
    def decided_count(self) -> int:
        """How many decided transactions are remembered."""
        return len(self._decided)

    def is_decided(self, transaction_id: str) -> bool:
        """True if the transaction was committed, rolled back or discarded."""
        return transaction_id in self._decided

    def mark_decided(self, transaction_id: str, offset: int) -> None:
        """Record a decision (from an OP record, or one just made) on the copy at ``offset``."""
        self._decided[transaction_id] = max(offset, self._decided.get(transaction_id, -1))

    def on_half(
        self, offset: int, append_ms: int, envelope: bytes, msg: MessageExt, now_ms: int
    ) -> HalfArrival:
        """A half message (or a newer copy of one, written at a check) at ``offset``: what it
        is to the state (see :class:`HalfArrival`)."""
        self.position = max(self.position, offset + 1)
        tid = msg.transaction_id or msg.msg_id
        if tid in self._decided:
            self.mark_decided(tid, offset)
            return HalfArrival.OLD
        current = self.pending.get(tid)
        if current is not None and current.offset >= offset:
            return HalfArrival.OLD  # an older copy, or the same one read again
        if current is not None and not same_message(current.message, msg):
            # Another message under a pending id (written by someone who knows the id): it
            # replaces nothing. The decision names its offset too, so that a restart that
            # reads it again finds the transaction decided rather than pending with it. Once
            # a newer copy is read past it, a restart that would read it reads from this copy
            # instead, to meet the transaction's own message first (see checkpoint()).
            current.latest_offset = max(current.latest_offset, offset)
            current.conflict_after = max(current.conflict_after, offset)
            return HalfArrival.CONFLICT
        if current is not None and current.held:
            # Its commit is being done on its own, decided by an end request read after the
            # copy it stays at: until it is done, a restart must read that request again.
            current.latest_offset = max(current.latest_offset, offset)
            return HalfArrival.COPY
        # Anything but plain ASCII digits (e.g. "²", which isdigit() accepts) counts as none.
        check_times = check_count(msg)
        if current is not None and check_times < check_count(current.message):
            # The message again, counting fewer checks than the copy it is read from: a send
            # stored twice (or written again) after a check copy. Read from there, a restart
            # would forget the checks made: dropped, but decisions name its offset too.
            current.latest_offset = max(current.latest_offset, offset)
            return HalfArrival.DUPLICATE
        born_ms = msg.born_timestamp_ms
        # Its immunity after birth (now, when born in the future: a clock is off), or, for a
        # copy written at a check, an interval on.
        due = copy_due_ms(self.policy, msg, append_ms, now_ms)
        latest, held = offset, False
        if current is not None:
            check_times = max(check_times, current.check_times)
            due = max(due, current.next_check_ms)
            latest, held = max(offset, current.latest_offset), current.held
        pending = PendingHalf(tid, offset, envelope, msg, check_times, born_ms, due, latest, held)
        if current is not None:
            pending.check_failures = current.check_failures
            pending.check_error = current.check_error
            pending.pins = current.pins
            if current.conflict_after >= 0:
                # Another message lies between the copy read so far and this one: a restart
                # from between them must read from that copy.
                pending.pins.append((current.offset, current.conflict_after))
        self.pending[tid] = pending
        heapq.heappush(self._by_offset, (offset, tid))
        if pending.pins:
            self._pinned.add(tid)
        if current is None or (due, check_times) != (current.next_check_ms, current.check_times):
            # Not when that check is scheduled already (a put-back copy; a check copy stamped
            # no later than its check): a second entry would hand it out, and check it, twice.
            heapq.heappush(self._schedule, (due, tid, check_times))
        interval = self.policy.check_interval_ms
        if due - max(append_ms, 0) > interval:
            # Its check is far away: put it back at the end an interval from now, so that its
            # offset does not hold the checkpoint (and every decision after it) back.
            heapq.heappush(self._put_backs, (max(append_ms, 0) + interval, tid, offset))
        return HalfArrival.NEW if current is None else HalfArrival.COPY

    def on_end(
        self, offset: int, transaction_id: str, producer_group: str | None = None
    ) -> PendingHalf | None:
        """An end-transaction request at ``offset`` (of ``producer_group``; None: not
        checked): the pending transaction it decides, or None when there is nothing to decide
        (already decided, a commit being applied, unknown here, or another group's)."""
        self.position = max(self.position, offset + 1)
        pending = self.pending.get(transaction_id)
        if pending is None or pending.held:
            return None
        if producer_group is not None and not pending.decidable_by(producer_group):
            return None
        if not self.caught_up:
            # Copies written before the restart may lie ahead, not read yet: the decision
            # names the end of the partition as it was, so that a restart that reads any of
            # them knows the transaction is decided.
            pending.latest_offset = max(pending.latest_offset, self.catch_up_offset - 1)
        return pending

    def on_other(self, offset: int) -> None:
        """A record that changes nothing (quarantined, or an UNKNOWN answer)."""
        self.position = max(self.position, offset + 1)

    def on_position(self, offset: int) -> None:
        """The consumer's position is ``offset``: every record before it was returned (and
        handled). It moves past transaction markers, which no consumer ever receives."""
        self.position = max(self.position, offset)

    def hold(self, pending: PendingHalf) -> None:
        """``pending``'s commit is applied on its own: keep it out of checks and decisions."""
        pending.held = True

    def resolve(self, pending: PendingHalf) -> None:
        """``pending`` was committed, rolled back or discarded."""
        self.pending.pop(pending.transaction_id, None)
        self.mark_decided(pending.transaction_id, pending.latest_offset)

    def due(
        self,
        now_ms: int,
        limit: int,
        admit: Callable[[PendingHalf], bool] | None = None,
    ) -> list[PendingHalf]:
        """Up to ``limit`` pending transactions whose check is due (none before caught up).

        ``admit`` (None: all) says whether one is handed out now; one it refuses (its group's
        window of unanswered checks is full) waits, due, in its group's queue, and is handed
        out first once admitted: each group's checks go out in the order they fell due."""
        out: list[PendingHalf] = []
        if not self.caught_up:
            return out
        for group in list(self._waiting):
            waiting = self._waiting[group]
            while waiting and len(out) < limit:
                pending = self._scheduled(waiting[0])
                if pending is not None:
                    if admit is not None and not admit(pending):
                        break
                    out.append(pending)
                waiting.popleft()
            if not waiting:
                del self._waiting[group]
        while self._schedule and len(out) < limit and self._schedule[0][0] <= now_ms:
            entry = heapq.heappop(self._schedule)
            pending = self._scheduled(entry)
            if pending is None:
                continue
            if admit is not None and not admit(pending):
                self._waiting.setdefault(pending.producer_group, deque()).append(entry)
                continue
            out.append(pending)
        return out

    @property
    def waiting(self) -> int:
        """Due checks waiting for room in their group's window (stale entries included)."""
        return sum(len(w) for w in self._waiting.values())

    def _scheduled(self, entry: tuple[int, str, int]) -> PendingHalf | None:
        """The pending transaction a schedule entry stands for; None when the entry is stale
        (resolved, or rescheduled since) or its commit is held."""
        due, tid, times = entry
        pending = self.pending.get(tid)
        if (
            pending is not None
            and pending.next_check_ms == due
            and pending.check_times == times
            and not pending.held
        ):
            return pending
        return None

    def put_backs_due(self, now_ms: int, limit: int) -> list[PendingHalf]:
        """Up to ``limit`` pending transactions to copy to the end of the partition, unchanged
        (no check): those whose copy was read an interval ago and whose check is still more
        than an interval away. Each is put back at most once per interval: the next one is
        planned when the copy is read back (:meth:`on_half`)."""
        out: list[PendingHalf] = []
        if not self.caught_up:
            return out
        interval = self.policy.check_interval_ms
        while self._put_backs and len(out) < limit and self._put_backs[0][0] <= now_ms:
            _, tid, offset = heapq.heappop(self._put_backs)
            pending = self.pending.get(tid)
            if (
                pending is not None
                and pending.offset == offset
                and not pending.held
                and pending.next_check_ms - now_ms > interval
            ):
                out.append(pending)
        return out

    def checked(self, pending: PendingHalf, now_ms: int) -> None:
        """A check of ``pending`` counts (its producer answered it, or it found no live
        producer): count it and schedule the next check. Its new copy's
        offset arrives with :meth:`copy_written`; until that copy is read back, the checkpoint
        stays at the old one (an end request may sit between the two)."""
        pending.check_times += 1
        pending.next_check_ms = now_ms + self.policy.check_interval_ms
        heapq.heappush(
            self._schedule, (pending.next_check_ms, pending.transaction_id, pending.check_times)
        )

    def asked(self, pending: PendingHalf, now_ms: int) -> None:
        """A check of ``pending`` was sent, not counted yet (it counts once answered:
        :meth:`checked`): unanswered, it is due again a check interval later."""
        self.postpone(pending, now_ms, asked_due_ms(self.policy, now_ms) - now_ms)

    def check_failed(self, pending: PendingHalf, now_ms: int, reason: str) -> None:
        """A check of ``pending`` could not be made, for ``reason``: it counts as a check (so
        a check that can never be made ends with the message parked, and its copy moves the
        checkpoint on), and the next one is an interval later."""
        pending.check_failures += 1
        pending.check_error = reason
        self.checked(pending, now_ms)

    def postpone(self, pending: PendingHalf, now_ms: int, delay_ms: int | None = None) -> None:
        """A check could not be made: try again ``delay_ms`` later (an interval when None),
        not counted."""
        pending.next_check_ms = now_ms + (
            self.policy.check_interval_ms if delay_ms is None else delay_ms
        )
        heapq.heappush(
            self._schedule, (pending.next_check_ms, pending.transaction_id, pending.check_times)
        )

    def copy_written(self, transaction_id: str, offset: int) -> None:
        """A copy (written at a check or put-back) landed at ``offset``, not read back yet."""
        pending = self.pending.get(transaction_id)
        if pending is not None:
            pending.latest_offset = max(pending.latest_offset, offset)
        else:
            self.mark_decided(transaction_id, offset)

    def checkpoint(self) -> int:
        """The offset from which a restart must read again: the oldest undecided copy, or the
        read position when nothing is undecided; but a restart that would read a half message
        conflicting with a pending transaction (one at or after the checkpoint) reads from
        that transaction's copy before it instead. Also forgets decisions older than it.

        A conflicting message read after a transaction's current copy needs nothing (the
        checkpoint is never past that copy); one read before it holds the checkpoint at the
        copy before the message only while something older than the message is pending."""
        by_offset = self._by_offset
        while by_offset and (
            (head := self.pending.get(by_offset[0][1])) is None or head.offset != by_offset[0][0]
        ):
            heapq.heappop(by_offset)
        checkpoint = min(by_offset[0][0], self.position) if by_offset else self.position
        pinned = [p for t in self._pinned if (p := self.pending.get(t)) is not None and p.pins]
        self._pinned = {p.transaction_id for p in pinned}
        moved = True
        while moved:  # each pin applied can bring another's conflicting message within reach
            moved = False
            for p in pinned:
                for copy, conflict in p.pins:
                    if copy < checkpoint <= conflict:
                        checkpoint, moved = copy, True
        for p in pinned:
            # A restart from here on never reads those messages, and the checkpoint only
            # moves forward (a failed Kafka transaction rebuilds the state): forget them.
            p.pins = [pin for pin in p.pins if pin[1] >= checkpoint]
        if len(self._decided) > 1024 and (
            checkpoint > self._decided_from or len(self._decided) > 2 * self._decided_kept
        ):
            # Only when the checkpoint moved, or the decisions doubled, since the last time:
            # a checkpoint pinned by an old transaction (a storm of checks) would otherwise
            # have every decision looked at on every call.
            self._decided = {t: o for t, o in self._decided.items() if o >= checkpoint}
            self._decided_kept = len(self._decided)
            self._decided_from = checkpoint
        if len(self._schedule) > 4 * len(self.pending) + 1024:
            self._schedule = [e for e in self._schedule if e[1] in self.pending]
            heapq.heapify(self._schedule)
        if len(by_offset) > 4 * len(self.pending) + 1024:
            self._by_offset = [(p.offset, t) for t, p in self.pending.items()]
            heapq.heapify(self._by_offset)
        if self.waiting > 2 * len(self.pending) + 1024:
            for group in list(self._waiting):
                kept = deque(e for e in self._waiting[group] if self._scheduled(e) is not None)
                if kept:
                    self._waiting[group] = kept
                else:
                    del self._waiting[group]
        if len(self._put_backs) > 2 * len(self.pending) + 1024:
            self._put_backs = [e for e in self._put_backs if e[1] in self.pending]
            heapq.heapify(self._put_backs)
        return checkpoint
