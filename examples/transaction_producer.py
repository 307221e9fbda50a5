"""Transactional messages, as in RocketMQ's TransactionListenerImpl example.

The local transaction of message ``i`` ends in state ``i % 3``: 0 stays unknown forever,
1 commits, 2 rolls back. ``execute_local_transaction`` answers UNKNOWN, so every outcome comes
from the coordinator's check-back (first check 6 s after sending, RocketMQ's default). A
consumer then receives only the committed messages (1, 4, 7). Needs a running coordinator:
``make up`` (or set ``KAFKA_BOOTSTRAP_SERVERS`` and run ``bridge coordinator``)::

    .venv/bin/python -m examples.transaction_producer
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from typing import Any

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)


class TransactionListenerImpl(TransactionListener):
    def __init__(self) -> None:
        self._index = itertools.count()
        self._local_trans: dict[str, int] = {}
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        with self._lock:
            self._local_trans[msg.transaction_id or ""] = next(self._index) % 3
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        status = self._local_trans.get(msg.transaction_id or "")
        return {
            0: TransactionStatus.UNKNOWN,
            1: TransactionStatus.COMMIT,
            2: TransactionStatus.ROLLBACK,
        }.get(status if status is not None else 1, TransactionStatus.COMMIT)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"TranTest-{uuid.uuid4().hex[:6]}"
    tags = ["TagA", "TagB", "TagC", "TagD", "TagE"]
    listener = TransactionListenerImpl()
    with TransactionMQProducer(
        "please_rename_unique_group_name", listener, config=config
    ) as producer:
        for i in range(10):
            msg = Message(topic, f"Hello RocketMQ {i}", tags=tags[i % len(tags)], keys=f"KEY{i}")
            result = producer.send_message_in_transaction(msg, None)
            print(f"sent     {result.msg_id} {result.local_transaction_state.value}")
        print("waiting for the coordinator's check-back ...")
        for received in read_messages(config, [topic], max_messages=3, timeout_ms=60_000):
            print(
                f"received {received.msg_id} tags={received.tags} keys={received.keys} "
                f"body={received.body.decode()!r}"
            )


if __name__ == "__main__":
    main()
