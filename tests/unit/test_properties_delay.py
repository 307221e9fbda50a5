"""Properties of delayed delivery's pure rules (``bridge.delay.model``, ``bridge.delay.routing``).

What the modules promise: a level above the maximum is the maximum and 0 or below is none; a
delay level waits in SCHEDULE partition ``level - 1``; a timer hops through tiers of
``precision * 2**k``, each hop to the largest tier that still lands before its time, so it is
never delivered early, every hop makes progress, it ends on its real topic, and (with no latency
between hops) it is late by less than the precision; a timer in the past is due at once; a
timer beyond ``timer_max_delay_ms`` and any malformed value are refused with
:class:`InvalidDelayError` (bad settings with :class:`InvalidArgumentError`).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bridge import ClientConfig, Message
from bridge.codec import delayed_message
from bridge.delay.model import (
    LANDING_MARGIN_MS,
    TIMER_PRECISIONS_MS,
    DelayPolicy,
    InvalidDelayError,
    parse_delay_levels,
)
from bridge.delay.routing import delayed_record
from bridge.errors import InvalidArgumentError
from bridge.message import MessageConst
from topics.catalog import SystemTopic
from topics.naming import system_topic

PROPERTY = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Fixed examples (no example database, nothing random between runs), a few hundred each."""

DAY_MS = 86_400_000
MAX_DELAY_MS = 400 * DAY_MS
"""The longest ``timer_max_delay_ms`` accepted."""

policies = st.builds(
    lambda precision, max_delay: DelayPolicy(
        timer_precision_ms=precision, timer_max_delay_ms=max(precision, max_delay)
    ),
    st.sampled_from(TIMER_PRECISIONS_MS),
    st.one_of(
        st.integers(1, MAX_DELAY_MS),
        st.sampled_from([1000, 3 * DAY_MS, MAX_DELAY_MS]),
    ),
)
"""Every valid timer setting: each precision, maxima from the precision to 400 days."""
delays_ms = st.one_of(
    st.integers(-(10**15), 10**15),
    st.integers(-2_000, 3_000),
    st.sampled_from([0, 1, LANDING_MARGIN_MS, LANDING_MARGIN_MS + 1, 999, 1000, 1001, 1250, 1251]),
)
"""Delays, ms: far past and far future, around zero, and around the precision and margin."""
level_words = st.one_of(
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.integers(-3, 10**6),
        st.sampled_from(["s", "m", "h", "d", "", "x", "ms"]),
    ),
    st.text(alphabet="0123456789smhd-+ .", max_size=6),
    st.integers(1, 12).map(lambda k: "9" * (500 * k) + "s"),
)
"""Words of a ``messageDelayLevel`` table: good ones, bad units, signs, and huge numbers."""


@PROPERTY
@given(words=st.lists(level_words, max_size=20), separator=st.sampled_from([" ", "  ", "\t"]))
def test_a_level_table_parses_to_positive_delays_or_is_refused_with_a_typed_error(
    words: list[str], separator: str
) -> None:
    spec = separator.join(words)
    try:
        delays = parse_delay_levels(spec)
    except InvalidArgumentError:
        return
    assert len(delays) == len(spec.split())
    assert all(isinstance(d, int) and d > 0 for d in delays)


@PROPERTY
@given(policy=policies, level=st.integers(-(2**63), 2**63))
def test_levels_are_clamped_to_the_table_and_zero_or_below_is_none(
    policy: DelayPolicy, level: int
) -> None:
    clamped = policy.clamp_level(level)
    assert 0 <= clamped <= policy.level_count
    assert (clamped == 0) == (level <= 0)
    if 1 <= level <= policy.level_count:
        assert clamped == level
    if level > policy.level_count:
        assert clamped == policy.level_count


@PROPERTY
@given(precision=st.integers(-10, 2000), max_delay=st.integers(-DAY_MS, 500 * DAY_MS))
def test_timer_settings_are_valid_or_refused_with_a_typed_error(
    precision: int, max_delay: int
) -> None:
    try:
        policy = DelayPolicy(timer_precision_ms=precision, timer_max_delay_ms=max_delay)
    except InvalidArgumentError:
        assert precision not in TIMER_PRECISIONS_MS or not precision <= max_delay <= MAX_DELAY_MS
        return
    # The tiers reach the maximum delay, and not one tier more.
    last = policy.tier_count - 1
    assert policy.tier_delay_ms(last) <= policy.timer_max_delay_ms < policy.tier_delay_ms(last + 1)


@PROPERTY
@given(policy=policies, now=st.integers(0, 2**42), delay=delays_ms, data=st.data())
def test_a_route_is_the_largest_tier_that_lands_before_the_time(
    policy: DelayPolicy, now: int, delay: int, data: st.DataObject
) -> None:
    tiers = data.draw(st.integers(1, policy.tier_count), label="tiers")
    tier = policy.route(now + delay, now, tiers)
    if delay <= 0:
        assert tier is None, "due (or past): delivered now"
        return
    assert tier is not None and 0 <= tier < tiers
    room = delay - LANDING_MARGIN_MS
    if room >= policy.timer_precision_ms:
        assert policy.tier_delay_ms(tier) <= room, "a tier never ends past the time"
        assert tier == tiers - 1 or policy.tier_delay_ms(tier + 1) > room, "the largest one"
    else:
        assert tier == 0, "less than a precision left: the shortest tier"


