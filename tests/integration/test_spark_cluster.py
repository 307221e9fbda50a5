"""The three Spark jobs on a Spark standalone cluster, submitted as docs/spark.md says.

A master and two workers (one core each) start from pyspark's own launcher (``bin/spark-class``:
the pip package ships no ``sbin`` scripts), the three-node local Kafka cluster beside them; each
job is submitted by running the recipe's own shell lines from docs/spark.md with
``spark-submit --master spark://...``, so the documentation cannot drift from what runs. The
executors get a Python that does not exist: the recipe says they run none, and a Python task
would fail the job. Each test checks that the job's executors ran its tasks on the workers (their
logs in the workers' work directories), not in the driver.

One cluster for the module; every JVM (master, workers, executors, drivers) runs in a process
group of its own, killed at teardown whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from bridge import (
    ClientConfig,
    Message,
    TransactionMQProducer,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from bridge.runtime.node_config import free_port
from tests.conftest import REPO_ROOT, SPARK_JAVA_OPTIONS, wait_until
from tests.spark_workloads import ByBody, ingest_workload, make_retry_history, visible

# Serial: three Kafka nodes, a master, two workers and their executors want the machine.
pytestmark = [
    pytest.mark.broker, pytest.mark.spark, pytest.mark.slow, pytest.mark.serial,
    # The first test waits for the clusters and a job queued behind the others (their bounds
    # below): on a loaded 2-core machine that outlasts the suite's 300 s.
    pytest.mark.timeout(900),
]  # fmt: skip

logger = logging.getLogger(__name__)

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
WORKERS = 2
SUBMIT_TIMEOUT_S = 480.0
"""A submission's bound (s), its wait for cores while the other jobs hold them included: the
jobs are submitted together, and a standalone master runs one application at a time when
each asks for every core."""
RUN_TIMEOUT_S = 720.0
"""A job's run with its data and its submissions (s)."""
KAFKA_WAIT_S = 180.0
"""How long a message may take to be visible, retried or dead-lettered (s): the coordinator
shares the machine with the clusters and the drivers."""
NO_PYTHON = "/nonexistent/python3"
"""The executors' Python: the recipe promises they run none of it."""


# --- the recipe, from docs/spark.md ----------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    """docs/spark.md's cluster recipe: the shell lines every job needs, and each job's line."""

    preamble: str
    jobs: dict[str, str]
    """Script path (``spark_jobs/ingest.py``) -> the line that submits it."""


def read_recipe(doc: Path = REPO_ROOT / "docs" / "spark.md") -> Recipe:
    blocks = re.findall(r"^```bash\n(.*?)^```", doc.read_text(), flags=re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if "spark-submit --master" in b]
    lines = block.replace("\\\n", " ").splitlines()
    jobs = {line.split()[1]: line for line in lines if line.startswith("submit spark_jobs/")}
    preamble = "\n".join(line for line in lines if not line.startswith("submit spark_jobs/"))
    assert set(jobs) == {
        "spark_jobs/ingest.py", "spark_jobs/transaction_audit.py", "spark_jobs/dlq_report.py",
    }, jobs  # fmt: skip
    return Recipe(preamble, jobs)


