# The coordinator (and CLI) image: `docker build -t rocketmq-kafka-bridge .`
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY bridge ./bridge
COPY topics ./topics
COPY spark_jobs ./spark_jobs
RUN pip install --no-cache-dir . && useradd --system --uid 10001 bridge
USER bridge
ENTRYPOINT ["bridge", "-v"]
CMD ["coordinator"]
