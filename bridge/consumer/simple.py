"""What a :class:`~bridge.SimpleConsumer` is made of below its front: the messages it hands
out (:class:`MessageView`) and the strategy the fetcher hands new messages to
(:class:`SimpleConsumption`).

The fetcher (the same as a push consumer's) polls the group's partitions and its retry
topic, filters, quarantines what cannot be decoded, holds each message in its partition's
:class:`~bridge.consumer.process_queue.ProcessQueue` and passes it here, where it waits in a
buffer for ``receive``. ``receive`` takes messages from the buffer and opens a lease on each
(:mod:`bridge.consumer.invisibility`); the lease counts as work running on its partition, so
a rebalance waits for it (up to ``drain_timeout_ms``) as it waits for a push consumer's
listeners. ``ack`` ends the lease and marks the message done in its queue, so the committed
offset can pass it. A lease whose deadline passes is ended on the poll thread and its message
sent back by the push consumer's :class:`~bridge.consumer.retry_policy.RetryPolicy`: a copy
straight to ``%RETRY%<group>`` (the invisible duration was the back-off) with one more
``RECONSUME_TIME``, or to ``%DLQ%<group>`` once the deliveries are spent; the message counts
as done only once Kafka acknowledged the copy (G6).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import ClassVar, Final

from bridge.consumer import delivery_counts
from bridge.consumer.consumption import Failure, Place, Strategy, places, record_failure, restore
from bridge.consumer.context import ConsumerContext
from bridge.consumer.counters import Count
from bridge.consumer.invisibility import Lease, LeaseEnd, Leases
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.errors import IllegalStateError, InvalidArgumentError, InvalidReceiptHandleError
from bridge.message import MessageConst, MessageExt, PropertyValue

logger = logging.getLogger(__name__)

_ROOM_POLL_S: Final = 0.05
"""A ``receive`` waiting for room (every lease taken) looks again this often, seconds."""

Held = tuple[ProcessQueue, MessageExt]
"""A message held for a simple consumer, and its partition's queue."""
Leased = tuple[ProcessQueue, MessageExt, Place]
"""A message received, its partition's queue, and where it was read (put back before the
consumer acts on it: the application may have changed the message, see
:func:`~bridge.consumer.consumption.restore`)."""


class MessageView:
    """A received message as RocketMQ 5 shows it (its ``MessageView``): one a
    :class:`~bridge.SimpleConsumer` received, to :meth:`~bridge.SimpleConsumer.ack` or
    :meth:`~bridge.SimpleConsumer.change_invisible_duration`, and the message a
    :mod:`bridge.v5` push consumer's listener or transaction checker is given.

    ``delivery_attempt`` counts the deliveries of the message to the group: 1 the first time,
    one more each time it comes back (after its invisible duration passed without an ack, or
    a push consumer's listener failed it). The RocketMQ fields read the received message;
    :attr:`message` is that message itself (a :class:`~bridge.MessageExt`: the Kafka topic,
    partition and offset, and the deserialized :attr:`~bridge.Message.value` and
    :attr:`~bridge.Message.key` when the consumer has deserializers)."""

    __slots__ = ("_book", "_lease", "_msg", "receipt_handle")

    def __init__(
        self,
        msg: MessageExt,
        lease: Lease[Leased] | None = None,
        book: Leases[Leased] | None = None,
    ) -> None:
        self._msg = msg
        self._lease = lease
        self._book = book
        self.receipt_handle = lease.handle if lease is not None else None
        """What acks this delivery (opaque); ``change_invisible_duration`` replaces it. None
        for a message no simple consumer received (nothing acks it)."""

    @property
    def message(self) -> MessageExt:
        """The received message."""
        return self._msg

    @property
    def message_id(self) -> str:
        """The message id (the same through retries and the DLQ)."""
        return self._msg.msg_id

    @property
    def topic(self) -> str:
        """The topic the message was sent to (RocketMQ name; for a redelivery, too)."""
        return self._msg.topic

    @property
    def body(self) -> bytes:
        """The payload."""
        return self._msg.body

    @property
    def tag(self) -> str | None:
        """The message's tag (RocketMQ 4's ``tags``), if any."""
        return self._msg.tags

    @property
    def keys(self) -> list[str]:
        """The business keys."""
        return self._msg.keys

    @property
    def properties(self) -> dict[str, PropertyValue]:
        """The user's properties (text, or bytes for a value that is not UTF-8)."""
        return self._msg.user_properties

    @property
    def message_group(self) -> str | None:
        """The message's FIFO message group (RocketMQ 5's), if any (see
        :attr:`bridge.Message.message_group`)."""
        return self._msg.message_group

    @property
    def delivery_attempt(self) -> int:
        """This delivery's number: 1 for the first, ``n + 1`` after ``n`` invisible
        durations passed without an ack."""
        return self._msg.reconsume_times + 1

    @property
    def born_timestamp(self) -> int:
        """When the producer made the message, epoch ms."""
        return self._msg.born_timestamp_ms

    @property
    def born_host(self) -> str:
        """The producer's address."""
        return self._msg.born_host

    @property
    def value(self) -> object:
        """The consumer's ``value_deserializer`` applied to the body (see
        :attr:`bridge.Message.value`)."""
        return self._msg.value

    @property
    def key(self) -> object:
        """The consumer's ``key_deserializer`` applied to the Kafka key (see
        :attr:`bridge.Message.key`)."""
        return self._msg.key

    def __repr__(self) -> str:
        return (
            f"MessageView(topic={self.topic!r}, message_id={self.message_id!r}, "
            f"tag={self.tag!r}, keys={self.keys!r}, body={len(self.body)} bytes, "
            f"delivery_attempt={self.delivery_attempt})"
        )


