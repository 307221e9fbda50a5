"""RocketMQ 5's simple consumer with RocketMQ 5's names (``bridge.v5``), as in RocketMQ 5's
Python client's simple consumer example: receive, work, ack.

Sends three messages, then receives them with a ``SimpleConsumer`` made from a
``ClientConfiguration``: two are acked, one is not, and it comes back once its invisible
duration (2 s here) has passed, with its delivery attempt counted, to be acked then. Needs
only Kafka::

    .venv/bin/python -m examples.v5_simple_consumer
"""

from __future__ import annotations

import logging
import os
import time
import uuid

from bridge import ConsumeFromWhere
from bridge.v5 import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

INVISIBLE_S = 2


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    endpoints = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    namespace = os.environ.get("BRIDGE_NAMESPACE", "")
    config = ClientConfiguration(endpoints, Credentials(), namespace)
    topic = f"example-jobs-{uuid.uuid4().hex[:6]}"

    producer = Producer(config, (topic,))
    producer.startup()
    try:
        for job in ("job-1", "job-2", "job-3"):
            producer.send(Message(topic, job, tag="Job"))
    finally:
        producer.shutdown()

    consumer = SimpleConsumer(
        config,
        f"example_v5_workers_{uuid.uuid4().hex[:6]}",
        {topic: FilterExpression("Job")},
        5,  # await_duration: how long receive waits for a message, s
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.startup()
    try:
        acked = 0
        deadline = time.monotonic() + 60
        while acked < 3 and time.monotonic() < deadline:
            for msg in consumer.receive(16, INVISIBLE_S):
                job = msg.body.decode()
                if job == "job-2" and msg.delivery_attempt == 1:
                    print(f"received {job} attempt={msg.delivery_attempt}: not acked")
                    continue  # back after INVISIBLE_S, attempt 2
                consumer.ack(msg)
                acked += 1
                print(f"received {job} attempt={msg.delivery_attempt}: acked")
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    main()
