"""What every job shares: the Spark session with Kafka's source on its class path, reading
topics with ``read_committed``, decoding records into message columns, and reports.

Spark's Kafka source comes from the project's jar cache (filled by Maven, ``bridge fetch
spark``) and is handed to Spark as local jars; ``--spark-jars packages`` uses
``spark.jars.packages`` instead (a machine with internet). Under ``spark-submit`` the driver
is already running, so its ``--jars`` must carry them: ``python -m spark_jobs.jars`` prints
the list from the cache.

Security: the jobs take the same client settings as every other entry point, the
``BRIDGE_KAFKA_*`` variables (librdkafka names) and a Kafka client properties file
(``--command-config`` or ``BRIDGE_COMMAND_CONFIG``), and hand them to Spark as ``kafka.``-prefixed
Java client options (:func:`kafka_security_options`; the mapping is
:mod:`topics.client_security`). The options' values are never logged, and Spark's redaction
covers the JAAS config that holds a password.
"""

from __future__ import annotations

import argparse
import html
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from topics.client_security import ENV_COMMAND_CONFIG, client_settings, spark_kafka_options
from topics.errors import InvalidArgumentError
from topics.errors import TopicNotFoundError as TopicNotFoundError  # noqa: PLC0414 - re-export
from topics.naming import DEFAULT_NAMESPACE
from topics.properties import MessageConst

SPARK_VERSION = "4.0.0"
"""The pinned pyspark version; the Kafka source jars must match it."""
KAFKA_PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
)
DELTA_PACKAGES = ("io.delta:delta-spark_2.13:4.0.0",)
_DELTA_PREFIXES = ("delta-",)  # antlr4 and Scala come with pyspark
_KAFKA_JAR_PREFIXES = (
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
    "spark-avro_",
)
"""What Spark needs beside its own jars (Hadoop and Scala come with pyspark)."""

SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|jaas|keystore[.]key"
"""Spark's ``spark.redaction.regex``: its default, plus the JAAS config and PEM key options
(their values hold a password or a private key)."""

ENV_SPARK_PARTITIONS = "BRIDGE_SPARK_PARTITIONS"
"""Shuffle partitions of the jobs' queries: a positive integer (else an
``InvalidArgumentError`` naming it), 4 by default; a query restarted from its checkpoint keeps
the count it started with."""
ENV_SPARK_JARS = "BRIDGE_SPARK_JARS"
"""Where the jobs' Spark Kafka source comes from (``--spark-jars``): ``cache`` (the jar cache,
as local jars: nothing downloads when it is warm), ``packages`` (``spark.jars.packages``, on a
machine with internet), ``none`` (``spark-submit --jars`` brought them) or ``auto`` (the
default: ``none`` under ``spark-submit``, else ``cache``)."""
DEFAULT_SPARK_PARTITIONS = 4
"""One per core measured no faster on the shared 2-core machine (``python -m bench spark``):
fewer, longer deduplication tasks balance worse against other load."""

SPARK_GROUP_ID_PREFIX = "bridge-spark"
"""Spark's Kafka source names its consumer groups ``bridge-spark-<query id>...``."""

HEADER_MSG_ID = MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
HEADER_TAGS = MessageConst.TAGS
HEADER_KEYS = MessageConst.KEYS
HEADER_BORN_HOST = MessageConst.BORN_HOST
HEADER_COPY_BORN_MS = "BRIDGE_BORN_MS"
"""bridge.codec.BORN_TIMESTAMP_HEADER (the jobs import nothing of ``bridge``)."""
_OWN_HEADERS = (HEADER_MSG_ID, HEADER_TAGS, HEADER_KEYS, HEADER_BORN_HOST)


def kafka_jars(*, delta: bool = False) -> list[Path]:
    """Spark's Kafka source and its dependencies (and Delta Lake's jars if ``delta``) from the
    jar cache, fetched on first use."""
    # Only the local jar cache needs the bridge package (spark-submit --jars does not).
    from bridge.runtime.jars import ensure_jars  # noqa: PLC0415

    libs = ensure_jars("spark")
    jars = sorted(p for p in libs.glob("*.jar") if p.name.startswith(_KAFKA_JAR_PREFIXES))
    if not any(p.name.startswith("spark-sql-kafka") for p in jars):
        raise RuntimeError(f"no spark-sql-kafka jar in {libs}: run `bridge fetch spark`")
    if delta:
        delta_libs = ensure_jars("delta")
        jars += sorted(p for p in delta_libs.glob("*.jar") if p.name.startswith(_DELTA_PREFIXES))
    return jars


