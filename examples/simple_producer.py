"""Plain messages: send them three ways and read them back.

Run against a broker started with ``make up`` (127.0.0.1:9092), or set
``KAFKA_BOOTSTRAP_SERVERS``::

    .venv/bin/python -m examples.simple_producer
"""

from __future__ import annotations

import logging
import threading
import uuid

from bridge import ClientConfig, Message, Producer, SendResult, read_messages


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"example-orders-{uuid.uuid4().hex[:6]}"
    acknowledged = threading.Event()

    def on_success(result: SendResult) -> None:
        print(
            f"async    {result.msg_id} stored at {result.topic}[{result.queue_id}]@{result.offset}"
        )
        acknowledged.set()

    def on_exception(error: Exception) -> None:
        print(f"async send failed: {error}")
        acknowledged.set()

    with Producer("example_producer_group", config=config) as producer:
        msg = Message(
            topic, b"order created", keys="order-1001", tags="TagA", properties={"region": "eu"}
        )
        result = producer.send_sync(msg)
        print(f"sync     {result.msg_id} {result.status.value} at offset {result.offset}")
        producer.send_async(
            Message(topic, b"order paid", keys="order-1001", tags="TagB"), on_success, on_exception
        )
        acknowledged.wait(10)
        producer.send_oneway(Message(topic, b"order shipped", keys="order-1001", tags="TagC"))

    for received in read_messages(config, [topic], max_messages=3):
        print(
            f"received {received.msg_id} tags={received.tags} keys={received.keys} "
            f"properties={received.user_properties} body={received.body.decode()!r}"
        )


if __name__ == "__main__":
    main()
