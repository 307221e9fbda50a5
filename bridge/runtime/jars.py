"""Fetch Java artifacts (the Kafka broker, Spark's Kafka source) from Maven into a cache.

Nothing is committed: a generated ``pom.xml`` and ``mvn dependency:copy-dependencies`` fill
``<cache>/jars/<set>-<version>/libs``; a marker file records a complete fetch, so a warm cache
costs nothing. The cache is ``$BRIDGE_CACHE_DIR`` if set, else ``.cache/`` of the source
checkout (git-ignored), else ``~/.cache/rocketmq-kafka-bridge``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final
from xml.sax.saxutils import escape

from bridge.errors import ArtifactFetchError, MissingToolError

logger = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
"""The Apache Kafka release the local broker runs."""
LOG4J_VERSION = "2.24.3"
"""log4j-core's version in Kafka 4.1.1; the slf4j 1.7 binding must match it."""
SPARK_VERSION = "4.0.0"
"""Must equal the pinned pyspark version: the newest Spark whose Kafka source, its token
provider and spark-avro all resolve from the package registry this project uses."""

DELTA_VERSION = "4.0.0"
"""The Delta Lake release built for Spark 4.0 (the ingest job's ``--format delta``)."""

ROCKETMQ_VERSION = "5.3.3"
"""The Apache RocketMQ release the side-by-side runs compare against (name server, broker and
the remoting client the differential driver is compiled with): the newest 5.3 release whose
jars all resolve from the package registry this project uses (5.3.4 lacks some)."""
ROCKETMQ_CLIENT_V5_VERSION = "5.2.0"
"""RocketMQ 5's Java gRPC client (apache/rocketmq-clients), the newest release on Maven Central:
the differential suite's SimpleConsumer and FIFO message group workloads go through it and the
proxy (set ``rocketmq-proxy``). It ships shaded (gRPC, protobuf and Netty inside), so it is a set
of its own, never on one class path with the broker's jars."""

_MAVEN_TIMEOUT_S = 900
JAVA_HINT = "a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"


@dataclass(frozen=True, slots=True)
class ArtifactSet:
    """A named set of Maven coordinates resolved together with their runtime dependencies."""

    name: str
    version: str
    coordinates: tuple[str, ...]
    """``group:artifact:version`` strings."""


ARTIFACT_SETS: Mapping[str, ArtifactSet] = MappingProxyType(
    {
        "kafka": ArtifactSet(
            "kafka",
            KAFKA_VERSION,
            (
                f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
                # Kafka 4 logs through slf4j 1.7 into log4j2.
                f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
            ),
        ),
        "spark": ArtifactSet(
            "spark",
            SPARK_VERSION,
            (
                f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
                f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
            ),
        ),
        "delta": ArtifactSet(
            "delta",
            DELTA_VERSION,
            (f"io.delta:delta-spark_2.13:{DELTA_VERSION}",),
        ),
        "rocketmq": ArtifactSet(
            "rocketmq",
            ROCKETMQ_VERSION,
            (
                f"org.apache.rocketmq:rocketmq-namesrv:{ROCKETMQ_VERSION}",
                f"org.apache.rocketmq:rocketmq-broker:{ROCKETMQ_VERSION}",
                f"org.apache.rocketmq:rocketmq-client:{ROCKETMQ_VERSION}",
            ),
        ),
        # The gRPC proxy of RocketMQ 5 (it brings the broker with it): run in local mode, the
        # proxy and the broker share one JVM (``bridge.runtime.rocketmq``, ``proxy=True``).
        "rocketmq-proxy": ArtifactSet(
            "rocketmq-proxy",
            ROCKETMQ_VERSION,
            (
                f"org.apache.rocketmq:rocketmq-proxy:{ROCKETMQ_VERSION}",
                f"org.apache.rocketmq:rocketmq-namesrv:{ROCKETMQ_VERSION}",
            ),
        ),
        "rocketmq-client-v5": ArtifactSet(
            "rocketmq-client-v5",
            ROCKETMQ_CLIENT_V5_VERSION,
            (f"org.apache.rocketmq:rocketmq-client-java:{ROCKETMQ_CLIENT_V5_VERSION}",),
        ),
    }
)


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "bridge").is_dir():
        return root
    return None


