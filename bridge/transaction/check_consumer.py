"""The check consumer of a :class:`~bridge.transaction.producer.TransactionMQProducer`:
:class:`CheckConsumer` reads the producer group's check topic and hands each request to the
:class:`~bridge.transaction.check_responder.CheckResponder`, which answers it on its check
threads. Kafka's side alone: the group membership, flow control while the check hold is full,
and the offsets of the requests taken.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bridge.config import ClientConfig
from bridge.kafka.clients import new_consumer
from topics.naming import transaction_check_group

# A part of the transactional producer: its records go where the producer's go, so a level set
# on "bridge.transaction.producer" covers them.
logger = logging.getLogger("bridge.transaction.producer.checks")

HOLD_WAIT_S = 0.05
"""How long the check loop waits for a request, or for room in the check hold, before it
looks at the stop flag and the hung checks again, s."""
_COMMIT_INTERVAL_S = 1.0
"""The check consumer commits the offsets of the requests it took at most this often, s."""


class CheckConsumer:
    """Reads the check requests of producer group ``group`` (a Kafka consumer whose session
    times out after ``session_timeout_ms``) until ``stop`` is set: each request read while
    ``hold`` has room takes a place in it and goes to ``take(record)`` (False: not taken, its
    place released here); ``watch()`` is called on every pass (at least every
    :data:`HOLD_WAIT_S` s). :meth:`run` is the consumer thread's body."""

    def __init__(
        self,
        config: ClientConfig,
        group: str,
        *,
        session_timeout_ms: int,
        hold: threading.BoundedSemaphore,
        stop: threading.Event,
        take: Callable[[Any], bool],
        watch: Callable[[], None],
    ) -> None:
        self._config = config
        self.group = group
        self._session_timeout_ms = session_timeout_ms
        self._hold = hold
        self._stop = stop
        self._take = take
        self._watch = watch

    def run(self) -> None:
        """Take check requests while the check hold has room, and keep the group membership
        whatever the request rate: offsets are committed at most once per
        :data:`_COMMIT_INTERVAL_S` (one commit per storm of requests, not one a request:
        thousands of commits queued on the connection held back the heartbeats until the
        session timed out), and while the hold is full the partitions are paused and polled
        (a consumer that stops polling leaves its group)."""
        topic = self._config.catalog().check_topic(self.group)
        taken: dict[int, int] = {}
        """Partition -> the offset after the last request taken, not committed yet."""
        committed_at = time.monotonic()
        paused: list[TopicPartition] = []
        rewind: set[int] = set()
        """Partitions sought back (while paused) to a request read but not taken."""

        def commit(partitions: list[TopicPartition] | None = None) -> None:
            # Synchronous when partitions are named (revoked, or closing): their next owner
            # starts after what this member took.
            nonlocal committed_at
            committed_at = time.monotonic()
            wanted = [p.partition for p in partitions] if partitions is not None else list(taken)
            offsets = [TopicPartition(topic, p, taken.pop(p)) for p in wanted if p in taken]
            if not offsets:
                return
            try:
                if partitions is None:
                    consumer.commit(offsets=offsets, asynchronous=True)
                else:
                    consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                # Not lost: a request taken again is answered again (answers are idempotent),
                # and one never answered is asked again by the coordinator.
                logger.info("check consumer: offsets not committed (%s)", exc)

        def revoked(_: Any, partitions: list[TopicPartition]) -> None:
            nonlocal paused
            commit(partitions)
            paused = []  # a new assignment starts unpaused
            rewind.clear()

        def flow_control(call: Callable[[Any], None], partitions: Any) -> bool:
            # Pausing, seeking or resuming a partition revoked meanwhile raises: the loop goes
            # on (a request not taken is read by the partition's next owner, or asked again).
            try:
                call(partitions)
            except KafkaException as exc:
                logger.info("check consumer: %s of %s failed (%s)", call.__name__, partitions, exc)
                return False
            return True

        consumer = new_consumer(
            self._config,
            transaction_check_group(self._config.namespace, self.group),
            client_id=f"{self.group}-check",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(self._session_timeout_ms // 6, 500),
        )
        consumer.subscribe([topic], on_revoke=revoked, on_lost=revoked)
        try:
            while not self._stop.is_set():
                self._watch()
                if time.monotonic() - committed_at >= _COMMIT_INTERVAL_S:
                    commit()
                if not self._hold.acquire(blocking=False):
                    # RocketMQ's checkRequestHoldMax: the hold is full (perhaps of checks
                    # behind a hung one). Requests wait in Kafka, for this member or another.
                    if not paused:
                        paused = consumer.assignment()
                        flow_control(consumer.pause, paused)
                    record = consumer.poll(HOLD_WAIT_S)
                    partition = None if record is None else record.partition()
                    if record is not None and partition is not None and partition not in rewind:
                        # Read before the pause took effect: read again after it.
                        rewind.add(partition)
                        flow_control(
                            consumer.seek, TopicPartition(topic, partition, record.offset() or 0)
                        )
                    continue
                if paused:
                    if not flow_control(consumer.resume, paused):
                        # Whatever was not resumed, this member must not stay paused.
                        flow_control(consumer.resume, consumer.assignment())
                    paused, rewind = [], set()
                record = consumer.poll(HOLD_WAIT_S)
                if record is None:
                    self._hold.release()
                    continue
                error = record.error()
                if error is not None:
                    self._hold.release()
                    if error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        logger.warning("check consumer: %s", error.str())
                    continue
                if not self._take(record):
                    self._hold.release()
                taken[record.partition() or 0] = (record.offset() or 0) + 1
            commit(consumer.assignment())
        finally:
            consumer.close()
