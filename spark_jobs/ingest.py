"""Ingest: land the committed messages of real topics in a table, exactly once.

A Structured Streaming query reads real topics with ``read_committed`` (so rolled-back and
undecided transactional messages never appear), decodes each record into message columns
(see :func:`spark_jobs.common.decode_messages`), drops any message id already landed, and
appends to Parquet (default) or Delta Lake (``--format delta``: the session gets Delta's
jars and extensions). The checkpoint holds the Kafka offsets, the ids
seen and the sink's commit log, so a query stopped at any point and restarted neither loses
nor duplicates a row.

Triggers: ``available-now`` lands what is there and stops; ``continuous`` runs until stopped,
one micro-batch every ``--interval`` (Spark's experimental continuous-processing mode cannot
deduplicate or write files, so it is not offered)::

    python -m spark_jobs.ingest --output /data/messages --checkpoint /data/ckpt/messages
    spark-submit --jars "$(python -m spark_jobs.jars)" spark_jobs/ingest.py --output ...
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

if __package__ in (None, ""):  # spark-submit runs the file as a script
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

from spark_jobs.common import (
    TopicNotFoundError,
    add_common_arguments,
    add_security_argument,
    batch_read,
    decode_messages,
    kafka_options,
    kafka_security_options,
    spark_session,
    topics_exist,
)
from topics.errors import InvalidArgumentError
from topics.naming import DEFAULT_NAMESPACE, real_topics_pattern

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "delta")
TRIGGERS = ("available-now", "continuous")


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """What to read and where to land it."""

    bootstrap_servers: str
    output: str
    """The table's path."""
    checkpoint: str
    """The query's checkpoint path: keep it with the table; a new one starts over."""
    topics: tuple[str, ...] = ()
    """Kafka topics to read; empty: every real topic (see ``namespace``)."""
    namespace: str = DEFAULT_NAMESPACE
    """With no ``topics``: every topic outside this namespace (and Kafka's own)."""
    table_format: str = "parquet"
    trigger: str = "available-now"
    interval: str = "10 seconds"
    """Micro-batch interval of the continuous trigger."""
    dedup_window: str | None = None
    """None: drop every id seen before, whenever (state grows with the ids). A duration
    (``"7 days"``): remember ids that long after their born time, bounded state; a message
    born longer ago than that behind the newest is dropped as late."""
    max_offsets_per_trigger: int | None = None
    query_name: str = "bridge_ingest"
    security: Mapping[str, str] | None = field(default=None, repr=False)
    """Spark Kafka source security options (``kafka.``-prefixed, see
    :func:`spark_jobs.common.kafka_security_options`); None: read from the environment when
    the query starts. Secrets: left out of the repr."""

    def __post_init__(self) -> None:
        if self.table_format not in FORMATS:
            raise InvalidArgumentError(
                f"table_format must be one of {FORMATS}, got {self.table_format!r}"
            )
        if self.trigger not in TRIGGERS:
            raise InvalidArgumentError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}")
        if not self.output or not self.checkpoint:
            raise InvalidArgumentError("output and checkpoint paths are required")


def start_ingest(spark: SparkSession, config: IngestConfig) -> StreamingQuery:
    """Start the ingest query (see the module docstring); the caller awaits or stops it. A
    topic of ``config.topics`` that does not exist raises :class:`TopicNotFoundError` naming
    it, before anything starts."""
    missing = [
        t
        for t in config.topics
        if not topics_exist(
            batch_read(spark, config.bootstrap_servers, topics=[t], security=config.security)
        )
    ]
    if missing:
        raise TopicNotFoundError(
            f"topics {missing} do not exist at {config.bootstrap_servers}: nothing to ingest "
            "from them (leave --topics out to read every real topic)"
        )
    options = kafka_options(
        config.bootstrap_servers,
        topics=config.topics,
        pattern=None if config.topics else real_topics_pattern(config.namespace),
        security=config.security,
    )
    if config.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(config.max_offsets_per_trigger)
    records = spark.readStream.format("kafka").options(**options).load()
    messages = decode_messages(records)
    if config.dedup_window:
        messages = messages.withWatermark(
            "born_timestamp", config.dedup_window
        ).dropDuplicatesWithinWatermark(["msg_id"])
    else:
        messages = messages.dropDuplicates(["msg_id"])
    writer = (
        messages.writeStream.format(config.table_format)
        .queryName(config.query_name)
        .outputMode("append")
        .option("checkpointLocation", config.checkpoint)
        .option("path", config.output)
    )
    if config.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=config.interval)
    return writer.start()


def parser() -> argparse.ArgumentParser:
    """The command line (options also read the ``bridge`` CLI's environment variables)."""
    p = argparse.ArgumentParser(prog="spark_jobs.ingest", description=__doc__.split("\n")[0])
    add_common_arguments(p)
    add_security_argument(p)
    p.add_argument("--output", required=True, help="table path")
    p.add_argument("--checkpoint", required=True, help="checkpoint path")
    p.add_argument("--topics", default="", help="comma-separated Kafka topics (default: all real)")
    p.add_argument("--format", dest="table_format", choices=FORMATS, default="parquet")
    p.add_argument("--trigger", choices=TRIGGERS, default="available-now")
    p.add_argument("--interval", default="10 seconds", help="continuous micro-batch interval")
    p.add_argument("--dedup-window", default=None, help='e.g. "7 days" (default: unbounded)')
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    return p


def config_from_args(args: argparse.Namespace) -> IngestConfig:
    """The :class:`IngestConfig` the parsed command line asks for."""
    return IngestConfig(
        bootstrap_servers=args.bootstrap_servers,
        output=args.output,
        checkpoint=args.checkpoint,
        topics=tuple(t for t in args.topics.split(",") if t),
        namespace=args.namespace,
        table_format=args.table_format,
        trigger=args.trigger,
        interval=args.interval,
        dedup_window=args.dedup_window,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        security=kafka_security_options(args.command_config),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = config_from_args(args)
    spark = spark_session(
        "bridge-ingest", jars=args.jars, master=args.master, delta=config.table_format == "delta"
    )
    query = start_ingest(spark, config)
    logger.info("ingest query %s started (%s)", query.id, config.trigger)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    progress = query.lastProgress
    if progress:
        logger.info("last batch: %s rows", progress.get("numInputRows"))


if __name__ == "__main__":
    main()
