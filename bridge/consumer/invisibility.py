"""A simple consumer's invisibility bookkeeping (RocketMQ 5's POP receipt handles). Pure logic.

Each message a ``receive`` hands out gets a :class:`Lease`: a receipt handle and a deadline
(monotonic seconds) until which the group does not deliver it again. The lease ends once:

* ``ack`` names its current handle (:attr:`LeaseEnd.ACKED`);
* its deadline passes (:attr:`LeaseEnd.EXPIRED`, taken by :meth:`Leases.expired`): the
  consumer then sends the message back, and it comes back with one more delivery attempt;
* the consumer gives its partition up or shuts down (:attr:`LeaseEnd.RELEASED`): the
  partition's next owner delivers it again.

``change_invisible_duration`` moves the deadline to ``now + duration`` and replaces the
handle: the old one is stale from then on, as in RocketMQ. Any use of a stale or unknown
handle raises :class:`~bridge.errors.InvalidReceiptHandleError` saying why; a lease ends
once, whichever of these comes first.

The number of open leases is capped (:attr:`Leases.limit`), so a consumer that never acks
holds at most that many messages out (G11); expiry frees room by itself.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from enum import Enum
from typing import Generic, TypeVar

from bridge.errors import InvalidArgumentError, InvalidReceiptHandleError

T = TypeVar("T")


class LeaseEnd(Enum):
    """Why a lease ended; the text completes "the receipt handle is stale: the message ..."."""

    ACKED = "was acked already"
    EXPIRED = (
        "was not acked within its invisible duration and is delivered again (with a new "
        "receipt handle)"
    )
    RELEASED = (
        "belongs to a partition this consumer gave up (a rebalance or a shutdown): the "
        "partition's next owner delivers it again"
    )
    REPLACED = "has a newer receipt handle, from change_invisible_duration"


def check_duration(name: str, seconds: object, maximum: float) -> float:
    """``seconds`` as a float if it is a positive finite number of seconds up to
    ``maximum``; else :class:`InvalidArgumentError` naming ``name``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds, got {seconds!r}")
    value = float(seconds)
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {seconds!r}")
    if value > maximum:
        raise InvalidArgumentError(f"{name} must be at most {maximum:g} s, got {seconds!r}")
    return value


class Lease(Generic[T]):
    """One delivery of one held message: ``item`` (what the consumer needs to act on it),
    its current ``handle`` and ``deadline`` (monotonic seconds), and ``end`` once it ended."""

    __slots__ = ("deadline", "end", "handle", "item")

    def __init__(self, item: T, handle: str, deadline: float) -> None:
        self.item = item
        self.handle = handle
        self.deadline = deadline
        self.end: LeaseEnd | None = None


class Leases(Generic[T]):
    """The open leases of one consumer, with their deadlines. Thread-safe.

    ``token`` starts every handle this book makes (a handle of another book is unknown
    here); ``limit`` caps the open leases."""

    def __init__(self, token: str, limit: int) -> None:
        self.token = token
        self.limit = limit
        self._open: dict[str, Lease[T]] = {}
        """By current handle."""
        self._due: list[tuple[float, int, Lease[T]]] = []
        """(deadline, sequence, lease); an entry whose deadline is no longer its lease's, or
        whose lease ended, is skipped when it comes up."""
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Open leases."""
        return len(self._open)

    def room(self) -> int:
        """How many more leases may open now."""
        return max(0, self.limit - len(self._open))

    def _handle(self) -> str:
        return f"{self.token}.{next(self._seq)}"

    def open(self, item: T, now: float, duration_s: float) -> Lease[T]:
        """A lease of ``item`` until ``now + duration_s``. The caller checked :meth:`room`
        (a book over its limit still opens it: the limit is the caller's to keep)."""
        with self._lock:
            lease = Lease(item, self._handle(), now + duration_s)
            self._open[lease.handle] = lease
            heapq.heappush(self._due, (lease.deadline, next(self._seq), lease))
            return lease

    def _current(self, lease: Lease[T], handle: str, now: float | None) -> None:
        """Raise unless ``handle`` is ``lease``'s current one and it is open (and, given
        ``now``, its deadline has not passed: a lease past it is as good as expired, though
        :meth:`expired` has not taken it yet); hold the lock."""
        if not handle.startswith(self.token + "."):
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} was not given by this consumer", "foreign"
            )
        if lease.end is not None:
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is stale: the message {lease.end.value}",
                lease.end.name.lower(),
            )
        if lease.handle != handle or self._open.get(handle) is not lease:
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is stale: the message {LeaseEnd.REPLACED.value}",
                LeaseEnd.REPLACED.name.lower(),
            )
        if now is not None and lease.deadline <= now:
            raise InvalidReceiptHandleError(
                f"receipt handle {handle!r} is stale: the message {LeaseEnd.EXPIRED.value}",
                LeaseEnd.EXPIRED.name.lower(),
            )

    def ack(self, lease: Lease[T], handle: str, now: float | None = None) -> None:
        """End ``lease`` as acked, if ``handle`` is its current one (and, given ``now``, its
        deadline has not passed); else raise :class:`InvalidReceiptHandleError` (and change
        nothing)."""
        with self._lock:
            self._current(lease, handle, now)
            del self._open[handle]
            lease.end = LeaseEnd.ACKED

    def check(self, lease: Lease[T], handle: str, now: float | None = None) -> None:
        """Raise :class:`InvalidReceiptHandleError` unless ``handle`` is open ``lease``'s
        current one."""
        with self._lock:
            self._current(lease, handle, now)

    def change(self, lease: Lease[T], handle: str, now: float, duration_s: float) -> str:
        """Move ``lease``'s deadline to ``now + duration_s`` and give it a new handle
        (returned; ``handle`` is stale from now on), if ``handle`` is its current one; else
        raise :class:`InvalidReceiptHandleError` (and change nothing)."""
        with self._lock:
            self._current(lease, handle, now)
            del self._open[handle]
            lease.handle = self._handle()
            lease.deadline = now + duration_s
            self._open[lease.handle] = lease
            heapq.heappush(self._due, (lease.deadline, next(self._seq), lease))
            return lease.handle

    def release(self, lease: Lease[T]) -> bool:
        """End open ``lease`` as released; False if it had ended already."""
        with self._lock:
            if lease.end is not None:
                return False
            self._open.pop(lease.handle, None)
            lease.end = LeaseEnd.RELEASED
            return True

    def expired(self, now: float) -> list[Lease[T]]:
        """End and return the open leases whose deadline is ``now`` or earlier, earliest
        first."""
        out: list[Lease[T]] = []
        with self._lock:
            due = self._due
            while due and due[0][0] <= now:
                deadline, _, lease = heapq.heappop(due)
                if lease.end is not None or lease.deadline != deadline:
                    continue  # acked, released, or its deadline was moved
                del self._open[lease.handle]
                lease.end = LeaseEnd.EXPIRED
                out.append(lease)
            if len(due) > 2 * len(self._open) + 64:
                # Moved and ended leases leave entries behind: rebuild now and then, so the
                # heap stays within a constant factor of the open leases.
                self._due = [e for e in due if e[2].end is None and e[2].deadline == e[0]]
                heapq.heapify(self._due)
        return out

    def open_leases(self) -> list[Lease[T]]:
        """The open leases, in no particular order."""
        with self._lock:
            return list(self._open.values())
