"""A simple consumer's bookkeeping without a broker: the leases (receipt handles, deadlines,
the cap) and the receive buffer over a partition's ProcessQueue, under random sequences of
receive, ack, change_invisible_duration, expiry, rebalance and copies acknowledged."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bridge import ClientConfig, MessageExt, SimpleConsumerConfig
from bridge.consumer.config import shared_settings
from bridge.consumer.context import ConsumerContext
from bridge.consumer.invisibility import LeaseEnd, Leases, check_duration
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import Quarantine
from bridge.consumer.simple import MessageView, SimpleConsumption
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidReceiptHandleError,
)


def _msg(offset: int, reconsume: int = 0) -> MessageExt:
    properties = {"RECONSUME_TIME": str(reconsume)} if reconsume else {}
    return MessageExt(
        "t", b"x", msg_id=f"id{offset}", queue_id=0, queue_offset=offset, properties=properties
    )


# --- the leases ----------------------------------------------------------------------------


def test_a_handle_acks_once_and_a_moved_deadline_leaves_the_old_handle_stale() -> None:
    book: Leases[str] = Leases("tok", limit=10)
    a = book.open("a", now=0.0, duration_s=5)
    b = book.open("b", now=0.0, duration_s=5)
    old = b.handle
    new = book.change(b, old, now=1.0, duration_s=10)
    assert new != old and b.deadline == 11.0
    with pytest.raises(InvalidReceiptHandleError) as stale:
        book.ack(b, old)
    assert stale.value.reason == "replaced"
    book.ack(a, a.handle)
    with pytest.raises(InvalidReceiptHandleError) as twice:
        book.ack(a, a.handle)
    assert twice.value.reason == "acked"
    assert book.expired(6.0) == []  # a acked, b moved to 11
    assert book.expired(11.0) == [b]
    with pytest.raises(InvalidReceiptHandleError) as late:
        book.ack(b, new)
    assert late.value.reason == "expired"
    with pytest.raises(InvalidReceiptHandleError) as foreign:
        book.ack(b, "other.1")
    assert foreign.value.reason == "foreign"
    assert len(book) == 0


def test_a_handle_past_its_deadline_is_refused_before_the_expiry_is_taken() -> None:
    # RocketMQ refuses a receipt handle as soon as its invisible time is over, not when the
    # broker gets round to it: so does the book, though expired() has not run yet.
    book: Leases[str] = Leases("tok", limit=10)
    lease = book.open("a", now=0.0, duration_s=5)
    for refused in (
        lambda: book.ack(lease, lease.handle, now=5.0),
        lambda: book.change(lease, lease.handle, now=5.5, duration_s=60),
        lambda: book.check(lease, lease.handle, now=6.0),
    ):
        with pytest.raises(InvalidReceiptHandleError) as late:
            refused()
        assert late.value.reason == "expired"
    assert lease.end is None and len(book) == 1  # left for expired() to send back
    assert book.expired(6.0) == [lease]
    b = book.open("b", now=6.0, duration_s=5)
    book.ack(b, b.handle, now=10.9)  # before its deadline: acked
    assert b.end is LeaseEnd.ACKED and len(book) == 0


def test_shortening_a_deadline_expires_the_message_sooner() -> None:
    book: Leases[str] = Leases("tok", limit=10)
    lease = book.open("a", now=0.0, duration_s=60)
    book.change(lease, lease.handle, now=1.0, duration_s=1)
    assert book.expired(2.0) == [lease]
    assert lease.end is LeaseEnd.EXPIRED


def test_room_is_the_limit_less_the_open_leases() -> None:
    book: Leases[int] = Leases("tok", limit=2)
    first = book.open(1, 0.0, 1)
    book.open(2, 0.0, 1)
    assert book.room() == 0
    book.ack(first, first.handle)
    assert book.room() == 1
    book.expired(5.0)
    assert book.room() == 2


@pytest.mark.parametrize("bad", [0, -1, -0.5, float("nan"), float("inf"), "5", None, True])
def test_durations_must_be_positive_finite_seconds(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="invisible_duration"):
        check_duration("invisible_duration", bad, 3600)


def test_durations_above_the_maximum_are_refused_by_name() -> None:
    assert check_duration("d", 1.5, 10) == 1.5
    with pytest.raises(InvalidArgumentError, match="at most 10 s"):
        check_duration("d", 11, 10)


class LeaseBook(RuleBasedStateMachine):
    """Random opens, acks (current, stale and foreign handles), changes, releases and clock
    moves against a model: each lease ends once, expiry returns exactly the open leases that
    are due, and the heap of deadlines stays bounded."""

    def __init__(self) -> None:
        super().__init__()
        self.book: Leases[int] = Leases("tok", limit=1000)
        self.now = 0.0
        self.leases: list[Any] = []
        self.model: dict[int, float] = {}
        """lease index -> deadline, of the open leases"""
        self.handles: dict[int, list[str]] = {}
        """lease index -> every handle it had, the current last"""
        self.ended: dict[int, LeaseEnd] = {}

    @rule(duration=st.floats(0.1, 20))
    def open(self, duration: float) -> None:
        index = len(self.leases)
        lease = self.book.open(index, self.now, duration)
        self.leases.append(lease)
        self.model[index] = self.now + duration
        self.handles[index] = [lease.handle]

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), stale=st.booleans())
    def ack(self, data: st.DataObject, stale: bool) -> None:
        index = data.draw(st.integers(0, len(self.leases) - 1))
        lease = self.leases[index]
        handle = self.handles[index][0 if stale else -1]
        current = handle == self.handles[index][-1]
        if index in self.model and current:
            self.book.ack(lease, handle)
            del self.model[index]
            self.ended[index] = LeaseEnd.ACKED
        else:
            with pytest.raises(InvalidReceiptHandleError):
                self.book.ack(lease, handle)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data(), duration=st.floats(0.1, 20))
    def change(self, data: st.DataObject, duration: float) -> None:
        index = data.draw(st.integers(0, len(self.leases) - 1))
        lease = self.leases[index]
        if index in self.model:
            new = self.book.change(lease, self.handles[index][-1], self.now, duration)
            self.handles[index].append(new)
            self.model[index] = self.now + duration
        else:
            with pytest.raises(InvalidReceiptHandleError):
                self.book.change(lease, self.handles[index][-1], self.now, duration)

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.leases) - 1))
        assert self.book.release(self.leases[index]) == (index in self.model)
        if index in self.model:
            del self.model[index]
            self.ended[index] = LeaseEnd.RELEASED

    @rule(step=st.floats(0, 8))
    def tick(self, step: float) -> None:
        self.now += step
        due = self.book.expired(self.now)
        expected = {i for i, deadline in self.model.items() if deadline <= self.now}
        assert {lease.item for lease in due} == expected
        deadlines = [lease.deadline for lease in due]
        assert deadlines == sorted(deadlines)
        for index in expected:
            del self.model[index]
            self.ended[index] = LeaseEnd.EXPIRED

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert len(self.book) == len(self.model)
        assert {lease.item for lease in self.book.open_leases()} == set(self.model)
        for index, end in self.ended.items():
            assert self.leases[index].end is end
        assert len(self.book._due) <= 2 * len(self.model) + 64 + len(self.leases)


TestLeaseBook = LeaseBook.TestCase
TestLeaseBook.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# --- the receive buffer over a partition ---------------------------------------------------


class _Copies:
    """Stands in for the retry policy's copies: records what was sent back; the test says
    when Kafka acknowledged each (then the message is done in its queue)."""

    def __init__(self) -> None:
        self.sent: list[tuple[ProcessQueue, MessageExt, list[int]]] = []

    def fail(self, pq: ProcessQueue, msgs: list[MessageExt], levels: list[int]) -> None:
        for msg in msgs:
            self.sent.append((pq, msg, levels))


class _Clock:
    """Monotonic seconds that pass only when the test says: a lease of 1 ms expires after
    :meth:`advance`, never because a busy machine was slow between two calls."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _consumption(
    max_unacked: int = 100, clock: _Clock | None = None
) -> tuple[SimpleConsumption, _Copies]:
    config = ClientConfig(bootstrap_servers="127.0.0.1:1", namespace="unit")
    context = ConsumerContext("g", config, shared_settings(SimpleConsumerConfig()))
    consumption = SimpleConsumption(context, Quarantine(context), max_unacked, clock or _Clock())
    copies = _Copies()
    consumption.policy = copies  # type: ignore[assignment]
    return consumption, copies


