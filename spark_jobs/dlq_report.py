"""Retry and dead-letter report: per consumer group, origin topic and reconsume depth.

Reads every retry topic (``%RETRY%<group>``) and dead-letter topic (``%DLQ%<group>``) of the
namespace and counts their messages by group, kind (retry or DLQ), origin topic
(``RETRY_TOPIC``; ``?`` when missing or empty) and depth (``RECONSUME_TIME``; 0 unless 1 to 18
ASCII digits, as the clients read it). A topic of the namespace whose name holds no escaped
group counts under group ``?``, with a warning naming it. Prints a table, writes an HTML chart and,
beside it, the rows as data (:func:`write_report_data`: ``dlq.parquet``, ``dlq.csv`` and
``dlq.jsonl`` next to ``dlq.html``)::

    python -m spark_jobs.dlq_report --chart reports/dlq.html
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import sys
import types
import typing
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

if __package__ in (None, ""):  # spark-submit runs the file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.common import (
    add_common_arguments,
    add_security_argument,
    count_property,
    decode_messages,
    kafka_security_options,
    print_table,
    spark_session,
    write_bar_chart,
)
from spark_jobs.system_topics import read_pattern
from topics.errors import InvalidTopicNameError
from topics.naming import group_topics_pattern, parse_kafka_topic
from topics.properties import MessageConst

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DlqRow:
    """Messages of one group, kind, origin topic and depth."""

    group: str
    kind: str
    """``retry`` or ``dlq``."""
    origin_topic: str
    reconsume_times: int
    count: int


def dlq_report(
    spark: SparkSession,
    bootstrap_servers: str,
    namespace: str,
    security: Mapping[str, str] | None = None,
) -> list[DlqRow]:
    """Compute the report (see the module docstring); ``security``: the Kafka source's
    ``kafka.`` options (:func:`spark_jobs.common.kafka_security_options`; None: from the
    environment)."""
    pattern = group_topics_pattern(namespace)
    records = read_pattern(spark, bootstrap_servers, pattern, security=security).cache()
    counts = {r["topic"]: r["count"] for r in records.groupBy("topic").count().collect()}
    if not counts:
        return []
    groups: dict[str, tuple[str, str]] = {}
    for topic, count in counts.items():
        try:
            parsed = parse_kafka_topic(topic, namespace)
            groups[topic] = (parsed.group or "", parsed.kind.value)
        except InvalidTopicNameError as exc:
            # A topic another tool created under the namespace: its messages are counted
            # under group "?" rather than stopping the report of every group.
            kind = topic[len(namespace) + 1 :].split(".", 1)[0].lower()
            groups[topic] = ("?", kind)
            logger.warning(
                "topic %s names no consumer group (%s): its %d record(s) are counted under "
                "group '?'",
                topic,
                exc,
                count,
            )
    group_of = F.create_map(*[F.lit(x) for t, (g, _) in groups.items() for x in (t, g)])
    kind_of = F.create_map(*[F.lit(x) for t, (_, k) in groups.items() for x in (t, k)])
    messages = decode_messages(records)
    props = F.col("properties")
    rows = (
        messages.select(
            group_of[F.col("topic")].alias("group"),
            kind_of[F.col("topic")].alias("kind"),
            F.coalesce(F.nullif(props[MessageConst.RETRY_TOPIC], F.lit("")), F.lit("?")).alias(
                "origin_topic"
            ),
            count_property(props[MessageConst.RECONSUME_TIME]).alias("reconsume_times"),
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


_SPARK_TYPES: dict[Any, T.DataType] = {
    str: T.StringType(),
    int: T.LongType(),
    float: T.DoubleType(),
    bool: T.BooleanType(),
}


def _spark_schema(row_type: type[Any]) -> T.StructType:
    """The Spark schema of dataclass ``row_type`` (``str``, ``int``, ``float``, ``bool``
    fields, each optionally ``| None``)."""
    hints = typing.get_type_hints(row_type)
    fields = []
    for f in dataclasses.fields(row_type):
        hint = hints[f.name]
        nullable = False
        if isinstance(hint, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            nullable, hint = True, args[0]
        fields.append(T.StructField(f.name, _SPARK_TYPES[hint], nullable))
    return T.StructType(fields)


def write_report_data(
    spark: SparkSession, rows: Sequence[Any], row_type: type[Any], chart: Path
) -> list[Path]:
    """Write ``rows`` (dataclasses of ``row_type``) beside ``chart`` under its name: Parquet
    (``<name>.parquet``, a directory as Spark writes it), CSV with a header
    (``<name>.csv``) and JSON Lines (``<name>.jsonl``); any earlier data there is replaced.
    Return the three paths.

    The Parquet copy is Spark's typed read of the JSON Lines file: a data frame made from
    Python rows (``createDataFrame``) would start Python on the executors, which the jobs
    otherwise never need (docs/spark.md: the workers need Java and Spark only). On a cluster
    the executors read that file, so ``chart`` is on storage they share with the driver, as
    the Parquet copy already requires."""
    chart.parent.mkdir(parents=True, exist_ok=True)
    parquet = chart.with_suffix(".parquet")
    table = chart.with_suffix(".csv")
    lines = chart.with_suffix(".jsonl")
    schema = _spark_schema(row_type)
    records = [dataclasses.asdict(r) for r in rows]
    with table.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(schema.fieldNames())
        writer.writerows(["" if v is None else v for v in r.values()] for r in records)
    with lines.open("w", encoding="utf-8") as out:
        for r in records:
            out.write(json.dumps(r, ensure_ascii=False) + "\n")
    frame = spark.read.schema(schema).option("mode", "FAILFAST").json(str(lines))
    frame.coalesce(1).write.mode("overwrite").parquet(str(parquet))
    return [parquet, table, lines]


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="spark_jobs.dlq_report")
    add_common_arguments(parser)
    add_security_argument(parser)
    parser.add_argument("--chart", type=Path, default=Path("reports/dlq.html"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spark = spark_session("bridge-dlq-report", jars=args.jars, master=args.master)
    rows = dlq_report(
        spark,
        args.bootstrap_servers,
        args.namespace,
        kafka_security_options(args.command_config),
    )
    report(rows, args.chart)
    for path in write_report_data(spark, rows, DlqRow, args.chart):
        print(f"data: {path}")


if __name__ == "__main__":
    main()
