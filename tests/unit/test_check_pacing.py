"""The check window per producer group (:mod:`bridge.coordinator.transaction.pacing`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.coordinator.transaction.pacing import (
    ANSWER_TARGET_MS,
    CHECK_WINDOW_MAX,
    CHECK_WINDOW_MIN,
    CHECK_WINDOW_START,
    CheckPacing,
)

INTERVAL = 3000


def test_a_group_starts_with_the_start_window_and_each_sent_check_takes_room() -> None:
    pacing = CheckPacing(INTERVAL)
    assert pacing.room("g") == CHECK_WINDOW_START
    pacing.sent("t1", 0, "g", 1, now_ms=0)
    assert pacing.room("g") == CHECK_WINDOW_START - 1
    assert pacing.room("other") == CHECK_WINDOW_START
    assert pacing.awaited("t1") is not None


def test_a_prompt_answer_grows_the_window_up_to_its_max() -> None:
    pacing = CheckPacing(INTERVAL, window_max=CHECK_WINDOW_START + 2)
    for n in range(5):
        pacing.sent(f"t{n}", 0, "g", 1, now_ms=0)
        assert pacing.answered(f"t{n}", 1, now_ms=10) is not None
    assert pacing.window("g") == CHECK_WINDOW_START + 2
    assert pacing.in_flight("g") == 0


def test_a_late_answer_shrinks_the_window_once_per_target() -> None:
    pacing = CheckPacing(INTERVAL)
    for n in range(3):
        pacing.sent(f"t{n}", 0, "g", 1, now_ms=0)
    late = ANSWER_TARGET_MS + 1
    pacing.answered("t0", 1, now_ms=late)
    assert pacing.window("g") == CHECK_WINDOW_START * 3 // 4
    pacing.answered("t1", 1, now_ms=late + 1)  # within the same target period: no change
    assert pacing.window("g") == CHECK_WINDOW_START * 3 // 4
    pacing.answered("t2", 1, now_ms=late + ANSWER_TARGET_MS)
    assert pacing.window("g") == CHECK_WINDOW_START * 3 // 4 * 3 // 4


def test_an_answer_to_another_check_number_answers_nothing() -> None:
    pacing = CheckPacing(INTERVAL)
    pacing.sent("t", 0, "g", 2, now_ms=0)
    assert pacing.answered("t", 1, now_ms=5) is None
    assert pacing.awaited("t") is not None
    awaited = pacing.answered("t", 0, now_ms=5)  # a producer that does not say which
    assert awaited is not None and awaited.check_times == 2


def test_unanswered_checks_halve_the_window_of_a_live_group_once_per_interval() -> None:
    pacing = CheckPacing(INTERVAL)
    for n in range(3):
        pacing.sent(f"t{n}", 0, "g", 1, now_ms=0)
    pacing.unanswered("t0", INTERVAL, live=True)
    pacing.unanswered("t1", INTERVAL + 1, live=True)
    assert pacing.window("g") == CHECK_WINDOW_START // 2
    pacing.unanswered("t2", 2 * INTERVAL, live=False)  # no live producer: not the pace
    assert pacing.window("g") == CHECK_WINDOW_START // 2
    assert pacing.in_flight("g") == 0


def test_revoked_partitions_and_old_checks_are_forgotten() -> None:
    pacing = CheckPacing(INTERVAL)
    pacing.sent("a", 0, "g", 1, now_ms=0)
    pacing.sent("b", 1, "g", 1, now_ms=100)
    pacing.forget_partitions({0})
    assert pacing.awaited("a") is None and pacing.awaited("b") is not None
    assert pacing.forget_older(101) == ["b"]
    assert len(pacing) == 0


def test_bad_windows_are_refused() -> None:
    with pytest.raises(ValueError):
        CheckPacing(INTERVAL, window_min=5, window_start=2)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(("send", "answer", "late", "unanswered", "forget")),
            st.integers(0, 30),
            st.sampled_from(("g1", "g2")),
        ),
        max_size=200,
    )
)
def test_in_flight_counts_the_awaited_checks_and_the_window_stays_in_bounds(
    steps: list[tuple[str, int, str]],
) -> None:
    pacing = CheckPacing(INTERVAL)
    now = 0
    for op, n, group in steps:
        now += 100
        tid = f"t{n}"
        if op == "send":
            pacing.sent(tid, n % 3, group, 1, now)
        elif op == "answer":
            pacing.answered(tid, 1, now)
        elif op == "late":
            pacing.answered(tid, 0, now + ANSWER_TARGET_MS * 2)
        elif op == "unanswered":
            pacing.unanswered(tid, now, live=True)
        else:
            pacing.forget(tid)
        for g in ("g1", "g2"):
            assert CHECK_WINDOW_MIN <= pacing.window(g) <= CHECK_WINDOW_MAX
            assert pacing.room(g) >= 0
        awaited = [pacing.awaited(f"t{k}") for k in range(31)]
        for g in ("g1", "g2"):
            assert pacing.in_flight(g) == sum(1 for a in awaited if a is not None and a.group == g)


def test_a_group_is_answering_for_a_check_interval_after_an_awaited_check_is_answered() -> None:
    """What tells a producer that answers slowly (asked again) from one that takes no checks
    (a check asked twice and unanswered counts)."""
    pacing = CheckPacing(INTERVAL)
    assert not pacing.answering("g", 0)
    pacing.sent("t1", 0, "g", 1, now_ms=0, asks=2)
    awaited = pacing.awaited("t1")
    assert awaited is not None and awaited.asks == 2
    pacing.answered("t2", 1, now_ms=50)  # no check of t2 awaited: not an answer of the group
    assert not pacing.answering("g", 50)
    pacing.answered("t1", 1, now_ms=100)
    assert pacing.answering("g", 100 + INTERVAL - 1)
    assert not pacing.answering("g", 100 + INTERVAL)
    assert not pacing.answering("other", 100)
