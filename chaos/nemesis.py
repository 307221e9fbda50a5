"""Nemeses: faults on a schedule drawn from the run's seed, each written to the history as a
``nemesis`` start and end event.

:func:`plan` draws the schedule from ``random.Random(seed)`` alone: the same seed gives the
same faults, in the same order, with the same targets and lengths (when each starts depends on
how long the previous one's recovery took). A short run (``make chaos``) gets one of each of
the most telling kinds; a soak cycles through every available kind, in a fresh order each
round, until its time is up. Faults are separated by quiet periods.

Kinds (names as in :data:`chaos.history.NEMESES`) and what each hits:

* ``coordinator_kill``: ``kill -9`` of one of the two coordinator processes, restarted after a
  few seconds, sometimes under a new ``BRIDGE_COORDINATOR_ID`` (its old static members then
  hold their partitions until the session timeout);
* ``coordinator_pause``: SIGSTOP of a coordinator for longer than its session timeout, then
  SIGCONT: a zombie whose late writes must be fenced;
* ``leader_kill``: ``kill -9`` of the broker leading a workload or system topic partition,
  restarted after a while (the run waits for the cluster's health before the fault ends);
* ``rolling_restart``: a clean stop and start of each broker in turn, health in between;
* ``net_latency``, ``net_drop``, ``net_partition``: through the fault proxy between the clients
  (coordinators, producers, push consumers) and the brokers: added latency, every
  connection cut once, every connection refused and cut until it heals;
* ``disk_full``: one broker's log directory (a small tmpfs mounted for the run) filled up, then
  freed; the broker usually stops on the I/O error and is started again;
* ``poison``: a burst of poison records (see :mod:`chaos.workload`).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from chaos.history import NEMESES, HistoryWriter

logger = logging.getLogger(__name__)

TELLING: Final = (
    "coordinator_kill",
    "coordinator_pause",
    "leader_kill",
    "net_partition",
    "net_latency",
    "net_drop",
    "poison",
)
"""The kinds a short run (``make chaos``) gets one of each, when available."""

NETWORK: Final = frozenset({"net_latency", "net_drop", "net_partition"})
BROKER: Final = frozenset({"leader_kill", "rolling_restart", "disk_full"})

WARM_UP_S: Final = 8.0
"""Load before the first fault, s."""


class ClusterControl(Protocol):
    """What the nemeses do to the brokers (:class:`bridge.runtime.cluster.LocalKafkaCluster`)."""

    @property
    def node_ids(self) -> Sequence[int]: ...

    def kill(self, node_id: int) -> None: ...

    def stop_node(self, node_id: int) -> None: ...

    def start_node(self, node_id: int) -> None: ...

    def leader_of(self, topic: str, partition: int) -> int | None: ...

    def wait_healthy(self, timeout_s: float) -> None: ...


class ProxyControl(Protocol):
    """What the network nemeses do (:class:`chaos.proxy.FaultProxy`)."""

    def set_latency(self, ms: float) -> None: ...

    def drop_connections(self) -> int: ...

    def partition(self) -> None: ...

    def heal(self) -> None: ...


class CoordinatorControl(Protocol):
    """The run's coordinator processes, by name (``coordinator-1``, ``coordinator-2``)."""

    @property
    def names(self) -> Sequence[str]: ...

    @property
    def session_timeout_s(self) -> float: ...

    def kill(self, name: str) -> str: ...

    def start(self, name: str, new_id: bool = False) -> str: ...

    def pause(self, name: str) -> str: ...

    def resume(self, name: str) -> str: ...


class PoisonSource(Protocol):
    """Sends poison records (:meth:`chaos.workload.Workload.send_poison`)."""

    def send_poison(self, count: int) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: ``quiet_s`` of quiet before it, then ``name`` for ``length_s`` (what
    that means depends on the kind: down time, pause, partition, latency), with ``params``."""

    name: str
    quiet_s: float
    length_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the plan printed at the start of a run."""
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"+{self.quiet_s:4.1f}s quiet, {self.name} {self.length_s:.1f}s {extra}".rstrip()


_ESTIMATE_S: Final = {
    "coordinator_kill": 4.0,
    "coordinator_pause": 2.0,
    "leader_kill": 20.0,
    "rolling_restart": 75.0,
    "net_latency": 0.0,
    "net_drop": 1.0,
    "net_partition": 0.0,
    "disk_full": 25.0,
    "poison": 2.0,
}
"""Time a fault takes besides its length (restarts, health waits), s: only to plan a short
run's schedule so that it fits."""


