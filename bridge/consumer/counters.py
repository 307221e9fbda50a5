"""A push consumer's counters: one :class:`Count` per kind of event, read as
:class:`ConsumerStats`, and mirrored into the process's metrics while they are on
(:func:`~bridge.observability.metrics.enable_metrics`)."""

from __future__ import annotations

import threading
from enum import IntEnum
from typing import NamedTuple

from prometheus_client import Counter

from bridge.observability.metrics import BridgeMetrics, active_metrics


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


def metric_of(metrics: BridgeMetrics, count: Count) -> Counter:
    """The Prometheus counter that mirrors ``count``."""
    return {
        Count.CONSUMED: metrics.messages_out,
        Count.FAILED: metrics.consume_failures,
        Count.SENT_BACK: metrics.retries,
        Count.DEAD_LETTERED: metrics.dead_letters,
        Count.RETRIED_LOCALLY: metrics.local_retries,
        Count.DROPPED: metrics.dropped,
        Count.FILTERED: metrics.filtered,
        Count.QUARANTINED: metrics.quarantined,
    }[count]


class Counters:
    """The counters of one consumer (``group`` in ``namespace``: the labels of its metrics).
    Thread-safe."""

    __slots__ = ("_group", "_lock", "_namespace", "_values")

    def __init__(self, group: str = "", namespace: str = "") -> None:
        self._lock = threading.Lock()
        self._values = [0] * len(Count)
        self._group = group
        self._namespace = namespace

    def add(self, count: Count, n: int = 1) -> None:
        """Count ``n`` more events of kind ``count``."""
        with self._lock:
            self._values[count] += n
        metrics = active_metrics()
        if metrics is not None and n:
            if count is Count.QUARANTINED:
                metrics.quarantined.labels(self._namespace, "consumer").inc(n)
            else:
                metric_of(metrics, count).labels(self._namespace, self._group).inc(n)

    def snapshot(self) -> ConsumerStats:
        """The counters now."""
        with self._lock:
            return ConsumerStats(*self._values)
