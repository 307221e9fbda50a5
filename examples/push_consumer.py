"""A push consumer with retry and a dead-letter queue, as in RocketMQ's PushConsumer example.

Sends five orders. The listener fails ``order-2`` once (it comes back from the group's retry
topic after delay level 3, 10 s by default) and ``order-4`` every time (with
``max_reconsume_times=1`` it lands in the group's dead-letter queue after its retry). Then
prints the DLQ and replays it. Needs a running coordinator for the retry delays (``make up``)::

    .venv/bin/python -m examples.push_consumer
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
from bridge.consumer.admin import dlq_summary, replay_dead_letters


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"example-orders-{uuid.uuid4().hex[:6]}"
    group = f"example_consumer_{uuid.uuid4().hex[:6]}"
    started = time.time()
    done = threading.Event()
    succeeded: set[str] = set()
    printing = threading.Lock()  # listeners run on several threads: one line at a time

    def listener(msg: MessageExt) -> ConsumeStatus:
        body = msg.body.decode()
        failing = body == "order-4" or (body == "order-2" and msg.reconsume_times == 0)
        with printing:
            print(
                f"{time.time() - started:5.1f}s {body} (topic {msg.topic}, "
                f"reconsume_times={msg.reconsume_times}) -> {'fail' if failing else 'ok'}"
            )
        if failing:
            return ConsumeStatus.RECONSUME_LATER
        succeeded.add(body)
        if len(succeeded) == 4:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group,
        config=config,
        max_reconsume_times=1,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic, listener, "TagA")
    with Producer("example_producer", config=config) as producer:
        for i in range(5):
            producer.send_sync(Message(topic, f"order-{i}", keys=f"order-{i}", tags="TagA"))
        producer.send_sync(Message(topic, "not for us", tags="TagB"))
    with consumer:
        done.wait(120)
        deadline = time.time() + 120
        while consumer.stats().dead_lettered < 1 and time.time() < deadline:
            time.sleep(0.2)
    for summary in dlq_summary(config, group):
        print(
            f"DLQ of {summary.group}: {summary.count} message(s) from {summary.origin_topics}, "
            f"reconsume depth {summary.reconsume_depth}"
        )
    replayed = replay_dead_letters(config, group)
    print(f"replayed {len(replayed)} dead letter(s) to {topic}")


if __name__ == "__main__":
    main()
