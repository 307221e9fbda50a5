"""Transaction audit: per producer group and real topic, how transactions ended.

Reads HALF (half messages and their check copies), OP (decisions: COMMIT, ROLLBACK, DISCARD
when parked) and the check-max topic (parked messages), and reports committed, rolled back,
pending (no decision yet), parked (ever), check counts and time-to-decision percentiles (from
the half message's born time to the first decision, ms). A record of these topics that is not
a readable record of its schema (a tombstone, another client's bytes, an unknown schema, a
body that does not decode) is left out with a warning per topic and reason, giving its count;
the others are audited. Prints a table, writes an HTML chart and, beside it, the rows as data
(``transactions.parquet``, ``.csv`` and ``.jsonl``)::

    python -m spark_jobs.transaction_audit --chart reports/transactions.html
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

if __package__ in (None, ""):  # spark-submit runs the file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.common import (
    add_common_arguments,
    add_security_argument,
    count_property,
    kafka_security_options,
    print_table,
    spark_session,
    write_bar_chart,
)
from spark_jobs.dlq_report import write_report_data
from spark_jobs.system_topics import decode_avro, read_topic, skipped_records
from topics.catalog import SystemTopic
from topics.naming import system_topic
from topics.properties import MessageConst

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One producer group and real topic."""

    producer_group: str
    topic: str
    committed: int
    rolled_back: int
    pending: int
    parked: int
    """Parked at some point (replayed or dropped ones included)."""
    max_checks: int
    mean_checks: float
    decision_p50_ms: float | None
    decision_p99_ms: float | None


def transaction_audit(
    spark: SparkSession,
    bootstrap_servers: str,
    namespace: str,
    security: Mapping[str, str] | None = None,
) -> list[AuditRow]:
    """Compute the audit (see the module docstring); ``security``: the Kafka source's
    ``kafka.`` options (:func:`spark_jobs.common.kafka_security_options`; None: from the
    environment)."""

    cached: list[DataFrame] = []

    def read(topic: SystemTopic, schema: str) -> DataFrame:
        kafka_topic = system_topic(topic.value, namespace)
        records = read_topic(spark, bootstrap_servers, kafka_topic, security=security)
        # Read once for both the records left out and the audit.
        records = records.select("value").cache()
        cached.append(records)
        for reason, count in skipped_records(records, schema):
            logger.warning("%s: left out %d record(s): %s", kafka_topic, count, reason)
        return decode_avro(records, schema)

    props = F.col("properties")
    tid = F.coalesce(props[MessageConst.TRANSACTION_ID], F.col("msg_id"))
    checks = count_property(props[MessageConst.TRANSACTION_CHECK_TIMES])
    halves = (
        read(SystemTopic.HALF, "MessageEnvelope")
        .select(
            tid.alias("tid"),
            props[MessageConst.PRODUCER_GROUP].alias("producer_group"),
            props[MessageConst.REAL_TOPIC].alias("topic"),
            checks.alias("checks"),
            F.col("born_timestamp_ms"),
        )
        .groupBy("tid")
        .agg(
            F.first("producer_group", ignorenulls=True).alias("producer_group"),
            F.first("topic", ignorenulls=True).alias("topic"),
            F.max("checks").alias("checks"),
            F.min("born_timestamp_ms").alias("born_ms"),
        )
    )
    ops = (
        read(SystemTopic.OP, "OpRecord")
        .groupBy(F.col("transaction_id").alias("tid"))
        .agg(
            F.max_by("action", "decided_at_ms").alias("final"),
            F.min("decided_at_ms").alias("decided_ms"),
            F.max((F.col("action") == "DISCARD").cast("int")).alias("discarded"),
        )
    )
    parked = (
        read(SystemTopic.CHECK_MAX, "MessageEnvelope")
        .select(tid.alias("tid"))
        .distinct()
        .withColumn("in_check_max", F.lit(1))
    )
    joined = halves.join(ops, "tid", "left").join(parked, "tid", "left")
    was_parked = (
        F.coalesce(F.col("discarded"), F.lit(0)) + F.coalesce(F.col("in_check_max"), F.lit(0))
    ) > 0
    decision_ms = F.when(
        F.col("final").isin("COMMIT", "ROLLBACK"), F.col("decided_ms") - F.col("born_ms")
    )
    report = (
        joined.groupBy(
            F.coalesce(F.col("producer_group"), F.lit("?")).alias("producer_group"),
            F.coalesce(F.col("topic"), F.lit("?")).alias("topic"),
        )
        .agg(
            F.sum((F.col("final") == "COMMIT").cast("int")).alias("committed"),
            F.sum((F.col("final") == "ROLLBACK").cast("int")).alias("rolled_back"),
            F.sum((F.col("final").isNull() & ~was_parked).cast("int")).alias("pending"),
            F.sum(was_parked.cast("int")).alias("parked"),
            F.max("checks").alias("max_checks"),
            F.avg("checks").alias("mean_checks"),
            F.percentile(decision_ms, F.array(F.lit(0.5), F.lit(0.99))).alias("decision"),
        )
        .orderBy("producer_group", "topic")
    )
    try:
        collected = report.collect()
    finally:
        for records in cached:
            records.unpersist()
    return [
        AuditRow(
            r["producer_group"],
            r["topic"],
            int(r["committed"] or 0),
            int(r["rolled_back"] or 0),
            int(r["pending"] or 0),
            int(r["parked"] or 0),
            int(r["max_checks"] or 0),
            float(r["mean_checks"] or 0.0),
            float(r["decision"][0]) if r["decision"] and r["decision"][0] is not None else None,
            float(r["decision"][1]) if r["decision"] and r["decision"][1] is not None else None,
        )
        for r in collected
    ]


def report(rows: list[AuditRow], chart: Path | None) -> str:
    """Print the audit as a table and write the chart; return the table's text."""
    text = print_table(
        "transactions by producer group and topic",
        [
            "producer group",
            "topic",
            "committed",
            "rolled back",
            "pending",
            "parked",
            "max checks",
            "mean checks",
            "decision p50 ms",
            "decision p99 ms",
        ],
        [
            (
                r.producer_group,
                r.topic,
                r.committed,
                r.rolled_back,
                r.pending,
                r.parked,
                r.max_checks,
                r.mean_checks,
                r.decision_p50_ms,
                r.decision_p99_ms,
            )
            for r in rows
        ],
    )
    if chart is not None:
        write_bar_chart(
            chart,
            "Transactions by producer group and topic",
            [
                (
                    f"{r.producer_group} / {r.topic}",
                    {
                        "committed": r.committed,
                        "rolled back": r.rolled_back,
                        "pending": r.pending,
                        "parked": r.parked,
                    },
                )
                for r in rows
            ],
        )
        print(f"chart: {chart}")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="spark_jobs.transaction_audit")
    add_common_arguments(parser)
    add_security_argument(parser)
    parser.add_argument("--chart", type=Path, default=Path("reports/transactions.html"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spark = spark_session("bridge-transaction-audit", jars=args.jars, master=args.master)
    rows = transaction_audit(
        spark,
        args.bootstrap_servers,
        args.namespace,
        kafka_security_options(args.command_config),
    )
    report(rows, args.chart)
    for path in write_report_data(spark, rows, AuditRow, args.chart):
        print(f"data: {path}")


if __name__ == "__main__":
    main()
