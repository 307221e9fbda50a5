"""Batch reads of system topics, and their Avro records decoded with Spark's Avro support.

System records use Avro single-object encoding: ``C3 01``, the schema's 8-byte CRC-64-AVRO
fingerprint, then the Avro body. Each known version of a schema (``topics/schemas``) decodes
the rows carrying its fingerprint; the versions' rows are unioned, so old records still read
after a schema evolves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from spark_jobs.common import kafka_options
from topics.avro import HEADER_LENGTH, SINGLE_OBJECT_MARKER, default_registry


def read_topic(
    spark: SparkSession,
    bootstrap_servers: str,
    kafka_topic: str,
    *,
    security: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every committed record of ``kafka_topic`` now (a batch read); ``security``: Spark Kafka
    source options (None: from the environment, see
    :func:`spark_jobs.common.kafka_security_options`)."""
    options = kafka_options(bootstrap_servers, topics=[kafka_topic], security=security)
    options["endingOffsets"] = "latest"
    return spark.read.format("kafka").options(**options).load()


def read_pattern(
    spark: SparkSession,
    bootstrap_servers: str,
    pattern: str,
    *,
    security: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every committed record now of the topics matching ``pattern`` (a batch read);
    ``security`` as for :func:`read_topic`."""
    options = kafka_options(bootstrap_servers, pattern=pattern, security=security)
    options["endingOffsets"] = "latest"
    return spark.read.format("kafka").options(**options).load()


def schema_versions(name: str) -> list[tuple[str, str]]:
    """(fingerprint hex, schema JSON) of every version of the record schema ``name``."""
    return [
        (v.fingerprint.hex().upper(), json.dumps(v.source))
        for v in default_registry().versions(name)
    ]


def decode_avro(records: DataFrame, name: str, *keep: str) -> DataFrame:
    """The ``name`` records among Kafka source ``records``, decoded: the schema's fields as
    columns, plus the source columns in ``keep``. Rows of other schemas are left out."""
    header = F.hex(F.substring(F.col("value"), 1, HEADER_LENGTH))
    body = F.expr(f"substring(value, {HEADER_LENGTH + 1})")
    marker = SINGLE_OBJECT_MARKER.hex().upper()
    parts = []
    for fingerprint, schema in schema_versions(name):
        parts.append(
            records.where(header == F.lit(marker + fingerprint)).select(
                *keep, from_avro(body, schema).alias("r")
            )
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part, allowMissingColumns=True)
    return union.select(*keep, "r.*")
