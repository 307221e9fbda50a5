"""The per-partition transaction state: schedule, discard rules, duplicates, checkpoint."""

from __future__ import annotations

from bridge.coordinator.transaction.state import CheckAction, CheckPolicy, HalfPartition
from bridge.message import MessageConst, MessageExt

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
    assert due.check_times == 1 and due.latest_offset == 7
    assert due.offset == 0  # until the copy at 7 is read back
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


def test_checkpoint_keeps_the_checked_copy_until_its_new_copy_is_read_back() -> None:
    # half@10 checked while the END at 15 is not read yet; its new copy lands at 20. A restart
    # from 15 would meet the END before any copy of the half and drop the commit.
    state = HalfPartition(0, POLICY, position=10)
    state.on_half(10, T0, b"", half("a"), now_ms=T0)
    state.on_other(14)
    (pending,) = state.due(T0 + 6_000, 1)
    state.checked(pending, T0 + 6_000)
    assert state.checkpoint() == 10
    state.copy_written("a", 20)
    assert state.checkpoint() == 10  # written, not read back
    state.on_half(20, T0 + 6_000, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), T0)
    assert state.checkpoint() == 20
    assert state.pending["a"].check_times == 1


def test_a_decision_made_before_the_new_copy_is_read_covers_that_copy() -> None:
    state = HalfPartition(0, POLICY, position=10)
    state.on_half(10, T0, b"", half("a"), now_ms=T0)
    (pending,) = state.due(T0 + 6_000, 1)
    state.checked(pending, T0 + 6_000)
    state.copy_written("a", 20)
    decided = state.on_end(15, "a")
    assert decided is not None and decided.latest_offset == 20  # the OP record names copy 20
    state.resolve(decided)
    assert state.checkpoint() == 16
    state.on_half(20, T0 + 6_000, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), T0)
    assert not state.pending
    assert state.checkpoint() == 21


def test_the_consumer_position_moves_past_trailing_transaction_markers() -> None:
    # Recovery wanted to read up to 3; the record at 2 is a commit marker no consumer sees.
    state = HalfPartition(0, POLICY, position=0, catch_up_offset=3)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    state.on_half(1, T0, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), T0)
    assert not state.caught_up
    state.on_position(3)
    assert state.caught_up
    assert len(state.due(T0 + 10**6, 10)) == 1
    state.on_position(1)  # never backwards
    assert state.position == 3


def test_immunity_is_capped_at_the_retention() -> None:
    policy = CheckPolicy(transaction_timeout_ms=6_000, file_reserved_time_ms=3_600_000)
    msg = half("a", {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: str(10**9)})
    assert policy.immunity_ms(msg) == 3_600_000


def test_a_long_immune_transaction_is_put_back_and_remembered_decisions_stay_bounded() -> None:
    state = HalfPartition(0, POLICY)
    immune = half("immune", {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "86400"})
    state.on_half(0, T0, b"immune-envelope", immune, now_ms=T0)
    offset, now, put_backs = 1, T0, 0
    for i in range(5_000):
        now += 100
        state.on_half(offset, now, b"", half(f"t{i}", born=now), now_ms=now)
        decided = state.on_end(offset + 1, f"t{i}")
        assert decided is not None
        state.resolve(decided)
        offset += 2
        for pending in state.put_backs_due(now, 10):
            assert pending.transaction_id == "immune" and pending.envelope == b"immune-envelope"
            state.copy_written("immune", offset)  # the copy, written at the end of the queue
            state.on_half(offset, now, pending.envelope, immune, now_ms=now)
            offset += 1
            put_backs += 1
        assert state.due(now, 10) == []  # a put-back is not a check
        state.checkpoint()
    # One put-back per check interval (30 s) over 500 s of traffic.
    assert 15 <= put_backs <= 17
    assert state.checkpoint() > offset - 2 * 300 - 20
    assert state.decided_count <= 1024 + 2 * 300
    assert state.pending["immune"].check_times == 0
    assert state.pending["immune"].next_check_ms == T0 + 86_400_000


def test_a_held_commit_is_not_checked_nor_decided_twice() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    pending = state.on_end(1, "a")
    assert pending is not None
    state.hold(pending)
    assert state.due(T0 + 10**6, 10) == []
    assert state.checkpoint() == 0
    assert state.on_end(2, "a") is None  # a later answer does not reopen it
    state.resolve(pending)
    assert state.checkpoint() == 3


def test_a_check_count_that_is_not_ascii_digits_counts_as_zero() -> None:
    # "²" passes str.isdigit() but int() refuses it: it must not stop the partition.
    state = HalfPartition(0, POLICY)
    for offset, raw in enumerate(("²", "-1", " 3", "1" * 40)):
        tid = f"t{offset}"
        state.on_half(offset, T0, b"", half(tid, {MessageConst.TRANSACTION_CHECK_TIMES: raw}), T0)
        assert state.pending[tid].check_times == 0, raw


def test_a_check_that_could_not_be_made_counts_and_parks_in_the_end() -> None:
    policy = CheckPolicy(transaction_timeout_ms=1_000, check_interval_ms=1_000,
                         transaction_check_max=3)  # fmt: skip
    state = HalfPartition(0, policy)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    now = T0 + 1_000
    for attempt in range(1, 4):
        (due,) = state.due(now, 10)
        assert policy.action(due.check_times, due.born_ms, now) is CheckAction.CHECK
        state.check_failed(due, now, "check topic cannot be created")
        assert due.check_times == attempt and due.check_failures == attempt
        assert due.check_error == "check topic cannot be created"
        now += 1_000
    (due,) = state.due(now, 10)
    assert policy.action(due.check_times, due.born_ms, now) is CheckAction.DISCARD


def test_checks_refused_room_wait_in_the_order_they_fell_due() -> None:
    state = HalfPartition(0, POLICY)
    for i, tid in enumerate(("a", "b", "c")):
        state.on_half(i, T0, b"", half(tid, born=T0 + i), now_ms=T0)
    room = [1]

    def admit(pending: object) -> bool:
        if room[0] <= 0:
            return False
        room[0] -= 1
        return True

    now = T0 + 10_000
    assert [p.transaction_id for p in state.due(now, 10, admit)] == ["a"]
    assert state.waiting == 2
    assert state.due(now, 10, admit) == []  # still no room: nothing handed out twice
    room[0] = 5
    assert [p.transaction_id for p in state.due(now, 10, admit)] == ["b", "c"]
    assert state.waiting == 0


def test_an_asked_check_is_due_again_an_interval_later_uncounted() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    (pending,) = state.due(T0 + 6_000, 10)
    state.asked(pending, T0 + 6_000)
    assert pending.check_times == 0
    assert state.due(T0 + 35_999, 10) == []
    assert [p.transaction_id for p in state.due(T0 + 36_000, 10)] == ["a"]


def test_the_checkpoint_is_the_oldest_pending_copy() -> None:
    state = HalfPartition(0, POLICY)
    state.on_half(0, T0, b"", half("a"), now_ms=T0)
    state.on_half(1, T0, b"", half("b"), now_ms=T0)
    state.on_half(2, T0, b"", half("a", {MessageConst.TRANSACTION_CHECK_TIMES: "1"}), now_ms=T0)
    assert state.checkpoint() == 1
    pending = state.on_end(3, "b")
    assert pending is not None
    state.resolve(pending)
    assert state.checkpoint() == 2
    pending = state.on_end(4, "a")
    assert pending is not None
    state.resolve(pending)
    assert state.checkpoint() == state.position == 5
