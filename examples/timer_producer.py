"""Timer messages (RocketMQ 5): deliver at a given time, or after a given delay.

Sends a message due in 2 seconds, one due 3 seconds from now by absolute time, and one whose
time has passed (delivered at once); a timer beyond ``timer_max_delay_ms`` is refused at send
time, and one due in 2.5 seconds is recalled with its send's recall handle (RocketMQ 5.3's
``recall_message``): it never arrives. Needs a running coordinator (``make up``)::

    .venv/bin/python -m examples.timer_producer
"""

from __future__ import annotations

import logging
import time
import uuid

from bridge import ClientConfig, Message, Producer, RecallTooLateError, read_messages
from bridge.delay.model import InvalidDelayError


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"example-timer-{uuid.uuid4().hex[:6]}"
    now_ms = time.time_ns() // 1_000_000
    relative = Message(topic, "in 2 s")
    relative.set_delay_time_sec(2)
    absolute = Message(topic, "at now + 3 s")
    absolute.set_deliver_time_ms(now_ms + 3000)
    past = Message(topic, "already due")
    past.set_deliver_time_ms(now_ms - 1000)
    recalled = Message(topic, "recalled")
    recalled.set_deliver_time_ms(now_ms + 2500)
    too_far = Message(topic, "next year")
    too_far.set_delay_time_sec(365 * 86_400)
    with Producer("example_timer_group", config=config) as producer:
        for msg in (relative, absolute, past):
            producer.send_sync(msg)
        try:
            producer.send_sync(too_far)
        except InvalidDelayError as exc:
            print(f"refused  {exc}")
        handle = producer.send_sync(recalled).recall_handle
        assert handle is not None  # a timer's send has one
        try:
            print(f"recalled {producer.recall_message(topic, handle)}")
        except RecallTooLateError as exc:  # less than a second before its time
            print(f"too late {exc}")
    for msg in read_messages(config, [topic], max_messages=3, timeout_ms=60_000):
        late_by = time.time_ns() // 1_000_000 - now_ms
        print(f"received {msg.body.decode()!r} {late_by / 1000:.1f} s after sending")


if __name__ == "__main__":
    main()
