"""What a record already waiting in a spread SCHEDULE or timer topic becomes when the slot
count changes: levels appended to ``message_delay_level``, or ``timer_max_delay_ms`` raised
(more tiers). With one partition per slot both were safe for the records that wait (level
``L`` is partition ``L - 1``, tier ``k`` is partition ``k`` whatever the count); the spread
layout puts lane ``j >= 1`` at ``j * n + ...``, so its meaning depends on ``n``: a record
written there carries ``n`` (``BRIDGE_SLOTS``), and one whose ``n`` is not the reader's goes by
the slot it was written for."""

from __future__ import annotations

import time

import pytest

from bridge import ClientConfig, Message, Producer
from bridge.codec import PreparedRecord
from bridge.coordinator.delay import records
from bridge.coordinator.delay.held import Held
from bridge.coordinator.delay.records import written_slots
from bridge.coordinator.delay.service import (
    ScheduleDeliveryService,
    TimerService,
    assignment_strategy,
)
from bridge.delay.routing import SLOTS_HEADER, slots_header
from bridge.delay_policy import (
    DEFAULT_MESSAGE_DELAY_LEVEL,
    DelayPolicy,
    partition_slot,
    slot_partition,
)
from bridge.kafka.service import ServiceConfig
from topics.catalog import SystemTopic

DAY_MS = 86_400_000


def _written_slots(partition: int, slots: int) -> int | None:
    """What the ``BRIDGE_SLOTS`` header of a record routed to ``partition`` with ``slots``
    slots says (the producer's and the coordinator's rule)."""
    header = slots_header(partition, slots)
    return int(header[0][1] or b"") if header else None


def test_appending_levels_never_shortens_the_wait_of_a_record_already_waiting() -> None:
    before = DelayPolicy(DEFAULT_MESSAGE_DELAY_LEVEL, level_partitions=2)
    after = DelayPolicy(DEFAULT_MESSAGE_DELAY_LEVEL + " 3h 4h", level_partitions=2)
    early = []
    displaced = 0
    for level in range(1, before.level_count + 1):
        for lane in range(2):
            partition = before.level_partition(level, lane)
            wanted = before.level_delays_ms[level - 1]
            written = _written_slots(partition, before.level_count)
            moved = after.displaced_slot(partition, written, after.level_count)
            # A displaced record goes by the level it was written for, never the partition's.
            served = (
                after.partition_delay_ms(partition)
                if moved is None
                else after.level_delays_ms[moved]
            )
            displaced += moved is not None
            if served < wanted:
                early.append((level, lane, partition, wanted, served))
    # Without the header, level 3-17 in lane 1 were read as the level before (level 17:
    # 20 min for 1 h).
    assert early == []
    assert displaced == before.level_count  # every lane-1 record, none of lane 0


def test_raising_timer_max_delay_keeps_the_tier_of_a_record_already_waiting() -> None:
    before = DelayPolicy(tier_partitions=2)
    after = DelayPolicy(timer_max_delay_ms=7 * DAY_MS, tier_partitions=2)
    assert (before.tier_count, after.tier_count) == (18, 20)
    moved = []
    for tier in range(before.tier_count):
        for lane in range(2):
            partition = before.tier_partition(tier, lane)
            written = _written_slots(partition, before.tier_count)
            displaced = after.displaced_slot(partition, written, after.tier_count)
            read_as = after.partition_tier(partition) if displaced is None else displaced
            if read_as != tier:
                moved.append((tier, lane, partition, read_as))
    # Without the header a 1 s tier record in lane 1 (partition 19) was held for tier 19's
    # wait, 2**19 s (about 6 days), before it was routed again: delivered days late.
    assert moved == []


def test_a_record_of_lane_0_or_of_the_same_count_is_read_by_its_partition() -> None:
    policy = DelayPolicy(tier_partitions=3)
    assert slots_header(17, 18) == []  # lane 0: no header
    assert slots_header(18, 18) == [(SLOTS_HEADER, b"18")]
    for partition in range(policy.timer_partitions):
        assert policy.displaced_slot(partition, None, 18) is None
        assert policy.displaced_slot(partition, 18, 18) is None
    # Fewer slots than written (levels removed): the written slot, if it differs.
    assert DelayPolicy().displaced_slot(18, 18, 16) == 17
    assert DelayPolicy().displaced_slot(5, 0, 16) is None  # a malformed count: by partition