def _draw(name: str, rng: random.Random, session_timeout_s: float, nodes: int) -> Fault:
    quiet = rng.uniform(5.0, 9.0)
    params: dict[str, Any] = {}
    if name == "coordinator_kill":
        length = rng.uniform(1.0, 4.0)
        params = {"coordinator": rng.randint(1, 2), "new_id": rng.random() < 0.5}
    elif name == "coordinator_pause":
        length = session_timeout_s + rng.uniform(3.0, 6.0)
        params = {"coordinator": rng.randint(1, 2)}
    elif name == "leader_kill":
        length = rng.uniform(4.0, 10.0)
        params = {"partition_of": rng.choice(("workload", "half", "schedule", "timer")),
                  "partition": rng.randint(0, 2)}  # fmt: skip
    elif name == "rolling_restart":
        length = 0.0
        order = list(range(1, nodes + 1))
        rng.shuffle(order)
        params = {"order": order}
    elif name == "net_latency":
        length = rng.uniform(6.0, 10.0)
        params = {"latency_ms": rng.choice((100, 200, 400))}
    elif name == "net_drop":
        length = 0.0
    elif name in ("net_partition", "disk_full"):
        length = rng.uniform(5.0, 10.0)
    elif name == "poison":
        length = 0.0
        params = {"count": rng.randint(4, 8)}
    else:
        raise ValueError(f"unknown nemesis {name!r}; known: {', '.join(NEMESES)}")
    return Fault(name, quiet, length, params)


def plan(
    seed: int,
    duration_s: float,
    *,
    soak: bool,
    available: Sequence[str],
    session_timeout_s: float = 10.0,
    nodes: int = 3,
) -> list[Fault]:
    """The faults of a run of ``duration_s`` seconds of load, drawn from ``seed`` alone.

    Short run: one of each :data:`TELLING` kind that is ``available``, in a seeded order, as
    many as fit. Soak: rounds of every ``available`` kind, each round in a fresh order, until
    the estimated time passes ``duration_s``.
    """
    unknown = sorted(set(available) - set(NEMESES))
    if unknown:
        raise ValueError(f"unknown nemeses {unknown}; known: {', '.join(NEMESES)}")
    rng = random.Random(seed)
    faults: list[Fault] = []
    budget = duration_s - WARM_UP_S
    used = 0.0
    if not soak:
        kinds = [k for k in TELLING if k in available]
        rng.shuffle(kinds)
        for kind in kinds:
            fault = _draw(kind, rng, session_timeout_s, nodes)
            cost = fault.quiet_s + fault.length_s + _ESTIMATE_S[kind]
            if used + cost > budget:
                continue  # the next kinds may still fit
            faults.append(fault)
            used += cost
        return faults
    kinds = [k for k in NEMESES if k in available]
    while kinds and used < budget:
        round_ = list(kinds)
        rng.shuffle(round_)
        for kind in round_:
            fault = _draw(kind, rng, session_timeout_s, nodes)
            faults.append(fault)
            used += fault.quiet_s + fault.length_s + _ESTIMATE_S[kind]
            if used >= budget:
                break
    return faults


