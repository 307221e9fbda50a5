"""Hops near deliveries (``bridge.delay.fetch``): while timers are delivered, or one in the final
window is due within ``_DELIVERY_SOON_MS``, a pass takes a bounded number of hops, so that a
transaction of hundreds of hops does not delay the deliveries due while it is written; the
hops left wait at their partition's head and the next pass, at once, takes them. With no
delivery near, a pass takes every hop due (a burst moves at full speed).

The fetcher runs against the model log of ``tests/unit/test_properties_timer_window.py``
(records are ``(fifo_ms, exact_ms)``; the model's hold window is ``HOLD_MS``)."""

from __future__ import annotations

from unittest.mock import patch

from confluent_kafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from bridge.delay import fetch
from bridge.delay.fetch import Fetcher, Held
from tests.unit.test_properties_timer_window import (
    PASS,
    PROPERTY,
    TOPIC,
    Broker,
    Consumer,
    Run,
    Service,
    _logs,
)

HOPS = 300
"""Timers due far beyond the hold window, all leaving their tier at once."""


def _fetcher(logs: dict[int, list[tuple[int, int] | None]]) -> tuple[Fetcher, Consumer]:
    broker = Broker(logs)
    consumer = Consumer(broker)
    fetcher = Fetcher(Service(broker, consumer))  # type: ignore[arg-type]
    fetcher.assign([TopicPartition(TOPIC, p) for p in logs])
    fetcher.reposition(consumer)  # type: ignore[arg-type]
    return fetcher, consumer


def _accept(fetcher: Fetcher, consumer: Consumer, partition: int) -> None:
    for record in consumer.fetch(partition, 10_000):
        fetcher.accept(record)


def _commit(fetcher: Fetcher, due: list[Held]) -> None:
    fetcher.positions(due)
    fetcher.committed(due)


def test_hops_are_bounded_while_a_delivery_is_due_soon_and_all_are_taken_in_the_end() -> None:
    # Partition 1: one timer whose tier wait is over, due at 30 ms (in the final window);
    # partition 0: HOPS timers due at 10 s, their tier wait over at 0 ms.
    fetcher, consumer = _fetcher({0: [(0, 10_000)] * HOPS, 1: [(0, 30)]})
    _accept(fetcher, consumer, 1)
    assert fetcher.due(0) == ([], [])  # in the window, due at 30 ms
    _accept(fetcher, consumer, 0)
    passes: list[int] = []
    taken: set[int] = set()
    while len(taken) < HOPS:
        due, _ = fetcher.due(0)
        assert due, f"no progress after {passes}"
        assert {h.partition for h in due} == {0}
        passes.append(len(due))
        taken.update(h.offset for h in due)
        _commit(fetcher, due)
        if len(taken) < HOPS:
            next_due = fetcher.next_due()
            assert next_due is not None and next_due <= 0, "the hops left must not wait"
    bound = fetch._HOPS_NEAR_DELIVERIES
    assert passes == [bound, bound, HOPS - 2 * bound]
    assert taken == set(range(HOPS))
    # The window's timer is still delivered at its time, not before.
    assert fetcher.due(29) == ([], [])
    due, _ = fetcher.due(30)
    assert [(h.partition, h.offset) for h in due] == [(1, 0)]


def test_hops_in_a_pass_that_delivers_are_bounded() -> None:
    # A delay-level-like record (no exact time) due now and HOPS hops behind it.
    log: list[tuple[int, int] | None] = [(0, 0)]
    log += [(0, 10_000)] * HOPS
    logs = {0: log}
    fetcher, consumer = _fetcher(logs)
    _accept(fetcher, consumer, 0)
    due, _ = fetcher.due(0)
    assert [h.offset for h in due] == list(range(1 + fetch._HOPS_NEAR_DELIVERIES))


def test_with_no_delivery_near_a_pass_takes_every_hop() -> None:
    fetcher, consumer = _fetcher({0: [(0, 10_000)] * HOPS, 1: [(0, 10_000 + 51)]})
    _accept(fetcher, consumer, 0)
    _accept(fetcher, consumer, 1)
    due, _ = fetcher.due(0)
    assert len(due) == HOPS + 1


@PROPERTY
@given(
    seed=st.integers(0, 2**32),
    partitions=st.integers(1, 2),
    size=st.integers(1, 60),
    passes=st.lists(PASS, max_size=60),
)
def test_bounded_hops_still_deliver_each_timer_once_never_early(
    seed: int,
    partitions: int,
    size: int,
    passes: list[tuple[int, int, list[bool], set[int], int]],
) -> None:
    with patch.object(fetch, "_HOPS_NEAR_DELIVERIES", 1):
        broker = Broker(_logs(seed, partitions, size, 0.1))
        run = Run(broker)
        for advance, fetched, splits, fail, restart in passes:
            run.step(advance, fetched, splits, fail)
            if restart == 0:
                run.restart()
        expected = {(p, o) for p, log in broker.logs.items() for o, e in enumerate(log) if e}
        for _ in range(2000):
            if expected <= run.delivered.keys():
                break
            run.step(5, 8, [], set())
        assert run.problems == []
        assert run.delivered.keys() == expected