class SimpleConsumption(Strategy):
    """The buffer of received messages and the leases of one simple consumer.

    ``max_unacked``: the most leases open at once."""

    orderly: ClassVar[bool] = False
    _RETRY_AT_ONCE: ClassVar[bool] = True
    expires_while_waiting: ClassVar[bool] = True
    cooperative: ClassVar[bool] = True
    """A message out stays with its receiver across a rebalance unless its partition moves:
    RocketMQ keeps a received message invisible however the group changes."""

    def __init__(
        self,
        context: ConsumerContext,
        quarantine: Quarantine,
        max_unacked: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the time leases are measured in, monotonic seconds (tests give one of
        their own, so that a lease expires when they say, not when a busy machine makes it)."""
        super().__init__(context, quarantine)
        self._clock = clock
        self.leases: Leases[Leased] = Leases(uuid.uuid4().hex[:16], max_unacked)
        self._ready: deque[Held] = deque()
        """Messages held and not received yet, in the order the fetcher passed them."""
        self._ready_changed = threading.Condition()
        self._closed = False
        self._out: weakref.WeakKeyDictionary[ProcessQueue, dict[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        """Per partition held, the offsets handed out and not done, with how many times they
        went out (counted by earlier owners too): what :meth:`commit_metadata` commits. A
        partition's entry goes with its queue."""
        self._out_lock = threading.Lock()
        self._persist: Callable[[Iterable[ProcessQueue]], bool] | None = None
        self._commit_wanted = threading.Event()

    def persist_with(self, commit: Callable[[Iterable[ProcessQueue]], bool]) -> None:
        """``commit``: commits the given partitions' offsets and metadata now, on the poll
        thread (the fetcher's :meth:`~bridge.consumer.fetcher.Fetcher.commit_now`)."""
        self._persist = commit

    # --- deliveries a partition's next owner counts ---------------------------------------
    def inherit(self, pq: ProcessQueue, offset: int, metadata: str) -> None:
        counts = delivery_counts.decode(offset, metadata)
        if counts:
            with self._out_lock:
                self._out[pq] = counts
            logger.info(
                "simple consumer %s: %s[%d] had %d messages out with its last owner; their "
                "deliveries are counted",
                self._context.group,
                pq.topic,
                pq.partition,
                len(counts),
            )

    def commit_metadata(self, pq: ProcessQueue, offset: int) -> str:
        with self._out_lock:
            out = self._out.get(pq)
            if not out:
                return ""
            for gone in [o for o in out if o < offset or not pq.holds(o)]:
                del out[gone]
            text, left = delivery_counts.encode(offset, out)
        if left:
            logger.warning(
                "simple consumer %s: %d messages out of %s[%d] beyond what the commit metadata "
                "holds: a crash would not count their delivery",
                self._context.group,
                left,
                pq.topic,
                pq.partition,
            )
        return text

    def _count_out(self, pq: ProcessQueue, offset: int) -> None:
        with self._out_lock:
            out = self._out.setdefault(pq, {})
            out[offset] = out.get(offset, 0) + 1

    def _count_done(self, pq: ProcessQueue, offset: int) -> None:
        with self._out_lock:
            out = self._out.get(pq)
            if out is not None:
                out.pop(offset, None)

    def _went_out_before(self, pq: ProcessQueue, msgs: list[MessageExt]) -> list[MessageExt]:
        """Those of ``msgs`` that went out with an earlier owner and were not done, each with
        ``reconsume_times`` raised by its deliveries there but one (the copy adds that one)."""
        with self._out_lock:
            out = self._out.get(pq)
            if not out:
                return []
            before = [(m, out[m.queue_offset]) for m in msgs if m.queue_offset in out]
        for msg, times in before:
            if times > 1:
                msg.put_system_property(
                    MessageConst.RECONSUME_TIME, str(msg.reconsume_times + times - 1)
                )
        return [m for m, _ in before]

    # --- from the fetcher (the poll thread) ----------------------------------------------
    def submit(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        before = self._went_out_before(pq, msgs)
        if before:
            # Received by an earlier owner that never acked them (it crashed, or gave the
            # partition up): back to the group as a message whose invisible duration passed,
            # one delivery more, or to the DLQ once they are spent.
            record_failure(before, Failure.NOT_ACKED)
            self.policy.fail(pq, before, [0] * len(before))
            sent = {id(m) for m in before}
            msgs = [m for m in msgs if id(m) not in sent]
            # Commit past them as soon as their copies are stored: a crash before would have
            # the next owner send them back once more, counting from the same delivery.
            context = self._context
            context.flush_copies(context.bounded_ms(context.config.send_msg_timeout_ms))
            if self._persist is not None:
                self._persist([pq])
        with self._ready_changed:
            self._ready.extend((pq, msg) for msg in msgs)
            self._ready_changed.notify_all()

    def _redeliver(self, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        # A copy could not be written: offered again (RECONSUME_TIME already counted one
        # more), ahead of the messages not received yet.
        with self._ready_changed:
            self._ready.extendleft((pq, msg) for msg in reversed(msgs))
            self._ready_changed.notify_all()

    def expire_overdue(self, queues: Iterable[ProcessQueue]) -> None:
        """Send back the messages whose invisible duration passed without an ack (those of
        a partition given up meanwhile are its next owner's)."""
        expired = self.leases.expired(self._clock())
        if not expired:
            return
        by_queue: dict[int, tuple[ProcessQueue, list[MessageExt]]] = {}
        for lease in expired:
            pq, msg, place = lease.item
            pq.end()
            if pq.released:
                continue
            restore([msg], [place], self._context.group)
            by_queue.setdefault(id(pq), (pq, []))[1].append(msg)
        for pq, msgs in by_queue.values():
            record_failure(msgs, Failure.NOT_ACKED)
            self.policy.fail(pq, msgs, [0] * len(msgs))

    def released(self, queues: Iterable[ProcessQueue]) -> None:
        """End the leases of messages of ``queues`` (given up) as released, so that they no
        longer count against :attr:`Leases.limit` and a late ack says why it is refused."""
        gone = {id(pq) for pq in queues}
        if not gone:
            return
        for lease in self.leases.open_leases():
            pq = lease.item[0]
            if id(pq) in gone and self.leases.release(lease):
                pq.end()

    # --- from the front (any thread) ---------------------------------------------------
    def take(self, count: int, duration_s: float, wait_s: float) -> list[MessageView]:
        """Up to ``count`` messages, each invisible for ``duration_s`` seconds, waiting up to
        ``wait_s`` seconds for one; fewer when the leases are at their limit (see
        :meth:`Leases.room`). Messages of a partition given up meanwhile are skipped."""
        deadline = time.monotonic() + wait_s
        ready = self._ready
        with self._ready_changed:
            while True:
                if self._closed:
                    raise IllegalStateError(f"simple consumer {self._context.group} is shut down")
                room = self.leases.room()
                views: list[MessageView] = []
                now = self._clock()
                while ready and len(views) < min(count, room):
                    pq, msg = ready.popleft()
                    if not pq.begin():
                        continue  # given up: the partition's next owner delivers it
                    self._count_out(pq, msg.queue_offset)
                    lease = self.leases.open((pq, msg, places([msg])[0]), now, duration_s)
                    views.append(MessageView(msg, lease, self.leases))
                if views:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return views
                self._ready_changed.wait(left if room else min(left, _ROOM_POLL_S))
        self._record_out()
        return views

    def _record_out(self) -> None:
        """Have the poll thread commit the deliveries just taken at its next poll (see
        :mod:`~bridge.consumer.delivery_counts`), within ``_POLL_TIMEOUT_S`` of the fetcher
        (0.1 s) rather than the commit interval: a crash after that counts them. Not from
        this thread: a commit made beside the poll thread's ``consume`` calls waits for them
        (about a second a ``receive``, measured)."""
        self._commit_wanted.set()

    def commit_wanted(self) -> bool:
        if not self._commit_wanted.is_set():
            return False
        self._commit_wanted.clear()
        return True

    def ack(self, view: object) -> None:
        """End ``view``'s lease and mark its message done; see :meth:`_lease_of` for what
        raises."""
        lease, handle = self._lease_of(view, "ack")
        pq, msg, place = lease.item
        restore([msg], [place], self._context.group)
        with pq.lock:
            if pq.released:
                self._refuse_released(lease, handle, pq)
            self.leases.ack(lease, handle, self._clock())
            pq.remove((msg.queue_offset,))
        self._count_done(pq, msg.queue_offset)
        pq.end()
        self._context.counters.add(Count.CONSUMED)

    def change(self, view: object, duration_s: float) -> str:
        """Move ``view``'s deadline to ``duration_s`` seconds from now; its new receipt
        handle (also set on ``view``)."""
        lease, handle = self._lease_of(view, "change_invisible_duration")
        pq = lease.item[0]
        with pq.lock:
            if pq.released:
                self._refuse_released(lease, handle, pq)
            new = self.leases.change(lease, handle, self._clock(), duration_s)
        assert isinstance(view, MessageView)  # checked by _lease_of
        view.receipt_handle = new
        return new

    def _lease_of(self, view: object, what: str) -> tuple[Lease[Leased], str]:
        """``view``'s lease and handle; :class:`InvalidArgumentError` for something that is
        no :class:`MessageView`, :class:`InvalidReceiptHandleError` for one another consumer
        received, :class:`IllegalStateError` once the consumer is shut down."""
        if not isinstance(view, MessageView):
            raise InvalidArgumentError(
                f"{what} takes a MessageView from receive(), got {type(view).__name__}"
            )
        if self._closed:
            raise IllegalStateError(f"simple consumer {self._context.group} is shut down")
        lease, handle = view._lease, view.receipt_handle
        if view._book is not self.leases or lease is None or handle is None:
            raise InvalidReceiptHandleError(
                f"{what}: message {view.message_id} was not received by this consumer "
                f"(group {self._context.group})",
                "foreign",
            )
        return lease, handle

    def _refuse_released(self, lease: Lease[Leased], handle: str, pq: ProcessQueue) -> None:
        """``lease``'s partition was given up: end it and raise why (its own end, if it had
        ended before)."""
        if self.leases.release(lease):
            pq.end()
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is stale: the message {LeaseEnd.RELEASED.value}",
                LeaseEnd.RELEASED.name.lower(),
            )
        self.leases.check(lease, handle)  # raises with the reason it ended

    def give_back(self, views: list[MessageView]) -> None:
        """Undo a ``receive`` whose caller never got ``views`` (an asyncio task cancelled
        meanwhile): their leases end, and the messages are offered again first, the same
        delivery."""
        back: list[Held] = []
        for view in views:
            if not isinstance(view, MessageView):
                raise InvalidArgumentError(
                    f"give_back takes messages received by a SimpleConsumer, got {view!r}"
                )
            lease = view._lease
            if view._book is not self.leases or lease is None:
                continue  # another consumer's: not this one's to offer again
            if self.leases.release(lease):
                pq, msg, place = lease.item
                pq.end()
                restore([msg], [place], self._context.group)
                with self._out_lock:  # never seen by the caller: not a delivery
                    out = self._out.get(pq)
                    if out is not None and out.get(msg.queue_offset, 0) > 1:
                        out[msg.queue_offset] -= 1
                    elif out is not None:
                        out.pop(msg.queue_offset, None)
                back.append((pq, msg))
        with self._ready_changed:
            if not self._closed:
                self._ready.extendleft(reversed(back))
                self._ready_changed.notify_all()

    def close(self) -> int:
        """Shutting down: end every open lease (their messages are delivered again by the
        partitions' next owners) and refuse further calls; how many were open."""
        with self._ready_changed:
            self._closed = True
            self._ready.clear()
            self._ready_changed.notify_all()
        released = 0
        for lease in self.leases.open_leases():
            if self.leases.release(lease):
                lease.item[0].end()
                released += 1
        return released

    def unacked(self) -> int:
        """Leases open now."""
        return len(self.leases)
