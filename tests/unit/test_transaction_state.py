"""The per-partition transaction state: schedule, discard rules, duplicates, checkpoint."""

from __future__ import annotations

from bridge.message import MessageConst, MessageExt
from bridge.transaction.state import CheckAction, CheckPolicy, HalfPartition

POLICY = CheckPolicy(
    transaction_timeout_ms=6_000, check_interval_ms=30_000, transaction_check_max=15,
    file_reserved_time_ms=72 * 3_600_000,
)  # fmt: skip
T0 = 1_700_000_000_000


def half(tid: str, props: dict[str, str] | None = None, born: int = T0) -> MessageExt:
    properties = {MessageConst.TRANSACTION_ID: tid, MessageConst.PRODUCER_GROUP: "g"}
    properties.update(props or {})
    return MessageExt("orders", b"x", msg_id=tid, born_timestamp_ms=born, properties=properties)


def test_first_check_follows_the_timeout_then_every_interval() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    assert state.due(T0 + 5_999, 10) == []
    (due,) = state.due(T0 + 6_000, 10)
    state.checked(due, T0 + 6_000)
    state.copy_written("a", 7)
    assert due.check_times == 1 and due.offset == 7
    assert state.due(T0 + 35_999, 10) == []
    assert [p.transaction_id for p in state.due(T0 + 36_000, 10)] == ["a"]


def test_immunity_property_sets_the_first_check() -> None:
    state = HalfPartition(0, POLICY)
    msg = half("a", {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "60"})
    state.on_half(0, T0, b"", msg, now_ms=T0)
    assert state.due(T0 + 59_999, 10) == []
    assert len(state.due(T0 + 60_000, 10)) == 1
    assert (
        POLICY.immunity_ms(half("b", {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "x"})) == 6_000
    )


def test_discard_after_the_maximum_and_never_before_a_first_check() -> None:
    assert POLICY.action(14, T0, T0) is CheckAction.CHECK
    assert POLICY.action(15, T0, T0) is CheckAction.DISCARD
    old = T0 + POLICY.file_reserved_time_ms + 1
    assert POLICY.action(0, T0, old) is CheckAction.CHECK  # RocketMQ #8311
    assert POLICY.action(1, T0, old) is CheckAction.DISCARD


def test_a_decided_transaction_is_never_decided_again() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    pending = state.on_end(1, "a")
    assert pending is not None
    state.resolve(pending)
    assert state.on_end(2, "a") is None  # a second commit, or a commit after a rollback
    state.on_half(3, T0, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), now_ms=T0)
    assert "a" not in state.pending  # a late copy of it is not revived
    assert state.due(T0 + 10**9, 10) == []


def test_replayed_copies_keep_the_newest_check_count() -> None:
    state = HalfPartition(0, POLICY, catch_up_offset=2)
    state.on_half(0, T0, b"", half("a"), now_ms=T0 + 100_000)
    assert state.due(T0 + 100_000, 10) == []  # not caught up yet: no check during replay
    copy = half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "4"})
    state.on_half(1, T0 + 90_000, b"", copy, now_ms=T0 + 100_000)
    assert state.pending["a"].check_times == 4
    assert state.pending["a"].offset == 1
    assert state.due(T0 + 119_999, 10) == []
    assert len(state.due(T0 + 120_000, 10)) == 1


def test_checkpoint_is_the_oldest_undecided_offset() -> None:
    state = HalfPartition(0, POLICY, position=0)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    state.on_half(1, T0, b"", half("b"), now_ms=T0)
    state.on_other(2)
    assert state.checkpoint() == 0
    pending = state.on_end(3, "a")
    assert pending is not None
    state.resolve(pending)
    assert state.checkpoint() == 1
    pending = state.on_end(4, "b")
    assert pending is not None
    state.resolve(pending)
    assert state.checkpoint() == 5


def test_a_copy_written_for_a_transaction_decided_meanwhile_stays_decided() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    (pending,) = state.due(T0 + 6_000, 1)
    state.checked(pending, T0 + 6_000)
    state.copy_written("a", 9)
    decided = state.on_end(1, "a")
    assert decided is not None
    state.resolve(decided)
    state.on_half(9, T0 + 6_000, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), T0)
    assert not state.pending
