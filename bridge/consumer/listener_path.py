"""Where a concurrent push consumer runs its listener: on the thread that polled Kafka, in
batches, or on the listener threads. Pure logic.

Handing each chunk of messages from the poll thread to a listener thread costs a thread
switch, and with the GIL a busy pool makes the poll thread and the listeners wait for each
other: for a listener that takes a microsecond, that hand-off is most of the consumer's cost.
So a listener measured fast runs where the messages are, on the poll thread, each poll's
messages in a row; one measured slow (a database call, an HTTP request) keeps the pool,
where ``consume_thread_count`` calls wait on their I/O at once.

:class:`PathChoice` keeps a moving estimate of the listener's time per message and decides,
with hysteresis so that a listener near the threshold does not flip at each poll: the poll
thread once the estimate is below ``consume_inline_threshold_us``, the pool again once it is
above :data:`EXIT_FACTOR` times that. A call that holds the poll thread too long (the fetcher
hands its poll loop to a new thread then: see :mod:`bridge.consumer.fetcher`) counts as
that long a message, so the listener goes back to the pool at once.
"""

from __future__ import annotations

import math
from typing import Final

EXIT_FACTOR: Final = 4.0
"""A listener on the poll thread goes back to the pool once its estimate is above this many
times the threshold (it came to the poll thread below the threshold: the hysteresis)."""
ESTIMATE_WEIGHT: Final = 0.25
"""The weight of a new measurement in the moving estimate (the others': ``1 - weight``)."""
_SHORTEST_S: Final = 1e-9
"""A measurement is taken as at least this, seconds (a nanosecond)."""


def inline_wanted(estimate_s: float, threshold_s: float, *, inline_now: bool) -> bool:
    """True if a listener whose estimated time per message is ``estimate_s`` (seconds; 0 or
    less: not measured yet) should run on the poll thread, given that it does now
    (``inline_now``) or not, and the threshold ``threshold_s`` (seconds; 0 or less: never).
    An estimate that is not a finite number never runs there."""
    if threshold_s <= 0 or estimate_s <= 0 or not math.isfinite(estimate_s):
        return False
    if inline_now:
        return estimate_s <= threshold_s * EXIT_FACTOR
    return estimate_s < threshold_s


def next_estimate(estimate_s: float, measured_s: float) -> float:
    """The moving estimate after a measurement of ``measured_s`` seconds a message (the first
    measurement, when ``estimate_s`` is 0 or less, is taken as it is)."""
    if estimate_s <= 0:
        return measured_s
    return estimate_s + ESTIMATE_WEIGHT * (measured_s - estimate_s)


class PathChoice:
    """The path of one consumer's listener: :attr:`inline` (the poll thread) or not (the
    pool), from its measured time per message. ``threshold_s``: ``consume_inline_threshold_us``
    in seconds (0: the pool always). Starts on the pool: a listener is measured first.

    Updated by whichever thread ran the listener; a decision read a little late only changes
    where one more batch runs, never what becomes of a message."""

    __slots__ = ("estimate_s", "inline", "threshold_s")

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.estimate_s = 0.0
        """The moving estimate of the listener's time per message, seconds (0: none yet)."""
        self.inline = False
        """The listener runs on the poll thread (else on the pool)."""

    def note(self, per_message_s: float) -> bool:
        """A batch took ``per_message_s`` seconds a message in the listener: update the
        estimate and the path; return :attr:`inline`."""
        if per_message_s < 0 or not math.isfinite(per_message_s):
            return self.inline  # a clock that went back: nothing learnt
        # A batch quicker than the clock's tick measures 0, which is "none yet" for the rule.
        measured = max(per_message_s, _SHORTEST_S)
        self.estimate_s = estimate = next_estimate(self.estimate_s, measured)
        self.inline = inline = inline_wanted(estimate, self.threshold_s, inline_now=self.inline)
        return inline

    def held_too_long(self, held_s: float) -> None:
        """A listener call held the poll thread ``held_s`` seconds and was left there (its
        poll loop moved on): the estimate becomes at least that, and the listener goes to the
        pool; it comes back only once its calls measure fast again."""
        self.estimate_s = max(self.estimate_s, held_s)
        self.inline = False
