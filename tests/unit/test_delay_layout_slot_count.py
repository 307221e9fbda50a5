"""What a record already waiting in a spread SCHEDULE or timer topic becomes when the slot
count changes: levels appended to ``message_delay_level``, or ``timer_max_delay_ms`` raised
(more tiers). With one partition per slot both were safe for the records that wait (level
``L`` is partition ``L - 1``, tier ``k`` is partition ``k`` whatever the count); the spread
layout puts lane ``j >= 1`` at ``j * n + ...``, so its meaning depends on ``n``: a record
written there carries ``n`` (``BRIDGE_SLOTS``), and one whose ``n`` is not the reader's goes by
the slot it was written for."""

from __future__ import annotations

import pytest

from bridge.coordinator.delay.service import assignment_strategy
from bridge.delay.routing import SLOTS_HEADER, slots_header
from bridge.delay_policy import DEFAULT_MESSAGE_DELAY_LEVEL, DelayPolicy, slot_partition

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
