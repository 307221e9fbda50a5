"""The push consumer running a chunk of messages per task (a Run of its ProcessQueue): copies
of received messages, either success status, the consume timeout and escapes from the task."""

from __future__ import annotations

import contextlib
import copy
import pickle
import time
from collections.abc import Callable
from typing import Any

from bridge import ConsumeStatus, MessageExt
from bridge.codec import _SLOTS
from bridge.consumer import PushConsumer
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.intake import Intake
from bridge.consumer.model import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyStatus,
    MessageListenerConcurrently,
)
from bridge.consumer.process_queue import ProcessQueue


class _Record:
    def __init__(self, topic: str, offset: int, value: bytes, headers: list[Any]) -> None:
        self._t, self._o, self._v, self._h = topic, offset, value, headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def value(self) -> bytes:
        return self._v

    def headers(self) -> list[Any]:
        return list(self._h)


def _received(
    consumer: PushConsumer, headers: list[Any], kafka_topic: str = "t", name: str = "t"
) -> MessageExt:
    """The message the push consumer's intake makes of one record of ``kafka_topic`` (the
    RocketMQ topic ``name``; the group's retry topic is rmq.RETRY.g)."""
    pq = ProcessQueue(kafka_topic, 0)
    intake = Intake(
        consumer._context, {(kafka_topic, 0): pq}, None, {kafka_topic: name}, "rmq.RETRY.g"
    )
    batches = intake.sort([_Record(kafka_topic, 5, b"body", headers)])
    return batches[(kafka_topic, 0)].msgs[0]


def test_a_received_message_can_be_copied_and_pickled() -> None:
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    headers = [("UNIQ_KEY", b"ID1"), ("TAGS", b"T"), ("bin", b"\xff")]
    ways: tuple[tuple[str, Callable[[MessageExt], MessageExt]], ...] = (
        ("copy", copy.copy),
        ("deepcopy", copy.deepcopy),
        ("pickle", lambda m: pickle.loads(pickle.dumps(m))),
    )
    for name, how in ways:
        msg = _received(consumer, headers)
        copied = how(msg)
        assert (copied.msg_id, copied.tags, copied.body) == ("ID1", "T", b"body"), name


def test_a_first_delivery_reads_no_header_for_its_reconsume_times() -> None:
    # A record of a real topic was never consumed before: the intake left out the headers
    # only the retry path writes, so the count is 0 without a scan of the rest (a listener
    # reading it first pays nothing per header). A header slipped into the held list after
    # the intake shows whether it is scanned.
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    msg = _received(consumer, [("UNIQ_KEY", b"ID1"), ("RECONSUME_TIME", b"3")])
    held = _SLOTS["_properties"].__get__(msg, MessageExt)
    assert held == [("UNIQ_KEY", b"ID1")]
    held.append(("RECONSUME_TIME", b"5"))
    assert msg.reconsume_times == 0


def test_a_copy_read_from_the_retry_topic_or_a_dlq_reads_its_reconsume_times() -> None:
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    headers = [("UNIQ_KEY", b"ID1"), ("RETRY_TOPIC", b"t"), ("RECONSUME_TIME", b"3")]
    for kafka_topic, name in (("rmq.RETRY.g", "%RETRY%g"), ("rmq.DLQ.g", "%DLQ%g")):
        assert _received(consumer, headers, kafka_topic, name).reconsume_times == 3, name


def _consumption(subs: dict[str, Any]) -> tuple[PushConsumer, ConcurrentConsumption]:
    consumer = PushConsumer("g", consume_thread_count=1)
    for topic, listener in subs.items():
        consumer.subscribe(topic, listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    return consumer, consumption


class _Pool:
    def submit(self, fn: Any, *args: Any) -> None:
        fn(*args)


def test_a_callable_returning_the_orderly_success_consumes_its_message() -> None:
    """leading_successes (and the metrics' _SUCCESS) take ConsumeOrderlyStatus.SUCCESS from a
    callable as a success; a concurrent consumer with the default batch size of 1 must too."""
    consumer, consumption = _consumption({"t": lambda m: ConsumeOrderlyStatus.SUCCESS})
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    failed: list[int] = []
    consumption.policy.fail = lambda pq, msgs, levels: failed.extend(  # type: ignore[method-assign]
        m.queue_offset for m in msgs
    )
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(3)]
    pq.put(msgs)
    consumption.submit(pq, msgs)
    assert failed == [], "sent back for retry although the listener said SUCCESS"
    assert pq.held == 0 and pq.commit_offset() == 3


