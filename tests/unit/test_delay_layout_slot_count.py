"""What a record already waiting in a spread SCHEDULE or timer topic becomes when the slot
count changes: levels appended to ``message_delay_level``, or ``timer_max_delay_ms`` raised
(more tiers). With one partition per slot both were safe for the records that wait (level
``L`` is partition ``L - 1``, tier ``k`` is partition ``k`` whatever the count); the spread
layout puts lane ``j >= 1`` at ``j * n + ...``, so its meaning depends on ``n``."""

from __future__ import annotations

from bridge.delay_policy import DEFAULT_MESSAGE_DELAY_LEVEL, DelayPolicy

DAY_MS = 86_400_000


def test_appending_levels_never_shortens_the_wait_of_a_record_already_waiting() -> None:
    before = DelayPolicy(DEFAULT_MESSAGE_DELAY_LEVEL, level_partitions=2)
    after = DelayPolicy(DEFAULT_MESSAGE_DELAY_LEVEL + " 3h 4h", level_partitions=2)
    early = []
    for level in range(1, before.level_count + 1):
        for lane in range(2):
            partition = before.level_partition(level, lane)
            wanted = before.level_delays_ms[level - 1]
            served = after.partition_delay_ms(partition)
            if served < wanted:
                early.append((level, lane, partition, wanted, served))
    # Today level 3-17 in lane 1 are read as the level before (level 17: 20 min for 1 h).
    assert early == []


def test_raising_timer_max_delay_keeps_the_tier_of_a_record_already_waiting() -> None:
    before = DelayPolicy(tier_partitions=2)
    after = DelayPolicy(timer_max_delay_ms=7 * DAY_MS, tier_partitions=2)
    assert (before.tier_count, after.tier_count) == (18, 20)
    moved = []
    for tier in range(before.tier_count):
        for lane in range(2):
            partition = before.tier_partition(tier, lane)
            if after.partition_tier(partition) != tier:
                moved.append((tier, lane, partition, after.partition_tier(partition)))
    # Today a 1 s tier record in lane 1 (partition 19) is held for tier 19's wait, 2**19 s
    # (about 6 days), before it is routed again: delivered days late.
    assert moved == []