def under_spark_submit() -> bool:
    """True when ``spark-submit`` started this Python process (its JVM is already running,
    so jars can no longer be added to the driver: pass ``spark-submit --jars``)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(
    app_name: str, *, jars: str = "auto", master: str | None = None, delta: bool = False
) -> SparkSession:
    """A session able to read Kafka (and write Delta Lake if ``delta``). ``jars``: ``cache``
    (local jars from the cache), ``packages`` (``spark.jars.packages``), ``none`` (given to
    ``spark-submit --jars``), or ``auto``: ``none`` under ``spark-submit``, else ``cache``."""
    if jars == "auto":
        jars = "none" if under_spark_submit() else "cache"
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if jars == "cache":
        builder = builder.config("spark.jars", ",".join(str(p) for p in kafka_jars(delta=delta)))
    elif jars == "packages":
        packages = KAFKA_PACKAGES + (DELTA_PACKAGES if delta else ())
        builder = builder.config("spark.jars.packages", ",".join(packages))
    elif jars != "none":
        raise InvalidArgumentError(f"jars must be cache, packages or none, got {jars!r}")
    if delta:
        builder = builder.config(
            "spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"
        ).config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
    return (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.redaction.regex", SPARK_REDACTION_REGEX)
        # Kafka headers may repeat a name; the last one wins, as in the Python client.
        .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions(os.environ)))
        .getOrCreate()
    )


def shuffle_partitions(environ: Mapping[str, str]) -> int:
    """Partitions of a shuffle (the ingest's deduplication by message id, the reports'
    aggregations): ``BRIDGE_SPARK_PARTITIONS``, else 4. A query restarted from a checkpoint
    keeps the count it started with (Spark reads it from the checkpoint). A value that is not
    a positive integer raises :class:`InvalidArgumentError` naming the variable."""
    given = environ.get(ENV_SPARK_PARTITIONS, "").strip()
    if not given:
        return DEFAULT_SPARK_PARTITIONS
    try:
        partitions = int(given)
    except ValueError:
        partitions = 0
    if partitions < 1:
        raise InvalidArgumentError(
            f"{ENV_SPARK_PARTITIONS} must be a positive integer, got {given!r}"
        )
    return partitions


def kafka_security_options(
    command_config: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Spark Kafka source options (``kafka.``-prefixed) for the client settings of
    ``environ`` (default: this process's environment): ``BRIDGE_KAFKA_*``, then the properties
    file ``command_config`` or, if None, the one ``BRIDGE_COMMAND_CONFIG`` names. A setting
    with no Java counterpart raises :class:`topics.client_security.ClientPropertyError` naming
    it. The values include secrets: never log them."""
    env = os.environ if environ is None else environ
    return spark_kafka_options(client_settings(env, command_config))


