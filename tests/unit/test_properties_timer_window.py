"""Properties of the timers' final window (``bridge.coordinator.delay.fetch.Fetcher``) against a
model of one Kafka partition log per tier partition and its group's committed offsets.

What it promises (the module's docstring, G5 in docs/guarantees.md): whatever the due times,
however much of a partition one pass fetches, whichever transactions fail (a rewind) and
whenever the service restarts (a new fetcher reading the committed offsets and their
metadata), every record is delivered exactly once and never before it is due; a transaction
marker among the offsets never holds a committed offset back; the offset metadata stays
within :data:`~bridge.coordinator.delay.fetch.METADATA_MAX_CHARS`; and a partition whose metadata is
unreadable waits, says how to clear it once a minute, and does not stop the others.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import pytest
from confluent_kafka import KafkaException, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import ClientConfig, TrustLimits
from bridge.coordinator.delay.fetch import (
    _OUT_OF_ORDER_MAX,
    _REFILL_BELOW,
    METADATA_MAX_CHARS,
    Fetcher,
    Held,
)
from bridge.coordinator.delay.held import DelaySettings
from bridge.kafka.service import ServiceConfig

PROPERTY = settings(max_examples=120, derandomize=True, database=None, deadline=None)
TOPIC = "rmq.timer"
GROUP = "rmq.coordinator.timer"
HOLD_MS = 50
"""The hold window of the model's policy, ms."""


class Record:
    """A fetched record, as much of confluent_kafka.Message as the fetcher reads."""

    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return []


@dataclass
class Broker:
    """Each partition's log (None: a transaction marker, which read_committed never returns)
    and the group's committed offsets with their metadata."""

    logs: dict[int, list[tuple[int, int] | None]]
    committed: dict[int, tuple[int, str | None]] = field(default_factory=dict)


