"""One fault-injection run, start to verdict: cluster, fault proxy, two coordinators, the
workload and the nemeses; then the drain, the teardown and the checker.

``python -m chaos run --seed N --duration S [--soak] [--out DIR]`` (see :mod:`chaos.__main__`).
Everything started here is stopped here, on success, on an error and on Ctrl-C or SIGTERM:
every broker JVM, coordinator and Spark child. The output directory (default
``.chaos/<utc-stamp>/``) keeps ``history.jsonl``, ``table.txt``, ``plan.txt``, ``run.log``, the
coordinators' logs and the brokers' logs (their data is removed unless ``keep_data``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

from bridge.config import ClientConfig
from bridge.coordinator.health import coordinator_health
from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from chaos.history import HistoryWriter, now_ms, read_history
from chaos.nemesis import (
    DiskFiller,
    Nemesis,
    Targets,
    available_kinds,
    plan,
)
from chaos.proxy import FaultProxy
from chaos.workload import (
    BROADCAST_INSTANCES,
    CONSUME_GROUP,
    DEFAULT_RATES,
    ORDERLY_GROUP,
    ORDERLY_SUSPEND_MS,
    TX_TOPIC,
    Workload,
    WorkloadConfig,
    run_spark_ingest,
)
from topics.catalog import SystemTopic

logger = logging.getLogger("chaos")

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
COORDINATOR_NAMES: Final = ("coordinator-1", "coordinator-2")

_COORDINATOR_MAIN: Final = (
    "import faulthandler, signal, sys\n"
    "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "from bridge.cli import main\n"
    "sys.argv[0] = 'bridge'\n"
    "main()\n"
)
"""``bridge coordinator`` as the CLI runs it, plus a dump of every thread's stack on stderr
(the coordinator's log) on SIGUSR1: the runner asks for one when the load ends and before
it stops the coordinators, so a service stuck in a call shows where."""


@dataclass(frozen=True, slots=True)
class RunConfig:
    """How one run goes. Times in seconds unless named otherwise."""

    seed: int
    duration_s: float
    soak: bool = False
    out_dir: Path | None = None
    """None: ``.chaos/<utc-stamp>/`` in the checkout."""
    nodes: int = 3
    heap_mb: int = 384
    """Of each broker JVM, MiB."""
    drain_timeout_s: float = 60.0
    settle_s: float = 3.0
    """Readers keep reading this long after the drain (a late duplicate still shows)."""
    spark: bool = True
    """Run the Spark ingest of the tx topic at the end (about 45 s)."""
    disk_full: bool | None = None
    """Mount a tmpfs log dir for one broker and fill it; None: on a soak, where root can."""
    nemeses: tuple[str, ...] | None = None
    """Only these kinds (None: every kind the run can inject)."""
    keep_data: bool = False
    namespace: str = "rmq"
    message_delay_level: str = "1s 2s 3s"
    timer_precision_ms: int = 500
    transaction_timeout_ms: int = 3000
    check_interval_ms: int = 3000
    session_timeout_ms: int = 10_000
    kafka_transaction_timeout_ms: int = 10_000
    max_reconsume_times: int = 2
    rate_scale: float = 1.0
    """Multiplies every operation rate of the workload."""


# --- the cluster --------------------------------------------------------------------------
BROKER_PROPERTIES: Final = {
    # Poison: a delayed message to a topic that does not exist must stay undeliverable.
    "auto.create.topics.enable": "false",
}


def make_cluster(config: RunConfig, data_dir: Path) -> LocalKafkaCluster:
    """The run's brokers, each with a PROXIED listener for the fault proxy."""
    return LocalKafkaCluster(
        LocalClusterConfig(
            data_dir=data_dir,
            nodes=config.nodes,
            heap_mb=config.heap_mb,
            replication_factor=min(3, config.nodes),
            min_insync_replicas=min(2, config.nodes),
            proxied=True,
            properties=BROKER_PROPERTIES,
        )
    )


# --- coordinators -------------------------------------------------------------------------
class CoordinatorProcess:
    """One ``bridge coordinator`` child process (its own session: a terminal's Ctrl-C reaches
    the runner only, which stops it in order)."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_path
        self.coordinator_id = env["BRIDGE_COORDINATOR_ID"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, coordinator_id: str | None = None) -> None:
        if coordinator_id:
            self.coordinator_id = coordinator_id
        env = {**self.env, "BRIDGE_COORDINATOR_ID": self.coordinator_id}
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.coordinator_id} at {datetime.now(UTC)} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _COORDINATOR_MAIN, "-v", "coordinator"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                start_new_session=True,
            )  # fmt: skip
        self.paused = False

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.paused = False

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGCONT (if paused), SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %.0f s; killing it", self.name, timeout_s)
            self.kill()
        self.paused = False


class Coordinators:
    """The two coordinators, restarted by a watchdog if one exits on its own (counted and
    reported: a coordinator should not die of the faults)."""

    def __init__(self, config: RunConfig, bootstrap: str, out_dir: Path) -> None:
        self.config = config
        base = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "BRIDGE_NAMESPACE": config.namespace,
            "BRIDGE_MESSAGE_DELAY_LEVEL": config.message_delay_level,
            "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
            "BRIDGE_TRANSACTION_TIMEOUT_MS": str(config.transaction_timeout_ms),
            "BRIDGE_CHECK_INTERVAL_MS": str(config.check_interval_ms),
            "BRIDGE_SESSION_TIMEOUT_MS": str(config.session_timeout_ms),
            "BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS": str(config.kafka_transaction_timeout_ms),
            "BRIDGE_TRANSACTION_PARTITIONS": "4",
            "BRIDGE_STATUS_INTERVAL_MS": "15000",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs = {
            name: CoordinatorProcess(
                name, {**base, "BRIDGE_COORDINATOR_ID": f"chaos-{name}"}, out_dir / f"{name}.log"
            )
            for name in COORDINATOR_NAMES
        }
        self._lock = threading.Lock()
        self._down: set[str] = set()
        """Names a nemesis keeps down on purpose."""
        self.unexpected_exits: list[str] = []
        self._stop = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="chaos-coordinators", daemon=True
        )

    @property
    def names(self) -> Sequence[str]:
        return list(self.procs)

    @property
    def session_timeout_s(self) -> float:
        return self.config.session_timeout_ms / 1000

    def start_all(self) -> None:
        for proc in self.procs.values():
            proc.start()
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for name, proc in self.procs.items():
                    if name in self._down or proc.alive() or proc.proc is None:
                        continue
                    code = proc.proc.returncode
                    note = f"{name} ({proc.coordinator_id}) exited by itself with code {code}"
                    logger.warning("%s; restarting it", note)
                    self.unexpected_exits.append(f"{datetime.now(UTC):%H:%M:%S} {note}")
                    proc.restarts += 1
                    proc.start()

    def kill(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            self._down.add(name)
            pid = proc.pid
            proc.kill()
        return f"pid {pid}, id {proc.coordinator_id}"

    def start(self, name: str, new_id: bool = False) -> str:
        with self._lock:
            proc = self.procs[name]
            if new_id:
                proc.restarts += 1
                base = proc.env["BRIDGE_COORDINATOR_ID"]
                proc.start(f"{base}-r{proc.restarts}")
            else:
                proc.start()
            self._down.discard(name)
        return f"pid {proc.pid}, id {proc.coordinator_id}" + (" (new id)" if new_id else "")

    def pause(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            self._down.add(name)
            proc.signal(signal.SIGSTOP)
            proc.paused = True
        return f"pid {proc.pid}, id {proc.coordinator_id}"

    def resume(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            proc.signal(signal.SIGCONT)
            proc.paused = False
            self._down.discard(name)
        return f"pid {proc.pid}, id {proc.coordinator_id}"

    def dump_stacks(self, why: str) -> None:
        """Every live coordinator writes its threads' stacks to its log (SIGUSR1)."""
        with self._lock:
            for proc in self.procs.values():
                if proc.alive() and not proc.paused:
                    with proc.log_path.open("ab") as log:
                        log.write(f"\n=== thread dump: {why} at {datetime.now(UTC)} ===\n".encode())
                    proc.signal(signal.SIGUSR1)

    def stop_all(self) -> None:
        self.dump_stacks("stopping")
        time.sleep(0.5)
        self._stop.set()
        if self._watchdog.is_alive():
            self._watchdog.join(5)
        with self._lock:
            for proc in self.procs.values():
                proc.signal(signal.SIGCONT)
            for proc in self.procs.values():
                proc.stop()


def wait_coordinators_healthy(bootstrap: str, namespace: str, timeout_s: float) -> None:
    """Until every coordinator service's group is stable with a member."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=namespace)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = coordinator_health(config)
            if all(s.healthy for s in last):
                return
        except Exception as exc:
            last = exc
        time.sleep(1.0)
    raise TimeoutError(f"coordinators not healthy within {timeout_s:.0f} s: {last}")


# --- the checker --------------------------------------------------------------------------
def run_checker(history: Path) -> tuple[str, str, bool]:
    """The checker's table (text and Markdown) and whether it found a violation."""
    try:
        from chaos.checker import check_file  # noqa: PLC0415 - lands separately
    except ImportError as exc:
        text = f"(no verdict: chaos.checker cannot be imported: {exc})"
        return text, text, True
    report = check_file(history)
    return report.render(50), report.render_markdown(50), not report.ok


# --- the run ------------------------------------------------------------------------------
def _default_out_dir() -> Path:
    return REPO_ROOT / ".chaos" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread, so teardown runs as on Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[{stamp}] {text}", flush=True)
    logger.info("%s", text)


def _config_event(config: RunConfig, workload: WorkloadConfig) -> dict[str, Any]:
    return {
        "seed": config.seed,
        "duration_s": config.duration_s,
        "soak": config.soak,
        "nodes": config.nodes,
        "max_reconsume_times": config.max_reconsume_times,
        "timer_precision_ms": config.timer_precision_ms,
        "delay_levels_ms": workload.delay_levels_ms,
        "transaction_timeout_ms": config.transaction_timeout_ms,
        "check_interval_ms": config.check_interval_ms,
        "session_timeout_ms": config.session_timeout_ms,
        "kafka_transaction_timeout_ms": config.kafka_transaction_timeout_ms,
        # The cluster keeps Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms.
        "transaction_abort_interval_ms": 10_000,
        "broadcast_observers": [f"broadcast-{i}" for i in BROADCAST_INSTANCES],
        "groups": {
            CONSUME_GROUP: {"max_reconsume_times": config.max_reconsume_times},
            ORDERLY_GROUP: {"suspend_current_queue_time_millis": ORDERLY_SUSPEND_MS},
        },
        "rates": dict(workload.rates),
    }


def run(config: RunConfig) -> int:
    """One run; the exit status: 0 no violation, 1 a violation, 2 the run itself failed."""
    out = Path(config.out_dir) if config.out_dir else _default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "run.log")
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # librdkafka's retries under faults are expected; keep them in run.log only at warning+.
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)
    logging.getLogger("chaos.rdkafka").setLevel(logging.ERROR)
    history_path = out / "history.jsonl"
    started = time.monotonic()
    status = 2
    try:
        with _sigterm_as_interrupt():
            status = _run(config, out, history_path)
    except KeyboardInterrupt:
        _say("interrupted; everything started was stopped")
        status = 130
    finally:
        root.removeHandler(handler)
        handler.close()
    _say(f"run took {time.monotonic() - started:.0f} s; output in {out}")
    return status


