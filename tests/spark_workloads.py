"""What the Spark jobs' tests (local and on a standalone cluster) write before a job reads it:
transactions decided by their body (:class:`ByBody`), the ingest's messages
(:func:`ingest_workload`) and a retry history for the DLQ report (:func:`make_retry_history`),
on the real broker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer as RawProducer

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
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


def visible(config: ClientConfig, topic: str) -> set[str]:
    """The ids of the messages of ``topic`` a reader sees now (committed ones)."""
    return {m.msg_id for m in read_messages(config, [topic], timeout_ms=500)}


@dataclass(frozen=True)
class IngestWorkload:
    """What :func:`ingest_workload` wrote."""

    config: ClientConfig
    topic: str
    plain: list[str]
    """The ids of p0 ... p4 (keys k0 ... k4, tags ``TagP``, property ``region=eu``)."""
    transactions: dict[str, str]
    """Body -> id of the transactional messages: c1 and c2 committed, r1 rolled back, u1 and
    late undecided."""
    listener: ByBody

    @property
    def committed(self) -> set[str]:
        """The ids committed before :meth:`commit_late`."""
        return {*self.plain, self.transactions["c1"], self.transactions["c2"]}

    @property
    def late(self) -> str:
        """The id that :meth:`commit_late` commits."""
        return self.transactions["late"]

    @property
    def never(self) -> set[str]:
        """The ids never committed: rolled back, or undecided for ever."""
        return {self.transactions["r1"], self.transactions["u1"]}

    def commit_late(self, timeout_s: float) -> None:
        """Answer the next check-back of "late" with COMMIT; return once it is visible
        (within ``timeout_s`` seconds)."""
        self.listener.answers["late"] = TransactionStatus.COMMIT
        wait_until(lambda: self.late in visible(self.config, self.topic), timeout_s=timeout_s)


@contextmanager
def ingest_workload(
    config: ClientConfig, topic: str, tx_group: str, timeout_s: float
) -> Iterator[IngestWorkload]:
    """Create ``topic`` (two partitions) and write the ingest's messages: five plain ones, five
    transactions of ``tx_group`` decided by their body, and a second record of p0 with its id,
    as a replay would write it. Yields once the committed ones are visible (within
    ``timeout_s`` seconds), with the transaction producer still open, so that its check-back
    can commit "late" (:meth:`IngestWorkload.commit_late`)."""
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 2)])
    with Producer("plain_pg", config=config) as producer:
        plain = [
            producer.send_sync(
                Message(topic, f"p{i}", keys=f"k{i}", tags="TagP", properties={"region": "eu"})
            ).msg_id
            for i in range(5)
        ]
    listener = ByBody()
    with TransactionMQProducer(tx_group, listener, config=config) as tx:
        transactions = {
            body: tx.send_message_in_transaction(Message(topic, body), None).msg_id
            for body in ("c1", "c2", "r1", "u1", "late")
        }
        raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
        raw.produce(topic, b"p0", headers=[("UNIQ_KEY", plain[0].encode())])
        raw.flush(10)
        work = IngestWorkload(config, topic, plain, transactions, listener)
        wait_until(lambda: visible(config, topic) >= work.committed, timeout_s=timeout_s)
        yield work


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
