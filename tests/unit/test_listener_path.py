"""Where a concurrent push consumer runs its listener: the poll thread for a listener measured
fast, the pool for a slow one, switching with hysteresis (bridge.consumer.listener_path), and
the consumer setting that sets the threshold."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import ConsumeStatus, MessageExt
from bridge.consumer import PushConsumer
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.listener_path import (
    ESTIMATE_WEIGHT,
    EXIT_FACTOR,
    PathChoice,
    inline_wanted,
    next_estimate,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.errors import InvalidArgumentError
from tests.conftest import wait_until

seconds = st.floats(min_value=1e-9, max_value=10.0, allow_nan=False)
thresholds = st.floats(min_value=1e-7, max_value=1.0, allow_nan=False)


@given(estimate=seconds, threshold=thresholds, inline_now=st.booleans())
def test_the_path_follows_the_estimate_with_hysteresis(
    estimate: float, threshold: float, inline_now: bool
) -> None:
    wanted = inline_wanted(estimate, threshold, inline_now=inline_now)
    if estimate < threshold:
        assert wanted, "below the threshold: the poll thread"
    elif estimate > threshold * EXIT_FACTOR:
        assert not wanted, "above the exit bound: the pool"
    else:
        # Between the two: where it is now (a pool listener at the threshold stays there).
        assert wanted == (inline_now and estimate <= threshold * EXIT_FACTOR)
        if not inline_now:
            assert not wanted


@given(
    estimate=st.one_of(st.just(0.0), st.floats(max_value=0.0), seconds),
    inline_now=st.booleans(),
)
def test_no_threshold_or_no_measurement_means_the_pool(estimate: float, inline_now: bool) -> None:
    assert not inline_wanted(estimate, 0.0, inline_now=inline_now), "0 turns it off"
    assert not inline_wanted(0.0, 1.0, inline_now=inline_now), "not measured yet"
    for odd in (math.inf, math.nan):
        assert not inline_wanted(odd, 1.0, inline_now=inline_now)


@given(estimate=st.one_of(st.just(0.0), seconds), measured=seconds)
def test_the_estimate_moves_a_quarter_of_the_way_to_each_measurement(
    estimate: float, measured: float
) -> None:
    after = next_estimate(estimate, measured)
    if estimate <= 0:
        assert after == measured, "the first measurement is taken as it is"
        return
    assert min(estimate, measured) <= after <= max(estimate, measured)
    assert after == pytest.approx(estimate + ESTIMATE_WEIGHT * (measured - estimate))


@given(
    threshold=thresholds,
    measurements=st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=60),
)
def test_a_choice_switches_only_across_the_bounds(
    threshold: float, measurements: list[float]
) -> None:
    """Replayed over any series of measurements: each switch to the poll thread happens with
    an estimate below the threshold, each switch back above the exit bound, never between."""
    choice = PathChoice(threshold)
    assert not choice.inline, "a listener is measured on the pool first"
    for measured in measurements:
        was = choice.inline
        now = choice.note(measured)
        assert now == choice.inline
        if now and not was:
            assert choice.estimate_s < threshold
        if was and not now:
            assert choice.estimate_s > threshold * EXIT_FACTOR
        if was == now and choice.estimate_s < threshold:
            assert now, "below the threshold it runs on the poll thread"


@given(threshold=thresholds, held=st.floats(min_value=0.0, max_value=100.0))
def test_a_call_that_held_the_poll_thread_sends_the_listener_to_the_pool(
    threshold: float, held: float
) -> None:
    choice = PathChoice(threshold)
    choice.note(threshold / 10)
    assert choice.inline
    choice.held_too_long(held)
    assert not choice.inline
    assert choice.estimate_s >= held


def test_measurements_that_teach_nothing_change_nothing() -> None:
    choice = PathChoice(1e-4)
    choice.note(1e-6)
    for odd in (-1.0, math.inf, math.nan):
        assert choice.note(odd)
        assert choice.estimate_s == 1e-6


def test_a_fast_listener_comes_back_to_the_poll_thread_only_once_measured_fast_again() -> None:
    choice = PathChoice(1e-4)
    choice.note(1e-6)
    choice.held_too_long(1.0)
    fast_notes = 0
    while not choice.note(1e-6):
        fast_notes += 1
        assert fast_notes < 100
    # 1 s decays by a quarter of the way each time: some 30 fast batches, not one.
    assert fast_notes > 20


# --- the setting -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.0, 1, 2.5, 100.0, 1e9])
def test_the_threshold_takes_zero_or_a_positive_number(value: float) -> None:
    assert (
        PushConsumerConfig(consume_inline_threshold_us=value).consume_inline_threshold_us == value
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (-1, "0 (never on the poll thread) or a positive"),
        (math.nan, "positive finite"),
        (math.inf, "positive finite"),
        (True, "must be a number"),
        ("100", "must be a number"),
        (None, "must be a number"),
    ],
)
def test_a_bad_threshold_is_refused_by_name(value: Any, said: str) -> None:
    with pytest.raises(InvalidArgumentError, match="consume_inline_threshold_us") as raised:
        PushConsumerConfig(consume_inline_threshold_us=value)
    assert said in str(raised.value)


def test_the_threshold_is_a_consumer_keyword() -> None:
    consumer = PushConsumer("g", consume_inline_threshold_us=0)
    assert consumer.settings.consume_inline_threshold_us == 0
    with pytest.raises(InvalidArgumentError, match="consume_inline_threshold_us"):
        PushConsumer("g", consume_inline_threshold_us=-5)


# --- the strategy ------------------------------------------------------------------------


class _Pool:
    """Records what is submitted; runs nothing."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []

    def submit(self, fn: Any, *args: Any) -> None:
        self.tasks.append((fn, args))