class Consumer:
    """A consumer of :class:`Broker`: fetch positions, paused partitions."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.position: dict[int, int] = {}
        self.paused: set[int] = set()

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        out = []
        for tp in tps:
            offset, metadata = self.broker.committed.get(tp.partition, (-1001, None))
            if metadata is None:
                out.append(TopicPartition(tp.topic, tp.partition, offset))
            else:
                out.append(TopicPartition(tp.topic, tp.partition, offset, metadata))
        return out

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused.difference_update(tp.partition for tp in tps)

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused.update(tp.partition for tp in tps)

    def seek(self, tp: TopicPartition) -> None:
        self.position[tp.partition] = max(tp.offset, 0)

    def fetch(self, partition: int, most: int) -> list[Record]:
        """Up to ``most`` records of ``partition`` from its position (markers skipped)."""
        if partition in self.paused or partition not in self.position:
            return []
        log = self.broker.logs[partition]
        out: list[Record] = []
        while len(out) < most and self.position[partition] < len(log):
            offset = self.position[partition]
            self.position[partition] += 1
            if log[offset] is not None:
                out.append(Record(partition, offset))
        return out


class Policy:
    def exit_time_ms(self, tier_due_ms: int, deliver_ms: int) -> int:
        return deliver_ms if 0 < deliver_ms - tier_due_ms < HOLD_MS else tier_due_ms


class Service:
    """What the fetcher asks of its delay service."""

    def __init__(self, broker: Broker, consumer: Consumer) -> None:
        self.topic, self.name, self.group_id = TOPIC, "timer", GROUP
        self._consumer = consumer
        self.policy = Policy()
        self.dropped = self.done_before = 0
        self.timeout_s = 1.0
        self.broker = broker

    def place(self, held: Held) -> None:
        entry = self.broker.logs[held.partition][held.offset]
        assert entry is not None
        held.fifo_ms, held.exact_ms = entry
        held.due_ms = self.policy.exit_time_ms(held.fifo_ms, held.exact_ms)

    def check_fencing(self, error: object) -> None:
        raise AssertionError(error)


class Run:
    """The delay service's loop over the model: fetch, take what is due, deliver it in
    transactions (some fail), commit their offsets."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.delivered: dict[tuple[int, int], int] = {}
        self.problems: list[str] = []
        self.now = 0
        self.restart()

    def restart(self) -> None:
        self.consumer = Consumer(self.broker)
        self.service = Service(self.broker, self.consumer)
        service = self.service
        client = ClientConfig(bootstrap_servers="127.0.0.1:1", request_timeout_ms=1000)
        config = ServiceConfig(client=client, catalog=client.catalog(), coordinator_id="c")
        policy: Any = service.policy
        delay_settings = DelaySettings(
            service.name, "timer", TOPIC, TOPIC, GROUP, config, policy, TrustLimits().topics
        )
        self.fetcher = Fetcher(
            delay_settings,
            consumer=lambda: service._consumer,  # type: ignore[arg-type,return-value]
            place=service.place,
            check_fencing=service.check_fencing,
            counts=service,  # type: ignore[arg-type]
        )
        self.fetcher.assign([TopicPartition(TOPIC, p) for p in self.broker.logs])

    def step(self, advance: int, fetch: int, splits: list[bool], fail: set[int]) -> None:
        """One pass: ``fetch`` records per partition at most, a transaction boundary after
        the due records ``splits`` marks, and transaction number ``i`` fails if in ``fail``."""
        self.now += advance
        fetcher = self.fetcher
        fetcher.reposition(self.consumer)  # type: ignore[arg-type]
        for partition in self.broker.logs:
            for record in self.consumer.fetch(partition, fetch):
                fetcher.accept(record)
        due, resume = fetcher.due(self.now)
        segments: list[list[Held]] = [[]]
        for index, held in enumerate(due):
            segments[-1].append(held)
            if index < len(splits) and splits[index]:
                segments.append([])
        failed: set[int] = set()
        for number, records in enumerate(segments):
            segment = [h for h in records if h.partition not in failed]
            if not segment:
                continue
            try:
                positions = fetcher.positions(segment)
            except KafkaException:
                failed.update(h.partition for h in segment)
                continue
            if number in fail:
                failed.update(h.partition for h in segment)
                continue
            for tp in positions:
                if tp.metadata is not None and len(tp.metadata) > METADATA_MAX_CHARS:
                    self.problems.append(f"metadata of {len(tp.metadata)} characters")
            for held in segment:
                key = (held.partition, held.offset)
                entry = self.broker.logs[held.partition][held.offset]
                assert entry is not None
                earliest = Policy().exit_time_ms(*entry)
                if key in self.delivered:
                    self.problems.append(f"{key} delivered twice")
                if self.now < earliest:
                    self.problems.append(f"{key} delivered at {self.now}, due at {earliest}")
                self.delivered[key] = self.now
            for tp in positions:
                self.broker.committed[tp.partition] = (tp.offset, tp.metadata)
            fetcher.committed(segment)
        if failed:
            fetcher.rewind_all()
        else:
            fetcher.fetch_again(self.consumer, resume)  # type: ignore[arg-type]


def _logs(
    seed: int, partitions: int, size: int, markers: float
) -> dict[int, list[tuple[int, int] | None]]:
    """Per partition ``size`` offsets: records whose wait in the partition ends in order
    (``fifo``) with an exact time around it (``exact``, often within the hold window), and
    transaction markers at random offsets."""
    rnd = random.Random(seed)
    logs: dict[int, list[tuple[int, int] | None]] = {}
    for partition in range(partitions):
        fifo = 0
        log: list[tuple[int, int] | None] = []
        for _ in range(size):
            if rnd.random() < markers:
                log.append(None)
                continue
            fifo += rnd.randint(0, 3)
            log.append((fifo, fifo + rnd.randint(-5, HOLD_MS + 10)))
        logs[partition] = log
    return logs


