"""A clock for the tests that count how many records a producer builds."""

from __future__ import annotations

import time


class CountingClock:
    """Stands in for the record builder's ``time`` module: the wall clock, counting its reads
    (one per plain record built)."""

    def __init__(self) -> None:
        self.reads = 0

    def time_ns(self) -> int:
        """The wall clock, in nanoseconds since the epoch."""
        self.reads += 1
        return time.time_ns()
