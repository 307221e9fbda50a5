"""A push consumer's deferred work: actions that run on its poll thread once they are due.

Any thread may schedule an action (a listener thread, a delivery report); only the poll thread
runs them, so an action never races the poll loop over the consumer's partitions.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(order=True)
class _Later:
    due: float
    """Monotonic seconds."""
    seq: int
    action: Callable[[], None] = field(compare=False)


class Scheduler:
    """Actions by due time, first due first, in the order scheduled among equals."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        """The consumer group, for logs."""
        self._heap: list[_Later] = []
        self._lock = threading.Lock()
        self._seq = itertools.count()

    def __len__(self) -> int:
        """How many actions wait."""
        with self._lock:
            return len(self._heap)

    def after(self, delay_ms: int, action: Callable[[], None]) -> None:
        """Run ``action`` on the poll thread after ``delay_ms`` (ms)."""
        item = _Later(time.monotonic() + delay_ms / 1000, next(self._seq), action)
        with self._lock:
            heapq.heappush(self._heap, item)

    def run_due(self) -> None:
        """Run every action due by now (on the poll thread); one that raises is logged."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._heap or self._heap[0].due > now:
                    return
                item = heapq.heappop(self._heap)
            try:
                item.action()
            except Exception:
                logger.exception("push consumer %s: deferred action failed", self._owner)