# --- processes --------------------------------------------------------------------------------
def stop_group(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """Stop ``proc``'s process group (SIGTERM, then SIGKILL): a worker's executors are in its
    group, as are a driver's JVM and Python."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
    proc.wait()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@dataclass
class Standalone:
    """A running Spark standalone master with its workers."""

    url: str
    """``spark://127.0.0.1:<port>``."""
    ui: str
    """The master's web UI (``/json`` lists workers and applications)."""
    work_dirs: list[Path]
    """Each worker's work directory (``<app id>/<executor id>/stderr``: an executor's log)."""
    env: dict[str, str]
    """Spark's environment for drivers (conf directory, loopback address)."""

    def apps(self) -> dict[str, dict[str, Any]]:
        """Every application the master knows, running or completed, by id."""
        state = get_json(f"{self.ui}/json/")
        return {a["id"]: a for a in state["activeapps"] + state["completedapps"]}

    def tasks_per_worker(self, app_id: str) -> list[int]:
        """How many tasks each worker's executors of ``app_id`` started, from their logs."""
        return [
            sum(log.read_text(errors="replace").count("Running task ") for log in logs)
            for logs in (sorted(d.glob(f"{app_id}/*/stderr")) for d in self.work_dirs)
        ]


def start_standalone(base: Path, procs: list[subprocess.Popen[Any]]) -> Standalone:
    """A master and :data:`WORKERS` workers of one core and 1 GiB each; every process is
    appended to ``procs`` as it starts (the caller stops them)."""
    conf = base / "conf"
    conf.mkdir()
    # Only what makes the JVMs cheaper on 2 shared cores: the recipe's own settings are its.
    (conf / "spark-defaults.conf").write_text(
        f"spark.executor.extraJavaOptions {SPARK_JAVA_OPTIONS}\n"
        "spark.ui.showConsoleProgress false\n"
    )
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": SPARK_JAVA_OPTIONS,
        "SPARK_SUBMIT_OPTS": SPARK_JAVA_OPTIONS,
        "PYSPARK_PYTHON": NO_PYTHON,
    }
    env.pop("PYSPARK_SUBMIT_ARGS", None)  # the in-process sessions' setting, not spark-submit's
    port, ui_port = free_port(), free_port()
    url, ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"

    def launch(name: str, *args: str) -> None:
        log = (base / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [str(SPARK_CLASS), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        procs.append(proc)

    launch(
        "master", "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
    )  # fmt: skip
    work_dirs = []
    for i in range(1, WORKERS + 1):
        work_dirs.append(base / f"worker-{i}")
        launch(
            f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
            "--work-dir", str(work_dirs[-1]), "--webui-port", str(free_port()), url,
        )  # fmt: skip

    def alive_workers() -> int:
        for proc in procs:
            assert proc.poll() is None, f"a Spark daemon exited: see {base}/*.log"
        try:
            return int(get_json(f"{ui}/json/")["aliveworkers"])
        except OSError:
            return 0

    wait_until(lambda: alive_workers() == WORKERS, timeout_s=90, interval_s=0.5)
    return Standalone(url, ui, work_dirs, env)


@dataclass
class Clusters:
    kafka: LocalKafkaCluster
    spark: Standalone
    recipe: Recipe
    shared: Path
    """The recipe's ``$SHARED``: every path the jobs write."""
    reader: SparkSession
    """A local session in this process that reads what the jobs wrote (Parquet)."""


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    base = tmp_path_factory.mktemp("spark-cluster")
    recipe = read_recipe()
    kafka = LocalKafkaCluster(LocalClusterConfig(data_dir=base / "kafka"))
    procs: list[subprocess.Popen[Any]] = []
    reader: SparkSession | None = None
    # Each driver's artifact manager makes artifacts/ in its working directory, the checkout,
    # and leaves it there: empty, or with a driver's files if it was killed.
    artifacts = REPO_ROOT / "artifacts"
    ours = not artifacts.exists()
    started = time.monotonic()
    try:
        # All at once: each is mostly a JVM starting.
        with ThreadPoolExecutor(2) as pool:
            kafka_up = pool.submit(kafka.start)
            local = pool.submit(
                SparkSession.builder.master("local[1]").appName("bridge-cluster-reader").getOrCreate
            )
            spark = start_standalone(base, procs)
            kafka_up.result()
            reader = local.result()
        logger.info(
            "measured: 3 Kafka nodes, a Spark master and %d workers up in %.1f s",
            WORKERS, time.monotonic() - started,
        )  # fmt: skip
        yield Clusters(kafka, spark, recipe, base / "shared", reader)
    finally:
        for proc in reversed(procs):  # workers (and their executors) first
            stop_group(proc)
        if reader is not None:
            reader.stop()
        kafka.stop()
        if ours:
            shutil.rmtree(artifacts, ignore_errors=True)


@dataclass(frozen=True)
class Submitted:
    app_id: str
    stdout: str


_APP_ID = re.compile(r"Connected to Spark cluster with app ID (app-[0-9-]+)")


def submit(clusters: Clusters, job: str, namespace: str, *extra: str, log_dir: Path) -> Submitted:
    """Run the recipe's line for ``job`` (its script path) with ``extra`` arguments, from the
    checkout, against the standalone master and the Kafka cluster; return the application the
    master ran for it (finished)."""
    script = f"set -euo pipefail\n{clusters.recipe.preamble}\n{clusters.recipe.jobs[job]}"
    if extra:
        script += " " + shlex.join(extra)
    env = {
        **clusters.spark.env,
        "SPARK_MASTER": clusters.spark.url,
        "KAFKA": clusters.kafka.bootstrap_servers,
        "SHARED": str(clusters.shared),
        "BRIDGE_NAMESPACE": namespace,
        "BRIDGE_SPARK_PARTITIONS": "2",  # tiny inputs: fewer tasks to start
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(job).stem
    out, err = log_dir / f"{stem}.stdout", log_dir / f"{stem}.stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(SUBMIT_TIMEOUT_S)
        finally:
            stop_group(proc)
    log = err.read_text(errors="replace")
    assert code == 0, f"{job} failed ({code}):\n{log[-6000:]}"
    found = _APP_ID.search(log)
    assert found, f"{job} never connected to {clusters.spark.url}: see {err}"
    app = clusters.spark.apps()[found[1]]
    assert (app["name"], app["state"]) == (f"bridge-{stem.replace('_', '-')}", "FINISHED"), app
    return Submitted(found[1], out.read_text())


def assert_ran_on_workers(clusters: Clusters, app_id: str) -> None:
    """The application's tasks ran in its executors on the workers (a standalone driver runs
    none itself)."""
    tasks = clusters.spark.tasks_per_worker(app_id)
    logger.info("measured: %s ran %s tasks per worker", app_id, tasks)
    assert sum(tasks) > 0, f"no executor of {app_id} ran a task: {tasks}"


# --- the Kafka side, and the runs -----------------------------------------------------------
def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def table_ids(spark: SparkSession, path: Path) -> list[str]:
    """The ids in the table, as Spark reads it (the files its sink log committed)."""
    try:
        rows = spark.read.parquet(str(path)).select("msg_id").collect()
    except AnalysisException:  # no batch committed yet
        return []
    return [r["msg_id"] for r in rows]


@dataclass(frozen=True)
class IngestRun:
    committed_before: set[str]
    """Committed when the first run started."""
    late: str
    """Undecided then, committed by a check-back before the second run."""
    never: set[str]
    """Rolled back, or undecided for ever."""
    first: list[str]
    """The table's ids after the first run."""
    final: list[str]
    """After the second."""
    apps: tuple[Submitted, Submitted]


def run_ingest(clusters: Clusters, config: ClientConfig, log_dir: Path) -> IngestRun:
    """Committed, rolled back and undecided messages, a duplicate record, the ingest; then a
    late commit and the ingest again."""
    job = "spark_jobs/ingest.py"
    # The topic is replicated on the three nodes.
    with ingest_workload(config, name("t"), name("txg"), timeout_s=KAFKA_WAIT_S) as work:
        first_app = submit(
            clusters, job, config.namespace, "--topics", work.topic, log_dir=log_dir / "1"
        )
        first = table_ids(clusters.reader, clusters.shared / "messages")
        work.commit_late(timeout_s=KAFKA_WAIT_S)  # the check-back commits it
    second_app = submit(
        clusters, job, config.namespace, "--topics", work.topic, log_dir=log_dir / "2"
    )
    final = table_ids(clusters.reader, clusters.shared / "messages")
    return IngestRun(work.committed, work.late, work.never, first, final, (first_app, second_app))


@dataclass(frozen=True)
class ReportRun:
    topic: str
    group: str
    rows: list[dict[str, Any]]
    """The report's JSON Lines."""
    app: Submitted


def run_audit(clusters: Clusters, config: ClientConfig, log_dir: Path) -> ReportRun:
    """Transactions committed, rolled back and pending, then the transaction audit."""
    topic, group = name("t"), name("audit")
    with TransactionMQProducer(group, ByBody(), config=config) as tx:
        for body in ("c1", "c2", "r1"):
            tx.send_message_in_transaction(Message(topic, body), None)
        pending = Message(topic, "u-immune")  # never checked while the test runs
        pending.put_user_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "3600")
        tx.send_message_in_transaction(pending, None)
    wait_until(lambda: len(visible(config, topic)) == 2, timeout_s=KAFKA_WAIT_S)
    app = submit(clusters, "spark_jobs/transaction_audit.py", config.namespace, log_dir=log_dir)
    lines = (clusters.shared / "reports" / "transactions.jsonl").read_text().splitlines()
    return ReportRun(topic, group, [json.loads(x) for x in lines], app)


def run_dlq(clusters: Clusters, config: ClientConfig, log_dir: Path) -> ReportRun:
    """Messages consumed at once, after two failures, and dead-lettered; then the DLQ report."""
    topic, group = name("t"), name("g")
    make_retry_history(config, topic, group, timeout_s=KAFKA_WAIT_S)
    app = submit(clusters, "spark_jobs/dlq_report.py", config.namespace, log_dir=log_dir)
    lines = (clusters.shared / "reports" / "dlq.jsonl").read_text().splitlines()
    return ReportRun(topic, group, [json.loads(x) for x in lines], app)


@dataclass(frozen=True)
class Runs:
    """Each job's run, under way together (the drivers start while another job runs)."""

    ingest: Future[IngestRun]
    audit: Future[ReportRun]
    dlq: Future[ReportRun]


@pytest.fixture(scope="module")
def runs(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    config = ClientConfig(
        bootstrap_servers=clusters.kafka.bootstrap_servers,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level="1s 1s 1s 1s 1s",
    )
    # Checks 1 s after a send and every second, never parked while the tests run.
    checks = CoordinatorConfig(
        client=config, coordinator_id="spark-cluster-tests", transaction_partitions=1,
        transaction_timeout_ms=1000, check_interval_ms=1000, transaction_check_max=1000,
        session_timeout_ms=6000,
    )  # fmt: skip
    logs = tmp_path_factory.mktemp("submits")
    with Coordinator(checks), ThreadPoolExecutor(3) as pool:
        yield Runs(
            pool.submit(run_ingest, clusters, config, logs / "ingest"),
            pool.submit(run_audit, clusters, config, logs / "audit"),
            pool.submit(run_dlq, clusters, config, logs / "dlq"),
        )


# --- the jobs ---------------------------------------------------------------------------------
def test_ingest_on_the_cluster_lands_committed_messages_once_and_late_commits_later(
    clusters: Clusters, runs: Runs
) -> None:
    run = runs.ingest.result(timeout=RUN_TIMEOUT_S)
    assert Counter(run.first) == Counter(run.committed_before), (
        "each committed message once, no other"
    )
    assert Counter(run.final) == Counter({*run.committed_before, run.late})
    assert not run.never & set(run.final)
    for app in run.apps:
        assert_ran_on_workers(clusters, app.app_id)


def test_transaction_audit_on_the_cluster(clusters: Clusters, runs: Runs) -> None:
    run = runs.audit.result(timeout=RUN_TIMEOUT_S)
    assert run.group in run.app.stdout
    [row] = [r for r in run.rows if r["producer_group"] == run.group]
    assert (row["topic"], row["committed"], row["rolled_back"], row["pending"], row["parked"]) == (
        run.topic, 2, 1, 1, 0,
    )  # fmt: skip
    assert_ran_on_workers(clusters, run.app.app_id)


def test_dlq_report_on_the_cluster(clusters: Clusters, runs: Runs) -> None:
    run = runs.dlq.result(timeout=RUN_TIMEOUT_S)
    assert run.group in run.app.stdout
    mine = {
        (r["kind"], r["origin_topic"], r["reconsume_times"]): r["count"]
        for r in run.rows
        if r["group"] == run.group
    }
    assert mine == {
        ("retry", run.topic, 1): 2,  # both failed once
        ("retry", run.topic, 2): 2,  # both failed twice
        ("dlq", run.topic, 3): 1,  # "always" after its third failure
    }
    assert_ran_on_workers(clusters, run.app.app_id)


def test_every_worker_ran_tasks(clusters: Clusters, runs: Runs) -> None:
    """The jobs' tasks spread over both workers (each application's executors: one a worker)."""
    apps = [a.app_id for a in runs.ingest.result(timeout=RUN_TIMEOUT_S).apps]
    apps += [r.result(timeout=RUN_TIMEOUT_S).app.app_id for r in (runs.audit, runs.dlq)]
    per_worker = [
        sum(n) for n in zip(*(clusters.spark.tasks_per_worker(a) for a in apps), strict=True)
    ]
    assert all(per_worker), f"tasks per worker: {per_worker}"
