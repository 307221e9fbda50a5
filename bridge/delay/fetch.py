"""How the delay services read their FIFO partitions: each partition from its committed
offset; when the head record is not due yet, what was fetched is held and the partition paused
until the head is due. So memory holds at most a batch per partition, whatever is waiting.

After a failed transaction or a new assignment, a partition is read again from its committed
offset, and nothing of it is taken before that seek succeeded.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.errors import WireFormatError
from bridge.kafka.quarantine import read_headers
from bridge.lifecycle import FatalServiceError

if TYPE_CHECKING:
    from bridge.delay.service import FifoDelayService

logger = logging.getLogger(__name__)

_REPOSITION_RETRY_S = 0.2
"""Wait between tries to read committed offsets when the group coordinator does not answer."""
RECORD_ERRORS: Final = (WireFormatError, ValueError, TypeError, SystemError, ArithmeticError)
"""What decoding one malformed record can raise (its own fault: it is quarantined)."""

Headers = list[tuple[str, bytes | None]]
Key = tuple[int, int]
"""(partition, offset) of a fetched record."""


@dataclass(slots=True)
class Held:
    """A fetched record, its headers read once (see :func:`read_headers`)."""

    record: Any
    partition: int
    offset: int
    headers: Headers
    header_error: str | None
    """Why the headers could not be read (then ``headers`` is empty)."""
    due_ms: int = 0
    send_key: tuple[int, bytes] | None = None
    """Identifies its send (see :func:`_send_key`), once it is due."""


class Fetcher:
    """The fetched records of a service's partitions, held until due, and where each
    partition is read from."""

    def __init__(self, service: FifoDelayService) -> None:
        self._svc = service
        self._held: dict[int, deque[Held]] = {}
        """Fetched records not due yet, per partition, in offset order (at most a batch)."""
        self._paused: set[int] = set()
        self._next_offset: dict[int, int | None] = {}
        """Assigned partitions -> the next offset to take; None until a seek to the committed
        offset succeeded (after an assignment or a failed transaction)."""
        self._reposition_after = 0.0

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Newly assigned ``partitions``: records fetched before this assignment may already
        sit in the batch being read, so nothing of them is taken before a seek to their
        committed offsets."""
        for tp in partitions:
            self._next_offset[tp.partition] = None
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)
        self._reposition_after = 0.0

    def revoke(self, revoked: set[int]) -> None:
        """Forget the partitions ``revoked``."""
        for partition in revoked:
            self._next_offset.pop(partition, None)
            self._held.pop(partition, None)
            self._paused.discard(partition)

    def next_due(self) -> int | None:
        """When the earliest held record is due, epoch ms (None: nothing held)."""
        return min((held[0].due_ms for held in self._held.values() if held), default=None)

    def due(self, now: int) -> tuple[list[Held], list[int]]:
        """Take the held records due at ``now`` (epoch ms), in order per partition; pause the
        partitions whose head is not due, and return the paused ones now empty (to be
        fetched again)."""
        due: list[Held] = []
        resume = []
        for partition, held in list(self._held.items()):
            while held and held[0].due_ms <= now:
                due.append(held.popleft())
            if held and partition not in self._paused:
                # The head is not due: stop fetching this partition until it is (it is FIFO,
                # so nothing behind it is due either); what was fetched waits here.
                self.pause([TopicPartition(self._svc.topic, partition)])
            elif not held:
                del self._held[partition]
                if partition in self._paused:
                    resume.append(partition)
        return due, resume

    def fetch_again(self, consumer: Consumer, partitions: list[int]) -> None:
        """Fetch ``partitions`` again from where they were taken up to."""
        for partition in partitions:
            expected = self._next_offset.get(partition)
            if expected is not None:
                self.resume(consumer, TopicPartition(self._svc.topic, partition, expected))

    def accept(self, record: Any) -> None:
        """Keep a fetched record, unless it is stale: of a partition no longer (or newly)
        assigned and not repositioned yet, or from before the last seek."""
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            self._svc.check_fencing(error)
            if error.fatal():  # the consumer cannot go on: stop rather than idle unseen
                raise FatalServiceError(f"{self._svc.name}: Kafka consumer failed: {error.str()}")
            logger.warning("%s: consumer error %s", self._svc.name, error.str())
            return
        partition = record.partition()
        offset = record.offset()
        expected = self._next_offset.get(partition)
        if expected is None or offset < expected:
            self._svc.dropped += 1
            return
        self._next_offset[partition] = offset + 1
        headers, header_error = read_headers(record)
        held = Held(record, partition, offset, headers, header_error)
        held.due_ms = self._svc.due_at(held)
        self._held.setdefault(partition, deque()).append(held)

    def rewind_all(self) -> None:
        """After a failed transaction: forget what was fetched and read every owned partition
        again from its committed offset."""
        self._held.clear()
        for partition in self._next_offset:
            self._next_offset[partition] = None
        self._reposition_after = 0.0
        if self._svc._consumer is not None:
            self.reposition(self._svc._consumer)

    def reposition(self, consumer: Consumer) -> None:
        """Seek the partitions waiting for it to their committed offsets. A partition whose
        committed offset cannot be read now is paused and waits (nothing of it is taken), so
        no later batch can commit past what a failed one left undone."""
        pending = [p for p, expected in self._next_offset.items() if expected is None]
        if not pending or time.monotonic() < self._reposition_after:
            return
        tps = [TopicPartition(self._svc.topic, p) for p in pending]
        try:
            committed = consumer.committed(tps, self._svc.timeout_s)
        except KafkaException as exc:
            logger.warning(
                "%s: cannot read committed offsets of partitions %s (%s); they wait",
                self._svc.name,
                pending,
                exc,
            )
            self._reposition_after = time.monotonic() + _REPOSITION_RETRY_S
            self.pause([tp for tp in tps if tp.partition not in self._paused])
            return
        for tp in committed:
            if tp.error is not None or tp.partition not in self._next_offset:
                continue
            self._held.pop(tp.partition, None)
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            if self.resume(consumer, TopicPartition(self._svc.topic, tp.partition, start)):
                self._next_offset[tp.partition] = max(tp.offset, 0)
        if any(expected is None for expected in self._next_offset.values()):
            self._reposition_after = time.monotonic() + _REPOSITION_RETRY_S

    def pause(self, tps: list[TopicPartition]) -> None:
        """Stop fetching the partitions of ``tps`` (what was fetched stays held)."""
        consumer = self._svc._consumer
        if consumer is None or not tps:
            return
        try:
            consumer.pause(tps)
            self._paused.update(tp.partition for tp in tps)
        except KafkaException as exc:  # revoked meanwhile
            logger.info("%s: pause failed: %s", self._svc.name, exc)

    def resume(self, consumer: Consumer, at: TopicPartition) -> bool:
        """Fetch ``at.partition`` from ``at.offset`` on. The seek also wakes the fetcher at
        once: after a plain resume of the only fetchable partition librdkafka's broker
        thread fetches again only when its idle wait ends (0.25 to 1 s later)."""
        try:
            consumer.resume([TopicPartition(self._svc.topic, at.partition)])
            self._paused.discard(at.partition)
            consumer.seek(at)
        except KafkaException as exc:
            logger.info("%s: seek of partition %d failed: %s", self._svc.name, at.partition, exc)
            return False
        return True
