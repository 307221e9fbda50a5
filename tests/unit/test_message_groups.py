"""FIFO message groups: the lane rule (each group one message at a time, in offset order,
groups in parallel, committed offsets never past an unfinished message), how a message's
group is read, ``Message.message_group``, and the FIFO strategy on real threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge import ConsumeStatus, Message, MessageConst, MessageExt
from bridge.consumer import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    PushConsumer,
)
from bridge.consumer.fifo import FifoConsumption
from bridge.consumer.message_groups import GroupKey, GroupLanes, Lane, group_of
from bridge.consumer.process_queue import ProcessQueue
from bridge.errors import IllegalStateError, InvalidArgumentError, InvalidMessageError
from tests.conftest import wait_until

GROUPS = [None, "a", "b", "c"]
"""A message's group in the property test: None is no group."""


def _msg(offset: int, group: str | None, partition: int = 0) -> MessageExt:
    properties = {MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"id-{partition}-{offset}"}
    if group is not None:
        properties[MessageConst.SHARDING_KEY] = group
    return MessageExt(
        "t",
        b"x",
        msg_id=f"id-{partition}-{offset}",
        queue_id=partition,
        queue_offset=offset,
        properties=properties,
    )


def _no_key() -> object:
    raise AssertionError("a bridge message's record key is never read")


