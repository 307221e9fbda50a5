"""A record the delay services fetched (:class:`Held`) and the counts they keep: what every part
of a delay service (:mod:`~bridge.delay.fetch`, :mod:`~bridge.delay.isolation`,
:mod:`~bridge.delay.delivery`) shares, with no behaviour of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from bridge.errors import WireFormatError

RECORD_ERRORS: Final = (WireFormatError, ValueError, TypeError, SystemError, ArithmeticError)
"""What decoding one malformed record can raise (its own fault: it is quarantined)."""

Headers = list[tuple[str, bytes | None]]
Key = tuple[int, int]
"""(partition, offset) of a fetched record."""


@dataclass(slots=True)
class Held:
    """A fetched record, its headers read once (see
    :func:`~bridge.kafka.quarantine.read_headers`)."""

    record: Any
    partition: int
    offset: int
    headers: Headers
    header_error: str | None
    """Why the headers could not be read (then ``headers`` is empty)."""
    due_ms: int = 0
    """When it is due, epoch ms (its exact time, for a timer in its final window)."""
    fifo_ms: int = 0
    """When its wait in its partition is over, epoch ms (then the records behind it may pass
    it); at most ``due_ms``."""
    exact_ms: int | None = None
    """A timer's delivery time, epoch ms (None: a delay level, or unreadable)."""
    send_key: tuple[int, bytes] | None = None
    """Identifies its send (see :func:`~bridge.delay.records.send_key`), once it is due."""


@dataclass(slots=True)
class DelayCounts:
    """What a delay service did, for tests and metrics (each part counts its own)."""

    delivered: int = 0
    """Messages delivered to their real topics."""
    moved_aside: int = 0
    """Messages sent back to wait after a failed delivery, or quarantined."""
    dropped: int = 0
    """Fetched records thrown away to be read again (stale after a rebalance or rewind)."""
    duplicates: int = 0
    """Second copies of one send, consumed without a delivery."""
    done_before: int = 0
    """Fetched records skipped because the committed offset metadata says they were
    delivered already (out of order, before a restart or a failed transaction)."""
