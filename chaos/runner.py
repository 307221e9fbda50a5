"""One fault-injection run, start to verdict: cluster, fault proxy, two coordinators, the
workload and the nemeses; then the drain, the teardown and the checker.

``python -m chaos run --seed N --duration S [--soak] [--out DIR]`` (see :mod:`chaos.__main__`).
Everything started here is stopped here, on success, on an error and on Ctrl-C or SIGTERM:
every broker JVM, coordinator and Spark child. The output directory (default
``.chaos/<utc-stamp>/``) keeps ``history.jsonl``, ``table.txt``, ``plan.txt``, ``run.log``, the
coordinators' logs and the brokers' logs (their data is removed unless ``keep_data``).

The parts: :mod:`chaos.run_config` (:class:`RunConfig`), :mod:`chaos.coordinators` (the
coordinator processes), :mod:`chaos.nemesis`, :mod:`chaos.proxy`, :mod:`chaos.workload` and
:mod:`chaos.checker`; this module puts them together in order and takes them apart again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from chaos.coordinators import (
    COORDINATOR_NAMES,
    CoordinatorProcess,
    Coordinators,
    wait_coordinators_healthy,
)
from chaos.history import HistoryWriter, now_ms, read_history
from chaos.nemesis import (
    DiskFiller,
    Nemesis,
    Targets,
    available_kinds,
    plan,
)
from chaos.proxy import FaultProxy
from chaos.run_config import REPO_ROOT, RunConfig
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

__all__ = [
    "BROKER_PROPERTIES",
    "COORDINATOR_NAMES",
    "REPO_ROOT",
    "CoordinatorProcess",
    "Coordinators",
    "RunConfig",
    "check_saved",
    "make_cluster",
    "run",
    "run_checker",
    "summary",
    "wait_coordinators_healthy",
]

logger = logging.getLogger("chaos")


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
            database_dir=str(out / "db") if config.database else None,
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
            database=workload,
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
        workload.record_database()
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
