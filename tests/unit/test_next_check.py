"""The next check of an undecided transaction as the operator views work it out from the
records the checker writes (its half message's copies in HALF, its check requests) is the one
the checker itself schedules: both use :func:`copy_due_ms` and :func:`asked_due_ms`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.coordinator.transaction.pending import (
    CheckPolicy,
    asked_due_ms,
    copy_due_ms,
    next_check_ms,
)
from bridge.coordinator.transaction.state import HalfPartition
from bridge.message import MessageConst, MessageExt

POLICY = CheckPolicy(transaction_timeout_ms=6_000, check_interval_ms=30_000)
T0 = 1_700_000_000_000


def half(checks: int = 0, immunity_s: str | None = None, born: int = T0) -> MessageExt:
    properties = {MessageConst.TRANSACTION_ID: "tx", MessageConst.PRODUCER_GROUP: "g"}
    if checks:
        properties[MessageConst.TRANSACTION_CHECK_TIMES] = str(checks)
    if immunity_s is not None:
        properties[MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS] = immunity_s
    return MessageExt("orders", b"x", msg_id="tx", born_timestamp_ms=born, properties=properties)


def test_a_copy_is_due_after_its_immunity_then_an_interval_after_each_check_copy() -> None:
    assert copy_due_ms(POLICY, half(), T0 + 50, T0 + 50) == T0 + 6_000
    assert copy_due_ms(POLICY, half(immunity_s="60"), T0, T0) == T0 + 60_000
    assert copy_due_ms(POLICY, half(checks=2), T0 + 9_000, T0 + 9_500) == T0 + 39_000
    # Born ahead of its reading (a clock is off): checked at once, as RocketMQ does.
    assert copy_due_ms(POLICY, half(born=T0 + 5_000), T0, T0) == T0
    assert asked_due_ms(POLICY, T0) == T0 + 30_000


def test_the_last_request_of_the_next_check_decides_once_made() -> None:
    assert next_check_ms(POLICY, T0 + 6_000, None) == T0 + 6_000
    assert next_check_ms(POLICY, T0 + 6_000, T0 + 6_200) == T0 + 36_200


events = st.lists(
    st.tuples(st.sampled_from(["ask", "answer", "put_back"]), st.integers(0, 120_000)),
    max_size=12,
)


@given(events, st.sampled_from([None, "20", "300", "x"]), st.integers(0, 2_000))
def test_the_operator_view_of_the_next_check_is_the_checker_s(
    steps: list[tuple[str, int]], immunity_s: str | None, first_append: int
) -> None:
    """Whatever the checker did (checks asked, answered, copies put back), the next check
    worked out from what it wrote is the one it holds."""
    state = HalfPartition(0, POLICY)
    offset, now = 0, T0 + first_append
    first = half(immunity_s=immunity_s)
    state.on_half(offset, now, b"", first, now)
    # What an operator reads: each copy's due time (in order) and the check requests.
    copies_due = copy_due_ms(POLICY, first, now, now)
    last_asked: int | None = None
    for kind, wait in steps:
        pending = state.pending["tx"]
        if kind == "ask":
            now = max(now, pending.next_check_ms) + wait % 1_000  # a check is asked once due
            state.asked(pending, now)
            last_asked = now
        elif kind == "answer" and last_asked is not None:
            now += wait % 5_000
            state.checked(pending, now)  # the answer counts: a copy with the new count
            offset += 1
            copy = half(checks=pending.check_times, immunity_s=immunity_s)
            state.on_half(offset, now, b"", copy, now)
            copies_due = max(copies_due, copy_due_ms(POLICY, copy, now, now))
            last_asked = None  # a request of the check after it is numbered one more
        elif kind == "put_back" and pending.next_check_ms - now > POLICY.check_interval_ms:
            now += wait % 1_000
            offset += 1
            copy = half(checks=pending.check_times, immunity_s=immunity_s)
            state.on_half(offset, now, b"", copy, now)
            copies_due = max(copies_due, copy_due_ms(POLICY, copy, now, now))
        assert state.pending["tx"].next_check_ms == next_check_ms(POLICY, copies_due, last_asked)
