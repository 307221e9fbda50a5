"""FIFO message groups: many groups in one partition, against the orderly consumer.

One partition holds :data:`GROUPS` message groups, :data:`EACH` messages each, sent round
robin (``message_group=``). The listener takes :data:`LISTENER_S` (a sleep: the I/O a real
listener waits on) and checks that no two messages of one group run at once and that each
group comes in send order. A FIFO consumer (``fifo=True``) runs the groups in parallel on its
listener threads (``consume_thread_count``, 20 by default); the baseline, from the same run,
is the orderly consumer on the same topic, which runs the partition one message at a time.
Both keep every group's order; time runs from the first message handed over until all are
consumed (group join excluded, for both).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid

from bench.consumer import Clock, _now, _since
from bench.harness import Row, interleaved_rates, print_rows
from bridge import ClientConfig, ConsumeFromWhere, ConsumeStatus, Message, MessageExt, Producer
from bridge.consumer import PushConsumer
from bridge.kafka.admin import TopicAdmin
from topics.catalog import TopicSpec

ROUNDS = int(os.environ.get("BENCH_FIFO_ROUNDS", "3"))
GROUPS = 100
EACH = int(os.environ.get("BENCH_FIFO_EACH", "30"))
"""Messages a group (3,000 in all by default: 15 s for the orderly baseline)."""
LISTENER_S = 0.005


def _fill(config: ClientConfig, topic: str) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    with Producer("bench_fifo_fill", config=config) as producer:
        for seq, group in itertools.product(range(EACH), range(GROUPS)):
            producer.send_async(Message(topic, f"{group}:{seq}", message_group=f"g{group}"))
        producer.flush(60_000)


def _consume(config: ClientConfig, topic: str, *, fifo: bool) -> tuple[int, float]:
    """Consume the topic with a new group, FIFO or orderly: (messages, seconds)."""
    total = GROUPS * EACH
    first: list[Clock] = []
    lock = threading.Lock()
    running: set[str] = set()
    next_seq: dict[str, int] = {}
    wrong: list[str] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        if not first:
            first.append(_now())
        group, seq = msg.body.decode().split(":")
        with lock:
            if group in running or next_seq.get(group, 0) != int(seq):
                wrong.append(msg.body.decode())
            running.add(group)
        time.sleep(LISTENER_S)
        with lock:
            running.discard(group)
            next_seq[group] = int(seq) + 1
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        f"bench_{'fifo' if fifo else 'orderly'}_{uuid.uuid4().hex[:8]}",
        config=config,
        fifo=fifo,
        orderly=not fifo,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic, listener)
    consumer.start()
    try:
        while consumer.stats().consumed < total:
            time.sleep(0.005)
        elapsed, _ = _since(first[0])
    finally:
        consumer.shutdown()
    if wrong:
        raise RuntimeError(f"group order broken ({'fifo' if fifo else 'orderly'}): {wrong[:5]}")
    return total, elapsed


def run(bootstrap: str) -> None:
    """Measure and print."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=f"bf{uuid.uuid4().hex[:8]}")
    topic = f"bench-fifo-{uuid.uuid4().hex[:6]}"
    _fill(config, topic)
    rates = interleaved_rates(
        ROUNDS,
        {
            "orderly": lambda: _consume(config, topic, fifo=False),
            "fifo": lambda: _consume(config, topic, fifo=True),
        },
    )
    rows = [
        Row(
            f"FIFO, {GROUPS} groups, {LISTENER_S * 1000:.0f} ms listener",
            "msg/s",
            rates["fifo"],
            rates["orderly"],
            "orderly consumer, same partition",
        ),
    ]
    print_rows(
        f"FIFO message groups ({GROUPS * EACH:,} messages, {GROUPS} groups, 1 partition)", rows
    )
