"""Delayed delivery's rules, as the delay services and the producer's routing use them: the
delay policy (:mod:`bridge.delay_policy`, which the connection settings build), and the error
a malformed delay raises. Pure logic, defined once in :mod:`bridge.delay_policy`."""

from __future__ import annotations

from bridge.delay_policy import (
    DEFAULT_MESSAGE_DELAY_LEVEL,
    LANDING_MARGIN_MS,
    TIMER_PRECISIONS_MS,
    DelayPolicy,
    parse_delay_levels,
)
from bridge.errors import InvalidDelayError

__all__ = [
    "DEFAULT_MESSAGE_DELAY_LEVEL",
    "LANDING_MARGIN_MS",
    "TIMER_PRECISIONS_MS",
    "DelayPolicy",
    "InvalidDelayError",
    "parse_delay_levels",
]
