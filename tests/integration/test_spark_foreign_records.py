"""The Spark jobs on records other Kafka clients wrote (a raw producer, as any Kafka tool could):
odd message ids land as rows of their own, and records that are not what a system, retry or
DLQ topic should hold are counted with a reason without stopping the report on the others
(against the real broker and a local Spark)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from spark_jobs import dlq_report, transaction_audit
from spark_jobs.common import spark_session
from spark_jobs.ingest import IngestConfig, start_ingest
from topics.avro import SINGLE_OBJECT_MARKER, default_registry

pytestmark = [pytest.mark.broker, pytest.mark.spark]

Headers = list[tuple[str, str | bytes | None]] | None


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # One JVM serves every test module's session and the first one fixes its class path:
    # every module asks for the Delta Lake jars too, whichever runs first.
    session = spark_session("bridge-foreign-record-tests", master="local[2]", delta=True)
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


def produce_raw(bootstrap: str, records: Sequence[tuple[str, bytes | None, Headers]]) -> None:
    """Create the topics (one partition each) and write ``(topic, value, headers)`` records
    in order, with confluent-kafka as it comes."""
    topics = sorted({topic for topic, _, _ in records})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(30)
    producer = RawProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for topic, value, headers in records:
        if headers is None:
            producer.produce(topic, value=value, key=b"k")
        else:
            producer.produce(topic, value=value, key=b"k", headers=headers)
    assert producer.flush(30) == 0


def test_ingest_lands_a_row_for_each_record_with_an_empty_missing_or_binary_uniq_key(
    spark: SparkSession, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"foreign-{uuid.uuid4().hex[:10]}"
    produce_raw(
        kafka_bootstrap,
        [
            (topic, b"empty id 1", [("UNIQ_KEY", b"")]),  # offset 0
            (topic, b"empty id 2", [("UNIQ_KEY", b"")]),  # 1
            (topic, b"null id", [("UNIQ_KEY", None)]),  # 2
            (topic, b"no headers", None),  # 3
            (topic, None, [("UNIQ_KEY", b"tomb")]),  # 4: a tombstone
            (topic, b"", [("UNIQ_KEY", b"\xff\xfeid"), ("TAGS", b"\xff")]),  # 5
            (topic, b"same id", [("UNIQ_KEY", b"dup")]),  # 6
            (topic, b"same id again", [("UNIQ_KEY", b"dup")]),  # 7: the same message
            (topic, b"id twice", [("UNIQ_KEY", b"a"), ("UNIQ_KEY", b"b")]),  # 8
        ],
    )
    output = tmp_path / "table"
    config = IngestConfig(
        bootstrap_servers=kafka_bootstrap,
        output=str(output),
        checkpoint=str(tmp_path / "ckpt"),
        topics=(topic,),
    )
    query = start_ingest(spark, config)
    query.awaitTermination(300)
    assert query.exception() is None
    rows = {r["offset"]: r for r in spark.read.parquet(str(output)).collect()}
    assert sorted(rows) == [0, 1, 2, 3, 4, 5, 6, 8]
    # Without an id (none, empty or null), a record is its topic-partition-offset, as the
    # clients read it.
    for offset in (0, 1, 2, 3):
        assert rows[offset]["msg_id"] == f"{topic}-0-{offset}"
    assert rows[4]["body"] is None
    assert bytes(rows[5]["body"]) == b""
    # An id that is not UTF-8 is no id either, as the clients read it (other bytes are kept).
    assert rows[5]["msg_id"] == f"{topic}-0-5" and rows[5]["tags"] == "\ufffd"
    assert rows[6]["msg_id"] == "dup"
    assert rows[8]["msg_id"] == "b"


def envelope(tid: str, *, checks: str = "0") -> bytes:
    """A half message of producer group ``pg`` for topic ``orders``, as the HALF topic holds."""
    return default_registry().encode(
        "MessageEnvelope",
        {
            "msg_id": tid,
            "body": b"b",
            "properties": {
                "__transactionId__": tid,
                "PGROUP": "pg",
                "REAL_TOPIC": "orders",
                "TRANSACTION_CHECK_TIMES": checks,
            },
            "born_timestamp_ms": int(time.time() * 1000) - 1000,
        },
    )


def op_record(tid: str, action: str) -> bytes:
    """A decision on the half message of transaction ``tid``, as the OP topic holds."""
    return default_registry().encode(
        "OpRecord",
        {
            "half_partition": 0,
            "half_offset": 0,
            "transaction_id": tid,
            "msg_id": tid,
            "producer_group": "pg",
            "action": action,
            "decided_at_ms": int(time.time() * 1000),
        },
    )


def test_transaction_audit_counts_records_it_cannot_read_and_audits_the_others(
    spark: SparkSession, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    half = f"{namespace}.RMQ_SYS_TRANS_HALF_TOPIC"
    op = f"{namespace}.RMQ_SYS_TRANS_OP_HALF_TOPIC"
    check_max = f"{namespace}.TRANS_CHECK_MAX_TIME_TOPIC"
    envelope_fingerprint = default_registry().latest("MessageEnvelope").fingerprint
    hostile: list[bytes | None] = [
        None,  # a tombstone
        b"not avro",
        SINGLE_OBJECT_MARKER + bytes(8) + b"body",  # a schema nobody knows
        SINGLE_OBJECT_MARKER + envelope_fingerprint + b"\xff\xff\xff\xff\xff\x7f",
        envelope("cut")[:-3],
    ]
    produce_raw(
        kafka_bootstrap,
        [(half, envelope("t-commit"), []), (half, envelope("t-open", checks="lots"), [])]
        + [(half, v, []) for v in hostile]
        + [(op, op_record("t-commit", "COMMIT"), [])]
        + [(op, v, []) for v in hostile]
        + [(check_max, v, []) for v in hostile],
    )
    with caplog.at_level(logging.WARNING, logger="spark_jobs.transaction_audit"):
        rows = transaction_audit.transaction_audit(spark, kafka_bootstrap, namespace, {})
    assert rows == [
        transaction_audit.AuditRow("pg", "orders", 1, 0, 1, 0, 0, 0.0, rows[0].decision_p50_ms,
                                   rows[0].decision_p99_ms)
    ]  # fmt: skip
    left_out = {r.getMessage() for r in caplog.records}
    for topic in (half, check_max):
        assert f"{topic}: left out 1 record(s): a null value (a tombstone)" in left_out
        assert f"{topic}: left out 1 record(s): not in Avro single object encoding" in left_out
        assert (
            f"{topic}: left out 1 record(s): an unknown schema fingerprint 0000000000000000"
            in left_out
        )
        assert (
            f"{topic}: left out 2 record(s): a MessageEnvelope record that does not decode"
            in left_out
        )
    assert f"{op}: left out 2 record(s): a MessageEnvelope record, not a OpRecord one" in left_out


def test_dlq_report_counts_retry_records_with_malformed_properties(
    spark: SparkSession, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = f"ns{uuid.uuid4().hex[:10]}"
    retry = f"{namespace}.RETRY.g"
    dlq = f"{namespace}.DLQ.g"
    unnamed = f"{namespace}.DLQ.g_zz"  # no escaped group: made by another tool
    origin = ("RETRY_TOPIC", b"orders")
    produce_raw(
        kafka_bootstrap,
        [
            (retry, b"x", [origin, ("RECONSUME_TIME", b"1")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", b"abc")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", b"2.5")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", b"-1")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", b"99999999999")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", b"\xff")]),
            (retry, b"x", [origin, ("RECONSUME_TIME", None)]),
            (retry, b"x", [("RETRY_TOPIC", b""), ("RECONSUME_TIME", b"1")]),
            (retry, None, None),
            (dlq, b"x", [origin, ("RECONSUME_TIME", b"3")]),
            (unnamed, b"x", [origin, ("RECONSUME_TIME", b"3")]),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="spark_jobs.dlq_report"):
        rows = dlq_report.dlq_report(spark, kafka_bootstrap, namespace, {})
    # A count property that is not 1 to 18 digits reads as 0, as the clients read it.
    assert {(r.group, r.kind, r.origin_topic, r.reconsume_times): r.count for r in rows} == {
        ("g", "retry", "orders", 1): 1,
        ("g", "retry", "orders", 0): 5,
        ("g", "retry", "orders", 99999999999): 1,
        ("g", "retry", "?", 1): 1,
        ("g", "retry", "?", 0): 1,
        ("g", "dlq", "orders", 3): 1,
        ("?", "dlq", "orders", 3): 1,
    }
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"topic {unnamed} names no consumer group")
    assert "its 1 record(s) are counted under group '?'" in warning
