"""RocketMQ 5's transactions (``bridge.v5``), as in RocketMQ 5's Python client's
transaction example: begin a transaction, send its message, then commit or roll back.

Three orders: the first transaction commits, the second rolls back, the third is left
undecided (as if the process had stopped before deciding) and the ``TransactionChecker``
commits it when the coordinator checks it back (``transaction_timeout_ms`` after it was sent:
6 s by default). The checker answers from what the application recorded, and answers
UNKNOWN ("ask again later") for an order it has no outcome for yet: a check may come while
the local transaction still runs, and a ROLLBACK then would stand against its commit. A
reader then receives only the committed orders, 1 and 3. Needs a running
coordinator: ``make up`` (or set ``KAFKA_BOOTSTRAP_SERVERS`` and run ``bridge coordinator``)::

    .venv/bin/python -m examples.v5_transaction_producer
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

from bridge import read_messages
from bridge.v5 import (
    ClientConfiguration,
    Credentials,
    Message,
    MessageView,
    Producer,
    TransactionChecker,
    TransactionResolution,
)


class OrderChecker(TransactionChecker):
    """Answers from what the application recorded: an order it saved commits, one it dropped
    rolls back, and one it has no outcome for yet is asked about again later."""

    def __init__(self) -> None:
        self.outcomes: dict[str, TransactionResolution] = {}
        self.lock = threading.Lock()

    def record(self, order: str, outcome: TransactionResolution) -> None:
        """The local transaction of ``order`` ended (it would be a database row)."""
        with self.lock:
            self.outcomes[order] = outcome

    def check(self, message: MessageView) -> TransactionResolution:
        order = message.keys[0]
        with self.lock:
            resolution = self.outcomes.get(order, TransactionResolution.UNKNOWN)
        print(f"check    {order}: {resolution.name}")
        return resolution


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    endpoints = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    namespace = os.environ.get("BRIDGE_NAMESPACE", "")
    config = ClientConfiguration(endpoints, Credentials(), namespace)
    topic = f"example-orders-{uuid.uuid4().hex[:6]}"
    checker = OrderChecker()

    # The topics a transactional message goes to are declared: check-backs of a topic's
    # transactions go to the producers that declare it.
    producer = Producer(config, (topic,), checker)
    producer.startup()
    try:
        for order, decide in (("order-1", "commit"), ("order-2", "rollback"), ("order-3", None)):
            transaction = producer.begin_transaction()
            msg = Message(topic, f"{order} created", keys=order)
            producer.send(msg, transaction)
            # The local transaction: order-2's fails; order-3's is saved, then the process
            # "stops" before deciding.
            saved = decide != "rollback"
            checker.record(
                order, TransactionResolution.COMMIT if saved else TransactionResolution.ROLLBACK
            )
            if decide == "commit":
                transaction.commit()
            elif decide == "rollback":
                transaction.rollback()
            print(f"sent     {order} {transaction.message_id}: {decide or 'left to the checker'}")
        print("waiting for the coordinator's check-back ...")
        reader_config = config.to_client_config()
        received = read_messages(reader_config, [topic], max_messages=2, timeout_ms=60_000)
        for message in received:
            print(f"received {message.body.decode()!r} ({message.msg_id})")
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main()
