"""Run the benchmarks: ``python -m bench [producer] [transactions] [delays] [consumer] [simple]
[fifo] [aio] [db] [spark]`` (all by default; uses KAFKA_BOOTSTRAP_SERVERS or a local broker);
``python -m bench storm`` measures a storm of checks (a few minutes: only when asked);
``python -m bench console`` pages a DLQ of 100,000 letters in the operator console and
replays 1,000 of them (only when asked);
``python -m bench rocketmq`` runs the same benchmarks against Apache RocketMQ and the bridge
side by side."""

from __future__ import annotations

import logging
import sys

from bench import (
    aio,
    check_storm,
    console_dlq,
    consumer,
    db,
    delays,
    fifo,
    producer,
    rocketmq,
    simple_consumer,
    spark_ingest,
    transactions,
)
from bench.harness import broker


def main() -> None:
    """Run the benchmarks one after another on one broker."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)
    with broker() as bootstrap:
        print(f"broker: {bootstrap}")
        only = set(sys.argv[1:])
        if not only or "producer" in only:
            producer.run(bootstrap)
        if not only or "transactions" in only:
            transactions.run(bootstrap)
        if not only or "delays" in only:
            delays.run(bootstrap)
        if not only or "consumer" in only:
            consumer.run(bootstrap)
        if not only or "simple" in only:
            simple_consumer.run(bootstrap)
        if not only or "fifo" in only:
            fifo.run(bootstrap)
        if not only or "aio" in only:
            aio.run(bootstrap)
        if not only or "db" in only:
            db.run(bootstrap)
        if not only or "spark" in only:
            spark_ingest.run(bootstrap)
        if "storm" in only:  # only when asked: 20,000 transactions checked at once
            check_storm.run(bootstrap)
        if "console" in only:  # only when asked: 100,000 dead letters, paged in the console
            console_dlq.run(bootstrap)
        if "rocketmq" in only:  # only when asked: it starts Apache RocketMQ beside Kafka
            rocketmq.run(bootstrap)


if __name__ == "__main__":
    main()