def kafka_options(
    bootstrap_servers: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    security: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Kafka source options: committed data only, headers included, from the earliest, with
    the ``security`` options (:func:`kafka_security_options`; None: read from the environment
    now). The result holds secrets: never log it."""
    if bool(topics) == bool(pattern):
        raise InvalidArgumentError("give either topics or a pattern")
    options = {
        **(kafka_security_options() if security is None else security),
        "kafka.bootstrap.servers": bootstrap_servers,
        # Spark and the Java client default to read_uncommitted: they would see aborted and
        # not-yet-committed transactional records.
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
        "startingOffsets": "earliest",
        # Spark's consumer groups start with this (the ACL: GROUP prefixed bridge-spark-).
        "groupIdPrefix": SPARK_GROUP_ID_PREFIX,
    }
    if topics:
        options["subscribe"] = ",".join(topics)
    else:
        options["subscribePattern"] = str(pattern)
    return options


def batch_read(
    spark: SparkSession,
    bootstrap_servers: str,
    *,
    topics: Sequence[str] = (),
    pattern: str | None = None,
    security: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every committed record now of ``topics`` or of the topics matching ``pattern`` (a
    batch read, not run yet); options as for :func:`kafka_options`."""
    options = kafka_options(bootstrap_servers, topics=topics, pattern=pattern, security=security)
    options["endingOffsets"] = "latest"
    return spark.read.format("kafka").options(**options).load()


def topics_exist(records: DataFrame) -> bool:
    """Whether every topic a :func:`batch_read` of named topics reads exists: the read is
    planned, which lists the partitions and reads nothing (a missing topic fails in Spark's
    Kafka source with a Java stack trace, after its retries: about 4 s)."""
    try:
        records.rdd.getNumPartitions()
    except Py4JJavaError as exc:
        if "UnknownTopicOrPartitionException" in str(exc.java_exception):
            return False
        raise
    return True


_HEADERS_AS_STRINGS = "array<struct<key:string,value:string>>"
"""Kafka headers with their values as (UTF-8) strings: one cast, compiled with the rest of
the projection (a ``transform`` lambda is evaluated row by row, outside Spark's generated
code)."""


def header_map(headers: Column) -> Column:
    """Kafka headers (array of key/binary value) as a map of strings (a repeated name: the
    last one wins, ``spark.sql.mapKeyDedupPolicy``)."""
    return F.map_from_entries(F.coalesce(headers, F.array()).cast(_HEADERS_AS_STRINGS))


def count_property(value: Column) -> Column:
    """A count property (``RECONSUME_TIME``, ``TRANSACTION_CHECK_TIMES``) as a long, read as the
    clients read it (``bridge.property_values.parse_count(...) or 0``): 1 to 18 ASCII digits,
    anything else (missing, empty, signed, spaced, not a number) 0. Spark 4 casts with ANSI
    semantics, where a plain ``cast`` of ``"abc"`` fails the whole query."""
    return F.when(value.rlike(r"^[0-9]{1,18}\z"), value.try_cast("long")).otherwise(F.lit(0))


def decode_messages(records: DataFrame) -> DataFrame:
    """Kafka source rows as messages: ``msg_id`` (``UNIQ_KEY``, else, as the clients do for a
    missing or empty one, topic-partition-offset),
    ``topic``, ``partition``, ``offset``, ``key``, ``body``, ``tags``, ``keys``, ``properties``
    (the user's and system ones), ``born_host``, ``born_timestamp`` and ``store_timestamp``
    (the record time when the topic stores append times or the record is a copy written after
    its message was born), ``ingested_at``.

    The header map is built once per row, in a projection of its own (Spark keeps it apart
    rather than building it again for each column that reads it); only ``properties`` needs a
    lambda (``map_filter``), evaluated outside Spark's generated code."""
    props = F.col("_props")
    create_time = F.col("timestampType") == F.lit(0)
    # A copy written after its message was born (a delivery, a dead letter, a replay) carries
    # the born time as its first header, and its timestamp is when it was written
    # (bridge.codec.stamped_copy); its other headers are the message's.
    headers = F.col("headers")
    first = F.try_element_at(headers, F.lit(1))
    copied_born = F.when(
        first["key"] == F.lit(HEADER_COPY_BORN_MS), count_property(first["value"].cast("string"))
    ).otherwise(F.lit(0))
    message_headers = F.when(copied_born > 0, F.slice(headers, 2, F.size(headers))).otherwise(
        headers
    )
    born = F.col("_copied_born")
    with_props = records.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("key"),
        F.col("value"),
        F.col("timestamp"),
        F.col("timestampType"),
        header_map(message_headers).alias("_props"),
        copied_born.alias("_copied_born"),
    )
    return with_props.select(
        # An empty UNIQ_KEY or one that is not UTF-8 (another Kafka client's record) is no
        # id, as the clients read it: as the same id (or the same text once shown), such
        # records would be deduplicated into one row, and the clients would name them apart.
        F.when(
            (props[HEADER_MSG_ID] != F.lit("")) & F.is_valid_utf8(props[HEADER_MSG_ID]),
            props[HEADER_MSG_ID],
        )
        .otherwise(F.concat_ws("-", F.col("topic"), F.col("partition"), F.col("offset")))
        .alias("msg_id"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("key").cast("string").alias("key"),
        F.col("value").alias("body"),
        props[HEADER_TAGS].alias("tags"),
        props[HEADER_KEYS].alias("keys"),
        F.map_filter(props, lambda k, v: ~k.isin(*_OWN_HEADERS)).alias("properties"),
        props[HEADER_BORN_HOST].alias("born_host"),
        F.when(born > 0, F.timestamp_millis(born))
        .when(create_time, F.col("timestamp"))
        .alias("born_timestamp"),
        F.when((born > 0) | ~create_time, F.col("timestamp")).alias("store_timestamp"),
        F.current_timestamp().alias("ingested_at"),
    )


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers``, ``--namespace``, ``--jars``, ``--master``: the same names and
    environment variables as the ``bridge`` command line."""
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka (env KAFKA_BOOTSTRAP_SERVERS)",
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("BRIDGE_NAMESPACE", DEFAULT_NAMESPACE),
        help="system topic namespace (env BRIDGE_NAMESPACE)",
    )
    parser.add_argument(
        "--spark-jars",
        dest="jars",
        choices=("auto", "cache", "packages", "none"),
        default=os.environ.get(ENV_SPARK_JARS, "auto"),
        help="where Spark's Kafka source comes from: the jar cache, spark.jars.packages, or "
        "spark-submit --jars (auto: the latter under spark-submit, else the cache; "
        "env BRIDGE_SPARK_JARS)",
    )
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")


def add_security_argument(parser: argparse.ArgumentParser) -> None:
    """``--command-config FILE``: a Kafka client properties file, as Kafka's tools take (env
    ``BRIDGE_COMMAND_CONFIG``); pass ``kafka_security_options(args.command_config)`` on."""
    parser.add_argument(
        "--command-config",
        default=os.environ.get(ENV_COMMAND_CONFIG) or None,
        metavar="FILE",
        help="Kafka client properties file (security settings; librdkafka or Java client names; "
        f"env {ENV_COMMAND_CONFIG}); BRIDGE_KAFKA_* variables are read too",
    )


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Print rows as an aligned text table; return the text."""
    data = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in data]) for i, c in enumerate(columns)]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in data]
    text = "\n".join(lines)
    print(text)
    return text


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


