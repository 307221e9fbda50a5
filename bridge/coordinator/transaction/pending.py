"""One undecided transaction of a HALF partition and the rules about it alone: RocketMQ's check
policy (when a due half message is checked, when it is discarded), what a copy of a half message
may differ in, and who may decide it (G12). Pure logic, no I/O; the partition's view over them
is :class:`~bridge.coordinator.transaction.state.HalfPartition`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from bridge.config import NamePatterns
from bridge.message import MessageConst, MessageExt, parse_count


class CheckAction(Enum):
    """What a due half message needs."""

    CHECK = "CHECK"
    DISCARD = "DISCARD"


class HalfArrival(Enum):
    """What a half message read from HALF is to the state (:meth:`HalfPartition.on_half`)."""

    NEW = "NEW"
    """Its transaction was neither pending nor decided: it is pending now."""
    COPY = "COPY"
    """The pending message again, at a newer offset (a check or put-back copy, or one send
    stored twice): the pending transaction is read from there now, its message unchanged."""
    DUPLICATE = "DUPLICATE"
    """The pending message again, counting fewer checks than the copy the pending one is read
    from (a send stored twice, read after a check copy): dropped; decisions name its offset
    too, so a restart that reads it again knows the transaction is decided."""
    OLD = "OLD"
    """An older copy, one read again, or a copy of a decided transaction: nothing changes."""
    CONFLICT = "CONFLICT"
    """A different message under the id of a pending transaction: it replaces nothing (the
    service quarantines it); decisions name its offset too, so a restart that reads it
    again knows the transaction is decided."""


COPY_CHANGES: frozenset[str] = frozenset({MessageConst.TRANSACTION_CHECK_TIMES})
"""Properties in which the coordinator's own copies of a half message (at a check) differ
from it."""


def check_count(msg: MessageExt) -> int:
    """The ``TRANSACTION_CHECK_TIMES`` of a copy (0 when none, or not plain ASCII digits)."""
    return parse_count(msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)) or 0


def same_message(a: MessageExt, b: MessageExt) -> bool:
    """True when ``a`` and ``b`` are one message: same id, body, birth, born host and
    properties, but for :data:`COPY_CHANGES`."""
    if (a.msg_id, a.body, a.born_timestamp_ms, a.born_host) != (
        b.msg_id,
        b.body,
        b.born_timestamp_ms,
        b.born_host,
    ):
        return False
    props_a = {k: v for k, v in a.properties.items() if k not in COPY_CHANGES}
    props_b = {k: v for k, v in b.properties.items() if k not in COPY_CHANGES}
    return props_a == props_b


@dataclass(frozen=True, slots=True)
class CheckPolicy:
    """RocketMQ's check-back settings, in milliseconds."""

    transaction_timeout_ms: int = 6_000
    check_interval_ms: int = 30_000
    transaction_check_max: int = 15
    file_reserved_time_ms: int = 72 * 3_600_000

    def immunity_ms(self, msg: MessageExt) -> int:
        """How long after its birth a message is left alone, ms (RocketMQ's
        ``getImmunityTime``: ``CHECK_IMMUNITY_TIME_IN_SECONDS`` when it is a valid number, else
        the timeout), never longer than the retention (``file_reserved_time_ms``)."""
        raw = msg.get_property(MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS)
        if raw:
            try:
                seconds = int(raw)
            except ValueError:
                return self.transaction_timeout_ms
            if seconds > 0:
                return min(seconds * 1000, self.file_reserved_time_ms)
        return self.transaction_timeout_ms

    def action(self, check_times: int, born_ms: int, now_ms: int) -> CheckAction:
        """Check or discard a due message that was checked ``check_times`` times so far."""
        if check_times >= self.transaction_check_max:
            return CheckAction.DISCARD
        if now_ms - born_ms > self.file_reserved_time_ms and check_times >= 1:
            return CheckAction.DISCARD
        return CheckAction.CHECK


BORN_AHEAD_TOLERANCE_MS = 1000
"""How far a half message's birth may lie after the time it is read before a clock is taken to
be off (and it is checked at once, as RocketMQ does), ms."""


def copy_due_ms(policy: CheckPolicy, msg: MessageExt, append_ms: int, now_ms: int) -> int:
    """When a copy of a half message read from HALF is next due for a check, ms since the
    epoch: one never checked (``TRANSACTION_CHECK_TIMES`` 0) once its immunity after its birth
    has passed (:meth:`CheckPolicy.immunity_ms`; at ``now_ms``, its reading time, when it was
    born more than :data:`BORN_AHEAD_TOLERANCE_MS` ahead of it); a copy written at a check a
    check interval after ``append_ms``, its timestamp in HALF. The checker's rule for each copy
    it reads (:meth:`~bridge.coordinator.transaction.state.HalfPartition.on_half`, which keeps the
    later of this and what it had), and the operator views'."""
    born_ms = msg.born_timestamp_ms
    if check_count(msg) == 0:
        if born_ms > now_ms + BORN_AHEAD_TOLERANCE_MS:
            return now_ms
        return born_ms + policy.immunity_ms(msg)
    return append_ms + policy.check_interval_ms