ENV_CACHE_DIR: Final = "BRIDGE_CACHE_DIR"
"""Where the jars and the local broker's data go; default: ``.cache/`` of the source checkout
(git-ignored), else ``~/.cache/rocketmq-kafka-bridge``."""


def cache_dir() -> Path:
    """The cache directory (created on demand)."""
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured:
        path = Path(configured)
    else:
        root = _checkout_root()
        path = root / ".cache" if root else Path.home() / ".cache" / "rocketmq-kafka-bridge"
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_tool(name: str, install_hint: str) -> str:
    """The path of program ``name``, or :class:`MissingToolError` naming what to install."""
    found = shutil.which(name)
    if found is None:
        raise MissingToolError(f"'{name}' was not found on PATH: install {install_hint}")
    return found


SHADOWED_REPOSITORIES = ("gcs-maven-central-mirror",)
"""Repository ids that dependency POMs declare (Spark's parent POM lists a mirror first) and
that Maven must not try: on a network that only reaches the configured registry, Maven 3.8
aborts on the first unreachable repository instead of trying the next one. Declaring the same
id, disabled, in the project POM shadows it; Maven's own configured repositories remain."""


def _pom(artifacts: ArtifactSet) -> str:
    deps = []
    for coordinate in artifacts.coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            "    <dependency>"
            f"<groupId>{escape(group)}</groupId><artifactId>{escape(artifact)}</artifactId>"
            f"<version>{escape(version)}</version></dependency>"
        )
    shadowed = [
        f"    <repository><id>{escape(repo_id)}</id><url>file:///nonexistent</url>"
        "<releases><enabled>false</enabled></releases>"
        "<snapshots><enabled>false</enabled></snapshots></repository>"
        for repo_id in SHADOWED_REPOSITORIES
    ]
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>local.rocketmq-kafka-bridge</groupId>\n"
        f"  <artifactId>{artifacts.name}-runtime</artifactId>\n"
        f"  <version>{artifacts.version}</version>\n"
        "  <packaging>pom</packaging>\n"
        "  <repositories>\n" + "\n".join(shadowed) + "\n  </repositories>\n"
        "  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</project>\n"
    )


def jar_dir(name: str) -> Path:
    """Where the set ``name`` is (or would be) cached."""
    artifacts = ARTIFACT_SETS[name]
    return cache_dir() / "jars" / f"{artifacts.name}-{artifacts.version}" / "libs"


def ensure_jars(name: str) -> Path:
    """Fetch the artifact set ``name`` (a key of :data:`ARTIFACT_SETS`) unless
    cached; return its ``libs`` directory. Raises :class:`MissingToolError` without Maven or
    Java and :class:`ArtifactFetchError` when Maven fails (its output's tail is in the
    message)."""
    if name not in ARTIFACT_SETS:
        raise ArtifactFetchError(f"unknown artifact set {name!r}; known: {sorted(ARTIFACT_SETS)}")
    libs = jar_dir(name)
    marker = libs.parent / ".complete"
    if marker.is_file() and any(libs.glob("*.jar")):
        return libs
    require_tool("java", JAVA_HINT)
    mvn = require_tool("mvn", "Apache Maven 3.6+ (Debian: apt-get install maven)")
    work = libs.parent
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(_pom(ARTIFACT_SETS[name]))
    if libs.exists():
        shutil.rmtree(libs)
    logger.info("fetching %s jars into %s (first run only)", name, libs)
    try:
        proc = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-U",  # retry artifacts a failed earlier attempt marked missing
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={libs}",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=_MAVEN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ArtifactFetchError(f"mvn did not finish within {_MAVEN_TIMEOUT_S} s") from exc
    if proc.returncode != 0 or not any(libs.glob("*.jar")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise ArtifactFetchError(
            f"mvn failed to fetch the {name} jars (exit {proc.returncode}):\n{tail}"
        )
    marker.write_text("\n".join(sorted(p.name for p in libs.glob("*.jar"))) + "\n")
    return libs
