"""Where a run's time went: test time (set-up, call and tear-down) summed by kind and by file,
printed at the end of every run that took more than a minute of it, so that CI's log says
which files to look at when the suite grows.

With pytest-xdist the sums are over every worker (three workers busy for ten minutes sum to
thirty), so they say where the machine's time goes, not the run's length.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

KINDS = ("unit", "spark", "serial")
"""Markers that name a kind of test, the first one a test has wins; the rest are ``broker``."""

FILES_SHOWN = 15
SHOWN_FROM_S = 60.0
"""Runs whose tests took less (s) print nothing."""

_by_file: defaultdict[str, float] = defaultdict(float)
_by_kind: defaultdict[str, float] = defaultdict(float)
_tests: Counter[str] = Counter()


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
