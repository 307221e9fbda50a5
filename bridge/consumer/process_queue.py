"""What a consumer holds of one partition (RocketMQ's ``ProcessQueue``). Pure logic.

Every message received stays here until it is done: consumed, or safely sent back for retry.
The offset to commit is the smallest one still held, or one past the highest received when
nothing is held, so a committed offset never passes a message that is not done, however the
listener threads finish out of order.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable

from bridge.message import MessageExt


class ProcessQueue:
    """The messages of one partition between receipt and completion. Thread-safe."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        """The Kafka topic."""
        self.partition = partition
        self._held: OrderedDict[int, MessageExt] = OrderedDict()
        self._highest = -1
        self._lock = threading.Condition()
        self._running = 0
        self.dropped = False
        """Set when the partition is revoked or the consumer stops: start no new work."""
        self.last_committed = -1
        """The offset last committed for this partition (kept by the committing thread)."""
        # Orderly consumption only: messages not yet handed to the listener, in order.
        self._pending: deque[MessageExt] = deque()
        self.orderly_scheduled = False
        """An orderly task owns this partition now (set and cleared under :meth:`lock`)."""

    # --- receipt and completion ---------------------------------------------------------
    def put(self, msgs: Iterable[MessageExt], *, pending: bool = False) -> None:
        """Hold ``msgs`` (in offset order); ``pending`` also queues them for an orderly task."""
        with self._lock:
            for msg in msgs:
                self._held[msg.queue_offset] = msg
                self._highest = max(self._highest, msg.queue_offset)
                if pending:
                    self._pending.append(msg)

    def skip(self, offset: int) -> None:
        """Record an offset that needs no work (filtered out, quarantined)."""
        with self._lock:
            self._highest = max(self._highest, offset)

    def remove(self, offsets: Iterable[int]) -> None:
        """Mark messages done."""
        with self._lock:
            for offset in offsets:
                self._held.pop(offset, None)

    def commit_offset(self) -> int | None:
        """The offset to commit (the next to read), or None if nothing was received."""
        with self._lock:
            if self._held:
                return next(iter(self._held))
            return self._highest + 1 if self._highest >= 0 else None

    @property
    def held(self) -> int:
        """How many messages are received and not done."""
        return len(self._held)

    # --- running work ---------------------------------------------------------------------
    def begin(self) -> bool:
        """Count a listener call as running; False (and nothing counted) once dropped."""
        with self._lock:
            if self.dropped:
                return False
            self._running += 1
            return True

    def end(self) -> None:
        """A listener call counted by :meth:`begin` finished."""
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._lock.notify_all()

    def drop_and_drain(self, timeout_s: float) -> bool:
        """Mark dropped and wait up to ``timeout_s`` for running calls; True if none remain."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self.dropped = True
            while self._running:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    # --- orderly --------------------------------------------------------------------------
    @property
    def lock(self) -> threading.Condition:
        """The queue's lock, for callers that combine several steps."""
        return self._lock

    def take(self, count: int) -> list[MessageExt]:
        """Up to ``count`` pending messages, oldest first (orderly)."""
        with self._lock:
            n = min(count, len(self._pending))
            return [self._pending.popleft() for _ in range(n)]

    def put_back(self, msgs: list[MessageExt]) -> None:
        """Return messages taken by :meth:`take` to the head, in order (orderly retry)."""
        with self._lock:
            self._pending.extendleft(reversed(msgs))
