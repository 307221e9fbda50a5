"""Delay levels (RocketMQ 4): each message waits its level's delay before delivery.

Sends one message at each of the first three levels of the configured table (RocketMQ's
default: 1 s, 5 s, 10 s) and prints when each arrives. Needs a running coordinator
(``make up``)::

    .venv/bin/python -m examples.delay_level_producer
"""

from __future__ import annotations

import logging
import time
import uuid

from bridge import ClientConfig, Message, Producer, read_messages


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"example-delayed-{uuid.uuid4().hex[:6]}"
    levels = config.delay_policy.level_delays_ms[:3]
    started = time.time()
    with Producer("example_delay_group", config=config) as producer:
        for level, delay_ms in enumerate(levels, start=1):
            producer.send_sync(Message(topic, f"level {level}", delay_time_level=level))
            print(f"sent     level {level} (delivered after {delay_ms / 1000:g} s)")
    for msg in read_messages(config, [topic], max_messages=len(levels), timeout_ms=60_000):
        print(f"received {msg.body.decode()!r} {time.time() - started:.1f} s after sending")


if __name__ == "__main__":
    main()