# --- the lane rule --------------------------------------------------------------------------
_STEP = st.one_of(
    st.tuples(st.just("receive"), st.integers(0, 1), st.lists(st.sampled_from(GROUPS), max_size=6)),
    st.tuples(st.just("take")),
    st.tuples(st.just("succeed"), st.integers(0, 20)),
    st.tuples(st.just("fail"), st.integers(0, 20)),
    st.tuples(st.just("resume"), st.integers(0, 20)),
)


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.lists(_STEP, max_size=60))
def test_groups_run_one_at_a_time_in_order_and_commits_never_pass_unfinished_work(
    steps: list[tuple[Any, ...]],
) -> None:
    lanes: GroupLanes[MessageExt] = GroupLanes()
    queues = [ProcessQueue("t", 0), ProcessQueue("t", 1)]
    next_offset = [0, 0]
    out: dict[Lane, MessageExt] = {}  # taken, running
    failed: dict[Lane, MessageExt] = {}  # taken, failed, put back, waiting to be resumed
    done: set[tuple[int, int]] = set()
    last_taken: dict[Lane, int] = {}
    lane_of: dict[tuple[int, int], GroupKey] = {}

    def run(step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "receive":
            _, p, groups = step
            msgs = [_msg(next_offset[p] + i, g, p) for i, g in enumerate(groups)]
            next_offset[p] += len(msgs)
            queues[p].put(msgs)
            for msg in msgs:
                lane_of[(p, msg.queue_offset)] = group = group_of(msg, _no_key)
                lanes.add(queues[p], group, msg)
        elif kind == "take":
            taken = lanes.take()
            if taken is None:
                return
            lane, msg = taken
            assert lane not in out and lane not in failed, "two messages of a group out"
            previous = last_taken.get(lane)
            assert previous is None or msg.queue_offset >= previous, "a group out of order"
            last_taken[lane] = msg.queue_offset
            assert (msg.queue_id, msg.queue_offset) not in done, "a done message taken again"
            out[lane] = msg
        elif kind in ("succeed", "fail") and out:
            lane = sorted(out, key=repr)[step[1] % len(out)]
            msg = out.pop(lane)
            if kind == "succeed":
                queues[msg.queue_id].remove([msg.queue_offset])
                done.add((msg.queue_id, msg.queue_offset))
                lanes.release(lane)
            else:
                lanes.put_back(lane, [msg])
                failed[lane] = msg
        elif kind == "resume" and failed:
            lane = sorted(failed, key=repr)[step[1] % len(failed)]
            del failed[lane]
            lanes.release(lane)

    def check() -> None:
        for p, pq in enumerate(queues):
            unfinished = [o for o in range(next_offset[p]) if (p, o) not in done]
            committed = pq.commit_offset()
            if unfinished:
                assert committed is not None and committed <= min(unfinished), "offset passed"

    for step in steps:
        run(step)
        check()
    # Every group not held by a running or failed message can go on: nothing else blocks it.
    while True:
        taken = lanes.take()
        if taken is None:
            break
        lane, msg = taken
        assert lane not in out and lane not in failed
        previous = last_taken.get(lane)
        assert previous is None or msg.queue_offset >= previous
        last_taken[lane] = msg.queue_offset
        queues[msg.queue_id].remove([msg.queue_offset])
        done.add((msg.queue_id, msg.queue_offset))
        lanes.release(lane)
        check()
    # Only messages behind a running or failed one of their group wait.
    held = {(m.queue_id, m.queue_offset) for m in [*out.values(), *failed.values()]}
    behind = [(p, o) for p in (0, 1) for o in range(next_offset[p]) if (p, o) not in done | held]
    assert lanes.waiting == len(behind) + len(failed)
    for p, o in behind:
        assert (queues[p], lane_of[(p, o)]) in out.keys() | failed.keys(), "blocked by another"
    # ... and once those are resumed and succeed, everything is done and committed.
    for lane, msg in list(out.items()) + list(failed.items()):
        if lane in failed:
            lanes.release(lane)
            taken = lanes.take()
            assert taken is not None and taken[1] is msg, "a failed message is retried first"
        queues[msg.queue_id].remove([msg.queue_offset])
        done.add((msg.queue_id, msg.queue_offset))
        lanes.release(lane)
        while (taken := lanes.take()) is not None:
            queues[taken[1].queue_id].remove([taken[1].queue_offset])
            done.add((taken[1].queue_id, taken[1].queue_offset))
            lanes.release(taken[0])
    assert lanes.waiting == 0
    for p, pq in enumerate(queues):
        assert pq.held == 0
        assert pq.commit_offset() == (next_offset[p] if next_offset[p] else None)


def test_a_failed_message_holds_up_its_group_only() -> None:
    lanes: GroupLanes[str] = GroupLanes()
    added: list[tuple[str, GroupKey]] = [("a1", b"a"), ("b1", b"b"), ("a2", b"a"), ("b2", b"b")]
    for item, group in [*added, ("x", 7)]:
        lanes.add("p", group, item)
    assert [lanes.take(), lanes.take(), lanes.take()] == [
        (("p", b"a"), "a1"),
        (("p", b"b"), "b1"),
        (("p", 7), "x"),
    ]
    lanes.put_back(("p", b"a"), ["a1"])  # a1 failed: retried later, in place
    lanes.release(("p", b"b"))
    assert lanes.take() == (("p", b"b"), "b2")
    assert lanes.take() is None, "a2 waits behind a1"
    lanes.release(("p", b"a"))
    assert lanes.take() == (("p", b"a"), "a1")


def test_messages_pushed_to_a_lanes_front_come_first_and_an_out_lane_stays_out() -> None:
    lanes: GroupLanes[str] = GroupLanes()
    lanes.add("p", b"a", "a3")
    lanes.push_front("p", b"b", ["b1", "b2"])  # an empty lane: ready, in the given order
    lanes.push_front("p", b"a", ["a1", "a2"])
    assert lanes.take() == (("p", b"a"), "a1")
    lanes.push_front("p", b"a", ["a0"])  # a1 is out: the lane offers nothing until released
    assert lanes.take() == (("p", b"b"), "b1")
    assert lanes.take() is None
    lanes.release(("p", b"a"))
    assert [lanes.take(), lanes.release(("p", b"a")), lanes.take()] == [
        (("p", b"a"), "a0"),
        True,
        (("p", b"a"), "a2"),
    ]


def test_forgotten_lanes_offer_nothing_and_late_releases_do_nothing() -> None:
    lanes: GroupLanes[str] = GroupLanes()
    lanes.add("p", b"a", "a1")
    lanes.add("p", b"a", "a2")
    lanes.add("q", b"a", "qa1")
    taken = lanes.take()
    assert taken == (("p", b"a"), "a1")
    assert lanes.forget("p") == 1
    assert not lanes.release(("p", b"a"))
    lanes.put_back(("p", b"a"), ["a1"])
    assert lanes.take() == (("q", b"a"), "qa1")
    assert lanes.take() is None and lanes.waiting == 0


# --- a message's group ----------------------------------------------------------------------
def test_the_group_is_the_message_group_else_a_foreign_records_key_else_the_offset() -> None:
    assert group_of(_msg(3, "g"), _no_key) == b"g"
    assert group_of(_msg(3, "é"), _no_key) == "é".encode()
    assert group_of(_msg(3, None), _no_key) == 3
    binary = _msg(4, None)
    binary.put_system_property(MessageConst.SHARDING_KEY, b"\xff\x00")
    assert group_of(binary, _no_key) == b"\xff\x00"
    empty = _msg(5, None)
    empty.put_system_property(MessageConst.SHARDING_KEY, "")
    assert group_of(empty, _no_key) == 5, "an empty group is none"
    foreign = MessageExt("t", b"x", queue_offset=9)  # no UNIQ_KEY: another Kafka client's
    assert group_of(foreign, lambda: b"user-1") == b"user-1"
    assert group_of(foreign, lambda: None) == 9
    assert group_of(foreign, lambda: b"") == 9


def test_message_group_is_rocketmq_5s_sharding_key_property_and_the_record_key() -> None:
    msg = Message("t", b"x", message_group="order-42")
    assert msg.message_group == "order-42"
    assert msg.get_property(MessageConst.SHARDING_KEY) == "order-42"
    assert msg.sharding_key == "order-42"
    assert msg.kafka_key() == b"order-42"
    msg.message_group = "order-43"
    assert msg.kafka_key() == b"order-43"
    msg.message_group = None
    assert msg.message_group is None and msg.kafka_key() is None
    assert Message("t", b"x", sharding_key="s").message_group == "s"
    assert Message("t", b"x").message_group is None


@pytest.mark.parametrize(
    ("group", "why"),
    [
        ("", "blank"),
        ("  ", "blank"),
        ("a\nb", r"control character U\+000A"),
        ("a\x85", r"control character U\+0085"),
        ("x" * 64, "64 bytes"),
        ("é" * 32, "64 bytes"),
        ("\ud800", "lone surrogate"),
        (b"g", "must be text"),
        (7, "must be text"),
    ],
)
def test_a_message_group_rocketmq_5_would_refuse_is_a_typed_error(group: object, why: str) -> None:
    with pytest.raises(InvalidMessageError, match=why):
        Message("t", b"x", message_group=group)  # type: ignore[arg-type]
    msg = Message("t", b"x")
    with pytest.raises(InvalidMessageError, match=why):
        msg.message_group = group  # type: ignore[assignment]
    assert msg.message_group is None


def test_a_group_of_63_bytes_is_taken() -> None:
    assert Message("t", b"x", message_group="x" * 63).message_group == "x" * 63


def test_message_group_with_a_sharding_key_or_key_object_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="message_group or sharding_key"):
        Message("t", b"x", message_group="g", sharding_key="s")
    with pytest.raises(InvalidMessageError, match="message_group or sharding_key"):
        Message("t", message_group="g", key="k", value="v")
    # Set afterwards: the key serializer's bytes would replace the group at send time.
    keyed = Message("t", key="k", value="v")
    with pytest.raises(InvalidMessageError, match="key= cannot take a message_group"):
        keyed.message_group = "g"
    assert keyed.message_group is None


