"""A histogram of due times counted while records stream past, apart from Kafka: a fixed
number of buckets, whatever the number of records (the delays page's "due in the coming
hours")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

BUCKET_MS: Final = 10 * 60_000
"""The width of a bucket, ms (10 minutes)."""

BUCKETS: Final = 36
"""Buckets after now: 36 of 10 minutes, the next 6 hours; later ones are counted together."""


@dataclass(slots=True)
class DueHistogram:
    """Counts of due times: overdue (before ``now_ms``), in each of ``buckets`` buckets of
    ``bucket_ms`` from ``now_ms``, and later. Memory: ``buckets`` integers."""

    now_ms: int
    bucket_ms: int = BUCKET_MS
    buckets: int = BUCKETS
    overdue: int = 0
    later: int = 0
    counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.bucket_ms <= 0 or self.buckets <= 0:
            raise ValueError("a histogram needs buckets of a positive width")
        self.counts = [0] * self.buckets

    def add(self, due_ms: int) -> None:
        """Count one record due at ``due_ms`` (epoch ms)."""
        if due_ms < self.now_ms:
            self.overdue += 1
            return
        index = (due_ms - self.now_ms) // self.bucket_ms
        if index < self.buckets:
            self.counts[index] += 1
        else:
            self.later += 1

    @property
    def total(self) -> int:
        return self.overdue + self.later + sum(self.counts)

    def rows(self) -> list[tuple[str, int, int]]:
        """(label, count, bar width in percent of the largest count) for overdue, each
        bucket (``+0:10``: due within 10 minutes from now, ...) and later."""
        widest = max([self.overdue, self.later, *self.counts]) or 1
        span = self.bucket_ms * self.buckets
        labels = ["overdue"] + [
            f"+{_clock(i * self.bucket_ms)}-{_clock((i + 1) * self.bucket_ms)}"
            for i in range(self.buckets)
        ]
        labels.append(f"later than +{_clock(span)}")
        values = [self.overdue, *self.counts, self.later]
        return [
            (label, n, round(100 * n / widest)) for label, n in zip(labels, values, strict=True)
        ]


def _clock(ms: int) -> str:
    """``h:mm`` of a span of ``ms``."""
    minutes = ms // 60_000
    return f"{minutes // 60}:{minutes % 60:02d}"
