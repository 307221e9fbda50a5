"""How a delay service's fetcher moves its consumer over the partitions it reads: pauses,
resumes with a seek, the committed offsets it reads again from (tried again shortly when the
group coordinator does not answer) and the error about offset metadata it cannot read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from bridge.coordinator.delay.held import DelaySettings
from bridge.errors import WireFormatError

logger = logging.getLogger("bridge.coordinator.delay.fetch")
"""The fetcher's logger: one name for an operator to tune for all of reading the partitions."""

_REPOSITION_RETRY_S = 0.2
"""Wait between tries to read committed offsets when the group coordinator does not answer."""
_MALFORMED_LOG_S = 60.0
"""A partition whose committed offset metadata cannot be read says so at most this often, s."""


class Seeks:
    """Pauses, resumes and seeks of the service's partitions through the consumer ``consumer``
    gives (None before the service started or after it stopped)."""

    def __init__(self, settings: DelaySettings, consumer: Callable[[], Consumer | None]) -> None:
        self._name = settings.name
        self._topic = settings.topic
        self._group_id = settings.group_id
        self._timeout_s = settings.timeout_s
        self._consumer = consumer
        self.paused: set[int] = set()
        """Partitions not fetched now (what was fetched of them stays held)."""
        self._malformed_logged: dict[int, float] = {}
        """Partition -> when its unreadable offset metadata was last logged, monotonic s."""
        self._retry_after = 0.0

    def forget(self, partition: int) -> None:
        """``partition`` is to be read again from its committed offset (or is no longer read):
        it counts as not paused (the seek that reads it again resumes it)."""
        self.paused.discard(partition)

    def revoked(self, partition: int) -> None:
        """``partition`` is no longer read."""
        self.forget(partition)
        self._malformed_logged.pop(partition, None)

    def now(self) -> None:
        """Read committed offsets on the next :meth:`committed`, without waiting."""
        self._retry_after = 0.0

    def later(self) -> None:
        """Read committed offsets again only after :data:`_REPOSITION_RETRY_S`."""
        self._retry_after = time.monotonic() + _REPOSITION_RETRY_S

    def committed(self, consumer: Consumer, partitions: list[int]) -> list[TopicPartition] | None:
        """The committed offsets of ``partitions``; None when they are not to be asked yet, or
        cannot be read now (then the partitions are paused, and asked again a moment later)."""
        if not partitions or time.monotonic() < self._retry_after:
            return None
        tps = [TopicPartition(self._topic, p) for p in partitions]
        try:
            committed: list[TopicPartition] = consumer.committed(tps, self._timeout_s)
        except KafkaException as exc:
            logger.warning(
                "%s: cannot read committed offsets of partitions %s (%s); they wait",
                self._name,
                partitions,
                exc,
            )
            self.later()
            self.pause([tp for tp in tps if tp.partition not in self.paused])
            return None
        return committed

    def readable(self, partition: int) -> None:
        """The offset metadata of ``partition`` could be read (again)."""
        self._malformed_logged.pop(partition, None)

    def malformed(self, tp: TopicPartition, exc: WireFormatError) -> None:
        """Pause partition ``tp``, which waits for its unreadable offset metadata, and log it (at
        most once per :data:`_MALFORMED_LOG_S`) with how an operator clears it."""
        now = time.monotonic()
        last = self._malformed_logged.get(tp.partition)
        if last is None or now - last >= _MALFORMED_LOG_S:
            self._malformed_logged[tp.partition] = now
            logger.error(
                "%s: partition %d of %s waits: %s. To clear it, stop every coordinator and run "
                "kafka-consumer-groups.sh --bootstrap-server <brokers> --group %s "
                "--topic %s:%d --reset-offsets --to-offset %d --execute (records of it "
                "delivered out of order after offset %d may then be delivered again)",
                self._name,
                tp.partition,
                self._topic,
                exc,
                self._group_id,
                self._topic,
                tp.partition,
                tp.offset,
                tp.offset,
            )
        self.pause([TopicPartition(self._topic, tp.partition)])

    def pause(self, tps: list[TopicPartition]) -> None:
        """Stop fetching the partitions of ``tps`` (what was fetched stays held)."""
        consumer = self._consumer()
        if consumer is None or not tps:
            return
        try:
            consumer.pause(tps)
            self.paused.update(tp.partition for tp in tps)
        except KafkaException as exc:  # revoked meanwhile
            logger.info("%s: pause failed: %s", self._name, exc)

    def resume(self, consumer: Consumer, partition: int, offset: int) -> bool:
        """Fetch ``partition`` from ``offset`` on. The seek also wakes the fetcher at once:
        after a plain resume of the only fetchable partition librdkafka's broker thread fetches
        again only when its idle wait ends (0.25 to 1 s later)."""
        try:
            consumer.resume([TopicPartition(self._topic, partition)])
            self.paused.discard(partition)
            consumer.seek(TopicPartition(self._topic, partition, offset))
        except KafkaException as exc:
            logger.info("%s: seek of partition %d failed: %s", self._name, partition, exc)
            return False
        return True
