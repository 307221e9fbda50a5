"""The suite's own timing report: how busy the cores were, read from ``/proc/stat``."""

from __future__ import annotations

import pytest

from tests.suite_timing import cpu_ticks

STAT = """cpu  100 5 50 800 40 3 2 0 7 0
cpu0 50 2 25 400 20 1 1 0 3 0
cpu1 50 3 25 400 20 2 1 0 4 0
intr 12345
"""


def test_busy_is_every_column_but_idle_and_iowait_and_guest_is_not_counted_twice() -> None:
    busy, everything = cpu_ticks(STAT)
    assert busy == 100 + 5 + 50 + 3 + 2 + 0
    assert everything == busy + 800 + 40


def test_a_stat_without_the_aggregate_line_is_refused() -> None:
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        cpu_ticks("cpu0 1 2 3 4 5 6 7 8\n")
