"""A push consumer's counters: one :class:`Count` per kind of event, read as
:class:`ConsumerStats`."""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import NamedTuple


class ConsumerStats(NamedTuple):
    """Counters since start: messages the listener consumed, failed, sent back to the retry
    topic, sent to the DLQ, retried locally after a failed send-back, dropped (BROADCASTING
    failures), filtered out by tag, and records quarantined."""

    consumed: int
    failed: int
    sent_back: int
    dead_lettered: int
    retried_locally: int
    dropped: int
    filtered: int
    quarantined: int


class Count(IntEnum):
    """What a consumer counts; each is the index of its field of :class:`ConsumerStats`."""

    CONSUMED = 0
    FAILED = 1
    SENT_BACK = 2
    DEAD_LETTERED = 3
    RETRIED_LOCALLY = 4
    DROPPED = 5
    FILTERED = 6
    QUARANTINED = 7


if [count.name.lower() for count in Count] != list(ConsumerStats._fields):  # pragma: no cover
    raise AssertionError("Count and ConsumerStats must list the same counters in one order")


class Counters:
    """The counters of one consumer. Thread-safe."""

    __slots__ = ("_lock", "_values")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = [0] * len(Count)

    def add(self, count: Count, n: int = 1) -> None:
        """Count ``n`` more events of kind ``count``."""
        with self._lock:
            self._values[count] += n

    def snapshot(self) -> ConsumerStats:
        """The counters now."""
        with self._lock:
            return ConsumerStats(*self._values)