def _range_member(partition: int, partitions: int, members: int) -> int:
    """The member librdkafka's ``range`` assignor (the delay services' first choice with more
    than one partition per slot, ``partition_assignment_strategy="range,roundrobin"``) gives a
    partition of the one topic the group reads: ``partitions // members`` consecutive
    partitions each, one more for each of the first ``partitions % members`` members."""
    share, extra = divmod(partitions, members)
    bound = extra * (share + 1)
    if partition < bound:
        return partition // (share + 1)
    return extra + (partition - bound) // share


@pytest.mark.parametrize(
    ("slots", "members"),
    [
        (18, 2),  # the default levels or tiers, two coordinator processes
        (18, 3),
        (18, 4),
        (20, 3),  # the tiers of timer_max_delay_ms = 7 days
        (18, 8),  # the 8-core model of docs/delays.md
    ],
)
def test_k_processes_share_every_slot_over_k_partitions_per_slot(slots: int, members: int) -> None:
    """docs/delays.md: "K processes share every level and every second when the partitions
    per level or tier are a multiple of K"."""
    for lanes in (members, 2 * members):
        alone = []
        for slot in range(slots):
            owners = {
                _range_member(slot_partition(slot, lane, slots), slots * lanes, members)
                for lane in range(lanes)
            }
            if len(owners) < members:
                alone.append((slot, sorted(owners)))
        assert alone == [], lanes


def test_the_delay_services_use_range_over_several_partitions_per_slot() -> None:
    """The assignor the test above models is the one the services ask for first."""
    assert assignment_strategy(1) == "roundrobin,range"
    assert assignment_strategy(2) == "range,roundrobin"


STORED = int(time.time() * 1000)
"""The broker's append time of the records below, epoch ms."""


class _Record:
    """A consumed SCHEDULE or timer record, as the delay services read it."""

    def __init__(self, prepared: PreparedRecord, stored: int) -> None:
        self._prepared, self._stored = prepared, stored

    def value(self) -> bytes | None:
        return self._prepared.value

    def key(self) -> bytes | None:
        return self._prepared.key

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._prepared.headers)

    def timestamp(self) -> tuple[int, int]:
        return (2, self._stored)


def _held(prepared: PreparedRecord, stored: int = STORED) -> Held:
    return Held(_Record(prepared, stored), prepared.partition, 0, list(prepared.headers), None)


@pytest.mark.parametrize("record_format", ["headers", "envelope"])
def test_records_past_lane_0_carry_the_slot_count_and_a_hop_rewrites_it(
    record_format: str,
) -> None:
    config = ClientConfig(
        delay_partitions_per_level=2,
        timer_partitions_per_tier=2,
        delay_record_format=record_format,
    )
    producer = Producer("slots", config=config)
    policy = config.delay_policy
    seen: dict[str, set[bool]] = {"level": set(), "timer": set()}
    for _ in range(64):
        level = producer.prepare(Message("orders", b"x", delay_time_level=3))
        slots = [v for k, v in level.headers if k == SLOTS_HEADER]
        assert slots == ([b"18"] if level.partition >= policy.level_count else [])
        seen["level"].add(bool(slots))
        timer = Message("orders", b"x")
        timer.set_delay_time_sec(10)
        record = producer.prepare(timer)
        slots = [v for k, v in record.headers if k == SLOTS_HEADER]
        assert slots == ([b"18"] if record.partition >= policy.tier_count else [])
        seen["timer"].add(bool(slots))
        # A hop to lane 0 drops it; one past lane 0 says the count it was routed with.
        held = _held(record)
        assert written_slots(held) == (18 if slots else None)
        to_lane_0 = records.hop(held, record.kafka_topic, 0, 3, 20)
        assert [k for k, _ in to_lane_0.headers].count(SLOTS_HEADER) == 0
        to_lane_1 = records.hop(held, record.kafka_topic, 0, 23, 20)
        assert [v for k, v in to_lane_1.headers if k == SLOTS_HEADER] == [b"20"]
    assert seen == {"level": {True, False}, "timer": {True, False}}


