"""The delay policy: RocketMQ 4's delay levels and RocketMQ 5's timer messages. Pure logic.

Settings of their own, apart from the connection settings: :class:`~bridge.config.ClientConfig`
builds one from its delay fields, and the topic catalog takes its SCHEDULE and timer partition
counts from it; the delay services route by it.

Every delay is served by FIFO queues of fixed delay, one Kafka partition each, so only the head
of each partition matters and memory stays bounded however many messages wait:

* delay level ``L`` waits in a partition of ``SCHEDULE_TOPIC_XXXX`` for the level's delay,
  counted from when the broker stored it (as RocketMQ's ``ScheduleMessageService``);
* a timer message hops through the tiers of ``rmq_sys_wheel_timer``: tier ``k`` waits
  ``precision * 2**k``. At each hop the message goes to the largest tier that does not pass
  its delivery time, so it is never early, reaches its time in about log2(delay / precision)
  hops; its last hop lands before its time and it waits the rest in memory, so it is late
  by the time its delivery takes to write.

The layout (:func:`slot_partition`): a level or a tier (a *slot*) is spread over several
partitions (*lanes*), so that the members of a coordinator group share what is due in one
level or one second. Lane 0 of slot ``s`` is partition ``s`` (the layout of releases with one
partition per slot: their records are read as they were written); lane ``j`` is in the
``j``-th block of ``slots`` partitions. Which slot a partition serves depends only on its
number and the slot count, never on how many lanes there are: adding partitions to a topic
changes the meaning of none that exists. Changing the slot count (levels appended, a longer
``timer_max_delay_ms``) changes the meaning of every partition past lane 0, so the records
written there carry the count they were routed with (:meth:`DelayPolicy.displaced_slot`).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Final

from bridge.errors import InvalidArgumentError, InvalidDelayError

__all__ = [
    "DEFAULT_LANES",
    "DEFAULT_MESSAGE_DELAY_LEVEL",
    "DELIVERY_BACKOFF_MAX_MS",
    "LANDING_MARGIN_MS",
    "LANES_MAX",
    "SPREAD_BY",
    "TIMER_PRECISIONS_MS",
    "DelayPolicy",
    "lane_for",
    "parse_delay_levels",
    "partition_lane",
    "partition_slot",
    "require_lanes",
    "slot_partition",
]

DEFAULT_MESSAGE_DELAY_LEVEL: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
"""RocketMQ's ``messageDelayLevel``."""

TIMER_PRECISIONS_MS: Final = (100, 200, 500, 1000)
"""RocketMQ 5's allowed ``timerPrecisionMs`` values."""
LANDING_MARGIN_MS: Final = 250
"""A timer hops to land this long before its time, then waits for the exact time in memory, so
the last hop's commit and fetch latency does not make it late."""

DELIVERY_BACKOFF_MAX_MS: Final = 60_000
"""The longest back-off between two deliveries of a delayed message that failed, ms: the
coordinator's back-off copies are timers due at most this far ahead, whatever
``timer_max_delay_ms`` is (see :meth:`DelayPolicy.out_of_reach`)."""

DEFAULT_LANES: Final = 1
"""Partitions per delay level and per timer tier by default: one, the layout of releases
before the spread one (18 partitions in each topic with the default settings; any coordinator
of any release reads it). Raise it to (a multiple of) the number of coordinator processes
that are to share a level or a second."""
LANES_MAX: Final = 64
"""The most partitions per level or tier a setting may ask for."""
SPREAD_BY: Final = ("id", "key")
"""What picks a delayed message's partition among its level's or tier's
(:func:`lane_for`): its message id (even spread), or its keys when it has any (the messages
of one key wait in one partition, so one level keeps their order)."""

_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL = re.compile(r"^(\d+)([smhd])$")


def _block_shift(slots: int) -> int:
    """How far each block of ``slots`` partitions turns its slots (see :func:`slot_partition`):
    1 when ``slots`` is even, else 0, so that the lanes of one slot fall on partitions of
    both parities (Kafka's round-robin assignor gives a group of two members the even and the
    odd partitions)."""
    return 1 - slots % 2