# --- the consumer's mode --------------------------------------------------------------------
class _Orderly(MessageListenerOrderly):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


class _Concurrent(MessageListenerConcurrently):
    def consume_message(self, msgs: list[MessageExt], context: Any) -> ConsumeStatus:
        return ConsumeStatus.CONSUME_SUCCESS


def _ok(msg: MessageExt) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


def test_fifo_is_a_mode_of_its_own_that_takes_callables() -> None:
    with pytest.raises(InvalidArgumentError, match="orderly=True and fifo=True"):
        PushConsumer("g", orderly=True, fifo=True)
    consumer = PushConsumer("g", fifo=True)
    assert consumer.fifo and not consumer.orderly
    assert consumer.max_reconsume_times == 16, "a group's default budget, as RocketMQ 5's"
    for listener in (_Orderly(), _Concurrent()):
        with pytest.raises(InvalidArgumentError, match="FIFO consumer calls its listener"):
            consumer.subscribe("t", listener)
    consumer.subscribe("t", _ok)
    assert isinstance(consumer._new_consumption(), FifoConsumption)
    with pytest.raises(IllegalStateError, match="it is FIFO"):
        consumer.orderly = True
    orderly = PushConsumer("g2")
    orderly.subscribe("t", _Orderly())
    with pytest.raises(IllegalStateError, match="consumes orderly"):
        orderly.fifo = True
    later = PushConsumer("g3")
    later.subscribe("t", _ok)
    later.fifo = True
    assert isinstance(later._new_consumption(), FifoConsumption)


