"""ProcessQueue's pure rules: held bytes, listener calls that settle or run past the consume
timeout, results that come after the partition was given up, offsets kept in order."""

from __future__ import annotations

import threading

import pytest

from bridge import MessageExt
from bridge.consumer import PushConsumerConfig
from bridge.consumer.process_queue import Call, ProcessQueue, Run, message_size
from bridge.errors import InvalidArgumentError


def _msg(offset: int, body: bytes = b"x", **properties: str) -> MessageExt:
    return MessageExt(
        "t", body, msg_id=f"id{offset}", queue_id=0, queue_offset=offset, properties=properties
    )


def test_held_bytes_count_bodies_and_properties_and_drop_as_messages_are_done() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(0, b"abcd", k="vv"), _msg(1, b"12")])
    assert message_size(_msg(0, b"abcd", k="vv")) == 4 + 1 + 2
    assert (pq.held, pq.held_bytes) == (2, 7 + 2)
    pq.remove([0])
    assert (pq.held, pq.held_bytes) == (1, 2)
    pq.remove([0, 1, 5])
    assert (pq.held, pq.held_bytes) == (0, 0)


def test_given_sizes_are_used_and_putting_an_offset_again_does_not_count_it_twice() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(0), _msg(1)], sizes=[100, 50], records=["r0", "r1"])
    pq.put([_msg(1)], sizes=[60], records=["r1b"])
    assert (pq.held, pq.held_bytes) == (2, 160)
    assert pq.record_of(1) == "r1b"
    assert pq.record_of(7) is None


@pytest.mark.parametrize(
    ("count", "size", "over"),
    [(3, 1000, True), (4, 30, True), (4, 31, False)],
)
def test_a_partition_is_over_when_either_threshold_is_reached(
    count: int, size: int, over: bool
) -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(o) for o in range(3)], sizes=[10, 10, 10])
    assert pq.over(count, size) is over


def test_offsets_put_out_of_order_still_commit_only_past_done_work() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(5)])
    pq.put([_msg(3), _msg(4)])
    assert pq.commit_offset() == 3
    pq.remove([3])
    assert pq.commit_offset() == 4
    pq.remove([4, 5])
    assert pq.commit_offset() == 6


def test_a_call_settles_the_results_of_the_messages_it_still_runs() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(3)]
    pq.put(msgs)
    call = object()
    pq.start(call, msgs, now=100.0)
    assert pq.settle(call, msgs) == {0, 1, 2}
    assert pq.settle(call, msgs) == set(), "a result counts once"


def test_a_message_past_the_timeout_is_taken_from_its_call_and_its_late_result_ignored() -> None:
    pq = ProcessQueue("t", 0)
    slow, quick = [_msg(0)], [_msg(1)]
    pq.put(slow + quick)
    slow_call, quick_call = object(), object()
    pq.start(slow_call, slow, now=100.0)
    pq.start(quick_call, quick, now=104.0)
    assert pq.overdue(now=105.0, timeout_s=5.0) == []
    assert pq.overdue(now=105.5, timeout_s=5.0) == slow
    assert pq.overdue(now=200.0, timeout_s=5.0) == quick, "each message is taken once"
    assert pq.held == 2, "overdue messages stay held until their copy is acknowledged"
    assert pq.commit_offset() == 0
    assert pq.settle(slow_call, slow) == set()


def test_a_message_started_again_belongs_to_its_new_call_only() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(0)]
    pq.put(msgs)
    stuck, retry = object(), object()
    pq.start(stuck, msgs, now=0.0)
    assert pq.overdue(now=10.0, timeout_s=1.0) == msgs
    pq.start(retry, msgs, now=10.0)  # consumed again locally (its copy was refused)
    assert pq.settle(stuck, msgs) == set()
    assert pq.settle(retry, msgs) == {0}


def test_results_that_settle_after_the_partition_was_released_never_count() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(0), _msg(1)]
    pq.put(msgs)
    call = object()
    assert pq.begin()
    pq.start(call, msgs, now=0.0)
    pq.drop()
    assert not pq.begin(), "a dropped queue starts no work"
    assert not pq.wait_idle(0.01)
    pq.release()
    assert pq.settle(call, msgs) == set()
    pq.end()
    assert pq.wait_idle(0.01)
    assert pq.commit_offset() == 0, "what the released call ran is never committed past"


def test_results_during_the_drain_still_count() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(0)]
    pq.put(msgs)
    call = object()
    pq.start(call, msgs, now=0.0)
    pq.drop()
    assert pq.settle(call, msgs) == {0}


def test_wait_idle_returns_as_soon_as_the_last_task_ends() -> None:
    pq = ProcessQueue("t", 0)
    assert pq.begin()
    ender = threading.Timer(0.05, pq.end)
    ender.start()
    assert pq.wait_idle(5.0)
    ender.join()


def test_orderly_enqueue_queues_only_the_messages_given() -> None:
    pq = ProcessQueue("t", 0)
    placeholder = _msg(1)
    pq.put([_msg(0), placeholder, _msg(2)])
    pq.enqueue([m for m in (_msg(0), _msg(2))])
    assert [m.queue_offset for m in pq.take(10)] == [0, 2]


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "15", True])
def test_consume_timeout_must_be_a_positive_number_of_minutes(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="consume_timeout"):
        PushConsumerConfig(consume_timeout=value)  # type: ignore[arg-type]


def test_consume_timeout_takes_fractions_of_a_minute_and_defaults_to_rocketmqs() -> None:
    assert PushConsumerConfig().consume_timeout == 15
    assert PushConsumerConfig(consume_timeout=0.05).consume_timeout == 0.05
    assert PushConsumerConfig().pull_threshold_size_for_queue == 100
    with pytest.raises(InvalidArgumentError, match="pull_threshold_size_for_queue"):
        PushConsumerConfig(pull_threshold_size_for_queue=0)