def slot_partition(slot: int, lane: int, slots: int) -> int:
    """The partition of lane ``lane`` of slot ``slot`` (a level index ``L - 1`` or a tier) in a
    topic of ``slots`` slots: ``lane * slots + (slot + lane * shift) % slots``, ``shift`` 1
    when ``slots`` is even, else 0. Lane 0 of slot ``s`` is partition ``s``. The shift makes
    consecutive lanes of one slot alternate between even and odd partition numbers, which a
    round-robin assignment gives to different group members."""
    return lane * slots + (slot + lane * _block_shift(slots)) % slots


def partition_slot(partition: int, slots: int) -> int:
    """The slot partition ``partition`` serves (the inverse of :func:`slot_partition`)."""
    lane = partition // slots
    return (partition % slots - lane * _block_shift(slots)) % slots


def partition_lane(partition: int, slots: int) -> int:
    """The lane of partition ``partition`` in its slot."""
    return partition // slots


def lane_for(spread_key: bytes, lanes: int) -> int:
    """The lane (``0 <= lane < lanes``) of a message whose spread key (message id or keys) is
    ``spread_key``: CRC-32, the same in every process and release (Python's ``hash`` of
    bytes is salted per process)."""
    return zlib.crc32(spread_key) % lanes if lanes > 1 else 0


def require_lanes(name: str, value: object) -> None:
    """:class:`InvalidArgumentError` naming ``name`` (a setting, as its owner spells it)
    unless ``value`` is a lane count, an integer from 1 to :data:`LANES_MAX`: the one check
    of :class:`DelayPolicy`'s counts and of the client settings that give them."""
    if type(value) is not int or not 1 <= value <= LANES_MAX:
        raise InvalidArgumentError(
            f"{name} must be an integer from 1 to {LANES_MAX}, got {value!r}"
        )


def parse_delay_levels(spec: str) -> tuple[int, ...]:
    """``"1s 5s 10s 30s 1m ..."`` -> delays in milliseconds (RocketMQ's format)."""
    levels = []
    for word in spec.split():
        m = _LEVEL.match(word)
        try:
            delay = int(m.group(1)) if m is not None else 0
        except ValueError:  # more digits than int() converts (4300)
            delay = 0
        if m is None or delay <= 0:
            raise InvalidArgumentError(
                f"delay level {word!r} in {spec!r} is not a positive number "
                "followed by s, m, h or d"
            )
        levels.append(delay * _UNIT_MS[m.group(2)])
    if not levels:
        raise InvalidArgumentError("the delay level table is empty")
    return tuple(levels)