def _run(config: RunConfig, out: Path, history_path: Path) -> int:
    data_dir = out / "cluster"
    disk: DiskFiller | None = None
    soak_disk = config.disk_full if config.disk_full is not None else config.soak
    with contextlib.ExitStack() as stack:
        cluster = make_cluster(config, data_dir)
        disk_node: int | None = None
        if soak_disk and config.nodes > 1:
            ok, why = DiskFiller.available()
            if ok:
                disk_node = max(cluster.node_ids)
                disk = DiskFiller(_node_log_dir(cluster, disk_node))
                try:
                    disk.mount()
                    stack.callback(disk.unmount)
                except Exception as exc:
                    _say(f"disk_full left out: mounting a tmpfs failed ({exc})")
                    disk = None
            else:
                _say(f"disk_full left out: {why}")
        _say(f"starting {config.nodes} broker(s) in {data_dir}")
        stack.callback(_stop_cluster, cluster, config.keep_data, data_dir)
        cluster.start()
        direct = cluster.bootstrap_servers
        proxy = FaultProxy(cluster.proxy_routes())
        proxy.start()
        stack.callback(proxy.stop)
        client_bootstrap = cluster.proxied_bootstrap_servers
        cluster.wait_healthy(120)
        _say(f"brokers ready: direct {direct}, clients {client_bootstrap}")

        rates = {k: v * config.rate_scale for k, v in DEFAULT_RATES.items()}
        wconfig = WorkloadConfig(
            seed=config.seed,
            client_bootstrap=client_bootstrap,
            reader_bootstrap=direct,
            namespace=config.namespace,
            message_delay_level=config.message_delay_level,
            timer_precision_ms=config.timer_precision_ms,
            max_reconsume_times=config.max_reconsume_times,
            replication_factor=min(3, config.nodes),
            min_insync_replicas=min(2, config.nodes),
            rates=rates,
        )
        history = HistoryWriter(history_path)
        stack.callback(history.close)
        workload = Workload(wconfig, history)
        workload.create_topics()

        coordinators = Coordinators(config, client_bootstrap, out)
        stack.callback(coordinators.stop_all)
        coordinators.start_all()
        wait_coordinators_healthy(direct, config.namespace, 120)
        _say("coordinators ready: " + ", ".join(
            f"{p.name} pid {p.pid} id {p.coordinator_id}" for p in coordinators.procs.values()
        ))  # fmt: skip

        catalog = wconfig.client_config().catalog()
        targets = Targets(
            cluster=cluster,
            proxy=proxy,
            coordinators=coordinators,
            poison=workload,
            leader_topics={
                "workload": TX_TOPIC,
                "half": catalog.topic(SystemTopic.HALF),
                "schedule": catalog.topic(SystemTopic.SCHEDULE),
                "timer": catalog.topic(SystemTopic.TIMER),
            },
            disk=disk,
            disk_node=disk_node,
        )
        kinds = available_kinds(targets)
        if config.nemeses is not None:
            kinds = [k for k in kinds if k in config.nemeses]
        faults = plan(
            config.seed, config.duration_s, soak=config.soak, available=kinds,
            session_timeout_s=coordinators.session_timeout_s, nodes=config.nodes,
        )  # fmt: skip
        plan_text = "\n".join(f.describe() for f in faults)
        (out / "plan.txt").write_text(plan_text + "\n")
        _say(f"nemesis plan (seed {config.seed}, kinds {', '.join(kinds)}):\n{plan_text}")

        history.write("phase", name="start", config=_config_event(config, wconfig))
        stack.callback(workload.stop)
        workload.start()
        nemesis = Nemesis(faults, targets, history)
        stack.callback(_stop_nemesis, nemesis)
        nemesis.start()
        _say(f"load for {config.duration_s:.0f} s")
        _progress(workload, config.duration_s)
        workload.stop_load()
        history.write("phase", name="load_end", detail=str(workload.counts()))
        coordinators.dump_stacks("load end")
        _say(f"load ended: {workload.counts()}")
        _stop_nemesis(nemesis)
        complete, detail = workload.drain(config.drain_timeout_s)
        history.write("phase", name="drained", complete=complete, detail=detail)
        _say(f"drained: {detail}")
        time.sleep(config.settle_s)

        workload.stop()
        notes = _notes(nemesis, coordinators, workload)
        if config.spark:
            failed = _spark(history, direct, out)
            notes += [failed] if failed else []
        history.write("phase", name="end", detail="; ".join(notes) or "clean")
        history.close()
    table, markdown, violated = run_checker(history_path)
    (out / "table.txt").write_text(table)
    (out / "table.md").write_text(markdown)
    print(table, flush=True)
    for note in notes:
        _say(f"note: {note}")
    if violated:
        _say("VIOLATION: see the table above and history.jsonl")
        return 1
    return 0


