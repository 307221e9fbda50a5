"""The coordinator's delay services: ``ScheduleDeliveryService`` (delay levels) and
``TimerService`` (timer messages), on one engine.

Each partition of the SCHEDULE and timer topics is a FIFO queue of fixed delay: its records are
due, in order, a fixed time after the broker stored them (LogAppendTime). The engine reads each
partition from its committed offset; when the head record is not due yet, it keeps what it
fetched and pauses the partition until the head is due. So memory holds at most a batch per
partition, whatever is waiting, and recovery after a crash is reading from the committed
offsets: nothing to rebuild.

Every batch is one Kafka transaction: the delivered (or re-routed) records and the offsets
that say they are done. A crash at any point delivers each message exactly once (G5).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import decode_envelope, decode_headers, real_record
from bridge.delay.model import DelayPolicy
from bridge.delay.routing import TIMER_ROUTING_HEADER
from bridge.errors import WireFormatError
from bridge.kafka.clients import new_consumer
from bridge.kafka.quarantine import quarantine_copy
from bridge.kafka.transactional import ServiceConfig, TransactionalService
from bridge.message import DELAY_PROPERTIES, MessageConst, now_ms
from topics.catalog import SystemTopic

logger = logging.getLogger(__name__)

_BATCH = 2000
_MAX_POLL_WAIT_MS = 50
REMOVED_ON_DELIVERY = frozenset(
    {MessageConst.REAL_TOPIC, MessageConst.REAL_QUEUE_ID, *DELAY_PROPERTIES}
)
"""Properties a delayed message loses when it reaches its real topic."""


class _FifoDelayService(TransactionalService):
    """Reads FIFO partitions of fixed delay; subclasses say what a due record becomes."""

    kind: str = ""
    system: SystemTopic = SystemTopic.SCHEDULE

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(self.kind, config)
        self.policy: DelayPolicy = config.client.delay_policy
        self.topic = config.catalog.topic(self.system)
        self._held: dict[int, list[Any]] = {}
        """Fetched records not due yet, per partition, in offset order (at most a batch)."""
        self._paused: set[int] = set()
        self.delivered = 0
        """Messages delivered to their real topics (for tests and metrics)."""

    def partition_delay_ms(self, partition: int) -> int:
        """How long records wait in ``partition``."""
        raise NotImplementedError

    def process(self, record: Any, now: int, out: list[tuple[Any, ...]]) -> None:
        """Append what the due ``record`` becomes to ``out`` (topic, partition, key, value,
        headers, timestamp)."""
        raise NotImplementedError

    # --- lifecycle ----------------------------------------------------------------------
    def on_start(self) -> None:
        client = self.config.client
        self.start_producer()
        self._consumer = new_consumer(
            client,
            f"{client.namespace}.coordinator.{self.kind}",
            client_id=self.name,
            fetch_wait_max_ms=_MAX_POLL_WAIT_MS,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Bounded prefetch: what waits stays in Kafka, not here.
            queued_max_messages_kbytes=8192,
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=f"{self.config.coordinator_id}-{self.kind}",
        )
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        started = time.monotonic()
        pending = 0
        try:
            for tp in consumer.committed(partitions, self.config.client.request_timeout_ms / 1000):
                low, high = consumer.get_watermark_offsets(tp, cached=False, timeout=5)
                pending += max(high - max(tp.offset, low), 0)
        except KafkaException as exc:  # only for the log line: never fail an assignment
            logger.info("%s: could not count waiting messages: %s", self.name, exc)
            pending = -1
        logger.info(
            "%s: assigned %s partitions %s, about %d messages waiting (%.2f s)",
            self.name, self.topic, [tp.partition for tp in partitions], pending,
            time.monotonic() - started,
        )  # fmt: skip

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        now = now_ms()
        next_due = min((self._due_at(h[0]) for h in self._held.values()), default=None)
        wait_ms = _MAX_POLL_WAIT_MS if next_due is None else min(_MAX_POLL_WAIT_MS, next_due - now)
        fetched: list[Any] = []
        first = consumer.poll(max(wait_ms, 0) / 1000)
        if first is not None:
            fetched = [first, *consumer.consume(_BATCH, 0)]
        for record in fetched:
            error = record.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    logger.warning("%s: consumer error %s", self.name, error.str())
                continue
            self._held.setdefault(record.partition(), []).append(record)
        out: list[tuple[Any, ...]] = []
        offsets: dict[int, int] = {}
        now = now_ms()
        resume = []
        for partition, held in list(self._held.items()):
            while held and self._due_at(held[0]) <= now:
                record = held.pop(0)
                try:
                    self.process(record, now, out)
                except (WireFormatError, ValueError) as exc:
                    copy = quarantine_copy(self.config.catalog, record, str(exc), self.name)
                    out.append(
                        (copy.topic, -1, copy.key, copy.value, copy.headers, copy.timestamp_ms)
                    )
                offsets[partition] = record.offset() + 1
            tp = TopicPartition(self.topic, partition)
            if held and partition not in self._paused:
                # The head is not due: stop fetching this partition until it is (it is FIFO,
                # so nothing behind it is due either); what was fetched waits here.
                consumer.pause([tp])
                self._paused.add(partition)
            elif not held:
                del self._held[partition]
                if partition in self._paused:
                    resume.append(tp)
                    self._paused.discard(partition)
        if offsets:
            self._commit(out, offsets)
        if resume:
            consumer.resume(resume)

    def _due_at(self, record: Any) -> int:
        """When ``record`` is due: a fixed time after it was stored."""
        return int(record.timestamp()[1]) + self.partition_delay_ms(record.partition())

    def _commit(self, out: list[tuple[Any, ...]], offsets: dict[int, int]) -> None:
        producer = self._producer
        consumer = self._consumer
        timeout_s = self.config.client.request_timeout_ms / 1000
        if consumer is None:
            return
        try:
            producer.begin_transaction()
            for topic, partition, key, value, headers, timestamp in out:
                producer.produce(
                    topic, value, key, partition=partition, headers=headers, timestamp=timestamp
                )
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                consumer.consumer_group_metadata(),
                timeout_s,
            )
            producer.commit_transaction(timeout_s)
            self.delivered += sum(1 for item in out if item[0] != self.topic)
        except KafkaException as exc:
            self.transaction_failed(exc)
            self._rewind()

    def _rewind(self) -> None:
        """Go back to the committed offsets of every owned partition (after a failed batch)."""
        consumer = self._consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        self._held.clear()
        if self._paused:
            consumer.resume([TopicPartition(self.topic, p) for p in self._paused])
            self._paused.clear()
        for tp in consumer.committed(assigned, self.config.client.request_timeout_ms / 1000):
            consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    def deliver(self, record: Any, out: list[tuple[Any, ...]]) -> None:
        """Append the real-topic record of a delayed message that is due."""
        msg = decode_envelope(record.value())
        real = real_record(msg, self.config.catalog.namespace, REMOVED_ON_DELIVERY)
        out.append(
            (real.topic, real.partition, real.key, real.value, real.headers, real.timestamp_ms)
        )


class ScheduleDeliveryService(_FifoDelayService):
    """RocketMQ's ``ScheduleMessageService``: partition ``L - 1`` of SCHEDULE holds delay
    level ``L``; each record is delivered the level's delay after it was stored."""

    kind = "schedule"
    system = SystemTopic.SCHEDULE

    def partition_delay_ms(self, partition: int) -> int:
        delays = self.policy.level_delays_ms
        return delays[min(partition, len(delays) - 1)]

    def process(self, record: Any, now: int, out: list[tuple[Any, ...]]) -> None:
        self.deliver(record, out)