@dataclass(frozen=True, slots=True)
class DelayPolicy:
    """The delay level table and the timer settings, shared by producers and coordinators."""

    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    timer_precision_ms: int = 1000
    """RocketMQ 5's ``timerPrecisionMs``: 100, 200, 500 or 1000."""
    timer_max_delay_ms: int = 3 * 86_400_000
    """RocketMQ 5's ``timerMaxDelaySec`` (3 days); up to 400 days is accepted."""
    level_partitions: int = DEFAULT_LANES
    """Partitions per delay level in SCHEDULE (1 to :data:`LANES_MAX`): the members of the
    schedule service's group share one level's load over them."""
    tier_partitions: int = DEFAULT_LANES
    """Partitions per timer tier in the timer topic (1 to :data:`LANES_MAX`): the members of
    the timer service's group share one second's load over them."""
    spread_by: str = "id"
    """What picks a message's partition among its level's or tier's: ``"id"`` or ``"key"``
    (:data:`SPREAD_BY`, :func:`lane_for`)."""
    level_delays_ms: tuple[int, ...] = field(init=False)
    tier_count: int = field(init=False, repr=False, compare=False)
    """How many timer tiers (= timer topic partitions) the maximum delay needs; computed once
    (every hop of the timer service routes with it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "level_delays_ms", parse_delay_levels(self.message_delay_level))
        if self.timer_precision_ms not in TIMER_PRECISIONS_MS:
            raise InvalidArgumentError(
                f"timer_precision_ms must be one of {TIMER_PRECISIONS_MS}, "
                f"got {self.timer_precision_ms}"
            )
        if not self.timer_precision_ms <= self.timer_max_delay_ms <= 400 * 86_400_000:
            raise InvalidArgumentError(
                f"timer_max_delay_ms must be between the precision and 400 days, "
                f"got {self.timer_max_delay_ms}"
            )
        for name in ("level_partitions", "tier_partitions"):
            require_lanes(name, getattr(self, name))
        if self.spread_by not in SPREAD_BY:
            raise InvalidArgumentError(
                f"spread_by must be one of {', '.join(repr(s) for s in SPREAD_BY)}, "
                f"got {self.spread_by!r}"
            )
        count = 1
        while self.timer_precision_ms * 2 ** (count - 1) * 2 <= self.timer_max_delay_ms:
            count += 1
        object.__setattr__(self, "tier_count", count)

    @property
    def level_count(self) -> int:
        """How many delay levels (the slots of SCHEDULE)."""
        return len(self.level_delays_ms)

    @property
    def schedule_partitions(self) -> int:
        """How many partitions SCHEDULE needs: :attr:`level_partitions` per level."""
        return self.level_count * self.level_partitions

    @property
    def timer_partitions(self) -> int:
        """How many partitions the timer topic needs: :attr:`tier_partitions` per tier."""
        return self.tier_count * self.tier_partitions

    def spread_lane(self, msg_id: str, key: bytes | None, lanes: int) -> int:
        """The lane of a message among ``lanes``: by its message id, or by its Kafka key
        (sharding key, else keys) when :attr:`spread_by` is ``"key"`` and it has one."""
        if self.spread_by == "key" and key:
            return lane_for(key, lanes)
        return lane_for(msg_id.encode("utf-8", "surrogatepass"), lanes)

    def level_partition(self, level: int, lane: int) -> int:
        """The SCHEDULE partition of lane ``lane`` of delay level ``level`` (1-based)."""
        return slot_partition(level - 1, lane, self.level_count)

    def tier_partition(self, tier: int, lane: int) -> int:
        """The timer topic partition of lane ``lane`` of tier ``tier``."""
        return slot_partition(tier, lane, self.tier_count)

    def partition_delay_ms(self, partition: int) -> int:
        """How long records wait in SCHEDULE partition ``partition``, ms: its level's delay."""
        return self.level_delays_ms[partition_slot(partition, self.level_count)]

    def partition_tier(self, partition: int) -> int:
        """The tier timer topic partition ``partition`` serves."""
        return partition_slot(partition, self.tier_count)

    def hop_partition(self, tier: int, from_partition: int, from_slots: int) -> int:
        """Where a coordinator's copy (a hop, a back-off) of a record read from partition
        ``from_partition`` of a topic of ``from_slots`` slots goes in tier ``tier``: the same
        lane (modulo :attr:`tier_partitions`), so a message keeps to one lane."""
        lane = partition_lane(from_partition, from_slots) % self.tier_partitions
        return self.tier_partition(tier, lane)

    def displaced_slot(self, partition: int, written_slots: int | None, slots: int) -> int | None:
        """The slot (level index or tier) a record of partition ``partition`` was written for,
        when it is not the one the partition serves now with ``slots`` slots; None when it is
        (or the record does not say). ``written_slots`` is the slot count the record was routed
        with (its ``BRIDGE_SLOTS`` header, :data:`bridge.delay.routing.SLOTS_HEADER`, which
        every record written past lane 0 carries), None without one: lane 0 of any count
        (partition ``s`` is slot ``s`` whatever the count, the layout of releases with one
        partition per slot), read by its partition as it always was. A partition past lane 0
        changes slot when the count changes (levels appended, ``timer_max_delay_ms`` raised);
        its records then go by the slot they were written for, never by the partition's."""
        if written_slots is None or written_slots == slots or written_slots < 1:
            return None
        written = partition_slot(partition, written_slots)
        return None if written == partition_slot(partition, slots) else written

    def clamp_level(self, level: int) -> int:
        """RocketMQ's rule: a level above the maximum is the maximum; 0 or below is none (0)."""
        return 0 if level <= 0 else min(level, self.level_count)

    def tier_delay_ms(self, tier: int) -> int:
        """How long a message waits in timer tier ``tier``."""
        return int(self.timer_precision_ms * 2**tier)

    def route(self, deliver_ms: int, now_ms: int, tiers: int | None = None) -> int | None:
        """The timer tier for a message due at ``deliver_ms``, or None if it is due now.

        The largest tier whose wait ends at least :data:`LANDING_MARGIN_MS` before
        ``deliver_ms``; tier 0 when less is left. Out of a tier, a message with less than
        :meth:`hold_window_ms` to go waits for its exact time (see :meth:`exit_time_ms`).
        """
        remaining = deliver_ms - now_ms
        if remaining <= 0:
            return None
        count = tiers if tiers is not None else self.tier_count
        ratio = (remaining - LANDING_MARGIN_MS) // self.timer_precision_ms
        tier = ratio.bit_length() - 1 if ratio >= 1 else 0
        return min(tier, count - 1)

    def out_of_reach(self, deliver_ms: int, now_ms: int) -> str | None:
        """Why a timer record due at ``deliver_ms`` that leaves its tier at ``now_ms`` is
        parked (quarantined) instead of hopping to another tier, or None if it hops on.

        A producer refuses a timer beyond ``timer_max_delay_ms``, as RocketMQ's broker does
        (``timerMaxDelaySec``), but a record written straight onto the timer topic, or by a
        producer with a larger maximum, may be due any time (year 9999, 2**63 - 1 ms): it
        would hop from the last tier to the last tier, a write each time, for ever. Such a
        record is beyond reach when it is more than the maximum plus
        :data:`DELIVERY_BACKOFF_MAX_MS` away after its wait in a tier: that margin lets the
        coordinator's own back-off copies (due up to that far ahead, whatever the maximum)
        and clocks of producer and coordinator hosts a minute apart pass; a timer sent within
        the maximum has, besides, waited in a tier and is nearer by that wait. ``now_ms``,
        not the born time, is the reference: a foreign record carries none, and it is what
        bounds the hops left.
        """
        ahead = deliver_ms - now_ms
        if ahead <= self.timer_max_delay_ms + DELIVERY_BACKOFF_MAX_MS:
            return None
        shown = str(deliver_ms)
        if len(shown) > 20:  # a foreign value may have thousands of digits
            shown = f"{shown[:20]}... ({len(shown)} digits)"
        return (
            f"timer due at TIMER_DELIVER_MS={shown} is {_span(ahead)} away, "
            f"beyond timer_max_delay_ms={self.timer_max_delay_ms} "
            f"({_span(self.timer_max_delay_ms)}) that producers refuse: it was written onto "
            "the timer topic by another client or by a producer with a larger maximum; "
            "parked instead of hopping between tiers until then (bridge quarantine replay "
            "delivers it at once)"
        )

    @property
    def hold_window_ms(self) -> int:
        """A message leaving its tier this close to its time waits for the exact time."""
        return self.timer_precision_ms + LANDING_MARGIN_MS

    def exit_time_ms(self, tier_due_ms: int, deliver_ms: int) -> int:
        """When a message whose tier wait ends at ``tier_due_ms`` is taken out: its exact
        time if that is within the hold window, else the end of the tier wait."""
        if 0 < deliver_ms - tier_due_ms < self.hold_window_ms:
            return deliver_ms
        return tier_due_ms

    def deliver_time_ms(
        self,
        *,
        born_ms: int,
        deliver_ms: str | None,
        delay_ms: str | None,
        delay_sec: str | None,
    ) -> int:
        """A timer message's absolute delivery time from its ``TIMER_*`` properties (the first
        set of ``TIMER_DELIVER_MS``, ``TIMER_DELAY_MS``, ``TIMER_DELAY_SEC``).

        Raises :class:`InvalidDelayError` for a malformed value or one beyond the maximum.
        """
        if deliver_ms is not None:
            due = _as_int("TIMER_DELIVER_MS", deliver_ms)
        elif delay_ms is not None:
            due = born_ms + _as_int("TIMER_DELAY_MS", delay_ms)
        elif delay_sec is not None:
            due = born_ms + _as_int("TIMER_DELAY_SEC", delay_sec) * 1000
        else:
            raise InvalidDelayError("no TIMER_DELIVER_MS, TIMER_DELAY_MS or TIMER_DELAY_SEC")
        if due - born_ms > self.timer_max_delay_ms:
            raise InvalidDelayError(
                f"timer delay of {due - born_ms} ms is beyond timer_max_delay_ms="
                f"{self.timer_max_delay_ms} ({self.timer_max_delay_ms // 86_400_000} days)"
            )
        return due


def _span(ms: int) -> str:
    """``ms`` for a reader: in days from a day on, else in seconds."""
    if ms < 86_400_000:
        return f"{ms / 1000:g} s"
    hundredths = ms // 864_000  # of a day, in integers: a float overflows for a foreign value
    if hundredths >= 10**11:
        return f"more than {10**9} days"
    return f"{hundredths // 100}.{hundredths % 100:02d} days"


def _as_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InvalidDelayError(f"{name} must be an integer, got {raw!r}") from None
