"""The suite's workloads, run ahead of the tests that read them, a few at a time.

Each workload runs on both sides at once and then mostly waits on both (delay levels, check
intervals, invisible durations, quiet periods): one after another they took 176 s of the suite's
197 s, with the machine's 2 cores 27% busy. So the session starts every workload its selected
tests need as soon as RocketMQ and the bridge are up, longest first, :data:`LANES` at a time,
and a test waits only for the workload it reads.

A workload is declared with :func:`scenario`: the decorated function (one argument, the
:class:`Sides`) is registered under its name, and the name becomes a module-scoped fixture
whose value is the workload's result (raising its exception, if it raised). Each workload uses
names of its own (:func:`~tests.differential.observe.run_both`), so two never read each other's
messages; what they share is the two brokers and the bridge's coordinator.

A workload stops on its own bounds (each side's deadline, a driver JVM's ``timeout_s``), not
on pytest's: a test that times out waiting for one leaves it running until then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest

from bridge.runtime.rocketmq import LocalRocketMQ
from tests.differential.bridge_side import BridgeEnv

LANES: Final = 2
"""Workloads run at once (a test that runs its own workload, in the main thread, adds one).
Their timings are compared within ``SLACK_MS`` of the machine's scheduling: two at a time kept
the cores 38-51% busy, where one left them 27% busy."""

T = TypeVar("T")


@dataclass(frozen=True)
class Sides:
    """What a workload runs against: the local RocketMQ, the bridge, the driver JVMs' home."""

    rocketmq: LocalRocketMQ
    bridge_env: BridgeEnv
    driver_home: Path


@dataclass(frozen=True)
class _Declared:
    run: Callable[[Sides], Any]
    expected_s: float


DECLARED: dict[str, _Declared] = {}
"""Every workload :func:`scenario` declared, by name."""


def scenario(expected_s: float) -> Callable[[Callable[[Sides], T]], Any]:
    """Declare a workload named after the decorated function, which took about ``expected_s``
    seconds when run alone (the longest start first, so that the last to start are short);
    the name becomes a module-scoped fixture returning what the function returned."""

    def declare(run: Callable[[Sides], T]) -> Any:
        name = run.__name__
        if name in DECLARED:
            raise ValueError(f"two workloads are named {name!r}")
        DECLARED[name] = _Declared(run, expected_s)

        def result(workload_lanes: Lanes) -> Any:
            return workload_lanes.result(name)

        result.__doc__ = run.__doc__
        return pytest.fixture(scope="module", name=name)(result)

    return declare


class Lanes:
    """The declared workloads in ``names``, started at once on ``lanes`` threads."""

    def __init__(self, sides: Sides, names: Iterable[str], lanes: int = LANES) -> None:
        self._pool = ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="workload")
        ordered = sorted(set(names), key=lambda name: (-DECLARED[name].expected_s, name))
        self._futures: dict[str, Future[Any]] = {
            name: self._pool.submit(DECLARED[name].run, sides) for name in ordered
        }

    def result(self, name: str) -> Any:
        """The workload's result once it has run; raises what it raised."""
        return self._futures[name].result()

    def close(self) -> None:
        """Drop the workloads not started yet. Those running (none, unless a test failed or the
        session was interrupted) are not waited for: the brokers stop after this, which ends
        them sooner than their own bounds would."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def needed(items: Iterable[pytest.Item]) -> set[str]:
    """The declared workloads that the collected ``items`` read."""
    return {
        name for item in items for name in getattr(item, "fixturenames", ()) if name in DECLARED
    }