class TimerService(_FifoDelayService):
    """RocketMQ 5's timer: a record in tier ``k`` waits ``precision * 2**k``, then goes to the
    largest tier that does not pass its delivery time, or to its real topic when due."""

    kind = "timer"
    system = SystemTopic.TIMER

    def partition_delay_ms(self, partition: int) -> int:
        return self.policy.tier_delay_ms(partition)

    def _due_at(self, record: Any) -> int:
        """Out of its tier, a record close to its time waits here for the exact time rather
        than another hop (records behind it, FIFO, wait at most the hold window more)."""
        tier_due = super()._due_at(record)
        try:
            deliver_ms = self._deliver_ms(record)
        except (WireFormatError, ValueError):
            return tier_due  # process() quarantines it
        return self.policy.exit_time_ms(tier_due, deliver_ms)

    @staticmethod
    def _deliver_ms(record: Any) -> int:
        raw = decode_headers(record.headers()).get(TIMER_ROUTING_HEADER)
        if raw is None:  # written by another client: the envelope has it too
            raw = decode_envelope(record.value()).get_property(TIMER_ROUTING_HEADER) or "0"
        return int(raw)

    def process(self, record: Any, now: int, out: list[tuple[Any, ...]]) -> None:
        deliver_ms = self._deliver_ms(record)
        tier = self.policy.route(deliver_ms, now, self.policy.tier_count)
        if tier is None:
            self.deliver(record, out)
        else:
            out.append((self.topic, tier, record.key(), record.value(), record.headers(), 0))
