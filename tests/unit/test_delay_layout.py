"""The spread layout of SCHEDULE and the timer topic: each level and tier over several
partitions, lane 0 where the one-partition layout put it, and what producers and the
coordinator's copies pick."""

from __future__ import annotations

import random

import pytest

from bridge import ClientConfig, Message, Producer
from bridge.delay_policy import (
    DelayPolicy,
    lane_for,
    partition_lane,
    partition_slot,
    slot_partition,
)
from bridge.errors import InvalidArgumentError
from topics.catalog import SystemTopic, TopicCatalog

DAY_MS = 86_400_000


@pytest.mark.parametrize("slots", [1, 2, 3, 17, 18, 25, 29])
def test_every_partition_serves_one_slot_and_lane_zero_is_the_old_layout(slots: int) -> None:
    lanes = 6
    seen = set()
    for slot in range(slots):
        assert slot_partition(slot, 0, slots) == slot  # the one-partition layout
        for lane in range(lanes):
            partition = slot_partition(slot, lane, slots)
            assert partition_slot(partition, slots) == slot
            assert partition_lane(partition, slots) == lane
            seen.add(partition)
    # The first ``lanes`` blocks, each partition once: no gap, no partition of two slots.
    assert seen == set(range(slots * lanes))


@pytest.mark.parametrize("slots", [2, 3, 17, 18, 25, 29])
def test_the_lanes_of_a_slot_alternate_between_even_and_odd_partitions(slots: int) -> None:
    """Kafka's round-robin assignor gives two members the even and the odd partitions of one
    topic: two lanes of every level or tier must go to both."""
    for slot in range(slots):
        parities = [slot_partition(slot, lane, slots) % 2 for lane in range(4)]
        assert parities in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_the_lane_is_stable_and_even() -> None:
    assert lane_for(b"AC1100000001", 4) == lane_for(b"AC1100000001", 4)  # no salted hash
    assert lane_for(b"anything", 1) == 0
    rng = random.Random(3)
    counts = [0] * 4
    for _ in range(40_000):
        counts[lane_for(rng.randbytes(16).hex().encode(), 4)] += 1
    assert min(counts) > 9_000


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"delay_partitions_per_level": 0}, "delay_partitions_per_level"),
        ({"timer_partitions_per_tier": 65}, "timer_partitions_per_tier"),
        ({"timer_partitions_per_tier": "2"}, "timer_partitions_per_tier"),
        ({"delay_spread_by": "tag"}, "delay_spread_by"),
    ],
)
def test_bad_spread_settings_are_refused_by_name(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        ClientConfig(**changes)  # type: ignore[arg-type]


def test_the_settings_read_from_the_environment_size_the_topics() -> None:
    config = ClientConfig.from_env(
        {
            "BRIDGE_DELAY_PARTITIONS_PER_LEVEL": "3",
            "BRIDGE_TIMER_PARTITIONS_PER_TIER": "4",
            "BRIDGE_DELAY_SPREAD_BY": "key",
        }
    )
    assert (config.delay_partitions_per_level, config.timer_partitions_per_tier) == (3, 4)
    catalog = config.catalog()
    assert catalog.spec(SystemTopic.SCHEDULE).partitions == 18 * 3
    assert catalog.spec(SystemTopic.TIMER).partitions == 18 * 4
    assert catalog.spec(SystemTopic.TIMER).expandable
    assert not catalog.spec(SystemTopic.HALF).expandable
    # The default is the one-partition layout (cheap, and what every coordinator reads).
    default = ClientConfig().catalog()
    assert default.spec(SystemTopic.SCHEDULE).partitions == 18
    assert default.spec(SystemTopic.TIMER).partitions == 18
    with pytest.raises(InvalidArgumentError, match="more than 10000"):
        TopicCatalog(timer_partitions=200, tier_partitions=64)


def _producer(**config: object) -> Producer:
    return Producer("pg", config=ClientConfig(**config))  # type: ignore[arg-type]


def test_producers_spread_a_level_and_a_tier_over_their_partitions() -> None:
    producer = _producer(delay_partitions_per_level=4, timer_partitions_per_tier=4)
    policy = producer.config.delay_policy
    levels, tiers = set(), set()
    for _ in range(200):
        level = producer.prepare(Message("orders", b"x", delay_time_level=3))
        assert partition_slot(level.partition, policy.level_count) == 2
        levels.add(level.partition)
        timer = Message("orders", b"x")
        timer.set_delay_time_sec(10)
        record = producer.prepare(timer)
        assert record.kafka_topic == TopicCatalog().topic(SystemTopic.TIMER)
        assert policy.partition_tier(record.partition) == 3  # 8 s at 1 s precision
        tiers.add(record.partition)
    assert levels == {slot_partition(2, lane, 18) for lane in range(4)}
    assert tiers == {slot_partition(3, lane, policy.tier_count) for lane in range(4)}


def test_by_key_the_messages_of_one_key_wait_in_one_partition() -> None:
    producer = _producer(delay_partitions_per_level=4, delay_spread_by="key")
    same = {
        producer.prepare(Message("orders", b"x", delay_time_level=2, keys="order-7")).partition
        for _ in range(50)
    }
    assert len(same) == 1
    # Without keys, the message id decides.
    spread = {
        producer.prepare(Message("orders", b"x", delay_time_level=2)).partition for _ in range(50)
    }
    assert len(spread) > 1


@pytest.mark.parametrize(
    ("precision", "max_delay_ms", "bound"), [(1000, 3 * DAY_MS, 17), (100, 31 * DAY_MS, 24)]
)
def test_a_far_timer_keeps_its_lane_and_its_hops_stay_bounded(
    precision: int, max_delay_ms: int, bound: int
) -> None:
    """The hops a timer takes do not depend on the lanes. At most 17 tier waits (the
    producer's write and 16 hops) up to 3 days at 1 s precision, 24 up to 31 days at 100 ms
    (a delay of about ``precision * 2**k`` walks down every tier below ``k``); about 9 and
    12 on average over random delays; never more than the tier count."""
    policy = DelayPolicy(
        timer_precision_ms=precision, timer_max_delay_ms=max_delay_ms, tier_partitions=4
    )
    rng = random.Random(precision)
    worst = 0
    # The worst delays: about a power of two of the precision walks down every tier below
    # it (the landing margin keeps it out of the tier of its own size).
    walks = [
        delay
        for k in range(policy.tier_count)
        for off in range(-precision, 2 * precision, precision // 20)
        if 0 < (delay := precision * 2**k + off) <= max_delay_ms
    ]
    for delay in [
        max_delay_ms,
        max_delay_ms // 2 - 1,
        *walks,
        *(rng.randint(1, max_delay_ms) for _ in range(5000)),
    ]:
        lane = rng.randrange(4)
        now, waits = 0, 0
        tier = policy.route(delay, now)
        assert tier is not None
        partition = policy.tier_partition(tier, lane)
        while True:
            waits += 1
            tier_wait = policy.tier_delay_ms(policy.partition_tier(partition))
            now = policy.exit_time_ms(now + tier_wait, delay)
            tier = policy.route(delay, now)
            if tier is None:
                break
            partition = policy.hop_partition(tier, partition, policy.tier_count)
            assert partition_lane(partition, policy.tier_count) == lane
        assert delay <= now < delay + precision  # never early
        worst = max(worst, waits)
    assert bound - 4 <= worst <= bound
    assert worst <= policy.tier_count


def test_a_back_off_copy_of_a_level_keeps_its_lane_among_the_tiers() -> None:
    policy = DelayPolicy(level_partitions=2, tier_partitions=2)
    from_level = policy.level_partition(5, 1)
    assert partition_lane(policy.hop_partition(0, from_level, policy.level_count), 18) == 1
    # A lane the timer topic does not have (more lanes per level than per tier) wraps.
    narrow = DelayPolicy(level_partitions=3, tier_partitions=2)
    wrapped = narrow.hop_partition(0, narrow.level_partition(5, 2), narrow.level_count)
    assert partition_lane(wrapped, narrow.tier_count) == 0
