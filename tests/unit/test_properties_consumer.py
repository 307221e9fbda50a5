"""Properties of the push consumer's retry ladder and its per-partition bookkeeping.

What the modules promise (``bridge.consumer.model``, ``bridge.consumer.send_back``,
``bridge.consumer.process_queue``; G6 in docs/guarantees.md): RocketMQ's send-back rule, a
message that failed ``n`` times waits at delay level ``3 + n`` (or its listener's level) and
goes to ``%DLQ%<group>`` after ``max_reconsume_times`` failures (-1: 16 for a concurrent
listener, unlimited for an orderly one), every copy keeping its body, keys, tags, properties and
id and counting one failure more; and a partition's committed offset never passes a message
that is not done, however listener calls settle, are withdrawn or run past the timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bridge import ClientConfig, MessageConst, MessageExt
from bridge.codec import (
    header_bytes,
    header_delivery_record,
    message_from_record,
)
from bridge.consumer.model import (
    DEFAULT_MAX_RECONSUME_TIMES,
    FIRST_RETRY_LEVEL,
    ORDERLY_UNLIMITED_RECONSUME,
    checked_ack_index,
    checked_delay_level,
    effective_max_reconsume_times,
    retry_route,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.send_back import send_back_record
from bridge.kafka.transactional import REMOVED_ON_DELIVERY
from bridge.message import PropertyValue
from topics.catalog import SystemTopic
from topics.naming import dlq_topic, retry_topic, system_topic

PROPERTY = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Fixed examples (no example database, nothing random between runs)."""

NAMESPACE = "ns"
GROUP = "order_consumer"
CONFIG = ClientConfig(namespace=NAMESPACE)
LEVELS = CONFIG.delay_policy.level_count

property_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8
).filter(lambda n: n not in MessageConst.__dict__.values())
property_values: st.SearchStrategy[PropertyValue] = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
    st.binary(max_size=12),
)


# --- the retry ladder ----------------------------------------------------------------------


@PROPERTY
@given(
    reconsume_times=st.integers(0, 10**6),
    max_reconsume_times=st.integers(-1, 64),
    orderly=st.booleans(),
    level=st.one_of(st.just(0), st.integers(-(2**31), 2**31)),
)
def test_a_failed_message_waits_one_level_more_per_failure_then_goes_to_the_dlq(
    reconsume_times: int, max_reconsume_times: int, orderly: bool, level: int
) -> None:
    budget = effective_max_reconsume_times(max_reconsume_times, orderly=orderly)
    if max_reconsume_times == -1:
        assert budget == (ORDERLY_UNLIMITED_RECONSUME if orderly else DEFAULT_MAX_RECONSUME_TIMES)
    else:
        assert budget == max_reconsume_times
    route = retry_route(reconsume_times, budget, level)
    assert route.reconsume_times == reconsume_times + 1, "every copy counts one failure more"
    assert route.to_dlq == (reconsume_times >= budget or level < 0)
    if not route.to_dlq:
        assert route.delay_level == (level if level > 0 else FIRST_RETRY_LEVEL + reconsume_times)
        assert route.delay_level >= 1


@dataclass
class _Record:
    """A consumed record as confluent-kafka hands it over (only what decoding reads)."""

    _topic: str
    _value: bytes | None
    _headers: list[tuple[str, bytes | None]]
    _offset: int

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return self._headers


def _consumed(
    topic: str, value: bytes | None, headers: Iterable[tuple[str, bytes | None]], at: int
) -> MessageExt:
    return message_from_record(_Record(topic, value, list(headers), at), CONFIG.catalog())