PASS = st.tuples(
    st.integers(0, 4),  # ms since the last pass
    st.integers(0, 8),  # records fetched per partition at most (a pass's cap)
    st.lists(st.booleans(), max_size=12),  # transaction boundaries
    st.sets(st.integers(0, 2), max_size=2),  # the transactions of the pass that fail
    st.integers(0, 40),  # 0: restart after this pass
)


@PROPERTY
@given(
    seed=st.integers(0, 2**32),
    partitions=st.integers(1, 2),
    size=st.integers(1, 60),
    markers=st.sampled_from([0.0, 0.1]),
    passes=st.lists(PASS, max_size=80),
)
def test_each_timer_is_delivered_once_never_early_through_failures_and_restarts(
    seed: int,
    partitions: int,
    size: int,
    markers: float,
    passes: list[tuple[int, int, list[bool], set[int], int]],
) -> None:
    _delivered_once_never_early(seed, partitions, size, markers, passes)


@PROPERTY
@given(
    seed=st.integers(0, 2**32),
    partitions=st.integers(1, 2),
    size=st.integers(1, 60),
    markers=st.sampled_from([0.0, 0.1]),
    passes=st.lists(PASS, max_size=80),
)
def test_the_same_with_a_small_window_fetched_again_while_it_is_full(
    seed: int,
    partitions: int,
    size: int,
    markers: float,
    passes: list[tuple[int, int, list[bool], set[int], int]],
) -> None:
    # A window of 4 fills in most passes: its partition's head waits for room, and the
    # partition is fetched again while fewer than 3 records are held.
    with (
        patch("bridge.coordinator.delay.fetch._OUT_OF_ORDER_MAX", 4),
        patch("bridge.coordinator.delay.fetch._REFILL_BELOW", 3),
    ):
        _delivered_once_never_early(seed, partitions, size, markers, passes)


def _delivered_once_never_early(
    seed: int,
    partitions: int,
    size: int,
    markers: float,
    passes: list[tuple[int, int, list[bool], set[int], int]],
) -> None:
    broker = Broker(_logs(seed, partitions, size, markers))
    run = Run(broker)
    for advance, fetch, splits, fail, restart in passes:
        run.step(advance, fetch, splits, fail)
        if restart == 0:
            run.restart()
    for _ in range(500):  # then no failure: everything is delivered in the end
        expected = {(p, o) for p, log in broker.logs.items() for o, e in enumerate(log) if e}
        if expected <= run.delivered.keys():
            break
        run.step(5, 8, [], set())
    assert run.problems == []
    assert run.delivered.keys() == expected
    # And the committed offsets reach the end of every log (no marker holds one back).
    run.restart()
    run.step(0, 8, [], set())
    for partition, log in broker.logs.items():
        if any(log):
            assert broker.committed[partition][0] >= max(o for o, e in enumerate(log) if e)


def test_a_re_read_fetched_only_up_to_the_done_range_commits_no_done_record() -> None:
    # Offset 10 was not done, 11 to 3,999 were (delivered out of order); the first pass after
    # the restart fetches only 10 to 3,000.
    broker = Broker({0: [(0, 0)] * 5000}, {0: (10, "w1:3990:")})
    run = Run(broker)
    run.step(100, 2991, [], set())
    assert run.delivered.keys() == {(0, 10)}
    assert run.service.done_before == 2990
    offset, metadata = broker.committed[0]
    assert offset == 4000 and metadata is None
    run.restart()
    run.step(0, 2000, [], set())
    assert min(o for _, o in run.delivered) == 10
    assert sorted(run.delivered)[1] == (0, 4000)
    assert run.problems == []


def test_a_marker_named_as_the_committed_offset_does_not_hold_it_back() -> None:
    # Metadata written before this release could commit a transaction marker (offset 11,
    # never fetched) as the base: it is passed once a higher offset is fetched.
    log: list[tuple[int, int] | None] = [(0, 0)] * 30
    log[11] = None
    broker = Broker({0: log}, {0: (11, "w1:4:")})
    run = Run(broker)
    run.step(100, 13, [], set())  # 12 to 24 (11 is no record)
    assert sorted(o for _, o in run.delivered) == list(range(15, 25))
    assert broker.committed[0] == (25, None)