def test_withdraw_takes_back_only_what_the_call_still_runs() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(4)]
    pq.put(msgs)
    call, other = object(), object()
    pq.start(call, msgs[:3], 0.0)
    pq.start(other, msgs[3:], 0.0)
    pq.remove([0])  # done meanwhile
    assert pq.overdue(100.0, 50.0) == msgs[1:]  # taken by the consume timeout...
    pq.start(call, msgs[1:3], 60.0)  # ...and 1, 2 started again by this call
    assert [m.queue_offset for m in pq.withdraw(call, msgs)] == [1, 2]
    assert pq.withdraw(call, msgs) == [], "withdrawn once"
    assert pq.overdue(1000.0, 1.0) == [], "no longer in any call"
    assert pq.settle(call, msgs) == set(), "a late result of the call does not count"


def test_nothing_is_withdrawn_once_the_queue_is_released() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(0)])
    call = object()
    pq.start(call, [_msg(0)], 0.0)
    pq.release()
    assert pq.withdraw(call, [_msg(0)]) == []


def test_refusals_are_counted_per_held_message_and_forgotten_with_it() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(0), _msg(1)])
    assert [pq.note_refusal(0), pq.note_refusal(0), pq.note_refusal(1)] == [1, 2, 1]
    pq.remove([0])
    assert pq.note_refusal(0) == 0, "done: nothing to count"
    pq.put([_msg(0)])
    assert pq.note_refusal(0) == 1


def test_a_run_marks_what_it_consumed_done_in_one_step_and_counts_it() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(4)]
    pq.put(msgs, sizes=[10] * 4)
    run = pq.open_run()
    run.consumed += msgs[:2]
    assert pq.finish(run, [msgs[2]]) == [msgs[2]], "a failure still counts: sent back"
    assert (pq.held, pq.held_bytes, run.done) == (2, 20, 2)
    assert pq.commit_offset() == 2
    run.consumed.append(msgs[3])
    assert pq.finish(run, []) == []
    assert (pq.held, run.done, run.settled) == (1, 3, 3), "each consumed message marked once"
    pq.close_run(run)
    assert pq.overdue(1e12, 0.0) == []


def test_a_run_past_the_timeout_loses_its_current_message_and_pins_nothing_it_finished() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(5)]
    pq.put(msgs)
    run = pq.open_run()
    run.consumed += msgs[:2]  # 0 and 1 consumed, not yet marked done...
    run.current = (msgs[2], 100.0, 2)  # ...and 2 in the listener since t=100
    assert pq.overdue(104.0, 5.0) == []
    assert pq.overdue(106.0, 5.0) == [msgs[2]], "taken by the consume timeout"
    assert pq.commit_offset() == 2, "what the run finished before it is done"
    assert run.done == 2
    assert pq.overdue(200.0, 5.0) == [], "taken once"
    run.consumed.append(msgs[2])  # the listener returns at last: its result does not count
    assert pq.finish(run, [msgs[3]]) == [msgs[3]]
    assert pq.held == 3 and run.ignored == 1, "2 stays held until its copy is acknowledged"
    assert pq.finish(run, [msgs[2]]) == [], "nor a failure of a taken message"
    assert pq.withdraw_run(run, msgs) == [msgs[3], msgs[4]], "held and not taken"


def test_a_run_past_the_timeout_hands_the_messages_it_has_not_started_to_another_task() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(6)]
    pq.put(msgs)
    run = pq.open_run()
    run.messages = pending = iter(msgs)
    for msg in pending:  # the task: 0 and 1 consumed, 2 in the listener since t=100...
        if msg.queue_offset == 2:
            run.current = (msg, 100.0, 2)
            break
        run.consumed.append(msg)
    assert next(pending) is msgs[3]  # ...and its call of 2 returned just now, it took 3
    rest: list[MessageExt] = []
    assert pq.overdue(106.0, 5.0, rest) == [msgs[2]]
    assert rest == msgs[4:], "what the task had not taken, not 3 (it runs it)"
    assert list(pending) == [], "the task runs none of them"
    assert pq.overdue(200.0, 5.0, rest) == [] and rest == msgs[4:], "handed off once"
    assert pq.withdraw_run(run, msgs) == [msgs[3]], "neither taken nor handed off"
    assert pq.commit_offset() == 2


def test_a_call_past_the_timeout_hands_the_requests_of_its_task_not_started_to_another() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(6)]
    pq.put(msgs)
    run = Run()
    run.requests = pending = iter([msgs[0:2], msgs[2:4], msgs[4:6]])
    pq.start(Call(run), next(pending), 100.0)
    other: list[MessageExt] = []
    assert pq.overdue(106.0, 5.0, other) == msgs[0:2]
    assert other == msgs[2:], "the requests not started, as messages"
    assert list(pending) == []
    call = object()  # a call of no run (orderly): nothing else to hand off
    pq.start(call, msgs[2:4], 200.0)
    other.clear()
    assert pq.overdue(206.0, 5.0, other) == msgs[2:4] and other == []


def test_a_released_queue_counts_no_result_of_a_run() -> None:
    pq = ProcessQueue("t", 0)
    msgs = [_msg(o) for o in range(3)]
    pq.put(msgs)
    run = pq.open_run()
    run.consumed.append(msgs[0])
    pq.release()
    assert pq.finish(run, [msgs[1]]) == []
    assert (pq.held, run.done, run.ignored) == (3, 0, 2)
    assert pq.withdraw_run(run, msgs) == []
    assert pq.commit_offset() == 0, "never committed past what the released run ran"