def _node_log_dir(cluster: LocalKafkaCluster, node_id: int) -> Path:
    return cluster.node(node_id).data_dir / "kraft"


def _progress(workload: Workload, duration_s: float) -> None:
    end = time.monotonic() + duration_s
    next_report = time.monotonic() + 30
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        if time.monotonic() >= next_report:
            _say(f"load: {sum(workload.counts().values())} operations, {left:.0f} s left")
            next_report += 30


def _stop_nemesis(nemesis: Nemesis) -> None:
    nemesis.stop()
    if nemesis.is_alive():
        nemesis.join(180)


def _spark(history: HistoryWriter, bootstrap: str, out: Path) -> str | None:
    """Run the ingest and record its rows; a note if it failed."""
    _say("Spark ingest of the tx topic (read_committed)")
    start_t = now_ms()
    try:
        ids, detail = run_spark_ingest(bootstrap, [TX_TOPIC], out / "spark")
    except Exception as exc:
        _say(f"Spark ingest failed: {exc}")
        return f"Spark ingest failed: {' '.join(str(exc).split())[:500]}"
    history.write("spark", ids=ids, topics=[TX_TOPIC], start_t=start_t)
    _say(f"Spark ingest: {detail}")
    return None


def _notes(nemesis: Nemesis, coordinators: Coordinators, workload: Workload) -> list[str]:
    notes = [f"nemesis failed: {e}" for e in nemesis.errors]
    notes += [f"coordinator exit: {e}" for e in coordinators.unexpected_exits]
    notes += [f"reader died: {e}" for e in workload.reader_errors()]
    return notes


def _stop_cluster(cluster: LocalKafkaCluster, keep_data: bool, data_dir: Path) -> None:
    try:
        cluster.stop()
    finally:
        if not keep_data:
            for kraft in data_dir.glob("*/kraft"):
                if not os.path.ismount(kraft):
                    shutil.rmtree(kraft, ignore_errors=True)


def check_saved(history: Path) -> int:
    """Re-check a saved history: print the table; 1 on a violation."""
    table, _, violated = run_checker(history)
    print(table, end="")
    return 1 if violated else 0


def summary(history: Path) -> dict[str, int]:
    """Events per type of a history (for tests and quick looks)."""
    counts: dict[str, int] = {}
    for event in read_history(history):
        counts[event["type"]] = counts.get(event["type"], 0) + 1
    return counts
