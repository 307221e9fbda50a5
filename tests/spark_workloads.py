"""What the Spark jobs' tests (local and on a standalone cluster) write before a job reads it:
transactions decided by their body (:class:`ByBody`) and a retry history for the DLQ report
(:func:`make_retry_history`), on the real broker."""

from __future__ import annotations

import threading
from typing import Any

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionListener,
    TransactionStatus,
)
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from topics.catalog import TopicSpec


class ByBody(TransactionListener):
    """Executes by the body's first letter: c commit, r rollback, anything else unknown;
    checks answer from ``answers`` (UNKNOWN when absent)."""

    def __init__(self) -> None:
        self.answers: dict[str, TransactionStatus] = {}

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        first = msg.body.decode()[0]
        return {"c": TransactionStatus.COMMIT, "r": TransactionStatus.ROLLBACK}.get(
            first, TransactionStatus.UNKNOWN
        )

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return self.answers.get(msg.body.decode(), TransactionStatus.UNKNOWN)


def make_retry_history(config: ClientConfig, topic: str, group: str, timeout_s: float) -> None:
    """Send "ok", "twice" and "always" to ``topic`` (created with one partition) and consume
    them in ``group`` with at most 2 reconsumes: "ok" at once, "twice" after two failures,
    "always" dead-lettered after its third. Returns once the consumer has seen it all (within
    ``timeout_s`` seconds) and stopped."""
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    failures = {"twice": 2, "always": 99}
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        with lock:
            body = msg.body.decode()
            if failures.get(body, 0) > 0:
                failures[body] -= 1
                return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group, config=config, max_reconsume_times=2,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )  # fmt: skip
    consumer.subscribe(topic, listener)
    with consumer:
        with Producer("plain_pg", config=config) as producer:
            for body in ("ok", "twice", "always"):
                producer.send_sync(Message(topic, body))
        wait_until(
            lambda: consumer.stats().dead_lettered == 1 and consumer.stats().consumed == 2,
            timeout_s=timeout_s,
        )
