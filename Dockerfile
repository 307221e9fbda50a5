# Images of the compose stack (see docker-compose.yml).
#   docker build --target coordinator -t rocketmq-kafka-bridge:0.1.0 .
#   docker build --target ingest -t rocketmq-kafka-bridge-ingest:0.1.0 .
# A named Debian release, not a floating tag: python:3.11-slim moved to Debian 13, which has no
# openjdk-17-jre-headless for the ingest image (tests/unit/test_compose.py checks both).
FROM python:3.11-slim-bookworm AS base
WORKDIR /app
COPY pyproject.toml README.md ./
COPY bridge ./bridge
COPY topics ./topics
COPY spark_jobs ./spark_jobs
RUN useradd --system --uid 10001 --create-home bridge

# The coordinator and the command line, with the operator console.
FROM base AS coordinator
RUN pip install --no-cache-dir ".[console]"
USER bridge
ENTRYPOINT ["bridge", "-v"]
CMD ["coordinator"]

# The Spark ingest job: pyspark, a Java runtime, and Spark's Kafka source fetched at build
# time into the image's Ivy cache, so nothing downloads when the job starts.
FROM base AS ingest
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir ".[spark]"
USER bridge
ENV BRIDGE_SPARK_JARS=packages
RUN python -c "from spark_jobs.common import spark_session; spark_session('warm-up', jars='packages', master='local[1]').stop()"
ENTRYPOINT ["python", "-m", "spark_jobs.ingest"]