def _fetch(consumption: SimpleConsumption, pq: ProcessQueue, offsets: range) -> None:
    msgs = [_msg(o) for o in offsets]
    pq.put(msgs)
    consumption.submit(pq, msgs)


def test_receive_takes_in_order_and_ack_lets_the_committed_offset_pass() -> None:
    consumption, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(5))
    first = consumption.take(2, 30, 0)
    assert [v.message.queue_offset for v in first] == [0, 1]
    assert [v.delivery_attempt for v in first] == [1, 1]
    consumption.ack(first[1])
    assert pq.commit_offset() == 0  # offset 0 is still out
    consumption.ack(first[0])
    assert pq.commit_offset() == 2  # 2..4 fetched, not received yet
    rest = consumption.take(10, 30, 0)
    assert [v.message.queue_offset for v in rest] == [2, 3, 4]
    for view in rest:
        consumption.ack(view)
    assert pq.commit_offset() == 5
    assert consumption.unacked() == 0 and pq.running == 0


def test_an_expired_message_is_sent_back_and_done_only_once_its_copy_is_acknowledged() -> None:
    clock = _Clock()
    consumption, copies = _consumption(clock=clock)
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(2))
    views = consumption.take(2, 0.001, 0)
    clock.advance(0.002)
    consumption.expire_overdue([pq])
    assert [m.queue_offset for _, m, _ in copies.sent] == [0, 1]
    assert all(levels == [0, 0] for _, _, levels in copies.sent)
    assert copies.sent[0][1].get_property("CONSUME_FAILURE") == "NOT_ACKED"
    assert pq.commit_offset() == 0  # copies not acknowledged yet
    with pytest.raises(InvalidReceiptHandleError) as late:
        consumption.ack(views[0])
    assert late.value.reason == "expired"
    pq.remove([0, 1])  # both copies acknowledged
    assert pq.commit_offset() == 2


