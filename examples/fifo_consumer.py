"""FIFO message groups, as in RocketMQ 5's FIFO example: each order's events in one group.

Sends the events of three orders (``created``, ``paid``, ``shipped``), interleaved, each order
its own message group, to one topic. A FIFO consumer (``fifo=True``) consumes each order's
events one at a time, in the order they were sent, and the orders in parallel. The listener
fails ``order-1 paid`` once: it is retried in place after ``suspend_current_queue_time_millis``
while ``order-1 shipped`` waits behind it, and the other orders go on. Needs only Kafka::

    .venv/bin/python -m examples.fifo_consumer
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
)

ORDERS = ("order-0", "order-1", "order-2")
EVENTS = ("created", "paid", "shipped")


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"example-order-events-{uuid.uuid4().hex[:6]}"
    started = time.time()
    done = threading.Event()
    consumed: list[str] = []
    printing = threading.Lock()  # listeners run on several threads: one line at a time

    def listener(msg: MessageExt) -> ConsumeStatus:
        event = msg.body.decode()
        failing = msg.message_group == "order-1" and event == "paid" and msg.reconsume_times == 0
        with printing:
            print(
                f"{time.time() - started:5.1f}s {msg.message_group} {event} "
                f"(reconsume_times={msg.reconsume_times}) -> {'fail' if failing else 'ok'}"
            )
            if not failing:
                consumed.append(f"{msg.message_group} {event}")
                if len(consumed) == len(ORDERS) * len(EVENTS):
                    done.set()
        return ConsumeStatus.RECONSUME_LATER if failing else ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"example_fifo_{uuid.uuid4().hex[:6]}",
        config=config,
        fifo=True,
        suspend_current_queue_time_millis=500,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic, listener)
    with Producer("example_fifo_producer", config=config) as producer:
        for event in EVENTS:
            for order in ORDERS:
                producer.send_sync(Message(topic, event, message_group=order))
    with consumer:
        done.wait(120)
    for order in ORDERS:
        print(f"{order}: {', '.join(c.split()[1] for c in consumed if c.startswith(order))}")


if __name__ == "__main__":
    main()
