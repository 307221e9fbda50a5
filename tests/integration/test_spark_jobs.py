"""The Spark jobs against the real broker and a local Spark: ingest exactly once of committed
messages only, a stopped and restarted query, the transaction audit and the DLQ report."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from bridge import (
    ClientConfig,
    Message,
    Producer,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.cli.admin.transactions import read_parked
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from spark_jobs import dlq_report, transaction_audit
from spark_jobs.common import TopicNotFoundError, spark_session
from spark_jobs.ingest import IngestConfig, start_ingest
from tests.conftest import REPO_ROOT, SPARK_JAVA_OPTIONS, wait_until
from tests.spark_workloads import ByBody, ingest_workload, make_retry_history
from topics.catalog import TopicSpec

pytestmark = [pytest.mark.broker, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session("bridge-tests", master="local[2]", delta=True)
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level="1s 1s 1s 1s 1s",
    )


def fast_checks(client: ClientConfig, check_max: int) -> CoordinatorConfig:
    """Checks 1 s after a send and every second after that."""
    return CoordinatorConfig(
        client=client, coordinator_id="spark-tests", transaction_partitions=1,
        transaction_timeout_ms=1000, check_interval_ms=1000, transaction_check_max=check_max,
        session_timeout_ms=6000,
    )  # fmt: skip


@pytest.fixture(scope="module")
def coordinator(spark_config: ClientConfig) -> Iterator[Coordinator]:
    # Checked every second but never parked while the tests run.
    with Coordinator(fast_checks(spark_config, check_max=1000)) as running:
        yield running


def table_ids(spark: SparkSession, path: Path) -> list[str]:
    """The ids in the table, as Spark reads it (committed files only)."""
    try:
        rows = spark.read.parquet(str(path)).select("msg_id").collect()
    except AnalysisException:  # no batch committed yet
        return []
    return [r["msg_id"] for r in rows]


def run_available_now(spark: SparkSession, config: IngestConfig) -> None:
    query = start_ingest(spark, config)
    query.awaitTermination(300)
    assert query.exception() is None


@pytest.mark.check("G7")
def test_ingest_lands_committed_messages_once_and_late_commits_later(
    spark: SparkSession, spark_config: ClientConfig, coordinator: Coordinator,
    unique: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    with ingest_workload(spark_config, unique("t"), unique("txg"), timeout_s=30) as work:
        config = IngestConfig(
            bootstrap_servers=spark_config.bootstrap_servers, output=str(tmp_path / "table"),
            checkpoint=str(tmp_path / "ckpt"), topics=(work.topic,),
        )  # fmt: skip
        run_available_now(spark, config)
        first = table_ids(spark, tmp_path / "table")
        assert Counter(first) == Counter(work.committed), "each committed message once, no other"
        row = (
            spark.read.parquet(str(tmp_path / "table")).where(f"msg_id = '{work.plain[1]}'").first()
        )
        assert row is not None
        assert (bytes(row["body"]), row["tags"], row["keys"], row["properties"]["region"]) == (
            b"p1", "TagP", "k1", "eu",
        )  # fmt: skip
        assert row["born_timestamp"] is not None and row["offset"] >= 0
        work.commit_late(timeout_s=60)  # the check-back commits it
    run_available_now(spark, config)
    second = table_ids(spark, tmp_path / "table")
    assert Counter(second) == Counter({*work.committed, work.late})
    assert not work.never & set(second)


def test_ingest_stopped_mid_stream_and_restarted_loses_and_duplicates_nothing(
    spark: SparkSession, spark_config: ClientConfig, unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    topic = unique("t")
    TopicAdmin(spark_config).ensure_topics([TopicSpec(topic, 2)])

    def send(bodies: list[str]) -> set[str]:
        with Producer("plain_pg", config=spark_config) as producer:
            return {producer.send_sync(Message(topic, b)).msg_id for b in bodies}

    sent = send([f"a{i}" for i in range(300)])
    config = IngestConfig(
        bootstrap_servers=spark_config.bootstrap_servers, output=str(tmp_path / "table"),
        checkpoint=str(tmp_path / "ckpt"), topics=(topic,), trigger="continuous",
        interval="500 milliseconds", max_offsets_per_trigger=60,
    )  # fmt: skip
    query = start_ingest(spark, config)
    try:
        wait_until(lambda: len(table_ids(spark, tmp_path / "table")) >= 60, timeout_s=120)
    finally:
        query.stop()
    landed = table_ids(spark, tmp_path / "table")
    assert len(landed) < len(sent), "stopped after everything landed: not mid-stream"
    sent |= send([f"b{i}" for i in range(100)])
    run_available_now(
        spark, dataclasses.replace(config, trigger="available-now", max_offsets_per_trigger=None)
    )
    final = table_ids(spark, tmp_path / "table")
    assert len(final) == len(set(final)), "a row was landed twice"
    assert set(final) == sent


def test_ingest_into_delta_lake(
    spark: SparkSession, spark_config: ClientConfig, unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    topic = unique("t")
    with Producer("plain_pg", config=spark_config) as producer:
        sent = [producer.send_sync(Message(topic, f"d{i}", tags="T")).msg_id for i in range(20)]
    config = IngestConfig(
        bootstrap_servers=spark_config.bootstrap_servers, output=str(tmp_path / "delta"),
        checkpoint=str(tmp_path / "ckpt"), topics=(topic,), table_format="delta",
    )  # fmt: skip
    run_available_now(spark, config)
    run_available_now(spark, config)  # nothing new: nothing added
    rows = spark.read.format("delta").load(str(tmp_path / "delta")).collect()
    assert sorted(r["msg_id"] for r in rows) == sorted(sent)
    assert {r["tags"] for r in rows} == {"T"}


def test_transaction_audit_counts_what_was_produced(
    spark: SparkSession, client_config: ClientConfig, unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    topic = unique("t")
    group = unique("audit")
    listener = ByBody()
    listener.answers["checked-commit"] = TransactionStatus.COMMIT
    spark_config = client_config  # its own namespace: parked after 3 checks
    with (
        Coordinator(fast_checks(client_config, check_max=3)),
        TransactionMQProducer(group, listener, config=spark_config) as tx,
    ):
        for body in ("c1", "c2", "c3", "r1", "r2", "checked-commit", "unknown-forever"):
            tx.send_message_in_transaction(Message(topic, body), None)
        pending = Message(topic, "u-immune")
        pending.put_user_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "3600")
        tx.send_message_in_transaction(pending, None)
        wait_until(
            lambda: any(m.body == b"unknown-forever" for m in read_parked(spark_config)),
            timeout_s=60,
        )
        wait_until(
            lambda: any(
                m.body == b"checked-commit"
                for m in read_messages(spark_config, [topic], timeout_ms=500)
            )
        )
    rows = transaction_audit.transaction_audit(
        spark, spark_config.bootstrap_servers, spark_config.namespace
    )
    [row] = [r for r in rows if r.producer_group == group]
    assert (row.topic, row.committed, row.rolled_back, row.pending, row.parked) == (
        topic, 4, 2, 1, 1,
    )  # fmt: skip
    assert row.max_checks >= 3
    assert row.decision_p50_ms is not None and row.decision_p50_ms >= 0
    text = transaction_audit.report(rows, tmp_path / "tx.html")
    assert group in text
    assert "<svg" in (tmp_path / "tx.html").read_text()


def test_dlq_report_matches_the_retry_history(
    spark: SparkSession, spark_config: ClientConfig, coordinator: Coordinator,
    unique: Callable[[str], str], tmp_path: Path,
) -> None:  # fmt: skip
    topic = unique("t")
    group = unique("g")
    make_retry_history(spark_config, topic, group, timeout_s=60)
    rows = dlq_report.dlq_report(spark, spark_config.bootstrap_servers, spark_config.namespace)
    mine = {(r.kind, r.origin_topic, r.reconsume_times): r.count for r in rows if r.group == group}
    assert mine == {
        ("retry", topic, 1): 2,  # both failed once
        ("retry", topic, 2): 2,  # both failed twice
        ("dlq", topic, 3): 1,  # "always" after its third failure
    }
    text = dlq_report.report(rows, tmp_path / "dlq.html")
    assert group in text
    assert "DLQ" in (tmp_path / "dlq.html").read_text()


def test_a_job_runs_with_spark_submit(kafka_bootstrap: str, tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "BRIDGE_NAMESPACE": f"ns{uuid.uuid4().hex[:10]}",
    }
    chart = tmp_path / "dlq.html"
    jars = subprocess.run(
        [sys.executable, "-m", "spark_jobs.jars"], capture_output=True, text=True,
        cwd=REPO_ROOT, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip
    assert "spark-sql-kafka-0-10_2.13" in jars
    proc = subprocess.run(
        [str(venv_bin / "spark-submit"), "--master", "local[1]", "--jars", jars,
         "--driver-java-options", SPARK_JAVA_OPTIONS,
         str(REPO_ROOT / "spark_jobs" / "dlq_report.py"), "--chart", str(chart)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "retries and dead letters by consumer group" in proc.stdout
    assert chart.exists()


def test_the_audit_of_a_namespace_without_system_topics_is_empty_and_says_so(
    spark: SparkSession, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: Spark's Py4JJavaError (UnknownTopicOrPartitionException, a Java stack trace)."""
    namespace = f"ns{uuid.uuid4().hex[:10]}"  # nothing ever ran in it
    caplog.set_level(logging.WARNING, logger="spark_jobs.system_topics")
    assert transaction_audit.transaction_audit(spark, kafka_bootstrap, namespace) == []
    missing = [r.args[0] for r in caplog.records if "does not exist" in str(r.msg)]  # type: ignore[index]
    assert missing == [
        f"{namespace}.RMQ_SYS_TRANS_HALF_TOPIC",
        f"{namespace}.RMQ_SYS_TRANS_OP_HALF_TOPIC",
        f"{namespace}.TRANS_CHECK_MAX_TIME_TOPIC",
    ]


def test_ingest_of_a_topic_that_does_not_exist_is_refused_naming_it(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    """Before: the query started and failed with Spark's StreamingQueryException."""
    present, absent = unique("t"), unique("absent")
    TopicAdmin(ClientConfig(bootstrap_servers=kafka_bootstrap)).ensure_topics(
        [TopicSpec(present, 1)]
    )
    config = IngestConfig(
        bootstrap_servers=kafka_bootstrap,
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ckpt"),
        topics=(present, absent),
    )
    with pytest.raises(TopicNotFoundError, match=rf"\['{absent}'\] do not exist"):
        start_ingest(spark, config)
    assert not (tmp_path / "ckpt").exists(), "nothing started"