def test_a_redelivery_counts_its_attempt() -> None:
    consumption, _ = _consumption()
    pq = ProcessQueue("rmq.RETRY.g", 0)
    msg = _msg(7, reconsume=2)
    pq.put([msg])
    consumption.submit(pq, [msg])
    (view,) = consumption.take(1, 30, 0)
    assert view.delivery_attempt == 3


def test_a_partition_given_up_refuses_acks_and_skips_its_unreceived_messages() -> None:
    consumption, copies = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(3))
    (view,) = consumption.take(1, 30, 0)
    assert pq.running == 1  # a rebalance waits for it
    pq.release()
    with pytest.raises(InvalidReceiptHandleError) as moved:
        consumption.ack(view)
    assert moved.value.reason == "released"
    assert pq.running == 0
    assert consumption.take(5, 30, 0) == []  # 1 and 2 are the next owner's
    assert pq.commit_offset() == 0 and copies.sent == []


def test_the_cap_limits_what_receive_hands_out_until_acks_free_room() -> None:
    consumption, _ = _consumption(max_unacked=3)
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(10))
    views = consumption.take(10, 30, 0)
    assert len(views) == 3
    assert consumption.take(10, 30, 0.01) == []
    consumption.ack(views[0])
    assert len(consumption.take(10, 30, 0)) == 1


def test_acks_of_foreign_objects_and_other_consumers_messages_are_typed_errors() -> None:
    mine, _ = _consumption()
    other, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(other, pq, range(1))
    (theirs,) = other.take(1, 30, 0)
    with pytest.raises(InvalidReceiptHandleError) as foreign:
        mine.ack(theirs)
    assert foreign.value.reason == "foreign"
    with pytest.raises(InvalidArgumentError, match="MessageView"):
        mine.ack(_msg(0))
    with pytest.raises(InvalidArgumentError, match="MessageView"):
        mine.change(theirs.receipt_handle, 5)


