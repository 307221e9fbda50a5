"""Shared benchmark plumbing: a broker to measure against, timing, and the result table."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@contextmanager
def broker() -> Iterator[str]:
    """``KAFKA_BOOTSTRAP_SERVERS`` if set, else a fresh local broker for this run."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="bridge-bench-") as tmp:
        kafka = LocalKafka(LocalKafkaConfig(data_dir=Path(tmp) / "kafka", heap_mb=1024))
        kafka.start()
        try:
            yield kafka.bootstrap_servers
        finally:
            kafka.stop()


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU time process ``pid`` has used so far, s (all its threads; read from
    Linux's ``/proc``); None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


def listening_pid(bootstrap: str) -> int | None:
    """The local process listening on the first bootstrap address's port (the broker, when it
    runs on this machine: a loopback address), from Linux's ``/proc``; None where it cannot be
    found."""
    try:
        host, port_text = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)
        if host not in _LOCAL_HOSTS and not host.startswith("127."):
            return None
        port = int(port_text)
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{cols[9]}]")
        if not inodes:  # nothing listens there: no process to look for
            return None
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fds = list((proc / "fd").iterdir())
            except OSError:
                continue
            for fd in fds:
                try:
                    target = os.readlink(fd)
                except OSError:  # closed meanwhile: the broker opens and closes files
                    continue
                if target in inodes:
                    return int(proc.name)
    except (OSError, IndexError, ValueError):
        return None
    return None


@dataclass(frozen=True, slots=True)
class Row:
    """One measured figure beside its baseline; ``higher_is_better`` orients the ratio."""

    name: str
    unit: str
    ours: float
    baseline: float
    baseline_name: str
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        """ours / baseline."""
        return self.ours / self.baseline if self.baseline else float("nan")


def interleaved_rates(
    runs: int, measures: dict[str, Callable[[], tuple[int, float]]]
) -> dict[str, float]:
    """Median rate (count per second) of each measurement, over ``runs`` rounds that run
    every measurement once in turn, so that drift on a shared machine hits all alike."""
    rates: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(runs):
        for name, measure in measures.items():
            count, seconds = measure()
            rates[name].append(count / seconds)
    return {name: statistics.median(values) for name, values in rates.items()}


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    """Run ``fn`` (returning a count) and time it, seconds."""
    started = time.perf_counter()
    count = fn()
    return count, time.perf_counter() - started


def print_rows(title: str, rows: list[Row]) -> None:
    """Print a plain table: figure, ours, baseline, ratio."""
    print(f"\n== {title}")
    header = f"{'figure':<34} {'ours':>12} {'baseline':>12} {'ratio':>7}  baseline is"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.name:<34} {r.ours:>12,.0f} {r.baseline:>12,.0f} {r.ratio:>7.2f}  "
            f"{r.baseline_name} ({r.unit})"
        )