def hop_to_the_end(
    policy: DelayPolicy, deliver_ms: int, now: int, tiers: int, latencies: list[int]
) -> tuple[int, int]:
    """Run a timer message through its tiers as the timer service does: stored ``latency`` after
    it was routed, taken out at :meth:`DelayPolicy.exit_time_ms`, routed again. Returns (when it
    is delivered, how many hops it took)."""
    hops = 0
    while (tier := policy.route(deliver_ms, now, tiers)) is not None:
        stored = now + (latencies[hops % len(latencies)] if latencies else 0)
        tier_due = stored + policy.tier_delay_ms(tier)
        out = policy.exit_time_ms(tier_due, deliver_ms)
        assert out >= tier_due, "never taken out before its tier wait ends"
        assert out > now, "every hop makes progress"
        now = out
        hops += 1
        assert hops <= 10_000, "a hop sequence that does not end"
    return now, hops


@PROPERTY
@given(policy=policies, now=st.integers(0, 2**42), delay=delays_ms, data=st.data())
def test_a_timer_is_never_early_and_late_by_less_than_the_precision(
    policy: DelayPolicy, now: int, delay: int, data: st.DataObject
) -> None:
    delay = min(delay, policy.timer_max_delay_ms)
    delivered, hops = hop_to_the_end(policy, now + delay, now, policy.tier_count, [])
    due = now + max(delay, 0)
    assert due <= delivered < due + policy.timer_precision_ms
    # About log2(delay / precision) hops: down the tiers once, a few more to land.
    assert hops <= 2 * policy.tier_count


@PROPERTY
@given(
    policy=policies,
    now=st.integers(0, 2**42),
    delay=st.integers(1, 40 * DAY_MS),
    latencies=st.lists(st.integers(0, 5_000), min_size=1, max_size=8),
    data=st.data(),
)
def test_with_slow_hops_or_too_few_tiers_a_timer_still_arrives_never_early(
    policy: DelayPolicy, now: int, delay: int, latencies: list[int], data: st.DataObject
) -> None:
    # Fewer tiers than the maximum needs (a timer topic created with fewer partitions) or a
    # slow broker between hops: still never early, and late by at most a precision plus the
    # slowest hop's latency.
    tiers = data.draw(st.integers(1, policy.tier_count), label="tiers")
    assume(delay // policy.tier_delay_ms(tiers - 1) <= 2_000)  # keep the hop count small
    delivered, _ = hop_to_the_end(policy, now + delay, now, tiers, latencies)
    assert now + delay <= delivered < now + delay + policy.timer_precision_ms + max(latencies)


@PROPERTY
@given(
    policy=policies,
    born=st.integers(0, 2**42),
    which=st.sampled_from(["deliver_ms", "delay_ms", "delay_sec"]),
    raw=st.one_of(
        st.integers(-(10**16), 10**16).map(str),
        st.text(alphabet="0123456789-+ _.e", max_size=12),
        st.integers(1, 10).map(lambda k: "9" * (500 * k)),
        st.text(max_size=8),
    ),
)
def test_timer_properties_give_a_time_within_the_maximum_or_a_typed_error(
    policy: DelayPolicy, born: int, which: str, raw: str
) -> None:
    fields: dict[str, str | None] = {"deliver_ms": None, "delay_ms": None, "delay_sec": None}
    fields[which] = raw
    try:
        due = policy.deliver_time_ms(born_ms=born, **fields)
    except InvalidDelayError:
        return
    assert due - born <= policy.timer_max_delay_ms
    number = int(raw)
    expected = {"deliver_ms": number, "delay_ms": born + number, "delay_sec": born + number * 1000}
    assert due == expected[which]


@PROPERTY
@given(level=st.integers(-5, 10**6), delay_ms=st.one_of(st.none(), delays_ms))
def test_a_delayed_message_waits_in_the_right_partition_and_a_level_wins_over_a_timer(
    level: int, delay_ms: int | None
) -> None:
    config = ClientConfig(namespace="ns")
    policy = config.delay_policy
    msg = Message("orders", b"x")
    msg.set_delay_time_level(level)
    if delay_ms is not None:
        delay_ms = min(delay_ms, policy.timer_max_delay_ms)
        msg.set_delay_time_ms(delay_ms)
    if not msg.is_delayed:
        assert level <= 0 and delay_ms is None
        return  # the producer sends it as it is, without delayed_record
    born = 1_700_000_000_000
    record = delayed_record(msg, "ID", born, "h", partition=3, config=config)
    if level > 0:
        assert record is not None
        assert record.kafka_topic == system_topic(SystemTopic.SCHEDULE.value, "ns")
        assert record.partition == policy.clamp_level(level) - 1
        waiting = delayed_message(record.headers, record.value)
        assert waiting.get_property(MessageConst.DELAY_TIME_LEVEL) == str(policy.clamp_level(level))
        assert waiting.get_property(MessageConst.TIMER_DELAY_MS) is None
    elif delay_ms is None or delay_ms <= 0:
        assert record is None, "a timer in the past: sent to its topic at once"
    else:
        assert record is not None
        assert record.kafka_topic == system_topic(SystemTopic.TIMER.value, "ns")
        assert record.partition == policy.route(born + delay_ms, born)
        waiting = delayed_message(record.headers, record.value)
        assert waiting.get_property(MessageConst.TIMER_DELIVER_MS) == str(born + delay_ms)
        assert waiting.get_property(MessageConst.REAL_QUEUE_ID) == "3"


# --- regressions found by the properties above -------------------------------------------------


def test_a_level_with_more_digits_than_int_converts_is_refused_with_a_typed_error() -> None:
    # int() refuses more than 4300 digits with a plain ValueError, which escaped.
    with pytest.raises(InvalidArgumentError, match="delay level"):
        parse_delay_levels("1s " + "9" * 4500 + "s")
