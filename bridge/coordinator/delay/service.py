"""The coordinator's delay services: ``ScheduleDeliveryService`` (delay levels) and
``TimerService`` (timer messages), on one engine.

Each partition of the SCHEDULE and timer topics is a FIFO queue of fixed delay: its records are
due, in order, a fixed time after the broker stored them (LogAppendTime). The engine reads each
partition from its committed offset and holds what it fetched until due
(:class:`~bridge.coordinator.delay.fetch.Fetcher`); recovery after a crash is reading from the
committed offsets: nothing to rebuild.

Every batch is one Kafka transaction: the delivered (or re-routed) records and the offsets
that say they are done. A crash at any point delivers each message exactly once (G5). After a
failed transaction or a new assignment, a partition is read again from its committed offset,
and nothing of it is processed before that seek succeeded.

The service is a thin loop over its collaborators: :class:`~bridge.coordinator.delay.fetch.Fetcher`
(reading and holding), :class:`~bridge.coordinator.delay.delivery.Delivery` (the Kafka transactions,
duplicate sends) and :class:`~bridge.coordinator.delay.isolation.Isolation` (messages that cannot be
delivered do not hold the others back).

Guarantees kept here (see ``docs/guarantees.md``): G2, G3, G5, G9, G12.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.codec import PreparedRecord
from bridge.config import NamePatterns, TrustLimits
from bridge.coordinator.delay import records
from bridge.coordinator.delay.delivery import Delivery
from bridge.coordinator.delay.fetch import Fetcher
from bridge.coordinator.delay.held import RECORD_ERRORS, DelayCounts, DelaySettings, Held
from bridge.coordinator.delay.isolation import Isolation
from bridge.coordinator.delay.recall_watch import RecallWatch, TimerRecalls
from bridge.delay.routing import slots_header
from bridge.delay_policy import DelayPolicy, partition_lane
from bridge.errors import InvalidDelayError
from bridge.kafka.clients import new_consumer
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.kafka.transactional import REMOVED_ON_DELIVERY
from bridge.lifecycle import FatalServiceError
from bridge.message import now_ms
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

__all__ = [
    "DELAY_METADATA_REFRESH_MS",
    "REMOVED_ON_DELIVERY",
    "ScheduleDeliveryService",
    "TimerService",
    "assignment_strategy",
    "timer_exit_ms",
]

_BATCH = 2000
_MAX_POLL_WAIT_MS = 50
DELAY_METADATA_REFRESH_MS = 2_000
"""How often a delay service's consumer looks up SCHEDULE or the timer topic, ms (consumers'
default: 30 s). Partitions added beside a running coordinator (``bridge topics create
--system`` raising the partitions per level or tier) are assigned and read within this plus a
rebalance, not half a minute late; the cost is one metadata request for one topic per
interval and consumer."""


def assignment_strategy(lanes: int) -> str:
    """The delay services' ``partition.assignment.strategy`` with ``lanes`` partitions per
    level or tier. One: round robin spreads the levels and tiers over the coordinator
    processes (range gave one process every tier: more processes helped no burst). More:
    range gives each member consecutive partitions, whole lanes (every level or tier) when
    the lanes are a multiple of the members, which round robin does not (18 slots over 4
    members: some slots on 2). The other one stays listed so that a group with members of
    another release agrees on one during a rolling upgrade. Both are eager."""
    return "range,roundrobin" if lanes > 1 else "roundrobin,range"


def timer_exit_ms(policy: DelayPolicy, held: Held) -> int:
    """When the coordinator takes the timer record ``held`` out of its tier partition
    (delivers it, or moves it to a lower tier), epoch ms: the end of its tier's wait
    (broker append time + :meth:`DelayPolicy.tier_delay_ms`), or its delivery time if that
    comes within the hold window after (:meth:`DelayPolicy.exit_time_ms`). A record whose
    delivery time cannot be read leaves at the end of the wait (and is quarantined then)."""
    tier_due = int(held.record.timestamp()[1])
    if (
        policy.displaced_slot(held.partition, records.written_slots(held), policy.tier_count)
        is None
    ):
        tier_due += policy.tier_delay_ms(policy.partition_tier(held.partition))
    # else written for another tier (the tier count changed): it hops at once, by its time.
    try:
        deliver_ms = records.timer_deliver_ms(held)
    except RECORD_ERRORS:
        return tier_due
    return policy.exit_time_ms(tier_due, deliver_ms)


class FifoDelayService(TransactionalService):
    """Reads FIFO partitions of fixed delay; subclasses say what a due record becomes."""

    kind: str = ""
    system: SystemTopic = SystemTopic.SCHEDULE

    def __init__(
        self, config: ServiceConfig, *, allowed_topics: NamePatterns | None = None
    ) -> None:
        super().__init__(self.kind, config)
        self.allowed_topics = allowed_topics or TrustLimits().topics
        """The real topics this service delivers to (G12): a message for another one is
        quarantined with the reason."""
        self.policy: DelayPolicy = config.client.delay_policy
        self.topic = config.catalog.topic(self.system)
        self.timer_topic = config.catalog.topic(SystemTopic.TIMER)
        self.counts = DelayCounts()
        """What it did (for tests and metrics)."""
        settings = DelaySettings(
            self.name,
            self.kind,
            self.topic,
            self.timer_topic,
            self.group_id,
            config,
            self.policy,
            self.allowed_topics,
        )
        self.fetcher = Fetcher(
            settings,
            consumer=lambda: self._consumer,
            place=self.place,
            check_fencing=self.check_fencing,
            counts=self.counts,
        )
        self.isolation = Isolation(settings, process=self.process, producer=lambda: self._producer)
        self.recalls = self.new_recalls()
        """Which final deliveries were recalled (timers only; None for delay levels)."""
        self.delivery = Delivery(
            settings,
            fetcher=self.fetcher,
            isolation=self.isolation,
            counts=self.counts,
            due_at=self.due_at,
            write=self.write,
            transaction_failed=self.transaction_failed,
            producer=lambda: self._producer,
            consumer=lambda: self._consumer,
            recalls=self.recalls,
        )

    def new_recalls(self) -> TimerRecalls | None:
        """What says which of this service's final deliveries were recalled (None: none
        can be)."""
        return None

    @property
    def recalled(self) -> int:
        """Timers not delivered because they were recalled in time."""
        return self.counts.recalled

    @property
    def delivered(self) -> int:
        """Messages delivered to their real topics (for tests and metrics)."""
        return self.counts.delivered

    @property
    def moved_aside(self) -> int:
        """Messages sent back to wait after a failed delivery, or quarantined."""
        return self.counts.moved_aside

    @property
    def dropped(self) -> int:
        """Fetched records thrown away to be read again (stale after a rebalance or rewind)."""
        return self.counts.dropped

    @property
    def duplicates(self) -> int:
        """Second copies of one send, consumed without a delivery."""
        return self.counts.duplicates

    @property
    def done_before(self) -> int:
        """Fetched records skipped because the committed offset metadata says they were
        delivered already (out of order, before a restart or a failed transaction)."""
        return self.counts.done_before

    def renewed(self) -> FifoDelayService:
        """A new, not started service of this kind with the same settings (see
        :meth:`TransactionalService.renewed`)."""
        return type(self)(self.config, allowed_topics=self.allowed_topics)

    def partition_delay_ms(self, partition: int) -> int:
        """How long records wait in ``partition``, ms."""
        raise NotImplementedError

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        """What the due record becomes, and whether that is its delivery to its real topic.
        Raises one of :data:`RECORD_ERRORS` if malformed."""
        raise NotImplementedError

    # --- lifecycle ----------------------------------------------------------------------
    def on_start(self) -> None:
        client = self.config.client
        self.start_producer()
        self._consumer = new_consumer(
            client,
            self.group_id,
            client_id=self.name,
            fetch_wait_max_ms=_MAX_POLL_WAIT_MS,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Bounded prefetch: what waits stays in Kafka, not here.
            queued_max_messages_kbytes=8192,
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=self.group_instance_id,
            partition_assignment_strategy=assignment_strategy(self._lanes()),
            # Added partitions: read within seconds, not at the next 30 s lookup.
            topic_metadata_refresh_interval_ms=DELAY_METADATA_REFRESH_MS,
        )
        self.isolation.start()
        if self.recalls is not None:
            self.recalls.watch.start()
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _lanes(self) -> int:
        """Partitions per slot of this service's topic (its setting)."""
        policy = self.policy
        return policy.level_partitions if self.kind == "schedule" else policy.tier_partitions

    def on_stop(self) -> None:
        super().on_stop()
        if self.recalls is not None:
            self.recalls.watch.stop()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.fetcher.assign(partitions)
        started = time.monotonic()
        pending = 0
        try:
            for tp in consumer.committed(partitions, self.timeout_s):
                low, high = consumer.get_watermark_offsets(tp, cached=False, timeout=5)
                pending += max(high - max(tp.offset, low), 0)
        except KafkaException as exc:  # only for the log line: never fail an assignment
            logger.info("%s: could not count waiting messages: %s", self.name, exc)
            pending = -1
        logger.info(
            "%s: assigned %s partitions %s, about %d messages waiting (%.2f s)",
            self.name,
            self.topic,
            [tp.partition for tp in partitions],
            pending,
            time.monotonic() - started,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        self.fetcher.revoke(revoked)
        self.isolation.revoke(revoked)

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None or not self.producer_ready():
            return
        self.fetcher.reposition(consumer)
        now = now_ms()
        if self.recalls is not None:
            self.recalls.ahead(self.fetcher.window_due(), now)
            now = now_ms()
        next_due = self.fetcher.next_due()
        wait_ms = _MAX_POLL_WAIT_MS if next_due is None else min(_MAX_POLL_WAIT_MS, next_due - now)
        fetched: list[Any] = []
        first = consumer.poll(max(wait_ms, 0) / 1000)
        if first is not None:
            fetched = [first, *consumer.consume(_BATCH, 0)]
        try:
            resume = self._take(fetched)
        except FatalServiceError:
            raise
        except BaseException:
            # Records were taken from Kafka and maybe from memory without being committed:
            # read them again rather than let a later batch commit past them.
            self.fetcher.rewind_all()
            raise
        if resume is None:
            return  # rewound: every partition is read again from its committed offset
        self.fetcher.fetch_again(consumer, resume)

    def _take(self, fetched: list[Any]) -> list[int] | None:
        """Keep the fetched records, deliver those due; return the partitions to fetch again
        (their held records are all gone), or None if a failed transaction rewound them."""
        for record in fetched:
            self.fetcher.accept(record)
        now = now_ms()
        due, resume = self.fetcher.due(now)
        if due and not self.delivery.deliver(due, now):
            return None
        return resume

    def due_at(self, held: Held) -> int:
        """When ``held`` is due, epoch ms: a fixed time after it was stored; at once when it
        was written for another slot than its partition serves now (:meth:`displaced`)."""
        stored = int(held.record.timestamp()[1])
        if self.displaced(held) is not None:
            return stored
        return stored + self.partition_delay_ms(held.partition)

    def displaced(self, held: Held) -> int | None:
        """The slot ``held`` was written for when its partition serves another one now (levels
        appended or tiers added since: :meth:`DelayPolicy.displaced_slot`), else None. Such a
        record is re-routed at once by its own slot, never held by its partition's."""
        policy = self.policy
        slots = policy.level_count if self.kind == "schedule" else policy.tier_count
        return policy.displaced_slot(held.partition, records.written_slots(held), slots)

    def place(self, held: Held) -> None:
        """Set when the fetched ``held`` may leave its place in its partition
        (:attr:`Held.fifo_ms`) and when it is due (:attr:`Held.due_ms`): both its
        :meth:`due_at`."""
        held.fifo_ms = held.due_ms = self.due_at(held)

    def deliver(self, held: Held) -> tuple[PreparedRecord, bool]:
        """The real-topic record of a delayed message that is due (see
        :func:`~bridge.coordinator.delay.records.delivery`), and True: it is its delivery."""
        return records.delivery(held, self.config.catalog.namespace), True


class ScheduleDeliveryService(FifoDelayService):
    """RocketMQ's ``ScheduleMessageService``: the partitions of delay level ``L`` in SCHEDULE
    (``L - 1`` and one more in each further block of levels,
    :func:`~bridge.delay_policy.slot_partition`) hold it; each record is delivered the level's
    delay after it was stored. The group's members share the partitions, so several
    coordinator processes share one level."""

    kind = "schedule"
    system = SystemTopic.SCHEDULE

    def partition_delay_ms(self, partition: int) -> int:
        return self.policy.partition_delay_ms(partition)

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        level = self.displaced(held)
        if level is None:
            return self.deliver(held)
        return self.reroute(held, level, now)

    def reroute(self, held: Held, level: int, now: int) -> tuple[PreparedRecord, bool]:
        """``held``, written for level index ``level`` in a partition that serves another
        level now (levels were appended): delivered if that level's delay since it was stored
        is over, else copied to the timer topic due then (in this transaction), so it is
        never early, and late by the timer's own lateness only. A level removed since is read
        as the last one (as a level above the maximum is)."""
        policy = self.policy
        delays = policy.level_delays_ms
        deliver_ms = int(held.record.timestamp()[1]) + delays[min(level, len(delays) - 1)]
        if deliver_ms <= now:
            return self.deliver(held)
        if policy.out_of_reach(deliver_ms, now) is not None:
            # A level longer than the timers reach (timer_max_delay_ms below it): to its own
            # level's partition in this lane, where it waits that level's delay again (late,
            # never early) rather than be parked by the timer service.
            lane = partition_lane(held.partition, policy.level_count) % policy.level_partitions
            target = policy.level_partition(min(level, policy.level_count - 1) + 1, lane)
            return records.hop(held, self.topic, deliver_ms, target, policy.level_count), False
        attempts, msg_id, msg = records.backoff_source(held, self.config.catalog.namespace)
        value, headers = records.backoff_copy(
            held,
            msg,
            attempts,
            f"level {level + 1} moved from partition {held.partition} (levels changed)",
            deliver_ms,
            envelope=self.config.client.delay_record_format == "envelope",
        )
        tier = policy.route(deliver_ms, now, policy.tier_count) or 0
        partition = policy.hop_partition(tier, held.partition, policy.level_count)
        headers = [*slots_header(partition, policy.tier_count), *headers]
        record = PreparedRecord(
            self.timer_topic, held.record.key(), value, headers, msg_id, 0, partition
        )
        return record, False


class TimerService(FifoDelayService):
    """RocketMQ 5's timer: a record in tier ``k`` (any of its partitions,
    :meth:`DelayPolicy.partition_tier`) waits ``precision * 2**k``, then goes to the largest
    tier that does not pass its delivery time (in the same lane), or to its real topic when
    due."""

    kind = "timer"
    system = SystemTopic.TIMER

    def partition_delay_ms(self, partition: int) -> int:
        return self.policy.tier_delay_ms(self.policy.partition_tier(partition))

    def new_recalls(self) -> TimerRecalls:
        """A timer recalled in time (``recall_message``) is skipped at its final delivery
        (:mod:`bridge.coordinator.delay.recall_watch`)."""
        catalog = self.config.catalog
        watch = RecallWatch(self.config.client, catalog.topic(SystemTopic.RECALL), self.name)
        return TimerRecalls(watch, self.policy)

    def due_at(self, held: Held) -> int:
        """Out of its tier, a record close to its time waits in memory for the exact time
        rather than another hop (in the final window: the records behind it go on); see
        :func:`timer_exit_ms`."""
        return timer_exit_ms(self.policy, held)

    def place(self, held: Held) -> None:
        """A timer may leave its tier partition when its tier wait is over
        (:attr:`Held.fifo_ms`), and is due then or, within the hold window of its time, at
        its time (:attr:`Held.due_ms`, :meth:`DelayPolicy.exit_time_ms`)."""
        held.fifo_ms = held.due_ms = tier_due = super().due_at(held)
        try:
            held.exact_ms = records.timer_deliver_ms(held)
        except RECORD_ERRORS:
            return  # process() quarantines it
        held.due_ms = self.policy.exit_time_ms(tier_due, held.exact_ms)

    def process(self, held: Held, now: int) -> tuple[PreparedRecord, bool]:
        """Deliver the due record, or hop it to the tier :meth:`DelayPolicy.route` picks; a
        record due further ahead than any producer sends (:meth:`DelayPolicy.out_of_reach`)
        raises :class:`InvalidDelayError` (one of :data:`RECORD_ERRORS`: it is
        quarantined)."""
        # place() read the delivery time when the record was fetched (None: unreadable then,
        # so reading it again raises and the record is quarantined).
        deliver_ms = held.exact_ms if held.exact_ms is not None else records.timer_deliver_ms(held)
        policy = self.policy
        tier = policy.route(deliver_ms, now, policy.tier_count)
        if tier is None:
            return self.deliver(held)
        beyond = policy.out_of_reach(deliver_ms, now)
        if beyond is not None:
            # Hopping on would cost a write per last-tier wait until its time (year 9999:
            # for ever); the quarantine keeps it, with the reason (logged there), for an
            # operator.
            raise InvalidDelayError(beyond)
        target = policy.hop_partition(tier, held.partition, policy.tier_count)
        return records.hop(held, self.topic, deliver_ms, target, policy.tier_count), False