class DiskFiller:
    """A small tmpfs mounted as one broker's log directory for the run, which the
    ``disk_full`` nemesis fills and frees. Needs root (``mount``); :meth:`available` says
    whether it works here. Nothing outside the tmpfs is ever written."""

    FILLER: Final = ".chaos-filler"

    def __init__(self, mount_point: Path, size_mb: int = 512) -> None:
        self.mount_point = Path(mount_point)
        self.size_mb = size_mb
        self.mounted = False

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") if a tmpfs can be mounted here, else (False, why)."""
        if os.geteuid() != 0:
            return False, "mounting a tmpfs needs root"
        if shutil.which("mount") is None or shutil.which("umount") is None:
            return False, "mount/umount not found"
        return True, ""

    def mount(self) -> None:
        """Mount the tmpfs (an empty directory is made first)."""
        self.mount_point.mkdir(parents=True, exist_ok=True)
        if any(self.mount_point.iterdir()):
            raise RuntimeError(f"{self.mount_point} is not empty; not mounting over it")
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs",
             str(self.mount_point)],
            check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        self.mounted = True

    def fill(self, leave_bytes: int = 16 * 1024) -> int:
        """Fill the tmpfs up to ``leave_bytes`` of free space; the bytes written."""
        stat = os.statvfs(self.mount_point)
        free = stat.f_bavail * stat.f_frsize
        size = max(0, free - leave_bytes)
        chunk = b"\0" * (1 << 20)
        written = 0
        try:
            with (self.mount_point / self.FILLER).open("wb") as out:
                while written < size:
                    n = min(len(chunk), size - written)
                    out.write(chunk[:n])
                    written += n
        except OSError:  # full before the estimate: that is the point
            pass
        return written

    def free(self) -> None:
        """Remove the filler."""
        (self.mount_point / self.FILLER).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily if busy); idempotent."""
        if not self.mounted:
            return
        self.free()
        point = str(self.mount_point)
        done = subprocess.run(["umount", point], check=False, capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)
        self.mounted = False


@dataclass(slots=True)
class Targets:
    """What the nemeses act on; None where the run has no such thing."""

    cluster: ClusterControl | None
    proxy: ProxyControl | None
    coordinators: CoordinatorControl
    poison: PoisonSource
    leader_topics: dict[str, str]
    """``partition_of`` name -> Kafka topic (workload, half, schedule, timer)."""
    disk: DiskFiller | None = None
    disk_node: int | None = None
    health_timeout_s: float = 90.0


def available_kinds(targets: Targets) -> list[str]:
    """The nemeses this run can inject."""
    out = ["coordinator_kill", "coordinator_pause", "poison"]
    if targets.cluster is not None and len(targets.cluster.node_ids) > 1:
        # One node: killing "the leader" would be an outage of the whole cluster.
        out += ["leader_kill", "rolling_restart"]
        if targets.disk is not None and targets.disk.mounted:
            out += ["disk_full"]
    if targets.proxy is not None:
        out += ["net_latency", "net_drop", "net_partition"]
    return [k for k in NEMESES if k in out]


class Nemesis(threading.Thread):
    """Runs ``faults`` in order against ``targets`` until the list ends or :meth:`stop`; a
    fault under way when stopped is cut short and undone before the thread ends."""

    def __init__(self, faults: list[Fault], targets: Targets, history: HistoryWriter) -> None:
        super().__init__(name="chaos-nemesis", daemon=True)
        self.faults = faults
        self.targets = targets
        self.history = history
        self._stop_event = threading.Event()
        self.done: list[str] = []
        self.errors: list[str] = []

    def stop(self) -> None:
        """Stop after undoing the fault under way."""
        self._stop_event.set()

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless stopped; True if stopped."""
        return self._stop_event.wait(max(0.0, seconds))

    def _event(self, fault: Fault, phase: str, target: str, detail: str) -> None:
        self.history.write("nemesis", name=fault.name, phase=phase, target=target, detail=detail)
        logger.info("nemesis %s %s %s: %s", fault.name, phase, target, detail)

    def run(self) -> None:
        if self._wait(WARM_UP_S):
            return
        for fault in self.faults:
            if self._wait(fault.quiet_s):
                return
            run: Callable[[Fault], None] = getattr(self, f"_{fault.name}")
            try:
                run(fault)
                self.done.append(fault.name)
            except Exception as exc:  # recorded; the schedule goes on
                logger.exception("nemesis %s failed", fault.name)
                self.errors.append(f"{fault.name}: {type(exc).__name__}: {exc}")
            if self._stop_event.is_set():
                return

    # --- coordinators -------------------------------------------------------------------
    def _coordinator_kill(self, fault: Fault) -> None:
        coords = self.targets.coordinators
        name = coords.names[(fault.params["coordinator"] - 1) % len(coords.names)]
        self._event(fault, "start", name, f"kill -9; down {fault.length_s:.1f} s")
        detail = coords.kill(name)
        logger.info("nemesis coordinator_kill: %s", detail)
        self._wait(fault.length_s)
        detail = coords.start(name, new_id=bool(fault.params.get("new_id")))
        self._event(fault, "end", name, f"restarted: {detail}")

    def _coordinator_pause(self, fault: Fault) -> None:
        coords = self.targets.coordinators
        name = coords.names[(fault.params["coordinator"] - 1) % len(coords.names)]
        self._event(
            fault, "start", name,
            f"SIGSTOP for {fault.length_s:.1f} s "
            f"(session timeout {coords.session_timeout_s:.0f} s)",
        )  # fmt: skip
        detail = coords.pause(name)
        logger.info("nemesis coordinator_pause: %s", detail)
        self._wait(fault.length_s)
        detail = coords.resume(name)
        self._event(fault, "end", name, f"SIGCONT ({detail})")

    # --- brokers ------------------------------------------------------------------------
    def _cluster(self) -> ClusterControl:
        if self.targets.cluster is None:
            raise RuntimeError("no cluster to act on")
        return self.targets.cluster

    def _healthy(self, cluster: ClusterControl) -> str:
        started = time.monotonic()
        try:
            cluster.wait_healthy(self.targets.health_timeout_s)
        except Exception as exc:
            return f"NOT healthy after {time.monotonic() - started:.0f} s: {exc}"
        return f"healthy after {time.monotonic() - started:.1f} s"

    def _leader_kill(self, fault: Fault) -> None:
        cluster = self._cluster()
        topic = self.targets.leader_topics[fault.params["partition_of"]]
        partition = int(fault.params["partition"])
        leader = None
        try:
            leader = cluster.leader_of(topic, partition)
        except Exception as exc:
            logger.warning("leader of %s[%d] unknown: %s", topic, partition, exc)
        node = leader if leader is not None else cluster.node_ids[partition % len(cluster.node_ids)]
        what = f"leader of {topic}[{partition}]" if leader is not None else "no leader known"
        detail = f"kill -9 ({what}); down {fault.length_s:.1f} s"
        self._event(fault, "start", f"node-{node}", detail)
        cluster.kill(node)
        self._wait(fault.length_s)
        cluster.start_node(node)
        self._event(fault, "end", f"node-{node}", f"restarted, {self._healthy(cluster)}")

    def _rolling_restart(self, fault: Fault) -> None:
        cluster = self._cluster()
        nodes = list(cluster.node_ids)
        order = [n for n in fault.params["order"] if n in nodes] or nodes
        target = ",".join(f"node-{n}" for n in order)
        self._event(fault, "start", target, "clean stop and start of each broker in turn")
        steps = []
        for node in order:
            started = time.monotonic()
            cluster.stop_node(node)
            cluster.start_node(node)
            health = self._healthy(cluster)
            steps.append(f"node-{node} {time.monotonic() - started:.0f} s, {health}")
            if self._stop_event.is_set():
                break
        self._event(fault, "end", target, "; ".join(steps))

    def _disk_full(self, fault: Fault) -> None:
        cluster = self._cluster()
        disk, node = self.targets.disk, self.targets.disk_node
        if disk is None or node is None:
            raise RuntimeError("no disk to fill")
        self._event(fault, "start", f"node-{node}", f"log dir filled for {fault.length_s:.1f} s")
        written = disk.fill()
        logger.info("nemesis disk_full: %d MiB written", written >> 20)
        self._wait(fault.length_s)
        disk.free()
        # The broker usually stopped on the I/O error; start it (a no-op if it runs).
        cluster.start_node(node)
        self._event(fault, "end", f"node-{node}", f"freed and started, {self._healthy(cluster)}")

    # --- network ------------------------------------------------------------------------
    def _proxy(self) -> ProxyControl:
        if self.targets.proxy is None:
            raise RuntimeError("no fault proxy")
        return self.targets.proxy

    def _net_latency(self, fault: Fault) -> None:
        proxy = self._proxy()
        ms = int(fault.params["latency_ms"])
        self._event(fault, "start", "proxy", f"{ms} ms each way for {fault.length_s:.1f} s")
        proxy.set_latency(ms)
        self._wait(fault.length_s)
        proxy.set_latency(0)
        self._event(fault, "end", "proxy", "latency 0")

    def _net_drop(self, fault: Fault) -> None:
        proxy = self._proxy()
        self._event(fault, "start", "proxy", "every client connection cut")
        cut = proxy.drop_connections()
        logger.info("nemesis net_drop: %d connections reset", cut)
        self._wait(1.0)
        self._event(fault, "end", "proxy", "clients reconnect")

    def _net_partition(self, fault: Fault) -> None:
        proxy = self._proxy()
        self._event(fault, "start", "proxy", f"clients cut off for {fault.length_s:.1f} s")
        proxy.partition()
        self._wait(fault.length_s)
        proxy.heal()
        self._event(fault, "end", "proxy", "healed")

    # --- poison -------------------------------------------------------------------------
    def _poison(self, fault: Fault) -> None:
        count = int(fault.params["count"])
        self._event(fault, "start", "workload", f"{count} poison records")
        ids = self.targets.poison.send_poison(count)
        self._event(fault, "end", "workload", "sent " + ", ".join(ids))