@settings(PROPERTY, max_examples=60)
@given(
    max_reconsume_times=st.sampled_from([-1, 0, 1, 2, 3, 16, 20]),
    levels=st.lists(st.integers(-1, 30), max_size=25),
    body=st.binary(max_size=64),
    keys=st.lists(st.text(alphabet="ab1-", min_size=1, max_size=4), max_size=3),
    tags=st.one_of(st.none(), st.text(alphabet="TagA-", min_size=1, max_size=5)),
    properties=st.dictionaries(property_names, property_values, max_size=5),
)
def test_a_message_that_always_fails_climbs_the_ladder_to_the_dlq_unchanged(
    max_reconsume_times: int,
    levels: list[int],
    body: bytes,
    keys: list[str],
    tags: str | None,
    properties: dict[str, PropertyValue],
) -> None:
    # Each hop as the bridge makes it: the consumer's send-back record, the schedule service
    # delivering it to the retry topic when its level's delay is over, the consumer decoding
    # the record it reads. ``levels``: what the listener asks for at each failure (0: default).
    headers = [(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, b"FIRST-ID")]
    headers += [(n, v.encode() if isinstance(v, str) else v) for n, v in properties.items()]
    if keys:
        headers.append((MessageConst.KEYS, " ".join(keys).encode()))
    if tags:
        headers.append((MessageConst.TAGS, tags.encode()))
    msg = _consumed("orders", body, headers, 0)
    budget = effective_max_reconsume_times(max_reconsume_times, orderly=False)
    deliveries = 0
    waited_at: list[int] = []
    while True:
        deliveries += 1
        assert deliveries <= budget + 1, "more deliveries than the retry budget"
        assert msg.reconsume_times == deliveries - 1
        asked = levels[deliveries - 1] if deliveries <= len(levels) else 0
        route = retry_route(msg.reconsume_times, budget, asked)
        record = send_back_record(msg, GROUP, route, budget, config=CONFIG, born_host=b"h")
        assert record.msg_id == "FIRST-ID"
        if route.to_dlq:
            assert record.kafka_topic == dlq_topic(GROUP, NAMESPACE)
            msg = _consumed(record.kafka_topic, record.value, record.headers, deliveries)
            break
        expected_level = CONFIG.delay_policy.clamp_level(
            asked if asked > 0 else FIRST_RETRY_LEVEL + msg.reconsume_times
        )
        assert record.kafka_topic == system_topic(SystemTopic.SCHEDULE.value, NAMESPACE)
        assert record.partition == expected_level - 1, "waits at its level, within the table"
        waited_at.append(expected_level)
        real = header_delivery_record(record.headers, record.value, NAMESPACE, REMOVED_ON_DELIVERY)
        assert real.kafka_topic == retry_topic(GROUP, NAMESPACE)
        msg = _consumed(real.kafka_topic, real.value, real.headers, deliveries)
    # Out of retries (or the listener asked for the DLQ): a dead letter of the first message.
    asked_dlq = next((i for i, level in enumerate(levels) if level < 0), None)
    assert deliveries == (budget if asked_dlq is None else min(budget, asked_dlq)) + 1
    if budget == DEFAULT_MAX_RECONSUME_TIMES and not any(levels):
        # RocketMQ's defaults: 16 retries at levels 3 to 18 (10 s ... 2 h), the whole table.
        assert waited_at == list(range(FIRST_RETRY_LEVEL, LEVELS + 1))
    assert msg.topic == f"%DLQ%{GROUP}"
    assert msg.msg_id == "FIRST-ID"
    assert msg.reconsume_times == deliveries
    assert msg.get_property(MessageConst.RETRY_TOPIC) == "orders"
    assert msg.get_property(MessageConst.ORIGIN_MESSAGE_ID) == "FIRST-ID"
    assert msg.get_property(MessageConst.MAX_RECONSUME_TIMES) == str(budget)
    assert msg.body == body
    assert msg.keys == keys
    assert msg.tags == (tags or None)
    kept = {n: header_bytes(msg.properties[n]) for n in properties}
    assert kept == {n: header_bytes(v) for n, v in properties.items()}, "byte for byte"
    for name in (MessageConst.DELAY_TIME_LEVEL, MessageConst.REAL_TOPIC):
        assert name not in msg.properties, name


@PROPERTY
@given(
    value=st.one_of(
        st.integers(), st.booleans(), st.floats(), st.none(), st.text(max_size=3), st.just(2**70)
    ),
    count=st.integers(1, 64),
)
def test_what_a_listener_leaves_in_its_context_is_checked_before_it_is_trusted(
    value: object, count: int
) -> None:
    index = checked_ack_index(value, count)
    level = checked_delay_level(value)
    if isinstance(value, bool) or not isinstance(value, int):
        assert index is None and level is None
    else:
        assert index is not None and -1 <= index <= count - 1
        assert index == max(-1, min(value, count - 1))
        assert level == value


# --- the process queue ---------------------------------------------------------------------


def _msg(offset: int) -> MessageExt:
    return MessageExt("t", b"x", msg_id=f"id{offset}", queue_id=0, queue_offset=offset)


