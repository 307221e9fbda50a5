"""A listener call that never returns holds only its own messages: once the consume timeout
sends them back, the messages of its chunk it had not started run on other threads (once),
and the committed offset moves on. The hung call returning late runs none of them again."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bridge import ConsumeStatus, MessageExt
from bridge.consumer import PushConsumer
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.model import ConsumeConcurrentlyContext, MessageListenerConcurrently
from bridge.consumer.process_queue import ProcessQueue
from tests.conftest import wait_until


class _Calls:
    """What the listener ran, on which thread, with the message at ``hang_on`` blocked in its
    call until :attr:`release` is set (the first time only)."""

    def __init__(self, hang_on: int) -> None:
        self.hang_on = hang_on
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hung_thread = 0
        self.runs: Counter[int] = Counter()
        self.threads: dict[int, int] = {}
        self._lock = threading.Lock()

    def run(self, msgs: list[MessageExt]) -> None:
        with self._lock:
            for msg in msgs:
                self.runs[msg.queue_offset] += 1
                self.threads[msg.queue_offset] = threading.get_ident()
            hang = any(m.queue_offset == self.hang_on for m in msgs) and not self.entered.is_set()
            if hang:
                self.hung_thread = threading.get_ident()
                self.entered.set()
        if hang:
            self.release.wait(30)


def _consumption(listener: Any, batch: int) -> tuple[PushConsumer, ConcurrentConsumption]:
    consumer = PushConsumer("g", consume_thread_count=2, consume_message_batch_max_size=batch)
    consumer.subscribe("t", listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    # A fast listener as measured: the whole poll is one chunk, run by one task.
    consumption._per_message_s = 1e-9
    return consumer, consumption


def _sent_back(consumption: ConcurrentConsumption) -> list[int]:
    """Stub the send-back: record the offsets, and mark them done (the copy acknowledged)."""
    sent: list[int] = []

    def fail(pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        sent.extend(m.queue_offset for m in msgs)
        pq.remove(m.queue_offset for m in msgs)

    consumption.policy.fail = fail  # type: ignore[method-assign]
    return sent


def _expire_an_hour_later(consumption: ConcurrentConsumption, pq: ProcessQueue) -> None:
    """Run the consume-timeout check as if an hour had passed: its first clock reading only
    (the threads it hands work to read the real clock)."""
    consumption._next_expiry_check = 0.0
    real = time.monotonic

    def an_hour_later() -> float:
        time.monotonic = real
        return real() + 3600

    try:
        time.monotonic = an_hour_later
        consumption.expire_overdue([pq])
    finally:
        time.monotonic = real


def _check_hung_chunk(
    consumer: PushConsumer,
    consumption: ConcurrentConsumption,
    calls: _Calls,
    count: int,
    taken: list[int],
) -> None:
    """Run ``count`` messages as one chunk whose call of ``calls.hang_on`` hangs; expect
    ``taken`` sent back by the consume timeout and every later message run elsewhere once."""
    sent = _sent_back(consumption)
    pool = ThreadPoolExecutor(2)
    consumer._context.executor = pool
    try:
        pq = ProcessQueue("t", 0)
        msgs = [
            MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(count)
        ]
        pq.put(msgs)
        consumption.submit(pq, msgs)
        assert calls.entered.wait(10), "the listener never reached the message it hangs on"
        wait_until(lambda: all(calls.runs[o] for o in range(taken[0])), timeout_s=10)
        _expire_an_hour_later(consumption, pq)
        assert sent == taken, f"sent back by the consume timeout: {sent}"
        rest = range(taken[-1] + 1, count)
        with contextlib.suppress(pytest.fail.Exception):
            wait_until(lambda: pq.commit_offset() == count, timeout_s=5)
        assert pq.commit_offset() == count, (
            f"commit offset {pq.commit_offset()} (held {pq.held}); run: {sorted(calls.runs)}"
        )
        assert all(calls.threads[o] != calls.hung_thread for o in rest), (
            f"run by the hung thread: {[o for o in rest if calls.threads[o] == calls.hung_thread]}"
        )
        calls.release.set()
        wait_until(lambda: pq.running == 0 and consumption._drainers == 0, timeout_s=10)
    finally:
        calls.release.set()
        pool.shutdown(wait=True)
    assert calls.runs == Counter(range(count)), f"every message run once: {calls.runs}"
    assert sent == taken, "the late result neither failed nor sent anything back"
    assert pq.held == 0 and pq.commit_offset() == count
    assert consumer.stats().consumed == count - len(taken), "the late result does not count"


def test_a_hung_per_message_call_leaves_the_rest_of_its_chunk_to_other_threads() -> None:
    calls = _Calls(hang_on=2)

    def listener(msg: MessageExt) -> ConsumeStatus:
        calls.run([msg])
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(listener, 1)
    _check_hung_chunk(consumer, consumption, calls, 6, [2])


def test_a_hung_batch_call_leaves_the_rest_of_its_chunk_to_other_threads() -> None:
    calls = _Calls(hang_on=2)

    class _Listener(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeStatus:
            calls.run(msgs)
            return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(_Listener(), 2)
    _check_hung_chunk(consumer, consumption, calls, 8, [2, 3])


def _check_failed_before_hung_call(listener: Any, batch: int, count: int, hung: int) -> None:
    """Run a chunk of ``count`` messages whose listener fails the first request and hangs on
    the one starting at ``hung``: once the consume timeout took the hung call, the committed
    offset reaches the end (the failed request is sent back then, not when the hung task
    ends), and each failed or hung message is sent back once."""
    calls: _Calls = listener.calls
    consumer, consumption = _consumption(listener, batch)
    sent = _sent_back(consumption)
    pool = ThreadPoolExecutor(2)
    consumer._context.executor = pool
    try:
        pq = ProcessQueue("t", 0)
        msgs = [
            MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(count)
        ]
        pq.put(msgs)
        consumption.submit(pq, msgs)
        assert calls.entered.wait(10)
        _expire_an_hour_later(consumption, pq)
        wait_until(lambda: all(calls.runs[o] for o in range(hung + batch, count)), timeout_s=10)
        wait_until(lambda: pq.commit_offset() == count, timeout_s=5)
        calls.release.set()
        wait_until(lambda: pq.running == 0, timeout_s=10)
        assert sorted(sent) == [*range(batch), *range(hung, hung + batch)], sorted(sent)
    finally:
        calls.release.set()
        pool.shutdown(wait=True)


def test_a_message_failed_before_a_hung_per_message_call_does_not_pin_the_offset() -> None:
    calls = _Calls(hang_on=2)

    def listener(msg: MessageExt) -> ConsumeStatus:
        calls.run([msg])
        if msg.queue_offset == 0:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    listener.calls = calls  # type: ignore[attr-defined]
    _check_failed_before_hung_call(listener, 1, 6, 2)


def test_a_request_failed_before_a_hung_batch_call_does_not_pin_the_offset() -> None:
    calls = _Calls(hang_on=2)

    class _Listener(MessageListenerConcurrently):
        def __init__(self) -> None:
            self.calls = calls

        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeStatus:
            calls.run(msgs)
            if msgs[0].queue_offset == 0:
                return ConsumeStatus.RECONSUME_LATER
            return ConsumeStatus.CONSUME_SUCCESS

    _check_failed_before_hung_call(_Listener(), 2, 8, 2)
