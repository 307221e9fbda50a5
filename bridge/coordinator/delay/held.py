"""What every part of a delay service (:mod:`~bridge.coordinator.delay.fetch`,
:mod:`~bridge.coordinator.delay.isolation`, :mod:`~bridge.coordinator.delay.delivery`) shares, with
no behaviour of its own: a record it fetched (:class:`Held`), the service's settings and the counts
it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from bridge.config import NamePatterns
from bridge.delay_policy import DelayPolicy
from bridge.errors import InvalidArgumentError, WireFormatError
from bridge.kafka.service import ServiceConfig

RECORD_ERRORS: Final = (WireFormatError, InvalidArgumentError)
"""What the codec raises for one malformed record (its own fault: it is quarantined): bytes
or headers it cannot decode (:class:`WireFormatError`), a real topic with no Kafka name or a
delay it cannot honour (:class:`InvalidArgumentError`). Anything else (a ``TypeError``, say)
is a fault of the code, not of the record: it fails the pass, which is read again, rather
than quarantine good records."""

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
    """Identifies its send (see :func:`~bridge.coordinator.delay.records.send_key`), once it is
    due."""


@dataclass(frozen=True, slots=True)
class DelaySettings:
    """A delay service's settings, as its parts read them."""

    name: str
    """The service's name (in log lines)."""
    kind: str
    """``schedule`` or ``timer`` (its metrics label)."""
    topic: str
    """The topic whose partitions it reads."""
    timer_topic: str
    """Where a back-off copy waits."""
    group_id: str
    config: ServiceConfig
    policy: DelayPolicy
    allowed_topics: NamePatterns
    """The real topics it delivers to (G12)."""

    @property
    def timeout_s(self) -> float:
        """Bound on each Kafka call, seconds."""
        return self.config.client.request_timeout_ms / 1000


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
    recalled: int = 0
    """Timers not delivered because they were recalled in time (``recall_message``)."""
