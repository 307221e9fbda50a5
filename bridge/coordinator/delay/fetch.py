"""How the delay services read their FIFO partitions: each partition from its committed
offset; when the head record's wait in the partition is not over, what was fetched is held and
the partition paused until it is. So memory holds at most a batch per partition (and a final
window, below; a partition whose head waits for room in that window keeps up to
:data:`_REFILL_BELOW` records and a batch), whatever is waiting.

The final window: a timer whose wait in its tier is over but whose exact time is less than the
hold window away (:meth:`~bridge.delay_policy.DelayPolicy.exit_time_ms`) waits in memory, in a
heap by delivery time, and is delivered when its time comes, out of offset order; the records
behind it in its partition go on meanwhile. So a timer's lateness does not depend on its
neighbours'. The committed offset of a partition stays at the smallest record not done; the
records above it that are done (delivered out of order) are named in the offset commit's
metadata, in the same Kafka transaction as their delivery, and skipped when the partition is
read again from its committed offset (G5: a crash at any point delivers each message once).
The metadata stays small because the records not done below the highest done one are few
(:data:`_OUT_OF_ORDER_MAX`, which also bounds the window of a partition); past that, a
partition waits in order as before.

After a failed transaction or a new assignment, a partition is read again from its committed
offset, and nothing of it is taken before that seek succeeded.

:class:`Fetcher` stays one class of about 400 lines: what it knows of a partition (held,
in the window, taken, named not done, done above the base) changes together in every step, and
the one rule they keep together (the committed offset and its metadata never pass a record not
done) would otherwise be spread over several objects. What stands apart has left: the record
and its types (:mod:`bridge.coordinator.delay.held`), the offset metadata's format
(:mod:`bridge.coordinator.delay.done_offsets`) and the consumer's pauses and seeks
(:mod:`bridge.coordinator.delay.seeks`).
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.coordinator.delay.done_offsets import METADATA_MAX_CHARS, decode_done, encode_done
from bridge.coordinator.delay.held import (
    RECORD_ERRORS,
    DelayCounts,
    DelaySettings,
    Headers,
    Held,
    Key,
)
from bridge.coordinator.delay.seeks import Seeks
from bridge.errors import WireFormatError
from bridge.kafka.quarantine import read_headers
from bridge.lifecycle import FatalServiceError

__all__ = [
    "METADATA_MAX_CHARS",
    "RECORD_ERRORS",
    "Fetcher",
    "Headers",
    "Held",
    "Key",
    "decode_done",
    "encode_done",
]

logger = logging.getLogger(__name__)

_OUT_OF_ORDER_MAX = 256
"""A partition puts a record in the final window, or takes a record past lower ones not done,
only while fewer than this many of its records are not done out of order: in the window,
taken from it in this pass, or named not done in the committed metadata. They are all the
offset metadata can list, so it stays below :data:`METADATA_MAX_CHARS` (256 offsets of up to
12 digits each), and at most this many records of a partition wait in the window (memory
stays bounded in a burst due at one time: the rest wait in order at the head)."""
_REFILL_BELOW = 500
"""A partition whose head waits only for room in the final window (the window is full) is
fetched again while fewer than this many of its records are held, so those behind it are in
memory when the window has room (memory: at most this many and one fetched batch)."""


class Fetcher:
    """The fetched records of a service's partitions, held until due, and where each
    partition is read from. ``consumer`` gives the service's consumer (None before it started
    or after it stopped), ``place`` sets when a fetched record is due, ``check_fencing`` stops
    the service when a consumer error says another coordinator runs with its id; stale and
    delivered-before records are counted in ``counts``."""

    def __init__(
        self,
        settings: DelaySettings,
        *,
        consumer: Callable[[], Consumer | None],
        place: Callable[[Held], None],
        check_fencing: Callable[[KafkaError], None],
        counts: DelayCounts,
    ) -> None:
        self._name = settings.name
        self._topic = settings.topic
        self._consumer = consumer
        self._place = place
        self._exit_time_ms = settings.policy.exit_time_ms
        self._check_fencing = check_fencing
        self._counts = counts
        self._held: dict[int, deque[Held]] = {}
        """Fetched records whose wait in their partition is not over, per partition, in offset
        order (at most a batch)."""
        self._window: list[tuple[int, int, int, Held]] = []
        """Heap of (due, partition, offset, record): timers whose wait in their partition is
        over, waiting for their exact time (the final window)."""
        self._waiting: dict[int, set[int]] = {}
        """Partition -> offsets of its records in the window."""
        self._taken: dict[int, set[int]] = {}
        """Partition -> offsets taken to be delivered, not committed yet."""
        self._high: dict[int, int] = {}
        """Partition -> every record below this offset is done but the ones not done (the
        window, taken, and :attr:`_restored`); 0: none done past the committed offset."""
        self._restored: dict[int, set[int]] = {}
        """Partition -> offsets the committed metadata names not done, not delivered since."""
        self._unseen: dict[int, deque[int]] = {}
        """Partition -> its :attr:`_restored` offsets not fetched yet since the last seek, in
        order: one that a higher fetched offset passes is no record (a transaction marker, or
        an aborted record, named by metadata of an older release) and is dropped."""
        self._ordered: set[int] = set()
        """Partitions delivering in offset order (no final window) because their offset
        metadata would not fit; each goes back to the window once nothing of it is not done
        out of order (its window drained and its committed metadata lists nothing)."""
        self._blocked: set[int] = set()
        """Partitions whose head's wait is over but which wait in order for the window."""
        self._next_offset: dict[int, int | None] = {}
        """Assigned partitions -> the next offset to take; None until a seek to the committed
        offset succeeded (after an assignment or a failed transaction)."""
        self._seeks = Seeks(settings, consumer)
        self._pending_high: dict[int, int] = {}
        """What :attr:`_high` becomes once the transaction being written commits."""
        self.in_order = False
        """Out-of-order delivery is off for every partition (set when the broker refuses the
        offset metadata)."""

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Newly assigned ``partitions``: records fetched before this assignment may already
        sit in the batch being read, so nothing of them is taken before a seek to their
        committed offsets."""
        for tp in partitions:
            self._forget(tp.partition)
            self._next_offset[tp.partition] = None
        self._seeks.now()

    def revoke(self, revoked: set[int]) -> None:
        """Forget the partitions ``revoked``."""
        for partition in revoked:
            self._forget(partition)
            self._next_offset.pop(partition, None)
            self._ordered.discard(partition)
            self._seeks.revoked(partition)

    def _forget(self, partition: int) -> None:
        """Drop what is held and known of ``partition`` (read again from its committed
        offset, or no longer ours)."""
        self._held.pop(partition, None)
        self._seeks.forget(partition)
        self._blocked.discard(partition)
        for known in (self._waiting, self._taken, self._high, self._restored, self._unseen):
            known.pop(partition, None)
        if any(entry[1] == partition for entry in self._window):
            self._window = [entry for entry in self._window if entry[1] != partition]
            heapq.heapify(self._window)

    def window_due(self) -> int | None:
        """The exact time of the earliest timer in the final window, epoch ms (None: the
        window is empty). Each is a final delivery to come."""
        return self._window[0][0] if self._window else None

    def next_due(self) -> int | None:
        """When the earliest record is due or may leave its place, epoch ms (None: nothing
        held). A partition whose head waits for room in the window counts when neither the
        window nor the committed metadata holds that room: what the last pass took blocked
        it, and the next pass may take its head at once."""
        heads = (
            held[0].due_ms if self.in_order or partition in self._ordered else held[0].fifo_ms
            for partition, held in self._held.items()
            if held and (partition not in self._blocked or self._blocked_by_pass(partition))
        )
        window = self._window[0][0] if self._window else None
        first = min(heads, default=None)
        if window is None:
            return first
        return window if first is None else min(first, window)

    def _blocked_by_pass(self, partition: int) -> bool:
        """``partition`` (blocked) has no record in the window and fewer than
        :data:`_OUT_OF_ORDER_MAX` named not done: only what one pass took blocked it."""
        return not self._waiting.get(partition) and (
            len(self._restored.get(partition, ())) < _OUT_OF_ORDER_MAX
        )

    def due(self, now: int) -> tuple[list[Held], list[int]]:
        """Take the records due at ``now`` (epoch ms), in offset order per partition: heads
        whose wait is over (a timer not at its exact time yet goes to the window) and
        window records whose time has come; pause the partitions whose head stays, and
        return the paused ones to fetch again: those now empty, and those whose head waits
        for room in the full window with fewer than :data:`_REFILL_BELOW` records held."""
        taken: dict[int, list[Held]] = {}
        window = self._window
        while window and window[0][0] <= now:
            _, partition, offset, record = heapq.heappop(window)
            self._waiting[partition].discard(offset)
            taken.setdefault(partition, []).append(record)
        resume = []
        exit_time = self._exit_time_ms
        for partition, held in list(self._held.items()):
            self._blocked.discard(partition)
            waiting = self._waiting.setdefault(partition, set())
            # Offsets the committed metadata names not done (those below the head are in the
            # window or taken in this pass, the others count in the metadata still), the
            # window's and those taken from it in this pass (a later transaction of this pass
            # may leave them not done): what the offset metadata may have to list.
            restored = self._restored.get(partition, ())
            out = taken.setdefault(partition, [])
            out_of_order = len(restored) + len(out)
            in_order = self.in_order
            if partition in self._ordered:
                if waiting or restored:
                    in_order = True
                else:
                    self._ordered.discard(partition)
                    logger.info("%s: partition %d: final window again", self._name, partition)
            while held and held[0].fifo_ms <= now:
                head = held[0]
                due_ms = head.due_ms
                if head.exact_ms is not None and due_ms <= now:
                    # Taken late (a busy coordinator): a timer close to its time waits for it
                    # here rather than hop to a tier that would make it later.
                    due_ms = exit_time(now, head.exact_ms)
                if due_ms > now:
                    if in_order:
                        break  # waits at the head for its time
                    if len(waiting) + out_of_order >= _OUT_OF_ORDER_MAX:
                        self._blocked.add(partition)
                        break
                    head.due_ms = due_ms
                    heapq.heappush(window, (due_ms, partition, head.offset, head))
                    waiting.add(head.offset)
                elif waiting and len(waiting) + out_of_order >= _OUT_OF_ORDER_MAX:
                    # Taking it past the window's records (all came out of this partition
                    # before it, so lie below it) would name too many not done in the offset
                    # metadata: in order until the window drains.
                    self._blocked.add(partition)
                    break
                else:
                    out.append(head)
                held.popleft()
            refill = partition in self._blocked and len(held) < _REFILL_BELOW
            if held and not refill and partition not in self._seeks.paused:
                # The head stays: stop fetching this partition until it may leave (FIFO: the
                # records behind it wait longer in the partition); what was fetched waits here.
                self._seeks.pause([TopicPartition(self._topic, partition)])
            elif held and refill and partition in self._seeks.paused:
                # The head's wait is over but it waits for room in the window: the records
                # behind it are about as close to their time, so keep a few fetched rather
                # than read them only when this queue has emptied (then at or after their
                # time at 5,000 timers a second).
                resume.append(partition)
            elif not held:
                del self._held[partition]
                if partition in self._seeks.paused:
                    resume.append(partition)
        due: list[Held] = []
        for partition, records in taken.items():
            if not records:
                continue
            if len(records) > 1:
                records.sort(key=lambda h: h.offset)
            self._taken.setdefault(partition, set()).update(h.offset for h in records)
            due += records
        return due, resume

    def positions(self, done: list[Held]) -> list[TopicPartition]:
        """The offsets to commit with the Kafka transaction that delivers ``done``: per
        partition, the smallest offset not done, and in the metadata which records above it
        are (see :func:`encode_done`). Raises ``KafkaException`` when the metadata would not
        fit (the transaction fails and is read again; the fetcher then keeps to offset
        order)."""
        offsets: dict[int, set[int]] = {}
        for record in done:
            offsets.setdefault(record.partition, set()).add(record.offset)
        out = []
        self._pending_high = {}
        for partition, committing in offsets.items():
            open_ = (
                self._waiting.get(partition, set())
                | (self._taken.get(partition, set()) - committing)
                | (self._restored.get(partition, set()) - committing)
            )
            queue = self._held.get(partition)
            if queue:
                nxt = queue[0].offset
            else:
                expected = self._next_offset.get(partition)
                nxt = max(committing) + 1 if expected is None else expected
            known_high = self._high.get(partition, 0)
            if nxt < known_high:
                # Read again up to a record the metadata calls done (or a transaction marker
                # among them): the next record not done is the first one named not done from
                # there, or ``known_high``. A done record committed as the base would be read
                # as not done (delivered twice); a marker would stay the base for good.
                nxt = min(
                    (
                        u
                        for u in self._restored.get(partition, ())
                        if u >= nxt and u not in committing
                    ),
                    default=known_high,
                )
            base = min(min(open_, default=nxt), nxt)
            high = max(known_high, max(committing) + 1)
            metadata = None
            if high > base + 1:
                undone = sorted(u for u in open_ if base < u < high)
                metadata = encode_done(base, high, undone)
                if metadata is not None and len(metadata) > METADATA_MAX_CHARS:
                    # Not expected (the records not done below ``high`` are bounded): the
                    # transaction fails, the partition is read again and keeps to offset
                    # order until nothing of it is done out of order.
                    if partition not in self._ordered:
                        self._ordered.add(partition)
                        logger.error(
                            "%s: partition %d: %d characters of offset metadata; its timers "
                            "are delivered in offset order until its final window drains",
                            self._name,
                            partition,
                            len(metadata),
                        )
                    raise KafkaException(
                        KafkaError(
                            KafkaError._STATE,
                            f"offset metadata of partition {partition} would be "
                            f"{len(metadata)} characters: delivering in order",
                        )
                    )
            self._pending_high[partition] = high if high > base + 1 else 0
            tp = TopicPartition(self._topic, partition, base)
            if metadata is not None:
                tp = TopicPartition(self._topic, partition, base, metadata)
            out.append(tp)
        return out

    def keep_order(self, why: str) -> None:
        """Deliver in offset order from now on (no final window): the offset metadata that
        out-of-order delivery needs cannot be written (``why``). What was committed with
        metadata before is still honoured."""
        if not self.in_order:
            logger.error("%s: %s; timers are delivered in offset order", self._name, why)
        self.in_order = True

    def committed(self, done: list[Held]) -> None:
        """The Kafka transaction that delivered ``done`` (with :meth:`positions`) committed."""
        for held in done:
            partition = held.partition
            taken = self._taken.get(partition)
            if taken is not None:
                taken.discard(held.offset)
            restored = self._restored.get(partition)
            if restored is not None:
                restored.discard(held.offset)
                if not restored:
                    del self._restored[partition]
        for partition, high in self._pending_high.items():
            if partition in self._next_offset:
                # Never lowered: the records below it are done but those still named not done
                # (a commit with no metadata moved the base up to or past it).
                self._high[partition] = max(high, self._high.get(partition, 0))
        self._pending_high = {}

    def fetch_again(self, consumer: Consumer, partitions: list[int]) -> None:
        """Fetch ``partitions`` again from where they were taken up to."""
        for partition in partitions:
            expected = self._next_offset.get(partition)
            if expected is not None:
                self._seeks.resume(consumer, partition, expected)

    def accept(self, record: Any) -> None:
        """Keep a fetched record, unless it is stale (of a partition no longer (or newly)
        assigned and not repositioned yet, or from before the last seek) or delivered already
        (named done in the committed metadata)."""
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            self._check_fencing(error)
            if error.fatal():  # the consumer cannot go on: stop rather than idle unseen
                raise FatalServiceError(f"{self._name}: Kafka consumer failed: {error.str()}")
            logger.warning("%s: consumer error %s", self._name, error.str())
            return
        partition = record.partition()
        offset = record.offset()
        expected = self._next_offset.get(partition)
        if expected is None or offset < expected:
            self._counts.dropped += 1
            return
        self._next_offset[partition] = offset + 1
        unseen = self._unseen.get(partition)
        if unseen:
            self._pass_unseen(partition, unseen, offset)
        if offset < self._high.get(partition, 0) and offset not in self._restored.get(
            partition, ()
        ):
            self._counts.done_before += 1  # delivered out of order before the last restart
            return
        headers, header_error = read_headers(record)
        held = Held(record, partition, offset, headers, header_error)
        self._place(held)
        self._held.setdefault(partition, deque()).append(held)

    def _pass_unseen(self, partition: int, unseen: deque[int], offset: int) -> None:
        """``offset`` of ``partition`` was fetched: the offsets named not done below it that
        were never fetched are no records (read_committed skips transaction markers and
        aborted records) and are forgotten, so that none stays the committed offset."""
        restored = self._restored.get(partition, set())
        while unseen and unseen[0] < offset:
            missing = unseen.popleft()
            restored.discard(missing)
            logger.info(
                "%s: partition %d: offset %d named not done is no record; skipped",
                self._name,
                partition,
                missing,
            )
        if unseen and unseen[0] == offset:
            unseen.popleft()
        if not unseen:
            del self._unseen[partition]
        if not restored:
            self._restored.pop(partition, None)

    def rewind_all(self) -> None:
        """After a failed transaction: forget what was fetched and read every owned partition
        again from its committed offset."""
        for known in (
            self._held,
            self._waiting,
            self._taken,
            self._high,
            self._restored,
            self._unseen,
        ):
            known.clear()
        self._window.clear()
        self._blocked.clear()
        for partition in self._next_offset:
            self._next_offset[partition] = None
        self._seeks.now()
        consumer = self._consumer()
        if consumer is not None:
            self.reposition(consumer)

    def reposition(self, consumer: Consumer) -> None:
        """Seek the partitions waiting for it to their committed offsets (and note which
        records above it the metadata says are done). A partition whose committed offset
        cannot be read now is paused and waits (nothing of it is taken), so no later batch can
        commit past what a failed one left undone."""
        pending = [p for p, expected in self._next_offset.items() if expected is None]
        committed = self._seeks.committed(consumer, pending)
        if committed is None:
            return
        for tp in committed:
            if tp.error is not None or tp.partition not in self._next_offset:
                continue
            self._forget(tp.partition)
            try:
                high, undone = decode_done(tp.offset, tp.metadata) if tp.offset >= 0 else (0, set())
            except WireFormatError as exc:
                # Only this code writes the metadata of this group: unreadable, it cannot be
                # trusted to say what was delivered, so the partition waits (loudly, once a
                # minute); the others go on.
                self._seeks.malformed(tp, exc)
                continue
            self._seeks.readable(tp.partition)
            start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            if self._seeks.resume(consumer, tp.partition, start):
                self._next_offset[tp.partition] = max(tp.offset, 0)
                if high:
                    self._high[tp.partition] = high
                    self._restored[tp.partition] = undone
                    self._unseen[tp.partition] = deque(sorted(undone))
        if any(expected is None for expected in self._next_offset.values()):
            self._seeks.later()
