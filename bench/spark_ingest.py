"""Spark ingest throughput against a plain Spark Kafka-to-Parquet copy of the same topic.

Both read the same topic (4 partitions, 100-byte bodies with the usual headers) from the
start with ``read_committed`` in one ``availableNow`` run into a fresh Parquet table: ours
decodes every record into message columns and drops duplicate message ids; the copy writes
the Kafka source's columns as they are. One unmeasured run of each warms the JVM up; then
rounds alternate and medians are shown.

Both run in one ``local[*]`` session, one task slot per core, as the jobs run by default. More
slots than cores sped the copy up more than the ingest on the shared 2-core machine (ratio
medians of 9 alternating rounds: 0.70 with ``local[*]``, 0.68 with ``local[3]``, 0.56 with
``local[4]``), so the figure stays at the jobs' default.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.harness import Row, interleaved_rates, print_rows
from bridge import ClientConfig, Message, Producer
from bridge.kafka.admin import TopicAdmin
from spark_jobs.common import kafka_options, spark_session
from spark_jobs.ingest import IngestConfig, start_ingest
from topics.catalog import TopicSpec

MESSAGES = int(os.environ.get("BENCH_SPARK_MESSAGES", "300000"))
ROUNDS = int(os.environ.get("BENCH_SPARK_ROUNDS", "3"))


def run(bootstrap: str) -> None:
    """Measure and print."""
    config = ClientConfig(bootstrap_servers=bootstrap)
    topic = f"bench-ingest-{uuid.uuid4().hex[:6]}"
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 4)])
    with Producer("bench_spark_fill", config=config) as producer:
        for i in range(MESSAGES):
            producer.send_async(Message(topic, b"x" * 100, keys=f"k{i}", tags="TagA"))
        producer.flush(60_000)
    spark = spark_session("bridge-bench", master="local[*]")
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="bridge-bench-spark-") as tmp:

        def ours() -> tuple[int, float]:
            out = Path(tmp) / uuid.uuid4().hex
            started = time.perf_counter()
            query = start_ingest(
                spark,
                IngestConfig(
                    bootstrap_servers=bootstrap,
                    output=str(out / "t"),
                    checkpoint=str(out / "c"),
                    topics=(topic,),
                ),
            )
            query.awaitTermination()
            return MESSAGES, time.perf_counter() - started

        def copy() -> tuple[int, float]:
            out = Path(tmp) / uuid.uuid4().hex
            started = time.perf_counter()
            query = (
                spark.readStream.format("kafka")
                .options(**kafka_options(bootstrap, topics=[topic]))
                .load()
                .writeStream.format("parquet")
                .option("path", str(out / "t"))
                .option("checkpointLocation", str(out / "c"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            return MESSAGES, time.perf_counter() - started

        measures: dict[str, Callable[[], tuple[int, float]]] = {"ours": ours, "copy": copy}
        ours()  # warm-up: the JVM compiles the Kafka source and Parquet writer paths
        copy()
        rates = interleaved_rates(ROUNDS, measures)
    spark.stop()
    print_rows(
        f"Spark ingest ({MESSAGES:,} messages x 100 B, 4 partitions, availableNow)",
        [
            Row(
                "ingest to Parquet",
                "rows/s",
                rates["ours"],
                rates["copy"],
                "plain Kafka-to-Parquet copy",
            )
        ],
    )