def test_a_displaced_timer_hops_at_once_by_its_own_time() -> None:
    laid_out = ClientConfig(timer_partitions_per_tier=2)
    longer = laid_out.replace(timer_max_delay_ms=7 * DAY_MS)
    service = TimerService(ServiceConfig(longer, longer.catalog(), "unit"))
    producer = Producer("slots", config=laid_out)
    stored = int(time.time() * 1000)  # the producer routes by the time left from now
    deliver = stored + 3_000
    for _ in range(32):
        timer = Message("orders", b"x")
        timer.set_deliver_time_ms(deliver)
        record = producer.prepare(timer)
        assert record is not None
        held = _held(record, stored)
        service.place(held)
        if record.partition < 18:  # lane 0: tier 1 for any count, a 2 s wait
            assert service.displaced(held) is None
            assert held.fifo_ms == stored + 2_000
        else:  # partition 20: tier 19 (2**19 s) for 20 tiers; written for tier 1
            assert service.displaced(held) == 1
            assert held.fifo_ms == stored
            hop, delivered = service.process(held, stored + 10)
            assert not delivered
            assert longer.delay_policy.partition_tier(hop.partition) == 1  # 2 s of 2.99 left


def test_a_displaced_level_waits_its_own_delay_in_the_timer_topic() -> None:
    laid_out = ClientConfig(message_delay_level="1s 2s 10s 20s", delay_partitions_per_level=2)
    appended = laid_out.replace(message_delay_level="1s 2s 10s 20s 30s 40s")
    service = ScheduleDeliveryService(ServiceConfig(appended, appended.catalog(), "unit"))
    producer = Producer("slots", config=laid_out)
    displaced = 0
    for _ in range(32):
        record = producer.prepare(Message("orders", b"x", delay_time_level=3))
        assert record is not None
        held = _held(record)
        if record.partition != 7:  # level 3 in lane 0 (partition 2) for both counts
            assert service.displaced(held) is None
            assert service.due_at(held) == STORED + 10_000
            continue
        displaced += 1  # partition 7: level 1 (1 s) for 6 levels
        assert service.displaced(held) == 2
        assert service.due_at(held) == STORED
        copy, delivered = service.process(held, STORED + 1_000)
        assert not delivered
        assert copy.kafka_topic == appended.catalog().topic(SystemTopic.TIMER)
        assert copy.kafka_topic == service.timer_topic
        timer_held = _held(copy)
        assert records.timer_deliver_ms(timer_held) == STORED + 10_000
        # Once its own delay is over it is delivered where it is.
        real, delivered = service.process(held, STORED + 10_000)
        assert delivered
        assert real.kafka_topic == "orders"
    assert displaced > 0


def test_a_displaced_level_beyond_the_timers_reach_waits_again_in_its_own_level() -> None:
    """With ``timer_max_delay_ms`` below a level's delay the timer topic would park the copy:
    it goes to its own level's partition instead (late, never early, never parked)."""
    laid_out = ClientConfig(
        message_delay_level="1s 2s 10s 2h",
        delay_partitions_per_level=2,
        timer_max_delay_ms=60_000,
    )
    appended = laid_out.replace(message_delay_level="1s 2s 10s 2h 3h 4h")
    service = ScheduleDeliveryService(ServiceConfig(appended, appended.catalog(), "unit"))
    producer = Producer("slots", config=laid_out)
    moved = 0
    for _ in range(32):
        record = producer.prepare(Message("orders", b"x", delay_time_level=4))
        assert record is not None
        if record.partition < 4:
            continue
        held = _held(record)  # partition 4: level 5 (3 h) for 6 levels, written for 2 h
        assert service.displaced(held) == 3
        copy, delivered = service.process(held, STORED + 1_000)
        assert not delivered
        assert copy.kafka_topic == service.topic
        policy = appended.delay_policy
        assert partition_slot(copy.partition, policy.level_count) == 3
        # In the lane partition 4 is for 6 levels (lane 0: partition 3, no header needed).
        assert copy.partition == 3
        assert [k for k, _ in copy.headers].count(SLOTS_HEADER) == 0
        assert service.displaced(_held(copy)) is None  # read as level 4 from now on
        moved += 1
    assert moved > 0