def _messages(first: int, count: int) -> list[MessageExt]:
    return [
        MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i)
        for i in range(first, first + count)
    ]


def _strategy(threshold_us: float) -> tuple[PushConsumer, ConcurrentConsumption, list[int]]:
    threads: list[int] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        threads.append(threading.get_ident())
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("g", consume_thread_count=2, consume_inline_threshold_us=threshold_us)
    consumer.subscribe("t", listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    return consumer, consumption, threads


def test_a_listener_measured_fast_is_kept_for_the_poll_thread_and_run_there() -> None:
    consumer, consumption, threads = _strategy(100.0)
    pool: _Pool = consumer._context.executor  # type: ignore[assignment]
    assert consumption.may_run_here()
    pq = ProcessQueue("t", 0)
    msgs = _messages(0, 10)
    pq.put(msgs)
    consumption.receive(pq, msgs)
    assert pool.tasks and not consumption.taken_here(), "not measured yet: the pool"
    for fn, args in pool.tasks:
        fn(*args)
    assert consumption._path.inline, "measured fast on the pool"
    pool.tasks.clear()
    more = _messages(10, 10)
    pq.put(more)
    consumption.receive(pq, more)
    assert not pool.tasks, "nothing handed to the pool"
    here = consumption.taken_here()
    assert here == [(pq, more)] and consumption.taken_here() == []
    threads.clear()
    consumption.run_here(*here[0])
    assert set(threads) == {threading.get_ident()}, "run on the calling (poll) thread"
    assert pq.held == 0 and pq.commit_offset() == 20
    assert consumer.stats().consumed == 20


def test_a_slow_listener_and_a_zero_threshold_keep_the_pool() -> None:
    consumer, consumption, _ = _strategy(0)
    pool: _Pool = consumer._context.executor  # type: ignore[assignment]
    assert not consumption.may_run_here()
    consumption._note_path(1e-9)
    pq = ProcessQueue("t", 0)
    msgs = _messages(0, 4)
    pq.put(msgs)
    consumption.receive(pq, msgs)
    assert pool.tasks and not consumption.taken_here(), "0: never the poll thread"
    consumer, consumption, _ = _strategy(100.0)
    pool = consumer._context.executor  # type: ignore[assignment]
    consumption._note_path(1e-9)
    assert consumption._path.inline
    consumption.held_too_long(2.0)
    consumption.receive(pq, msgs)
    assert pool.tasks and not consumption.taken_here(), "held the poll thread: the pool"


# --- the poll loop moving off a held poll thread ------------------------------------------


class _Here:
    """A strategy whose poll-thread work is given: records what ran where."""

    def __init__(self, work: list[tuple[ProcessQueue, list[MessageExt]]]) -> None:
        self.work = work
        self.ran: list[int] = []
        self.submitted: list[int] = []
        self.held: list[float] = []
        self.block: threading.Event | None = None
        self.entered = threading.Event()

    def may_run_here(self) -> bool:
        return True

    def taken_here(self) -> list[tuple[ProcessQueue, list[MessageExt]]]:
        work, self.work = self.work, []
        return work

    def run_here(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self.ran.append(msgs[0].queue_offset)
        self.entered.set()
        if self.block is not None:
            self.block.wait(10)

    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        self.submitted.append(msgs[0].queue_offset)

    def held_too_long(self, held_s: float) -> None:
        self.held.append(held_s)


def _fetcher(strategy: _Here, consume_timeout_min: float = 15) -> Any:
    from bridge.consumer.fetcher import Fetcher

    consumer = PushConsumer("g", consume_timeout=consume_timeout_min)
    return Fetcher(consumer._context, strategy, consumer._quarantine, {}, "")  # type: ignore[arg-type]


@dataclass
class _HeldPoll:
    """A poll thread held by its listener while the watchdog runs (:func:`_held_poll`)."""

    fetcher: Any
    started: list[threading.Thread]
    """The poll threads the watchdog started (never run)."""
    result: list[bool]
    """What the held thread's ``_run_here`` returned, once its listener returned."""


@contextmanager
def _held_poll(strategy: _Here) -> Iterator[_HeldPoll]:
    """A fetcher of ``strategy`` (consume_timeout 0.01 min, 0.6 s: the poll thread may be
    held 0.15 s) whose poll thread is held in the listener (``strategy.block``) and whose
    watchdog runs; on leaving, the listener returns and both threads end."""
    strategy.block = block = threading.Event()
    fetcher = _fetcher(strategy, consume_timeout_min=0.01)
    held_poll = _HeldPoll(fetcher, [], [])

    class _NewPollThread(threading.Thread):
        def start(self) -> None:
            held_poll.started.append(self)

    fetcher._poll_thread = lambda: _NewPollThread(target=lambda: None)
    held = threading.Thread(target=lambda: held_poll.result.append(fetcher._run_here()))
    fetcher._thread = held
    watchdog = threading.Thread(target=fetcher._watch, daemon=True)
    held.start()
    assert strategy.entered.wait(10)
    watchdog.start()
    try:
        yield held_poll
    finally:
        block.set()
        held.join(10)
        fetcher._closed.set()
        watchdog.join(10)


def test_a_held_poll_thread_hands_what_it_had_not_started_to_the_pool_and_stops_polling() -> None:
    pq = ProcessQueue("t", 0)
    strategy = _Here([(pq, _messages(0, 2)), (pq, _messages(2, 2)), (pq, _messages(4, 2))])
    fetcher = _fetcher(strategy)
    fetcher._thread = threading.current_thread()
    other = threading.Thread(target=lambda: None)

    def run_here(pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        strategy.ran.append(msgs[0].queue_offset)
        fetcher._thread = other  # the watchdog moved the poll loop meanwhile

    strategy.run_here = run_here  # type: ignore[method-assign]
    assert fetcher._run_here() is False, "this thread polls no more"
    assert strategy.ran == [0] and strategy.submitted == [2, 4]
    assert fetcher._here_since == 0.0
    fetcher._thread = threading.current_thread()
    strategy.work = [(pq, _messages(6, 1))]
    strategy.run_here = _Here.run_here.__get__(strategy)  # type: ignore[method-assign]
    assert fetcher._run_here() is True and strategy.ran[-1] == 6, "not moved: it goes on"


def test_the_watchdog_moves_the_poll_loop_off_a_thread_a_listener_holds() -> None:
    pq = ProcessQueue("t", 0)
    strategy = _Here([(pq, _messages(0, 1))])
    with _held_poll(strategy) as held:
        # The watchdog reports the hold after it started the new thread.
        wait_until(lambda: bool(held.started) and bool(strategy.held), timeout_s=10)
        assert held.fetcher._thread is held.started[0], "a new poll thread took the loop"
        assert strategy.held[0] >= 0.15
        assert held.fetcher._here_since == 0.0
    assert held.result == [False], "the held thread stops polling once its listener returns"


def test_a_listener_that_never_returns_strands_none_of_its_polls_other_messages() -> None:
    # The poll's other partitions' messages must reach the pool once the poll loop moves on,
    # not when (if ever) the held listener returns: else they are never run and their
    # partitions' offsets never pass them.
    first, second, third = ProcessQueue("t", 0), ProcessQueue("t", 1), ProcessQueue("t", 2)
    strategy = _Here(
        [(first, _messages(0, 1)), (second, _messages(10, 1)), (third, _messages(20, 1))]
    )
    with _held_poll(strategy) as held:
        wait_until(lambda: bool(strategy.held), timeout_s=10)
        wait_until(lambda: sorted(strategy.submitted) == [10, 20], timeout_s=5)
        assert strategy.ran == [0], "each message runs once: on the held thread or the pool"
    assert held.result == [False]
    assert strategy.ran == [0] and sorted(strategy.submitted) == [10, 20], "nothing twice"


def test_system_exit_from_a_listener_on_the_poll_thread_ends_neither_loop_nor_poll() -> None:
    calls: list[int] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        calls.append(msg.queue_offset)
        if msg.queue_offset == 1 and calls.count(1) == 1:
            raise SystemExit(3)
        return ConsumeStatus.CONSUME_SUCCESS

    from bridge.consumer.fetcher import Fetcher

    consumer = PushConsumer("g", consume_inline_threshold_us=100.0)
    consumer.subscribe("t", listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    consumption._note_path(1e-9)
    fetcher = Fetcher(consumer._context, consumption, consumer._quarantine, {}, "")
    fetcher._thread = threading.current_thread()
    one, two = ProcessQueue("t", 0), ProcessQueue("t", 1)
    a, b = _messages(0, 3), [MessageExt("t", b"x", msg_id="n0", queue_id=1, queue_offset=0)]
    one.put(a)
    two.put(b)
    consumption.receive(one, a)
    consumption.receive(two, b)
    try:
        still = fetcher._run_here()
    except BaseException as exc:
        pytest.fail(f"the poll thread's loop would end: {exc!r} escaped _run_here")
    assert still is True, "the poll loop goes on on this thread"
    assert fetcher._here_since == 0.0
    assert two.held == 0, "the other partition's message of the same poll ran"
    assert one.holds(1), "the message whose call escaped is kept, not committed past"
    assert one.commit_offset() == 1


def test_while_a_held_poll_thread_is_still_held_the_next_poll_runs_on_the_pool() -> None:
    # A listener that hangs now and then would otherwise leave one more poll thread held
    # each time it came back to the poll thread: threads without bound, where the listener
    # threads are consume_thread_count at most.
    pq = ProcessQueue("t", 0)
    strategy = _Here([(pq, _messages(0, 1))])
    with _held_poll(strategy) as held:
        fetcher = held.fetcher
        wait_until(lambda: bool(held.started), timeout_s=10)
        result: list[bool] = []
        poll = threading.Thread(target=lambda: result.append(fetcher._run_here()))
        fetcher._thread = poll
        strategy.work = [(pq, _messages(1, 1))]
        poll.start()
        poll.join(10)
        assert result == [True]
        assert strategy.ran == [0] and strategy.submitted == [1], "the pool, not a 2nd hold"
    # Once the held thread is gone, the poll thread runs the fast listener again.
    fetcher._thread = threading.current_thread()
    strategy.work = [(pq, _messages(2, 1))]
    assert fetcher._run_here() is True and strategy.ran == [0, 2]


def test_a_shutdown_stops_the_poll_thread_starting_the_rest_of_its_poll() -> None:
    # As a listener thread stops at its next request once shutdown gives the partitions up:
    # the rest stays held, never committed past, and the group consumes it again.
    pq = ProcessQueue("t", 0)
    strategy = _Here([(pq, _messages(0, 1)), (pq, _messages(1, 1)), (pq, _messages(2, 1))])
    fetcher = _fetcher(strategy)
    fetcher._thread = threading.current_thread()

    def run_here(pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        strategy.ran.append(msgs[0].queue_offset)
        fetcher._stopping.set()  # shutdown() began meanwhile

    strategy.run_here = run_here  # type: ignore[method-assign]
    assert fetcher._run_here() is True
    assert strategy.ran == [0] and strategy.submitted == [], "nothing started after the stop"
