"""Kafka source rows decoded into message columns (``spark_jobs.common.decode_messages``): the
values a straightforward per-header decoding gives, and the header map built once per row
inside Spark's generated code (a local Spark; no broker needed)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bridge.codec import BORN_TIMESTAMP_HEADER, copied_born_timestamp
from spark_jobs.common import HEADER_COPY_BORN_MS, decode_messages, spark_session

pytestmark = [pytest.mark.spark]

KAFKA_SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType(
                    [
                        StructField("key", StringType()),
                        StructField("value", BinaryType()),
                    ]
                )
            ),
        ),
    ]
)
"""The columns Spark's Kafka source gives with ``includeHeaders``."""

AT = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
BORN_MS = 1_700_000_000_123
"""The born time a copy's first header holds (before AT)."""
COPY_BORN = BORN_TIMESTAMP_HEADER


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # One JVM serves every test module's session and the first one fixes its class path:
    # every module asks for the Delta Lake jars too, whichever runs first.
    session = spark_session("bridge-decode-tests", master="local[1]", delta=True)
    yield session
    session.stop()


def records(spark: SparkSession) -> DataFrame:
    """Kafka-shaped rows with the cases that matter: own and user headers, a repeated name, a
    header without a value, no headers at all, bytes that are not UTF-8, append times."""
    rows: list[tuple[Any, ...]] = [
        (b"k1", b"body1", "t", 0, 5, AT, 0, [
            ("UNIQ_KEY", b"ID1"), ("TAGS", b"TagA"), ("KEYS", b"k1 k2"),
            ("BORN_HOST", b"10.0.0.1"), ("region", b"eu"), ("WAIT", b"true"),
        ]),
        (None, b"body2", "t", 1, 7, AT, 1, [
            ("UNIQ_KEY", b"ID2"), ("region", b"eu"), ("region", b"us"), ("empty", None),
        ]),
        (b"k3", None, "t", 1, 8, AT, 0, []),
        (b"k4", b"body4", "u", 2, 9, AT, 0, None),
        (b"\xff\xfe", b"\x00", "u", 3, 1, AT, 0, [("odd", b"\xc3\x28"), ("TAGS", b"\xff")]),
        # A copy stamped when written, born earlier (a user's property of the same name after).
        (b"k5", b"copy", "v", 4, 2, AT, 0, [
            (COPY_BORN, str(BORN_MS).encode()), ("UNIQ_KEY", b"ID5"), (COPY_BORN, b"user's"),
        ]),
        # Another client's first header of that name, not a time: a property like any other.
        (b"k6", b"foreign", "v", 4, 3, AT, 0, [(COPY_BORN, b"soon"), ("UNIQ_KEY", b"ID6")]),
    ]  # fmt: skip
    return spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)


def expected(row: Any) -> dict[str, Any]:
    """One record decoded header by header in Python (the later of a repeated name wins)."""
    headers = row["headers"] or []
    born_ms = copied_born_timestamp([(n, None if v is None else bytes(v)) for n, v in headers])
    props: dict[str, str | None] = {}
    for name, value in headers if born_ms is None else headers[1:]:
        props[name] = None if value is None else bytes(value).decode("utf-8", "replace")
    own = ("UNIQ_KEY", "TAGS", "KEYS", "BORN_HOST")
    create_time = row["timestampType"] == 0 and born_ms is None
    return {
        "msg_id": props.get("UNIQ_KEY") or f"{row['topic']}-{row['partition']}-{row['offset']}",
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "key": None if row["key"] is None else bytes(row["key"]).decode("utf-8", "replace"),
        "body": None if row["value"] is None else bytes(row["value"]),
        "tags": props.get("TAGS"),
        "keys": props.get("KEYS"),
        "properties": {k: v for k, v in props.items() if k not in own},
        "born_host": props.get("BORN_HOST"),
        "born_timestamp": (
            datetime.fromtimestamp(born_ms / 1000)
            if born_ms is not None
            else row["timestamp"]
            if create_time
            else None
        ),
        "store_timestamp": None if create_time else row["timestamp"],
    }


def test_records_decode_into_the_message_columns(spark: SparkSession) -> None:
    source = records(spark)
    decoded = decode_messages(source)
    assert decoded.columns == [
        "msg_id", "topic", "partition", "offset", "key", "body", "tags", "keys", "properties",
        "born_host", "born_timestamp", "store_timestamp", "ingested_at",
    ]  # fmt: skip
    got = decoded.orderBy("topic", "partition", "offset").collect()
    want = [expected(r) for r in source.orderBy("topic", "partition", "offset").collect()]
    assert len(got) == len(want) == 7
    for row, exp in zip(got, want, strict=True):
        actual = row.asDict()
        actual["body"] = None if actual["body"] is None else bytes(actual["body"])
        assert actual.pop("ingested_at") is not None
        assert actual == exp
    assert got[1]["properties"] == {"region": "us", "empty": None}
    assert got[5]["born_timestamp"] == datetime.fromtimestamp(BORN_MS / 1000)
    assert got[5]["properties"] == {COPY_BORN: "user's"}
    assert got[6]["properties"] == {COPY_BORN: "soon"}


def test_the_header_map_is_built_once_per_row_in_generated_code(spark: SparkSession) -> None:
    decoded = decode_messages(records(spark).where(col("partition") >= 0))
    plan = decoded._jdf.queryExecution().executedPlan().toString()
    # No per-header lambda, and one map for the five columns that read it.
    assert "transform(" not in plan, plan
    assert plan.count("map_from_entries(") == 1, plan
    [line] = [x for x in plan.splitlines() if "map_from_entries(" in x]
    assert line.lstrip("+- ").startswith("*("), f"outside whole-stage code generation: {plan}"


def test_the_jobs_name_the_copy_header_as_the_clients_do() -> None:
    assert HEADER_COPY_BORN_MS == BORN_TIMESTAMP_HEADER