def test_a_consumed_message_is_not_taken_by_the_timeout_while_a_batch_listener_runs() -> None:
    """A retry partition holds messages of several topics: one whose listener is a callable,
    one whose listener is a batch listener. While the batch listener runs past
    consume_timeout, only its own message is overdue, not the callable's message consumed
    before it."""
    pq = ProcessQueue("rmq.RETRY.g", 0)
    overdue: list[int] = []

    class _Slow(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeStatus:
            # The consume-timeout check runs while this listener is in its call.
            overdue.extend(m.queue_offset for m in pq.overdue(time.monotonic() + 3600, 60.0))
            return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(
        {"a": lambda m: ConsumeStatus.CONSUME_SUCCESS, "b": _Slow()}
    )
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    consumption.policy.fail = lambda pq, msgs, levels: None  # type: ignore[method-assign]
    msgs = [
        MessageExt("a", b"x", msg_id="a0", queue_id=0, queue_offset=0),
        MessageExt("b", b"x", msg_id="b1", queue_id=0, queue_offset=1),
    ]
    pq.put(msgs)
    consumption.submit(pq, msgs)
    assert overdue == [1], f"taken past consume_timeout: {overdue} (0 was consumed at once)"


class _Abort(BaseException):
    pass


def test_a_listener_escaping_with_a_base_exception_does_not_pin_what_was_consumed() -> None:
    """Messages the listener consumed before it escaped are done; the one it escaped on is
    still taken by consume_timeout (as before the per-chunk runs), so the partition's commit
    can move on."""

    def listener(msg: MessageExt) -> ConsumeStatus:
        if msg.queue_offset == 3:
            raise _Abort()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption({"t": listener})
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    sent_back: list[int] = []

    def fail(pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        sent_back.extend(m.queue_offset for m in msgs)
        pq.remove(m.queue_offset for m in msgs)  # the copy acknowledged

    consumption.policy.fail = fail  # type: ignore[method-assign]
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(4)]
    pq.put(msgs)
    with contextlib.suppress(_Abort):
        consumption.submit(pq, msgs)
    consumption._next_expiry_check = 0.0
    consumption.expire_overdue([pq])  # now: nothing overdue yet
    consumption._next_expiry_check = 0.0
    real = time.monotonic
    try:
        time.monotonic = lambda: real() + 3600
        consumption.expire_overdue([pq])
    finally:
        time.monotonic = real
    assert pq.commit_offset() == 4, (
        f"commit offset {pq.commit_offset()}, held {pq.held}, sent back {sent_back}"
    )


def test_a_listener_escaping_with_a_base_exception_leaves_the_rest_of_its_chunk_to_run() -> None:
    """The messages of the chunk after the one the listener escaped on are run again (not
    held until a restart), and those it failed before are too."""
    runs: list[int] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        runs.append(msg.queue_offset)
        if msg.queue_offset == 3 and runs.count(3) == 1:
            raise _Abort()
        if msg.queue_offset == 1 and runs.count(1) == 1:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption({"t": listener})
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    again: list[int] = []

    def retry_locally(
        pq: ProcessQueue, msgs: list[MessageExt], delay_ms: int | None = None
    ) -> None:
        again.extend(m.queue_offset for m in msgs)

    consumption.policy.retry_locally = retry_locally  # type: ignore[method-assign]
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(6)]
    pq.put(msgs)
    with contextlib.suppress(_Abort):
        consumption.submit(pq, msgs)
    assert again == [1, 4, 5], f"run again: {again}"


def test_a_batch_listener_escaping_with_a_base_exception_leaves_the_rest_of_its_chunk_to_run() -> (
    None
):
    """As for a per-message listener: the messages of the call it escaped from stay in that
    call (the consume timeout sends them back), and the chunk's failed and unrun messages run
    again, not held until a restart."""
    calls: list[list[int]] = []

    class _Listener(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeStatus:
            calls.append([m.queue_offset for m in msgs])
            if msgs[0].queue_offset == 2:
                raise _Abort()
            if msgs[0].queue_offset == 0:
                return ConsumeStatus.RECONSUME_LATER
            return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("g", consume_thread_count=1, consume_message_batch_max_size=2)
    consumer.subscribe("t", _Listener())
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    consumption._per_message_s = 1e-9  # measured fast: the poll is one chunk
    consumer._context.executor = _Pool()  # type: ignore[assignment]
    again: list[int] = []
    sent_back: list[int] = []

    def retry_locally(
        pq: ProcessQueue, msgs: list[MessageExt], delay_ms: int | None = None
    ) -> None:
        again.extend(m.queue_offset for m in msgs)

    def fail(pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        sent_back.extend(m.queue_offset for m in msgs)
        pq.remove(m.queue_offset for m in msgs)  # the copy acknowledged

    consumption.policy.retry_locally = retry_locally  # type: ignore[method-assign]
    consumption.policy.fail = fail  # type: ignore[method-assign]
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(8)]
    pq.put(msgs)
    with contextlib.suppress(_Abort):
        consumption.submit(pq, msgs)
    assert calls == [[0, 1], [2, 3]]
    assert again == [0, 1, 4, 5, 6, 7], f"run again: {again}"
    consumption._next_expiry_check = 0.0
    real = time.monotonic
    try:
        time.monotonic = lambda: real() + 3600
        consumption.expire_overdue([pq])
    finally:
        time.monotonic = real
    assert sent_back == [2, 3], f"sent back: {sent_back}"
    assert calls == [[0, 1], [2, 3]], "nothing handed off twice"