def test_timers_out_of_order_in_a_burst_keep_the_metadata_small() -> None:
    # 1,200 timers leave their tier together, their exact times shuffled.
    rnd = random.Random(1)
    exact = list(range(1200))
    rnd.shuffle(exact)
    broker = Broker({0: [(0, 1 + e % (HOLD_MS - 1)) for e in exact]})
    run = Run(broker)
    run.step(0, 2000, [], set())  # none due yet: as many as may wait go to the window
    for _ in range(400):
        run.step(1, 2000, [], set())
    assert len(run.delivered) == 1200
    assert run.problems == []
    assert not run.fetcher.in_order
    assert len(run.fetcher._window) == 0


def test_a_window_never_holds_more_than_the_metadata_can_list() -> None:
    broker = Broker({0: [(0, HOLD_MS - 1)] * 1000})
    run = Run(broker)
    run.step(0, 1000, [], set())
    assert len(run.fetcher._window) == _OUT_OF_ORDER_MAX


def test_records_behind_a_full_window_are_in_memory_when_their_time_comes() -> None:
    # 2,000 timers whose wait in the partition is over, all due at HOLD_MS - 1: the window
    # takes 256; the partition goes on being fetched (300 a pass) while fewer than
    # _REFILL_BELOW are held, so that those records go out in the pass at their time instead
    # of being read from Kafka only once the held ones are gone.
    broker = Broker({0: [(0, HOLD_MS - 1)] * 2000})
    run = Run(broker)
    for _ in range(10):
        run.step(0, 300, [], set())
    held = len(run.fetcher._held[0])
    assert len(run.fetcher._window) == _OUT_OF_ORDER_MAX
    assert _REFILL_BELOW <= held < _REFILL_BELOW + 300  # and no more: memory stays bounded
    run.step(HOLD_MS - 1, 300, [], set())
    assert len(run.delivered) == _OUT_OF_ORDER_MAX + held
    assert run.problems == []


def test_a_head_blocked_by_what_the_last_pass_took_is_due_at_once() -> None:
    # 256 timers due at 10 fill the window, 300 due at 20 wait behind them. The pass at 10
    # takes the 256: the next head waits for the next pass (what one pass takes out of order
    # is bounded too), and the service must not sleep its whole poll wait before that pass.
    first: list[tuple[int, int] | None] = [(0, 10)]
    later: list[tuple[int, int] | None] = [(0, 20)]
    log = first * _OUT_OF_ORDER_MAX + later * 300
    broker = Broker({0: log})
    run = Run(broker)
    run.step(0, 1000, [], set())
    run.step(10, 1000, [], set())
    assert len(run.delivered) == _OUT_OF_ORDER_MAX
    assert not run.fetcher._window
    next_due = run.fetcher.next_due()
    assert next_due is not None and next_due <= 10
    run.step(0, 1000, [], set())  # that pass puts the next ones in the window
    assert len(run.fetcher._window) == _OUT_OF_ORDER_MAX


def test_unreadable_metadata_stops_its_partition_only_and_says_how_to_clear_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker({0: [(0, 0)] * 5, 1: [(0, 0)] * 5}, {0: (2, "w1:x:")})
    run = Run(broker)
    with caplog.at_level(logging.ERROR, logger="bridge.coordinator.delay.fetch"):
        for _ in range(20):
            run.fetcher._seeks.now()  # as if 0.2 s had passed between passes
            run.step(1, 5, [], set())
    assert sorted(run.delivered) == [(1, o) for o in range(5)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "--reset-offsets" in errors[0] and f"--group {GROUP}" in errors[0]
    assert f"--topic {TOPIC}:0" in errors[0] and "--to-offset 2" in errors[0]
