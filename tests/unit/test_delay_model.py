"""Delay levels, timer tiers and routing: never early, late by less than the precision."""

from __future__ import annotations

import random

import pytest

from bridge import ClientConfig, Message, Producer
from bridge.delay.model import DelayPolicy, InvalidDelayError, parse_delay_levels
from bridge.delay_policy import DELIVERY_BACKOFF_MAX_MS
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst
from topics.catalog import SystemTopic, TopicCatalog

DAY_MS = 86_400_000


def test_rocketmqs_default_levels() -> None:
    policy = DelayPolicy()
    assert policy.level_count == 18
    assert policy.level_delays_ms[:4] == (1000, 5000, 10_000, 30_000)
    assert policy.level_delays_ms[-2:] == (3_600_000, 7_200_000)


@pytest.mark.parametrize("spec", ["", "1x", "0s", "-1s", "5", "1s two"])
def test_malformed_level_tables_are_refused(spec: str) -> None:
    with pytest.raises(InvalidArgumentError):
        parse_delay_levels(spec)


def test_levels_above_the_maximum_are_clamped_and_zero_means_none() -> None:
    policy = DelayPolicy()
    assert [policy.clamp_level(n) for n in (-3, 0, 1, 18, 19, 99)] == [0, 0, 1, 18, 18, 18]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"timer_precision_ms": 300}, "timer_precision_ms"),
        ({"timer_max_delay_ms": 401 * DAY_MS}, "400 days"),
    ],
)
def test_invalid_timer_settings(kwargs: dict[str, int], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        DelayPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", [100, 200, 500, 1000])
def test_hops_are_never_early_and_late_by_less_than_the_precision(precision: int) -> None:
    policy = DelayPolicy(timer_precision_ms=precision, timer_max_delay_ms=365 * DAY_MS)
    rng = random.Random(precision)
    for _ in range(3000):
        delay = rng.choice([rng.randint(1, 10_000), rng.randint(1, 365 * DAY_MS)])
        now, due, hops = 0, delay, 0
        while (tier := policy.route(due, now)) is not None:
            assert policy.tier_delay_ms(tier) <= max(due - now, precision)
            # Out of the tier the service waits for the exact time when it is close.
            now = policy.exit_time_ms(now + policy.tier_delay_ms(tier), due)
            hops += 1
        assert due <= now < due + precision
        assert hops <= 2 * policy.tier_count


def test_a_year_of_delay_needs_29_tiers_at_100_ms() -> None:
    policy = DelayPolicy(timer_precision_ms=100, timer_max_delay_ms=365 * DAY_MS)
    assert policy.tier_count == 29
    assert policy.tier_delay_ms(28) <= 365 * DAY_MS < policy.tier_delay_ms(29)


def test_timer_properties_and_the_maximum() -> None:
    policy = DelayPolicy()
    assert (
        policy.deliver_time_ms(born_ms=1000, deliver_ms="5000", delay_ms=None, delay_sec=None)
        == 5000
    )
    assert (
        policy.deliver_time_ms(born_ms=1000, deliver_ms=None, delay_ms="250", delay_sec=None)
        == 1250
    )
    assert (
        policy.deliver_time_ms(born_ms=1000, deliver_ms=None, delay_ms=None, delay_sec="2") == 3000
    )
    with pytest.raises(InvalidDelayError, match="beyond timer_max_delay_ms=259200000"):
        policy.deliver_time_ms(born_ms=0, deliver_ms=None, delay_ms=None, delay_sec=str(4 * 86_400))
    with pytest.raises(InvalidDelayError, match="TIMER_DELAY_MS must be an integer"):
        policy.deliver_time_ms(born_ms=0, deliver_ms=None, delay_ms="soon", delay_sec=None)


def producer(**config: object) -> Producer:
    return Producer("pg", config=ClientConfig(**config))  # type: ignore[arg-type]


def test_a_delay_level_message_goes_to_its_schedule_partition() -> None:
    record = producer().prepare(Message("orders", b"x", delay_time_level=25, keys="k"), partition=2)
    assert record.kafka_topic == TopicCatalog().topic(SystemTopic.SCHEDULE)
    assert record.partition == 17  # level 25 clamped to 18
    from bridge.codec import delayed_message

    msg = delayed_message(record.headers, record.value)
    assert msg.get_property(MessageConst.DELAY_TIME_LEVEL) == "18"
    assert msg.get_property(MessageConst.REAL_TOPIC) == "orders"
    assert msg.get_property(MessageConst.REAL_QUEUE_ID) == "2"
    assert msg.keys == ["k"]


def test_a_timer_goes_to_its_tier_and_a_level_wins_over_it() -> None:
    timer = Message("orders", b"x")
    timer.set_delay_time_sec(10)
    record = producer().prepare(timer)
    assert record.kafka_topic == TopicCatalog().topic(SystemTopic.TIMER)
    assert record.partition == 3  # 8 s: the largest tier ending 250 ms before 10 s at 1 s
    timer.set_delay_time_level(1)
    assert producer().prepare(timer).kafka_topic == TopicCatalog().topic(SystemTopic.SCHEDULE)


def test_a_timer_in_the_past_is_sent_at_once_without_timer_properties() -> None:
    past = Message("orders", b"x")
    past.set_deliver_time_ms(1)
    record = producer().prepare(past)
    assert record.kafka_topic == "orders"
    assert not [h for h, _ in record.headers if h.startswith("TIMER_")]


def test_a_timer_beyond_the_maximum_is_refused_at_send_time() -> None:
    far = Message("orders", b"x")
    far.set_delay_time_sec(4 * 86_400)
    with pytest.raises(InvalidDelayError, match="beyond"):
        producer().prepare(far)
    assert producer(timer_max_delay_ms=365 * DAY_MS).prepare(far).partition >= 0


def test_the_catalogs_defaults_match_the_default_delay_settings() -> None:
    default, derived = TopicCatalog(), ClientConfig().catalog()
    assert (default.delay_level_count, default.timer_partitions) == (
        derived.delay_level_count,
        derived.timer_partitions,
    )


@pytest.mark.parametrize(
    ("precision_ms", "max_ms"), [(1000, 3 * DAY_MS), (100, 100), (100, 1000), (1000, 400 * DAY_MS)]
)
def test_only_timers_beyond_the_maximum_and_the_back_off_margin_are_out_of_reach(
    precision_ms: int, max_ms: int
) -> None:
    policy = DelayPolicy(timer_precision_ms=precision_ms, timer_max_delay_ms=max_ms)
    now = 1_800_000_000_000
    # The coordinator's back-off copies (up to a minute ahead) hop on whatever the maximum.
    margin = DELIVERY_BACKOFF_MAX_MS
    for ahead in (1, max_ms, max_ms + margin, margin):
        assert policy.out_of_reach(now + ahead, now) is None, ahead
    for due in (now + max(max_ms, 0) + margin + 1, 253_402_300_799_000, 2**63 - 1, 10**4000):
        why = policy.out_of_reach(due, now)
        assert why is not None and f"beyond timer_max_delay_ms={max_ms}" in why
        assert len(why) < 500  # a value of thousands of digits is shown cut


def test_a_producer_never_sends_a_timer_the_coordinator_finds_out_of_reach() -> None:
    policy = DelayPolicy(timer_precision_ms=100, timer_max_delay_ms=1000)
    born = 1_800_000_000_000
    for delay in range(0, 1001, 50):
        due = policy.deliver_time_ms(
            born_ms=born, deliver_ms=None, delay_ms=str(delay), delay_sec=None
        )
        tier = policy.route(due, born)
        # Taken out of its tier no sooner than its wait after the send.
        left = born + (0 if tier is None else policy.tier_delay_ms(tier))
        assert policy.out_of_reach(due, left) is None
