"""Where a run's time went: test time (set-up, call and tear-down) summed by kind and by file,
printed at the end of every run that took more than a minute of it, so that CI's log says
which files to look at when the suite grows.

With pytest-xdist the sums are over every worker (three workers busy for ten minutes sum to
thirty), so they say where the machine's time goes, not the run's length. The last line says how
busy the machine's cores were over the run (every process's user and system time, the broker's
JVM and other people's work included, from ``/proc/stat``): a run that keeps them busy gains
nothing from more workers, one that leaves them idle is waiting on timers.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

KINDS = ("unit", "spark", "serial")
"""Markers that name a kind of test, the first one a test has wins; the rest are ``broker``."""

FILES_SHOWN = 15
SHOWN_FROM_S = 60.0
"""Runs whose tests took less (s) print nothing."""

_by_file: defaultdict[str, float] = defaultdict(float)
_by_kind: defaultdict[str, float] = defaultdict(float)
_tests: Counter[str] = Counter()
_started: list[tuple[float, tuple[int, int] | None]] = []
"""The session's start: monotonic time (s) and the cores' ticks then."""

PROC_STAT = Path("/proc/stat")


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, all) clock ticks of every core since boot, from the text of ``/proc/stat``.

    Busy is every column of the ``cpu`` line but idle and iowait (guest time is already in
    user and nice, so it is left out to count it once).
    """
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(f) for f in fields[1:9]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + ticks[4]
            return sum(ticks) - idle, sum(ticks)
    raise ValueError("no aggregate cpu line in /proc/stat")


def _read_ticks() -> tuple[int, int] | None:
    try:
        return cpu_ticks(PROC_STAT.read_text())
    except (OSError, ValueError):  # not Linux: the line is left out
        return None


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append((time.monotonic(), _read_ticks()))


def kind_of(keywords: object) -> str:
    """The kind of a test with these keywords (its markers among them)."""
    return next((k for k in KINDS if k in keywords), "broker")  # type: ignore[operator]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    kind = kind_of(report.keywords)
    _by_file[path] += report.duration
    _by_kind[kind] += report.duration
    if report.when == "call":
        _tests[kind] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    total = sum(_by_kind.values())
    if total < SHOWN_FROM_S:
        return
    write = terminalreporter.write_line
    terminalreporter.section("test time by kind and by file (summed over workers)")
    for kind, seconds in sorted(_by_kind.items(), key=lambda kv: -kv[1]):
        write(f"{seconds:8.0f} s {seconds / total:4.0%} {_tests[kind]:5d} tests  {kind}")
    write(f"{total:8.0f} s in all")
    for path, seconds in sorted(_by_file.items(), key=lambda kv: -kv[1])[:FILES_SHOWN]:
        write(f"{seconds:8.0f} s {seconds / total:4.0%}  {path}")
    started, before = _started[0]
    after = _read_ticks()
    if before is not None and after is not None and after[1] > before[1]:
        busy = (after[0] - before[0]) / (after[1] - before[1])
        cores = os.cpu_count() or 1
        wall = time.monotonic() - started
        write(f"machine CPU busy {busy:.0%} of {cores} cores over {wall:.0f} s (every process)")
