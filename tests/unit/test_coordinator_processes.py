"""``bridge coordinator --processes N``: the settings of the children, and how the command
starts, watches and stops them (with stand-in children: Python processes that wait for a
signal; the integration test ``tests/integration/test_coordinator_processes.py`` runs real
coordinators)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from bridge.coordinator.processes import (
    ENV_PROCESSES,
    ChildSpec,
    CoordinatorProcesses,
    child_specs,
    parse_processes,
)
from bridge.errors import InvalidArgumentError
from bridge.lifecycle import FatalServiceError
from tests.conftest import wait_until

WAITS_FOR_SIGTERM = textwrap.dedent(
    """
    import signal, sys, threading
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait(120)
    sys.exit(0 if stop.is_set() else 9)
    """
)


def _child(name: str, script: str = WAITS_FOR_SIGTERM) -> ChildSpec:
    return ChildSpec(name, [sys.executable, "-c", script], dict(os.environ))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not reaped yet) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


@pytest.mark.parametrize(
    ("raw", "count"), [(None, 1), ("", 1), (" ", 1), ("1", 1), ("4", 4), (2, 2)]
)
def test_process_count_defaults_to_one(raw: str | int | None, count: int) -> None:
    assert parse_processes(raw) == count


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "65"])
def test_a_bad_process_count_is_refused_by_name(raw: str) -> None:
    with pytest.raises(InvalidArgumentError, match=ENV_PROCESSES):
        parse_processes(raw)


def test_children_get_distinct_ids_derived_from_the_given_one() -> None:
    specs = child_specs(
        3,
        "coord-a",
        {"BRIDGE_COORDINATOR_ID": "coord-a", ENV_PROCESSES: "3", "KEEP": "x"},
        root_args=["-v"],
        overrides={"BRIDGE_NAMESPACE": "ns"},
        metrics_port=9464,
    )
    assert [s.coordinator_id for s in specs] == ["coord-a-1", "coord-a-2", "coord-a-3"]
    assert [s.env["BRIDGE_COORDINATOR_ID"] for s in specs] == [
        "coord-a-1",
        "coord-a-2",
        "coord-a-3",
    ]
    assert {s.env[ENV_PROCESSES] for s in specs} == {"1"}  # a child never starts children
    assert [s.env["BRIDGE_METRICS_PORT"] for s in specs] == ["9464", "9465", "9466"]
    assert all(s.env["KEEP"] == "x" and s.env["BRIDGE_NAMESPACE"] == "ns" for s in specs)
    assert specs[0].argv[1:] == ["-m", "bridge.cli", "-v", "coordinator"]


def test_children_without_metrics_serve_none_and_port_zero_stays_any() -> None:
    none = child_specs(2, "c", {"BRIDGE_METRICS_PORT": "9464"})
    assert all("BRIDGE_METRICS_PORT" not in s.env for s in none)
    anywhere = child_specs(2, "c", {}, metrics_port=0)
    assert [s.env["BRIDGE_METRICS_PORT"] for s in anywhere] == ["0", "0"]


def test_a_stop_stops_every_child_and_ends_cleanly() -> None:
    group = CoordinatorProcesses([_child("c-1"), _child("c-2")], grace_s=10)
    stop = threading.Event()
    group.start()
    try:
        pids = group.pids()
        assert all(_alive(pid) for pid in pids)
        threading.Timer(0.5, stop.set).start()
        group.run_until(stop)  # raises if a child did not stop cleanly
        assert [c.process.returncode for c in group.children] == [0, 0]
        assert not any(_alive(pid) for pid in pids)
    finally:
        group.stop()


def test_a_child_that_ends_by_itself_stops_the_others_and_is_named() -> None:
    failing = _child("c-2", "import sys, time; time.sleep(0.3); sys.exit(3)")
    group = CoordinatorProcesses([_child("c-1"), failing], grace_s=10)
    group.start()
    try:
        with pytest.raises(FatalServiceError, match=r"c-2 \(pid \d+\) ended with status 3") as err:
            group.run_until(threading.Event())
        assert "the other 1 stopped" in str(err.value)
        assert group.children[0].process.returncode == 0  # stopped, by SIGTERM
    finally:
        group.stop()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stubborn = _child(
        "c-1",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w').close(); time.sleep(60)",
    )
    group = CoordinatorProcesses([stubborn], grace_s=0.5)
    group.start()
    wait_until(ready.exists, timeout_s=30)  # its handler is in place
    stop = threading.Event()
    stop.set()
    with pytest.raises(FatalServiceError, match="stopped with status -9"):
        group.run_until(stop)


def test_children_die_with_a_killed_command(tmp_path: Path) -> None:
    """SIGKILL of the command (nothing of it runs to stop the children): they get SIGTERM."""
    pids_file = tmp_path / "pids"
    parent = textwrap.dedent(
        f"""
        import os, sys, threading
        from bridge.coordinator.processes import ChildSpec, CoordinatorProcesses
        script = {WAITS_FOR_SIGTERM!r}
        specs = [ChildSpec(f"c-{{i}}", [sys.executable, "-c", script], dict(os.environ))
                 for i in (1, 2)]
        group = CoordinatorProcesses(specs)
        group.start()
        open({str(pids_file)!r}, "w").write(" ".join(map(str, group.pids())))
        threading.Event().wait(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=Path(__file__).parents[2])
    try:
        wait_until(lambda: pids_file.exists() and pids_file.read_text(), timeout_s=30)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(_alive(pid) for pid in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not any(_alive(pid) for pid in pids), timeout_s=15)
    finally:
        proc.kill()
        proc.wait()


def test_a_metrics_port_range_past_65535_is_refused_before_any_child_starts() -> None:
    with pytest.raises(InvalidArgumentError, match="65535"):
        child_specs(3, "c", {}, metrics_port=65534)
    assert [s.env["BRIDGE_METRICS_PORT"] for s in child_specs(2, "c", {}, metrics_port=65534)] == [
        "65534",
        "65535",
    ]