def test_a_view_no_simple_consumer_received_is_nobody_s_to_ack() -> None:
    # The view a bridge.v5 push consumer's listener or transaction checker is given.
    consumption, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(1))
    pushed = MessageView(_msg(0))
    assert pushed.receipt_handle is None and pushed.message_id == _msg(0).msg_id
    for call in (lambda: consumption.ack(pushed), lambda: consumption.change(pushed, 5)):
        with pytest.raises(InvalidReceiptHandleError) as refused:
            call()
        assert refused.value.reason == "foreign"
    consumption.give_back([pushed])  # not this consumer's to offer again: left as it is
    (received,) = consumption.take(5, 30, 0)
    assert received.message.queue_offset == 0 and consumption.take(5, 30, 0) == []


def test_an_application_that_changes_where_a_message_was_read_cannot_hide_it() -> None:
    clock = _Clock()
    consumption, copies = _consumption(clock=clock)
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(2))
    first, second = consumption.take(2, 0.001, 0)
    first.message.queue_offset = 99
    second.message.topic = "elsewhere"
    consumption.ack(first)
    clock.advance(0.002)
    consumption.expire_overdue([pq])
    assert [(m.queue_offset, m.topic) for _, m, _ in copies.sent] == [(1, "t")]
    assert pq.commit_offset() == 1


def test_change_gives_the_view_a_new_handle_and_ack_uses_it() -> None:
    consumption, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(1))
    (view,) = consumption.take(1, 30, 0)
    old = view.receipt_handle
    new = consumption.change(view, 60)
    assert view.receipt_handle == new != old
    consumption.ack(view)
    assert pq.commit_offset() == 1


def test_give_back_offers_the_same_delivery_again_first() -> None:
    consumption, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(3))
    taken = consumption.take(2, 30, 0)
    consumption.give_back(taken)
    assert pq.running == 0
    again = consumption.take(3, 30, 0)
    assert [v.message.queue_offset for v in again] == [0, 1, 2]
    assert all(v.delivery_attempt == 1 for v in again)


def test_leases_of_a_partition_given_up_end_as_released_and_free_their_room() -> None:
    consumption, _ = _consumption(max_unacked=2)
    kept, moved = ProcessQueue("t", 0), ProcessQueue("t", 1)
    _fetch(consumption, kept, range(1))
    _fetch(consumption, moved, range(1))
    on_kept, on_moved = consumption.take(2, 30, 0)
    assert consumption.unacked() == 2
    moved.release()  # the fetcher gave partition 1 up, then tells the strategy
    consumption.released([moved])
    assert consumption.unacked() == 1 and moved.running == 0
    with pytest.raises(InvalidReceiptHandleError) as late:
        consumption.ack(on_moved)
    assert late.value.reason == "released"
    consumption.ack(on_kept)  # the other partition's lease is untouched
    assert kept.commit_offset() == 1


def test_give_back_leaves_another_consumers_messages_and_refuses_what_is_no_message() -> None:
    a, _ = _consumption()
    b, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(a, pq, range(1))
    (view,) = a.take(1, 30, 0)
    b.give_back([view])
    assert b.take(1, 30, 0) == [] and a.unacked() == 1
    a.ack(view)
    with pytest.raises(InvalidArgumentError):
        b.give_back(["x"])  # type: ignore[list-item]


def test_close_releases_every_lease_and_refuses_further_calls() -> None:
    consumption, _ = _consumption()
    pq = ProcessQueue("t", 0)
    _fetch(consumption, pq, range(2))
    views = consumption.take(2, 30, 0)
    assert consumption.close() == 2
    assert pq.running == 0
    with pytest.raises(IllegalStateError):
        consumption.ack(views[0])
    with pytest.raises(IllegalStateError):
        consumption.take(1, 30, 0)


def test_receives_and_acks_from_many_threads_hand_each_message_out_once() -> None:
    consumption, _ = _consumption(max_unacked=50)
    pq = ProcessQueue("t", 0)
    total = 2000
    _fetch(consumption, pq, range(total))
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            views = consumption.take(7, 30, 0)
            if not views:
                return
            for view in views:
                consumption.ack(view)
            with lock:
                seen.extend(v.message.queue_offset for v in views)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seen) == list(range(total))
    assert pq.commit_offset() == total and pq.running == 0