_COLOURS = ("#2e7d32", "#c62828", "#f9a825", "#6a1b9a", "#1565c0", "#ef6c00", "#00838f")


def write_bar_chart(
    path: Path, title: str, bars: Sequence[tuple[str, Mapping[str, float]]]
) -> Path:
    """A self-contained HTML page with a stacked horizontal bar per label (inline SVG)."""
    segments = sorted({s for _, parts in bars for s in parts})
    colour = {s: _COLOURS[i % len(_COLOURS)] for i, s in enumerate(segments)}
    widest = max((sum(parts.values()) for _, parts in bars), default=0) or 1
    row_h, label_w, bar_w = 28, 360, 560
    height = row_h * (len(bars) + 2)
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 80}" '
        f'height="{height}" font-family="sans-serif" font-size="13">'
    ]
    for i, (label, parts) in enumerate(bars):
        y = row_h * i + 6
        svg.append(f'<text x="0" y="{y + 15}">{html.escape(label)}</text>')
        x = float(label_w)
        for segment in segments:
            value = parts.get(segment, 0)
            if not value:
                continue
            w = bar_w * value / widest
            svg.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 10}" '
                f'fill="{colour[segment]}"><title>{html.escape(segment)}: {value:g}</title></rect>'
            )
            x += w
        svg.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{sum(parts.values()):g}</text>')
    legend_y = row_h * len(bars) + 20
    for i, segment in enumerate(segments):
        x = label_w + i * 140
        svg.append(
            f'<rect x="{x}" y="{legend_y - 11}" width="12" height="12" fill="{colour[segment]}"/>'
        )
        svg.append(f'<text x="{x + 16}" y="{legend_y}">{html.escape(segment)}</text>')
    svg.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<h2 style='font-family:sans-serif'>{html.escape(title)}</h2>{''.join(svg)}\n"
    )
    return path
