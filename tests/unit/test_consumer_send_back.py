"""The push consumer's send-back of a task's failed messages: one report handler for the
copies of one call, whatever order and thread the delivery reports come in."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaError

from bridge import ConsumeStatus, MessageExt
from bridge.codec import PreparedRecord
from bridge.consumer import PushConsumer
from bridge.consumer.counters import ConsumerStats
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.retry_policy import RetryPolicy


class _Sender:
    """Stands in for the producer of copies: keeps each copy and its report callback."""

    def __init__(self, refuse: set[int] | None = None) -> None:
        self.sent: list[tuple[PreparedRecord, Any]] = []
        self.refuse = refuse or set()
        """Indexes (in sending order) whose hand-over raises."""
        self._tried = 0

    def send_record_async(
        self, record: PreparedRecord, partition: int, callback: Any, **_: Any
    ) -> None:
        tried, self._tried = self._tried, self._tried + 1
        if tried in self.refuse:
            raise RuntimeError("local queue full")
        self.sent.append((record, callback))


def _setup(
    count: int, sender: _Sender
) -> tuple[PushConsumer, RetryPolicy, ProcessQueue, list[Any]]:
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    consumer._context.producer = sender  # type: ignore[assignment]
    policy = consumer._new_consumption().policy
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(count)]
    pq.put(msgs)
    return consumer, policy, pq, msgs


def _stats(consumer: PushConsumer) -> ConsumerStats:
    return consumer.stats()


def test_the_copies_of_one_call_are_done_together_once_the_last_report_came() -> None:
    sender = _Sender()
    consumer, policy, pq, msgs = _setup(4, sender)
    policy.fail(pq, msgs[:3], [0, 0, 0])
    assert [record.kafka_topic for record, _ in sender.sent] == [sender.sent[0][0].kafka_topic] * 3
    # Reports out of order: the messages stay held (never committed past) until every copy
    # of the call was acknowledged, then are done and counted at once.
    sender.sent[2][1](None, None)
    sender.sent[0][1](None, None)
    assert (pq.held, pq.commit_offset(), _stats(consumer).sent_back) == (4, 0, 0)
    sender.sent[1][1](None, None)
    assert (pq.held, pq.commit_offset(), _stats(consumer).sent_back) == (1, 3, 3)
    assert _stats(consumer).failed == 3


def test_a_failed_copy_stays_held_and_its_acknowledged_neighbours_are_done() -> None:
    sender = _Sender()
    consumer, policy, pq, msgs = _setup(3, sender)
    policy.fail(pq, msgs, [0, 0, 0])
    sender.sent[0][1](None, None)
    sender.sent[1][1](KafkaError(KafkaError._MSG_TIMED_OUT), None)
    sender.sent[2][1](None, None)
    # The copy that failed: consumed again later, held meanwhile (offset 1 pins the commit).
    assert (pq.held, pq.commit_offset()) == (1, 1)
    stats = _stats(consumer)
    assert (stats.sent_back, stats.retried_locally) == (2, 1)
    assert msgs[1].reconsume_times == 1


def test_reports_before_the_call_ends_wait_for_it_and_a_refused_hand_over_counts_as_reported() -> (
    None
):
    # The sender reports each copy as it is handed over (another thread served the report):
    # nothing is done before the call ended, and a copy whose hand-over raised (consumed
    # again later) does not leave the others held for ever.
    sender = _Sender(refuse={1})
    consumer, policy, pq, msgs = _setup(3, sender)
    seen: list[tuple[int, int]] = []
    real = sender.send_record_async

    def send_and_report(record: PreparedRecord, partition: int, callback: Any, **_: Any) -> None:
        real(record, partition, callback)
        seen.append((pq.held, _stats(consumer).sent_back))
        callback(None, None)

    sender.send_record_async = send_and_report  # type: ignore[method-assign]
    policy.fail(pq, msgs, [0, 0, 0])
    assert seen == [(3, 0), (3, 0)]
    assert (pq.held, pq.commit_offset(), _stats(consumer).sent_back) == (1, 1, 2)
    assert _stats(consumer).retried_locally == 1


def test_reports_served_on_many_threads_at_once_mark_every_message_done_once() -> None:
    sender = _Sender()
    consumer, policy, pq, msgs = _setup(400, sender)
    policy.fail(pq, msgs, [0] * len(msgs))
    start = threading.Barrier(4)

    def serve(share: list[tuple[PreparedRecord, Any]]) -> None:
        start.wait()
        for _, callback in share:
            callback(None, None)

    threads = [threading.Thread(target=serve, args=(sender.sent[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert (pq.held, pq.commit_offset(), _stats(consumer).sent_back) == (0, 400, 400)