class PartitionLeases(RuleBasedStateMachine):
    """One partition read by a simple consumer: fetches, receives, acks, deadline changes,
    expiries whose copies Kafka acknowledges later, and a rebalance. The committed offset
    never passes a message that is neither acked nor acknowledged as sent back (G6), and each
    received message ends once."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()
        self.consumption, self.copies = _consumption(max_unacked=8, clock=self.clock)
        self.pq = ProcessQueue("t", 0)
        self.next_offset = 0
        self.views: list[MessageView] = []
        self.finished: set[int] = set()
        """offsets acked, or whose copy Kafka acknowledged"""
        self.acknowledged_copies = 0

    @rule(count=st.integers(1, 5))
    def fetch(self, count: int) -> None:
        if self.pq.released:
            return
        _fetch(self.consumption, self.pq, range(self.next_offset, self.next_offset + count))
        self.next_offset += count

    @rule(count=st.integers(1, 4), short=st.booleans())
    def receive(self, count: int, short: bool) -> None:
        views = self.consumption.take(count, 0.0005 if short else 600, 0)
        offsets = [v.message.queue_offset for v in self.views]
        for view in views:
            assert view.message.queue_offset not in offsets, "a message out twice at once"
        self.views += views

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        view = data.draw(st.sampled_from(self.views))
        try:
            self.consumption.ack(view)
        except InvalidReceiptHandleError:
            return
        offset = view.message.queue_offset
        assert offset not in self.finished
        self.finished.add(offset)

    @precondition(lambda self: bool(self.views))
    @rule(data=st.data(), short=st.booleans())
    def change(self, data: st.DataObject, short: bool) -> None:
        view = data.draw(st.sampled_from(self.views))
        with contextlib.suppress(InvalidReceiptHandleError):
            self.consumption.change(view, 0.0005 if short else 600)

    @rule()
    def time_passes(self) -> None:
        # Short leases end; until the next sweep, an ack or change of one is what decides.
        self.clock.advance(0.001)

    @rule()
    def expire(self) -> None:
        self.consumption.expire_overdue([self.pq])

    @precondition(lambda self: self.acknowledged_copies < len(self.copies.sent))
    @rule()
    def copy_acknowledged(self) -> None:
        pq, msg, _ = self.copies.sent[self.acknowledged_copies]
        self.acknowledged_copies += 1
        offset = msg.queue_offset
        assert offset not in self.finished, "sent back after it was acked"
        pq.remove([offset])
        self.finished.add(offset)

    @rule()
    def rebalance(self) -> None:
        self.pq.release()

    @invariant()
    def never_past_an_unfinished_message(self) -> None:
        committed = self.pq.commit_offset()
        if committed is None:
            return
        unfinished = set(range(self.next_offset)) - self.finished
        assert all(o >= committed for o in unfinished)
        assert len(self.consumption.leases) <= 8


TestPartitionLeases = PartitionLeases.TestCase
TestPartitionLeases.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


# --- the copy of an expired message ----------------------------------------------------------


def test_an_expired_message_is_copied_straight_to_the_retry_topic_and_to_the_dlq_at_the_end() -> (
    None
):
    consumption, _ = _consumption()
    policy = SimpleConsumption(consumption._context, Quarantine(consumption._context), 10).policy
    catalog = consumption._context.catalog
    msg = _msg(3, reconsume=1)
    msg.put_user_property("raw", b"\xff")
    route, record = policy.copy_of(msg, 0)
    assert (route.to_dlq, route.delay_level, route.reconsume_times) == (False, 0, 2)
    assert record.kafka_topic == catalog.retry_topic("g")  # not SCHEDULE: no delay level
    headers = dict(record.headers)
    assert headers["RECONSUME_TIME"] == b"2"
    assert headers["RETRY_TOPIC"] == b"t"
    assert headers["raw"] == b"\xff"
    last = _msg(4, reconsume=16)  # the 17th delivery (max_delivery_attempts) expired
    route, record = policy.copy_of(last, 0)
    assert route.to_dlq and record.kafka_topic == catalog.dlq_topic("g")
