"""The Spark reports write their rows beside the HTML chart: Parquet, CSV and JSON Lines that
read back as the rows the report computed (a local Spark; no broker needed)."""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_jobs.common import spark_session
from spark_jobs.dlq_report import DlqRow, report, write_report_data
from spark_jobs.transaction_audit import AuditRow

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # One JVM serves every test module's session and the first one fixes its class path:
    # every module asks for the Delta Lake jars too, whichever runs first.
    session = spark_session("bridge-report-data-tests", master="local[1]", delta=True)
    yield session
    session.stop()


def test_dlq_and_audit_rows_are_written_as_parquet_csv_and_json(
    spark: SparkSession, tmp_path: Path
) -> None:
    dlq_rows = [
        DlqRow("g1", "retry", "orders", 1, 5),
        DlqRow("g1", "dlq", "orders", 17, 2),
    ]
    chart = tmp_path / "reports" / "dlq.html"
    report(dlq_rows, chart)
    parquet, table, lines = write_report_data(spark, dlq_rows, DlqRow, chart)
    assert chart.is_file() and parquet.parent == chart.parent
    back = [DlqRow(**r.asDict()) for r in spark.read.parquet(str(parquet)).collect()]
    assert sorted(back, key=str) == sorted(dlq_rows, key=str)
    with table.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows[1] == {
        "group": "g1",
        "kind": "dlq",
        "origin_topic": "orders",
        "reconsume_times": "17",
        "count": "2",
    }
    assert [DlqRow(**json.loads(x)) for x in lines.read_text().splitlines()] == dlq_rows

    audit = [
        AuditRow("pg", "orders", 3, 1, 0, 1, 4, 1.5, 12.0, None),
        AuditRow("pg", "refunds", 0, 0, 0, 0, 0, 0.0, None, None),
    ]
    written = write_report_data(spark, audit, AuditRow, tmp_path / "tx.html")
    back_audit = [AuditRow(**r.asDict()) for r in spark.read.parquet(str(written[0])).collect()]
    assert sorted(back_audit, key=str) == audit
    assert [json.loads(x) for x in written[2].read_text().splitlines()] == [
        dataclasses.asdict(r) for r in audit
    ]
    # Written again (no rows now): replaced, and still readable with its columns.
    write_report_data(spark, [], AuditRow, tmp_path / "tx.html")
    empty = spark.read.parquet(str(written[0]))
    assert empty.count() == 0 and "decision_p99_ms" in empty.columns
    assert written[1].read_text().splitlines() == [
        ",".join(f.name for f in dataclasses.fields(AuditRow))
    ]