def asked_due_ms(policy: CheckPolicy, asked_ms: int) -> int:
    """When a transaction whose check request was written at ``asked_ms`` is due again if that
    check goes unanswered, ms since the epoch: a check interval on (its answer, when it comes,
    writes a copy whose :func:`copy_due_ms` is the same interval after the answer)."""
    return asked_ms + policy.check_interval_ms


def next_check_ms(policy: CheckPolicy, copies_due_ms: int, last_asked_ms: int | None) -> int:
    """The next check of an undecided transaction as the checker that owns it schedules it,
    from the records it writes: ``copies_due_ms``, the latest :func:`copy_due_ms` of the copies
    of its half message read in order (each no earlier than the one before), and
    ``last_asked_ms``, when the last request of its next check (numbered its count + 1) was
    written to its group's check topic (None: none). A check is asked only once due, so the
    request's time decides when there is one (:func:`asked_due_ms`). Exact while the
    coordinator that asked runs; one that takes the partition over after a restart knows only
    the copies, and may check sooner."""
    if last_asked_ms is None:
        return copies_due_ms
    return max(copies_due_ms, asked_due_ms(policy, last_asked_ms))


@dataclass(slots=True)
class PendingHalf:
    """An undecided transaction: its newest half message copy and its check schedule."""

    transaction_id: str
    offset: int
    """Offset of the newest copy read back from the HALF partition: a restart must read from
    here (a copy written at a check or put-back counts once it is read back)."""
    envelope: bytes
    message: MessageExt
    check_times: int
    born_ms: int
    next_check_ms: int
    latest_offset: int = -1
    """Offset of the newest copy written, read back or not (what a decision record names, so
    a restart that reads that copy knows the transaction is decided); for a decision read
    while catching up after a restart, at least the end of the partition as it was then."""
    held: bool = False
    """A commit is being applied on its own (its real record could not be written with the
    others): no check, and no other decision, until it is committed or parked."""
    check_failures: int = 0
    """Checks that could not be made (e.g. the group's check topic cannot be created); each
    one counts in :attr:`check_times` so the message is parked in the end."""
    check_error: str | None = None
    """Why the last check could not be made (None when it was made)."""
    conflict_after: int = -1
    """Offset of the last half message under its id that is not its own
    (:attr:`HalfArrival.CONFLICT`) read after :attr:`offset` (-1: none). A restart from the
    checkpoint, which is never past :attr:`offset`, meets this copy before it."""
    pins: list[tuple[int, int]] = field(default_factory=list)
    """(offset of an older copy, offset of the last conflicting half message read between it
    and the next copy): a restart from past that copy up to that message would take the
    conflicting one for the transaction, so the checkpoint stays at the copy while it would
    fall there (:meth:`HalfPartition.checkpoint`). Dropped once the checkpoint is past the
    message: a restart never reads it again."""

    def __post_init__(self) -> None:
        self.latest_offset = max(self.latest_offset, self.offset)

    @property
    def producer_group(self) -> str:
        """The producer group that sent it (``PGROUP``; empty when the half message names
        none)."""
        value = self.message.get_property(MessageConst.PRODUCER_GROUP)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value or ""

    def decidable_by(self, producer_group: str) -> bool:
        """True when an end request of ``producer_group`` may decide this transaction: the
        group its half message names, or any group when it names none."""
        own = self.producer_group
        return not own or own == producer_group


def end_refusal(
    pending: PendingHalf, producer_group: str, status: str, allowed_groups: NamePatterns
) -> str | None:
    """Why an end request (``status``: COMMIT or ROLLBACK) of ``producer_group`` does not
    decide ``pending``, or None when it does: another group's request changes nothing, nor
    does a COMMIT of a half message whose group is outside ``allowed_groups`` (a ROLLBACK
    writes no real record, and is applied)."""
    tid = pending.transaction_id
    if not pending.decidable_by(producer_group):
        return (
            f"transaction {tid}: {status} from producer group {producer_group!r} ignored: its "
            f"half message belongs to producer group {pending.producer_group!r}; it stays "
            "pending and is checked with its own group"
        )
    if status == "COMMIT":
        refusal = allowed_groups.refusal("producer group", pending.producer_group)
        if refusal is not None:
            return f"transaction {tid}: COMMIT ignored: {refusal}; it is parked at its check time"
    return None
