"""How a concurrent push consumer hands held messages to its listener threads: one backlog of
chunks, taken by at most ``consume_thread_count`` pool tasks, each running chunks until none is
left. Every message reaches the listener exactly once, whatever the threads interleave."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bridge import ConsumeStatus, MessageExt
from bridge.consumer import PushConsumer
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.process_queue import ProcessQueue
from tests.conftest import wait_until


class _HeldPool:
    """A pool that runs nothing until told to: what was submitted, in order."""

    def __init__(self) -> None:
        self.tasks: list[Callable[[], Any]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.tasks.append(lambda: fn(*args))


def _messages(first: int, count: int, partition: int = 0) -> list[MessageExt]:
    return [
        MessageExt("t", b"x", msg_id=f"{partition}-{i}", queue_id=partition, queue_offset=i)
        for i in range(first, first + count)
    ]


def _consumption(
    listener: Callable[[MessageExt], ConsumeStatus], threads: int
) -> tuple[PushConsumer, ConcurrentConsumption]:
    consumer = PushConsumer("g", consume_thread_count=threads)
    consumer.subscribe("t", listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    return consumer, consumption


def test_chunks_queued_while_the_tasks_run_start_no_more_tasks() -> None:
    seen: list[int] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        seen.append(msg.queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(listener, 4)
    pool = _HeldPool()
    consumer._context.executor = pool  # type: ignore[assignment]
    pq = ProcessQueue("t", 0)
    for first in (0, 40, 80):
        msgs = _messages(first, 40)
        pq.put(msgs)
        consumption.submit(pq, msgs)
    # 4 tasks for 3 x 4 chunks: those queued later wait for the running tasks.
    assert len(pool.tasks) == 4
    for task in pool.tasks:
        task()
    assert seen == list(range(120)), "every message once, oldest chunk first"
    assert pq.held == 0 and pq.commit_offset() == 120
    assert consumption._drainers == 0, "every task ended once the backlog was empty"
    msgs = _messages(120, 8)
    pq.put(msgs)
    consumption._per_message_s = 0.1  # a slow listener: its chunks spread over the threads
    consumption.submit(pq, msgs)
    assert len(pool.tasks) == 8, "new chunks once every task ended: new tasks"


def test_a_fast_listener_runs_many_messages_per_task_a_slow_one_every_thread() -> None:
    def listener(msg: MessageExt) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(listener, 4)
    pool = _HeldPool()
    consumer._context.executor = pool  # type: ignore[assignment]
    pq = ProcessQueue("t", 0)
    msgs = _messages(0, 40)
    pq.put(msgs)
    consumption.submit(pq, msgs)
    assert [len(m) for _, m in consumption._backlog] == [10] * 4, "not measured yet: shared"
    for task in pool.tasks:
        task()
    assert 0 < consumption._per_message_s < 0.001, "the listener's calls were measured"
    msgs = _messages(40, 100)
    pq.put(msgs)
    consumption.submit(pq, msgs)
    assert [len(m) for _, m in consumption._backlog] == [64, 36], "fast: full chunks"
    for task in pool.tasks[4:]:
        task()
    assert pq.held == 0 and pq.commit_offset() == 140 and consumer.stats().consumed == 140
    consumption._per_message_s = 0.01  # 10 ms a message
    msgs = _messages(140, 40)
    pq.put(msgs)
    consumption.submit(pq, msgs)
    assert [len(m) for _, m in consumption._backlog] == [10] * 4, "slow: every thread"


def test_every_message_is_consumed_once_whatever_the_threads_interleave() -> None:
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        with lock:
            counts[msg.msg_id] = counts.get(msg.msg_id, 0) + 1
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(listener, 3)
    consumer._context.executor = ThreadPoolExecutor(3)
    queues = [ProcessQueue("t", p) for p in range(4)]
    total = 0
    try:
        # Small submits from several threads at once, as polls and local retries do, while the
        # tasks take chunks and end: a chunk queued as the last task ends must still run.
        def feed(pq: ProcessQueue) -> None:
            for first in range(0, 2000, 5):
                msgs = _messages(first, 5, pq.partition)
                pq.put(msgs)
                consumption.submit(pq, msgs)

        feeders = [threading.Thread(target=feed, args=(pq,)) for pq in queues]
        for thread in feeders:
            thread.start()
        for thread in feeders:
            thread.join()
        total = 2000 * len(queues)
        wait_until(lambda: sum(counts.values()) >= total and consumption._drainers == 0)
    finally:
        consumer._context.pool.shutdown(wait=True)
    assert sum(counts.values()) == total
    assert set(counts.values()) == {1}, "no message twice"
    assert all(pq.held == 0 and pq.commit_offset() == 2000 for pq in queues)
    assert consumer.stats().consumed == total


class _Abort(BaseException):
    """What escapes a listener past ``Exception`` (``SystemExit``, a cancellation, ...)."""


def test_a_listener_escaping_with_a_base_exception_leaves_no_chunk_stranded() -> None:
    seen: list[int] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        if msg.queue_offset == 0:
            raise _Abort()
        seen.append(msg.queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption = _consumption(listener, 1)
    pool = ThreadPoolExecutor(1)
    consumer._context.executor = pool
    try:
        pq = ProcessQueue("t", 0)
        msgs = _messages(0, 200)
        pq.put(msgs)
        consumption.submit(pq, msgs)
        # The chunk whose listener escaped ends there (its messages stay held, so the offset
        # is never committed past them); every other chunk still reaches the listener.
        wait_until(lambda: 199 in seen, timeout_s=10)
        assert not consumption._backlog
    finally:
        pool.shutdown(wait=True)
