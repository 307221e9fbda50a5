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
* ``poison``: a burst of poison records (see :mod:`chaos.workload`);
* ``db_outage``: the application's database goes away for a while: every
  ``execute_local_transaction`` and ``check_local_transaction`` answers UNKNOWN, and a storm of
  a thousand or more transactions (intent ``unknown_then_commit``) is sent meanwhile; once it
  is back, checks answer per intent. Shorter than ``transaction_check_max`` check intervals:
  none of them may be parked, each committed must be read once.

The parts: :mod:`chaos.nemesis_plan` (the schedule) and :mod:`chaos.disk_filler` (the tmpfs of
``disk_full``); this module holds what the nemeses act on and the thread that injects them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from chaos.disk_filler import DiskFiller
from chaos.history import NEMESES, HistoryWriter
from chaos.nemesis_plan import BROKER, NETWORK, TELLING, WARM_UP_S, Fault, plan

__all__ = [
    "BROKER",
    "NETWORK",
    "TELLING",
    "WARM_UP_S",
    "ClusterControl",
    "CoordinatorControl",
    "DiskFiller",
    "Fault",
    "Nemesis",
    "PoisonSource",
    "ProxyControl",
    "Targets",
    "available_kinds",
    "plan",
]

logger = logging.getLogger(__name__)


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


class DatabaseControl(Protocol):
    """The application's database behind the transaction listener
    (:class:`chaos.workload.Workload`)."""

    def database_down(self, down: bool) -> None: ...

    def send_storm(self, count: int) -> list[str]: ...


class PoisonSource(Protocol):
    """Sends poison records (:meth:`chaos.workload.Workload.send_poison`)."""

    def send_poison(self, count: int) -> list[str]: ...


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
    database: DatabaseControl | None = None
    health_timeout_s: float = 90.0


def available_kinds(targets: Targets) -> list[str]:
    """The nemeses this run can inject."""
    out = ["coordinator_kill", "coordinator_pause", "poison"]
    if targets.database is not None:
        out.append("db_outage")
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

    # --- the application's database -------------------------------------------------------
    def _db_outage(self, fault: Fault) -> None:
        database = self.targets.database
        if database is None:
            raise RuntimeError("db_outage needs a database to take down")
        count = int(fault.params["storm"])
        started = time.monotonic()
        self._event(
            fault,
            "start",
            "database",
            f"every local transaction and check answers UNKNOWN for {fault.length_s:.1f} s; "
            f"{count} transactions sent meanwhile",
        )
        database.database_down(True)
        try:
            ids = database.send_storm(count)
            self._wait(fault.length_s - (time.monotonic() - started))
        finally:
            database.database_down(False)
        self._event(fault, "end", "database", f"back; {len(ids)} sent during the outage")
