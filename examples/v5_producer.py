"""RocketMQ 5's names (``bridge.v5``): a producer and a push consumer, as in RocketMQ 5's
Python client's producer and push consumer examples.

Sends an order's events to one topic three ways (``send``, ``send_async`` and a FIFO message
group) with a tag, keys and a property, and one event with another tag; a push consumer whose
subscription takes the first tag consumes them and prints each. Needs only Kafka::

    .venv/bin/python -m examples.v5_producer
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

from bridge import ConsumeFromWhere
from bridge.v5 import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    MessageView,
    Producer,
    PushConsumer,
)


class OrderListener(MessageListener):
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.consumed = 0

    def consume(self, message: MessageView) -> ConsumeResult:
        with self.lock:  # called on several threads at once: one line at a time
            print(
                f"received {message.body.decode()!r} tag={message.tag} keys={message.keys} "
                f"properties={message.properties} group={message.message_group} "
                f"attempt={message.delivery_attempt}"
            )
            self.consumed += 1
            if self.consumed == self.expected:
                self.done.set()
        return ConsumeResult.SUCCESS


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    endpoints = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    credentials = Credentials()  # with a SASL login: Credentials("user", "password")
    config = ClientConfiguration(endpoints, credentials, os.environ.get("BRIDGE_NAMESPACE", ""))
    topic = f"example-orders-{uuid.uuid4().hex[:6]}"

    producer = Producer(config, (topic,))
    producer.startup()
    try:
        msg = Message()
        msg.topic = topic
        msg.body = b"order created"
        msg.tag = "TagA"
        msg.keys = "order-1"
        msg.add_property("region", "eu")
        receipt = producer.send(msg)
        print(f"sent     {receipt.message_id} at {receipt.topic}[{receipt.queue_id}]")

        future = producer.send_async(Message(topic, b"order paid", tag="TagA", keys="order-1"))
        future.add_done_callback(lambda done: print(f"async    {done.result().message_id}"))
        future.result(timeout=30)

        fifo = Message(topic, b"order shipped", tag="TagA", message_group="order-1")
        print(f"fifo     {producer.send(fifo).message_id} in group {fifo.message_group}")
        producer.send(Message(topic, b"order audited", tag="TagB"))  # not for the consumer
    finally:
        producer.shutdown()

    listener = OrderListener(expected=3)
    consumer = PushConsumer(
        config,
        f"example_v5_consumer_{uuid.uuid4().hex[:6]}",
        listener,
        {topic: FilterExpression("TagA")},
        # A new group starts at the end of the topic (RocketMQ's default); this one reads the
        # messages sent above.
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.startup()
    try:
        listener.done.wait(60)
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    main()
