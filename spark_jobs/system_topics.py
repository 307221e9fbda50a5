"""Batch reads of system topics, and their Avro records decoded with Spark's Avro support.

System records use Avro single-object encoding: ``C3 01``, the schema's 8-byte CRC-64-AVRO
fingerprint, then the Avro body. Each known version of a schema (``topics/schemas``) decodes
the rows carrying its fingerprint; the versions' rows are unioned, so old records still read
after a schema evolves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from spark_jobs.common import batch_read, topics_exist
from topics.avro import HEADER_LENGTH, SINGLE_OBJECT_MARKER, default_registry

logger = logging.getLogger(__name__)


def read_topic(
    spark: SparkSession,
    bootstrap_servers: str,
    kafka_topic: str,
    *,
    security: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every committed record of ``kafka_topic`` now (a batch read); ``security``: Spark Kafka
    source options (None: from the environment, see
    :func:`spark_jobs.common.kafka_security_options`). A topic that does not exist reads as
    empty, with a warning naming it: nothing was written there yet, or the namespace is not
    the one meant (Spark's own error is a Java stack trace)."""
    records = batch_read(spark, bootstrap_servers, topics=[kafka_topic], security=security)
    if not topics_exist(records):
        logger.warning(
            "%s does not exist at %s: read as empty (nothing was written to it yet, or the "
            "namespace is not the one meant)",
            kafka_topic,
            bootstrap_servers,
        )
        return spark.createDataFrame([], records.schema)
    return records


def read_pattern(
    spark: SparkSession,
    bootstrap_servers: str,
    pattern: str,
    *,
    security: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every committed record now of the topics matching ``pattern`` (a batch read);
    ``security`` as for :func:`read_topic`."""
    return batch_read(spark, bootstrap_servers, pattern=pattern, security=security)


def schema_versions(name: str) -> list[tuple[str, str]]:
    """(fingerprint hex, schema JSON) of every version of the record schema ``name``."""
    return [
        (v.fingerprint.hex().upper(), json.dumps(v.source))
        for v in default_registry().versions(name)
    ]


_MARKER_HEX = SINGLE_OBJECT_MARKER.hex().upper()
_PERMISSIVE = {"mode": "PERMISSIVE"}
"""A body that does not decode gives null instead of failing the query (``FAILFAST``, Spark's
default): one malformed record must not stop a report on all the others."""


def _fingerprint() -> Column:
    """The record's schema fingerprint in hex (upper case), null when its value is not in
    single object encoding."""
    value = F.col("value")
    return F.when(
        (F.length(value) >= HEADER_LENGTH)
        & (F.hex(F.substring(value, 1, len(SINGLE_OBJECT_MARKER))) == _MARKER_HEX),
        F.hex(F.substring(value, len(SINGLE_OBJECT_MARKER) + 1, 8)),
    )


def _body() -> Column:
    """The Avro body after the single object encoding's header."""
    return F.expr(f"substring(value, {HEADER_LENGTH + 1})")


def _decoded(schema: str) -> Column:
    """The record's body decoded with ``schema`` (JSON); null when it does not decode. Spark's
    permissive mode gives a struct of nulls then, not null: a field that cannot be null in
    Avro (the schema's first one that is not a union) tells them apart."""
    record = from_avro(_body(), schema, _PERMISSIVE)
    required = [f["name"] for f in json.loads(schema)["fields"] if not isinstance(f["type"], list)]
    if not required:
        return record
    return F.when(record[required[0]].isNotNull(), record)


def decode_avro(records: DataFrame, name: str, *keep: str) -> DataFrame:
    """The ``name`` records among Kafka source ``records``, decoded: the schema's fields as
    columns, plus the source columns in ``keep``. Records that are not ``name`` records of a
    known version, or do not decode, are left out: :func:`skipped_records` counts them."""
    fingerprint = _fingerprint()
    parts = []
    for version, schema in schema_versions(name):
        parts.append(
            records.where(fingerprint == F.lit(version))
            .select(*keep, _decoded(schema).alias("r"))
            .where(F.col("r").isNotNull())
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part, allowMissingColumns=True)
    return union.select(*keep, "r.*")


def skipped_records(records: DataFrame, name: str) -> list[tuple[str, int]]:
    """Why records among Kafka source ``records`` are left out by :func:`decode_avro`
    ``(records, name)``: (reason, count) pairs, most frequent first; empty when every record
    decodes. Runs a Spark job: cache ``records`` to read the topic once."""
    fingerprint = _fingerprint()
    registry = default_registry()
    own = schema_versions(name)
    others = {
        v.fingerprint.hex().upper(): other
        for other in sorted(registry.names() - {name})
        for v in registry.versions(other)
    }
    malformed = F.lit(False)
    for version, schema in own:
        malformed = F.when(fingerprint == F.lit(version), _decoded(schema).isNull()).otherwise(
            malformed
        )
    other_schema = F.create_map(*[F.lit(x) for item in others.items() for x in item])
    reason = (
        F.when(F.col("value").isNull(), F.lit("a null value (a tombstone)"))
        .when(fingerprint.isNull(), F.lit("not in Avro single object encoding"))
        .when(
            fingerprint.isin(*[v for v, _ in own]),
            F.when(malformed, F.lit(f"a {name} record that does not decode")),
        )
        .when(
            fingerprint.isin(*others),
            F.concat(F.lit("a "), other_schema[fingerprint], F.lit(f" record, not a {name} one")),
        )
        .otherwise(F.concat(F.lit("an unknown schema fingerprint "), fingerprint))
    )
    rows = (
        records.select(reason.alias("reason"))
        .where(F.col("reason").isNotNull())
        .groupBy("reason")
        .count()
        .orderBy(F.desc("count"), "reason")
        .collect()
    )
    return [(r["reason"], int(r["count"])) for r in rows]