# --- the strategy on real threads -----------------------------------------------------------
def _fifo(
    listener: Callable[[MessageExt], ConsumeStatus], threads: int, **options: Any
) -> tuple[PushConsumer, FifoConsumption, ThreadPoolExecutor]:
    consumer = PushConsumer("g", fifo=True, consume_thread_count=threads, **options)
    consumer.subscribe("t", listener)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, FifoConsumption)
    pool = ThreadPoolExecutor(threads)
    consumer._context.executor = pool
    return consumer, consumption, pool


def test_groups_interleaved_in_one_partition_run_in_parallel_each_in_order() -> None:
    lock = threading.Lock()
    running: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    most_at_once = 0

    def listener(msg: MessageExt) -> ConsumeStatus:
        nonlocal most_at_once
        group = msg.message_group or ""
        with lock:
            running[group] = running.get(group, 0) + 1
            assert running[group] == 1, f"two messages of {group} at once"
            most_at_once = max(most_at_once, sum(running.values()))
        time.sleep(0.002)
        with lock:
            running[group] -= 1
            seen.setdefault(group, []).append(msg.queue_offset)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption, pool = _fifo(listener, 8)
    try:
        pq = ProcessQueue("t", 0)
        groups = [f"g{i}" for i in range(10)]
        for first in range(0, 400, 50):
            msgs = [_msg(o, groups[o % 10]) for o in range(first, first + 50)]
            pq.put(msgs)
            consumption.submit(pq, msgs)
        wait_until(lambda: pq.held == 0, timeout_s=30)
    finally:
        pool.shutdown(wait=True)
    for i, group in enumerate(groups):
        assert seen[group] == list(range(i, 400, 10)), f"{group} out of order"
    assert most_at_once > 1, "the groups ran in parallel"
    assert pq.commit_offset() == 400 and consumer.stats().consumed == 400
    assert consumption._workers == 0


def test_a_failed_message_is_retried_in_place_while_other_groups_go_on() -> None:
    lock = threading.Lock()
    seen: list[tuple[str, int, int]] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        with lock:
            seen.append((msg.message_group or "", msg.queue_offset, msg.reconsume_times))
        if msg.queue_offset == 0 and msg.reconsume_times < 2:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer, consumption, pool = _fifo(listener, 4, suspend_current_queue_time_millis=1)
    try:
        pq = ProcessQueue("t", 0)
        msgs = [_msg(o, "a" if o % 2 == 0 else "b") for o in range(10)]
        pq.put(msgs)
        consumption.submit(pq, msgs)
        wait_until(lambda: all(o in pq_offsets(seen) for o in range(1, 10, 2)))
        assert [o for g, o, _ in seen if g == "a"] == [0], "a waits behind its failed head"
        assert pq.commit_offset() == 0, "never past the failed message"
        while pq.held:
            consumer._context.scheduler.run_due()  # the poll thread's part: retries due
            time.sleep(0.005)
    finally:
        pool.shutdown(wait=True)
    a = [(o, n) for g, o, n in seen if g == "a"]
    assert a == [(0, 0), (0, 1), (0, 2), (2, 0), (4, 0), (6, 0), (8, 0)]
    assert pq.commit_offset() == 10


def pq_offsets(seen: list[tuple[str, int, int]]) -> set[int]:
    return {o for _, o, _ in seen}
