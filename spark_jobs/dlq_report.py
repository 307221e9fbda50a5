"""Retry and dead-letter report: per consumer group, origin topic and reconsume depth.

Reads every retry topic (``%RETRY%<group>``) and dead-letter topic (``%DLQ%<group>``) of the
namespace and counts their messages by group, kind (retry or DLQ), origin topic
(``RETRY_TOPIC``) and depth (``RECONSUME_TIME``). Prints a table and writes an HTML chart::

    python -m spark_jobs.dlq_report --chart reports/dlq.html
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

if __package__ in (None, ""):  # spark-submit runs the file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.common import (
    add_common_arguments,
    decode_messages,
    print_table,
    spark_session,
    write_bar_chart,
)
from spark_jobs.system_topics import read_pattern
from topics.naming import group_topics_pattern, parse_kafka_topic
from topics.properties import MessageConst


@dataclass(frozen=True, slots=True)
class DlqRow:
    """Messages of one group, kind, origin topic and depth."""

    group: str
    kind: str
    """``retry`` or ``dlq``."""
    origin_topic: str
    reconsume_times: int
    count: int


def dlq_report(spark: SparkSession, bootstrap_servers: str, namespace: str) -> list[DlqRow]:
    """Compute the report (see the module docstring)."""
    pattern = group_topics_pattern(namespace)
    records = read_pattern(spark, bootstrap_servers, pattern).cache()
    topics = [r["topic"] for r in records.select("topic").distinct().collect()]
    if not topics:
        return []
    groups = {t: parse_kafka_topic(t, namespace) for t in topics}
    group_of = F.create_map(*[F.lit(x) for t, p in groups.items() for x in (t, p.group or "")])
    kind_of = F.create_map(*[F.lit(x) for t, p in groups.items() for x in (t, p.kind.value)])
    messages = decode_messages(records)
    props = F.col("properties")
    rows = (
        messages.select(
            group_of[F.col("topic")].alias("group"),
            kind_of[F.col("topic")].alias("kind"),
            F.coalesce(props[MessageConst.RETRY_TOPIC], F.lit("?")).alias("origin_topic"),
            F.coalesce(props[MessageConst.RECONSUME_TIME].cast("int"), F.lit(0)).alias(
                "reconsume_times"
            ),
        )
        .groupBy("group", "kind", "origin_topic", "reconsume_times")
        .count()
        .orderBy("group", "kind", "origin_topic", "reconsume_times")
        .collect()
    )
    return [
        DlqRow(r["group"], r["kind"], r["origin_topic"], int(r["reconsume_times"]), int(r["count"]))
        for r in rows
    ]


def report(rows: list[DlqRow], chart: Path | None) -> str:
    """Print the report as a table and write the chart; return the table's text."""
    text = print_table(
        "retries and dead letters by consumer group",
        ["group", "kind", "origin topic", "reconsume times", "messages"],
        [(r.group, r.kind, r.origin_topic, r.reconsume_times, r.count) for r in rows],
    )
    if chart is not None:
        bars: dict[str, dict[str, float]] = defaultdict(dict)
        for r in rows:
            segment = "DLQ" if r.kind == "dlq" else f"retry #{r.reconsume_times}"
            parts = bars[f"{r.group} / {r.origin_topic}"]
            parts[segment] = parts.get(segment, 0) + r.count
        write_bar_chart(chart, "Retries and dead letters", sorted(bars.items()))
        print(f"chart: {chart}")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="spark_jobs.dlq_report")
    add_common_arguments(parser)
    parser.add_argument("--chart", type=Path, default=Path("reports/dlq.html"))
    args = parser.parse_args(argv)
    spark = spark_session("bridge-dlq-report", jars=args.jars, master=args.master)
    report(dlq_report(spark, args.bootstrap_servers, args.namespace), args.chart)


if __name__ == "__main__":
    main()