class PartitionWork(RuleBasedStateMachine):
    """One partition's messages between receipt and completion, with listener calls that
    settle, are withdrawn, run past the consume timeout, or outlive the partition."""

    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue("t", 0)
        self.now = 0.0
        self.received: dict[int, int] = {}
        """offset -> size, of every message put (the newest size)"""
        self.done: set[int] = set()
        self.skipped: set[int] = set()
        self.calls = 0
        self.running: dict[int, list[MessageExt]] = {}
        """call -> the messages it was started with"""
        self.owner: dict[int, int] = {}
        """offset -> the call whose result for it still counts"""
        self.since: dict[int, float] = {}
        self.released = False
        self.pending: list[int] = []
        """offsets queued for an orderly task, in order"""

    def held(self) -> list[int]:
        return sorted(set(self.received) - self.done)

    @rule(
        offsets=st.lists(st.integers(0, 40), min_size=1, max_size=6),
        sizes=st.lists(st.integers(0, 100), min_size=6, max_size=6),
        orderly=st.booleans(),
    )
    def receive(self, offsets: list[int], sizes: list[int], orderly: bool) -> None:
        # In any order (put keeps them sorted); an offset is fetched once per assignment (a
        # cut poll seeks back to the first record it did not put).
        seen = set(self.received) | self.skipped
        offsets = [o for o in dict.fromkeys(offsets) if o not in seen]
        msgs = [_msg(o) for o in offsets]
        self.pq.put(msgs, pending=orderly, sizes=sizes[: len(msgs)])
        for o, size in zip(offsets, sizes, strict=False):
            self.received[o] = size
            if orderly:
                self.pending.append(o)

    @rule(offset=st.integers(0, 45))
    def skip(self, offset: int) -> None:
        if offset in self.received:
            return  # filtered offsets are never put
        self.pq.skip(offset)
        self.skipped.add(offset)

    @precondition(lambda self: bool(self.held()))
    @rule(data=st.data())
    def start_call(self, data: st.DataObject) -> None:
        offsets = data.draw(st.lists(st.sampled_from(self.held()), min_size=1, max_size=4))
        self.calls += 1
        msgs = [_msg(o) for o in dict.fromkeys(offsets)]
        self.pq.start(self.calls, msgs, self.now)
        self.running[self.calls] = msgs
        for m in msgs:
            self.owner[m.queue_offset] = self.calls
            self.since[m.queue_offset] = self.now

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), succeeded=st.booleans())
    def call_returns(self, data: st.DataObject, succeeded: bool) -> None:
        call = data.draw(st.sampled_from(sorted(self.running)))
        msgs = self.running.pop(call)
        counted = self.pq.settle(call, msgs)
        expected = set() if self.released else {
            m.queue_offset for m in msgs
            if m.queue_offset in self.held() and self.owner.get(m.queue_offset) == call
        }  # fmt: skip
        assert counted == expected, "a result counts once, for the call that still runs it"
        for m in msgs:
            if self.owner.get(m.queue_offset) == call:
                del self.owner[m.queue_offset]
        if succeeded:  # consumed (or its retry copy acknowledged): done
            self.pq.remove(counted)
            self.done |= counted

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def call_withdrawn(self, data: st.DataObject) -> None:
        # A call whose result cannot be used (it broke): what it still runs goes to another.
        call = data.draw(st.sampled_from(sorted(self.running)))
        msgs = self.running.pop(call)
        taken = self.pq.withdraw(call, msgs)
        expected = [] if self.released else [
            m.queue_offset for m in msgs
            if m.queue_offset in self.held() and self.owner.get(m.queue_offset) == call
        ]  # fmt: skip
        assert [m.queue_offset for m in taken] == expected
        for m in msgs:
            if self.owner.get(m.queue_offset) == call:
                del self.owner[m.queue_offset]
        if taken:
            self.calls += 1
            self.pq.start(self.calls, taken, self.now)
            self.running[self.calls] = taken
            for m in taken:
                self.owner[m.queue_offset] = self.calls
                self.since[m.queue_offset] = self.now

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 30.0]), timeout=st.sampled_from([1.0, 10.0]))
    def time_passes_and_late_calls_are_cut(self, seconds: float, timeout: float) -> None:
        self.now += seconds
        late = self.pq.overdue(self.now, timeout)
        expected = sorted(
            o
            for o, c in self.owner.items()
            if o in self.held() and self.now - self.since[o] > timeout
        )
        assert [m.queue_offset for m in late] == expected, "each late message taken once"
        for m in late:
            del self.owner[m.queue_offset]

    @precondition(lambda self: bool(self.held()))
    @rule(data=st.data())
    def copies_acknowledged(self, data: st.DataObject) -> None:
        # A late message's retry copy (or a dead letter) is acknowledged: it is done.
        offsets = set(data.draw(st.lists(st.sampled_from(self.held()), max_size=3)))
        self.pq.remove(offsets)
        self.done |= offsets
        for o in offsets:
            self.owner.pop(o, None)

    @rule()
    def partition_released(self) -> None:
        self.pq.release()
        self.released = True

    @rule(count=st.integers(0, 4), put_back=st.booleans())
    def orderly_take(self, count: int, put_back: bool) -> None:
        taken = self.pq.take(count)
        assert [m.queue_offset for m in taken] == self.pending[:count], "oldest first"
        del self.pending[:count]
        if put_back:  # the batch failed: retried in place, in order
            self.pq.put_back(taken)
            self.pending[:0] = [m.queue_offset for m in taken]

    @invariant()
    def the_committed_offset_never_passes_a_message_not_done(self) -> None:
        commit = self.pq.commit_offset()
        held = self.held()
        seen = set(self.received) | self.skipped
        if not seen:
            assert commit is None
            return
        assert commit is not None
        assert all(commit <= o for o in held), (commit, held)
        # ...and goes as far as it may: to the first message not done, or past everything.
        assert commit == (held[0] if held else max(seen) + 1)
        assert self.pq.held == len(held)
        assert self.pq.held_bytes == sum(self.received[o] for o in held)


PartitionWork.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_partition_work = PartitionWork.TestCase
