"""``Producer.prepare_batch`` and ``send_batch`` without a broker (an address nobody listens
on): a batch builds the records single sends build and refuses what they refuse, with the same
typed errors, before anything reaches librdkafka; every message gets an outcome within the
send timeout, in order."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge import ClientConfig, Message, Producer
from bridge.codec import PreparedRecord
from bridge.errors import (
    BridgeError,
    IllegalStateError,
    InvalidArgumentError,
    InvalidMessageError,
    KafkaClientError,
    SendTimeoutError,
)
from bridge.message import RESERVED_PROPERTIES, MessageConst
from tests.clocks import CountingClock

NOWHERE = "127.0.0.1:1"
any_text = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\ud800\udfff"))


def nowhere(send_msg_timeout_ms: int = 3000, **kafka: str) -> ClientConfig:
    """A config for a broker that does not exist (nothing is ever delivered)."""
    return ClientConfig(
        bootstrap_servers=NOWHERE, send_msg_timeout_ms=send_msg_timeout_ms, kafka=kafka
    )


@pytest.fixture()
def started() -> Iterator[Producer]:
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        yield producer
        producer._sender.pump.kafka.purge()  # nothing is delivered: drop what is queued


def comparable(record: PreparedRecord) -> tuple[Any, ...]:
    """A record without what differs between two builds of one message (id, born time; for a
    delayed message's envelope, its topic and partition only)."""
    if record.kafka_topic.endswith("SCHEDULE_TOPIC_XXXX"):
        return record.kafka_topic, record.partition
    own = (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,)
    headers = [(n, v) for n, v in record.headers if n not in own]
    return record.kafka_topic, record.key, record.value, headers, record.partition


def test_a_batch_builds_the_records_single_sends_build() -> None:
    producer = Producer("pg", config=ClientConfig(namespace="ns"))
    msgs = [
        Message("orders", b"a"),
        Message("orders", b"b", tags="TagA"),
        Message("orders", b"c", tags="TagA"),
        Message("orders", b"d", tags="\u6807\u7b7e"),  # non-ASCII tags
        Message("payments", b"e", keys="k1 k2", tags="T"),
        Message("payments", b"f", properties={"p": "v", "bin": b"\xff"}),
        Message("orders", b"g", sharding_key="s"),
        Message("orders", b"h", delay_time_level=2),
        Message("%RETRY%group", b"i"),
        Message("orders", b"j", tags=""),
    ]
    records = producer.prepare_batch(msgs)
    singles = [producer.prepare(msg) for msg in msgs]
    assert [comparable(r) for r in records] == [comparable(r) for r in singles]
    assert [r.kafka_topic for r in records[:4]] == ["orders"] * 4
    assert records[7].kafka_topic == "ns.SCHEDULE_TOPIC_XXXX"
    ids = [r.msg_id for r in records]
    assert len(set(ids)) == len(ids)
    for record in records:
        assert (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, record.msg_id.encode()) in list(
            record.headers
        ) or record.kafka_topic == "ns.SCHEDULE_TOPIC_XXXX"


def test_ids_stay_unique_in_a_batch_longer_than_the_id_counter() -> None:
    # The id's counter has 16 bits; a batch shares its born time only for 1,024 messages.
    records = Producer("pg").prepare_batch(Message("orders", b"x") for _ in range(70_000))
    assert len({r.msg_id for r in records}) == 70_000


def test_a_batch_of_one_message_or_of_no_iterable_is_refused() -> None:
    producer = Producer("pg")
    with pytest.raises(InvalidArgumentError, match=r"got Message .*send_sync"):
        producer.prepare_batch(Message("orders", b"x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="got int"):
        producer.prepare_batch(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="expected a Message, got str"):
        producer.prepare_batch(["not a message"])  # type: ignore[list-item]
    assert producer.prepare_batch([]) == []


def _with(topic: object = "orders", tags: object = None, body: object = b"x") -> Message:
    msg = Message("orders", b"x")
    msg.topic = topic  # type: ignore[assignment]  # what an untyped caller can do
    msg.tags = tags  # type: ignore[assignment]
    msg._body = body  # type: ignore[assignment]
    return msg


@settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    topic=st.one_of(
        st.sampled_from(["orders", "__consumer_offsets", "SCHEDULE_TOPIC_XXXX", "bad topic!"]),
        any_text,
        st.integers(),
        st.none(),
        st.binary(max_size=3),
    ),
    tags=st.one_of(st.none(), any_text, st.integers(), st.binary(max_size=3), st.just("T" * 9000)),
    body=st.one_of(st.binary(max_size=3), st.just(b"x" * 2000)),
    keys=st.lists(any_text.filter(lambda k: bool(k) and " " not in k), max_size=2),
    system=st.dictionaries(
        st.one_of(any_text, st.sampled_from(sorted(RESERVED_PROPERTIES))),
        st.one_of(any_text, st.binary(max_size=3), st.integers()),
        max_size=2,
    ),
)
@example(topic="orders", tags="T\udc00", body=b"x", keys=[], system={})
@example(topic=42, tags=None, body=b"x", keys=[], system={})
@example(topic="orders", tags=5, body=b"x", keys=[], system={})
@example(topic="orders", tags=None, body=b"", keys=[], system={})
def test_a_batch_refuses_what_a_single_send_refuses_with_the_same_error(
    topic: object, tags: object, body: bytes, keys: list[str], system: dict[str, object]
) -> None:
    producer = Producer("pg", config=ClientConfig(namespace="ns", max_message_bytes=1000))
    msg = _with(topic, tags, body)
    msg.keys = keys
    for name, value in system.items():
        msg.put_system_property(name, value)  # type: ignore[arg-type]
    try:
        single = producer.prepare(msg)
    except BridgeError as exc:
        refused: BridgeError | None = exc
    else:
        refused = None
    # After a valid message with the same topic and tags, so cached values are in play.
    first = _with(
        "orders" if type(topic) is not str else topic, tags if type(tags) is str else None
    )
    try:
        producer.prepare(first)
    except BridgeError:
        first = Message("orders", b"first")
    if refused is None:
        records = producer.prepare_batch([first, msg])
        assert comparable(records[1]) == comparable(single)
    else:
        with pytest.raises(type(refused)) as raised:
            producer.prepare_batch([first, msg])
        assert str(raised.value) == str(refused)


def test_the_current_trace_context_goes_into_every_message_of_a_batch() -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    context = trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    own = "00-0000000000000000000000000000abcd-000000000000ef01-01"
    msgs = [Message("orders", b"a"), Message("orders", b"b")]
    msgs[1].put_system_property(MessageConst.TRACE_PARENT, own)
    single = Message("orders", b"c")
    producer = Producer("pg")
    with trace.use_span(trace.NonRecordingSpan(context)):
        records = producer.prepare_batch(msgs)
        producer.prepare(single)
    expected = single.get_property(MessageConst.TRACE_PARENT)
    assert isinstance(expected, str)
    assert "1234" in expected
    assert msgs[0].get_property(MessageConst.TRACE_PARENT) == expected
    assert msgs[1].get_property(MessageConst.TRACE_PARENT) == own  # one already set is kept
    assert (MessageConst.TRACE_PARENT, expected.encode()) in list(records[0].headers)
    # Without a current span nothing is written.
    plain = Message("orders", b"d")
    producer.prepare_batch([plain])
    assert plain.get_property(MessageConst.TRACE_PARENT) is None


class ProduceLog:
    """Stands in for a producer's confluent-kafka client: records what ``produce`` is given."""

    def __init__(self, kafka: Any) -> None:
        self.kafka = kafka
        self.values: list[bytes] = []

    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        self.values.append(value)
        self.kafka.produce(topic, value, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kafka, name)


def test_a_bad_message_anywhere_in_a_batch_sends_none_of_it(started: Producer) -> None:
    log = ProduceLog(started._sender.pump.kafka)
    started._sender.pump.kafka = log
    batch = [Message("orders", b"a"), Message("orders", b"b"), _with(tags=b"bytes")]
    with pytest.raises(InvalidMessageError, match="tags must be a string, got bytes"):
        started.send_batch(batch)
    with pytest.raises(InvalidArgumentError, match="partition -2"):
        started.send_batch(batch[:2], partition=-2)
    assert log.values == []  # nothing was handed to librdkafka
    started.send_batch(batch[:1])  # the log sees what is handed over
    assert log.values == [b"a"]


def test_send_batch_requires_a_started_producer() -> None:
    producer = Producer("pg", config=nowhere())
    with pytest.raises(IllegalStateError, match="call start"):
        producer.send_batch([Message("orders", b"x")])


def test_an_unreachable_broker_fails_each_message_of_a_batch_within_the_send_timeout() -> None:
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        started = time.monotonic()
        results = producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(5)])
        elapsed = time.monotonic() - started
    assert elapsed < 1.0 + 1.0 + 0.5  # the timeout, the report's grace, slack
    assert len(results) == 5
    assert all(isinstance(r, KafkaClientError) for r in results)
    assert all(isinstance(r, SendTimeoutError) for r in results), results


class QueueFullAfter(ProduceLog):
    """A client whose local queue is full after ``room`` records: ``produce`` raises
    ``BufferError`` as confluent-kafka's does."""

    def __init__(self, kafka: Any, room: int) -> None:
        super().__init__(kafka)
        self.room = room

    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        if len(self.values) >= self.room:
            raise BufferError("Local: Queue full")
        super().produce(topic, value, *args, **kwargs)


def test_a_local_queue_full_for_the_send_timeout_fails_the_rest_unsent() -> None:
    # One record fits and no broker takes it: the second waits the whole timeout for room,
    # then it and the third fail without being sent.
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        producer._sender.pump.kafka = log = QueueFullAfter(producer._sender.pump.kafka, room=1)
        started = time.monotonic()
        results = producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(3)])
        elapsed = time.monotonic() - started
    assert log.values == [b"m0"]
    assert elapsed < 2 * 1.0 + 1.0 + 0.5  # the stall, the first one's timeout and grace, slack
    assert all(isinstance(r, SendTimeoutError) for r in results), results
    assert "Message timed out" in str(results[0])
    assert "local queue full for 1000 ms" in str(results[1])
    assert "never sent" in str(results[2])


class OtherSendsWhileFull(ProduceLog):
    """A client whose local queue is full once, at the second record, while other threads
    take ``taken`` message ids of the same producer; then there is room again."""

    def __init__(self, producer: Producer, taken: int) -> None:
        super().__init__(producer._sender.pump.kafka)
        self.producer = producer
        self.taken = taken
        self.stalled = False

    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        if len(self.values) == 1 and not self.stalled:
            self.stalled = True
            for _ in range(self.taken):
                self.producer._builder._ids.next_id()
            raise BufferError("Local: Queue full")
        super().produce(topic, value, *args, **kwargs)


def test_ids_stay_unique_when_a_hand_over_waits_while_other_sends_take_ids() -> None:
    # The 16-bit counter goes round once while the second message waits for room: a record
    # built after the wait with the batch's old millisecond would repeat the first one's id.
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        producer._sender.pump.kafka = log = OtherSendsWhileFull(producer, taken=65_534)
        results = producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(3)])
        producer._sender.pump.kafka.purge()
    assert log.stalled
    ids = [str(r).split("send of ")[1].split()[0] for r in results]
    assert len(set(ids)) == 3, ids


class _Clock:
    """Stands in for the record builder's ``time`` module: a wall clock that moves only when
    told (ns)."""

    def __init__(self) -> None:
        self.now_ns = time.time_ns()

    def time_ns(self) -> int:
        return self.now_ns


class FullOnceWhileTheClockMoves(ProduceLog):
    """A client whose local queue is full once, at the second record, while ``clock`` moves
    on 5 s; records each handed-over record's timestamp."""

    def __init__(self, kafka: Any, clock: _Clock) -> None:
        super().__init__(kafka)
        self.clock = clock
        self.stalled = False
        self.timestamps: list[int] = []

    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        if len(self.values) == 1 and not self.stalled:
            self.stalled = True
            self.clock.now_ns += 5_000_000_000
            raise BufferError("Local: Queue full")
        self.timestamps.append(kwargs["timestamp"])
        super().produce(topic, value, *args, **kwargs)


def test_the_records_after_a_hand_over_that_waited_for_room_are_dated_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr("bridge.client.records.time", clock)
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        log = FullOnceWhileTheClockMoves(producer._sender.pump.kafka, clock)
        producer._sender.pump.kafka = log
        producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(3)])
        producer._sender.pump.kafka.purge()
    born_ms = clock.now_ns // 1_000_000 - 5_000
    # The first two were built before the wait (the second is sent after it as it was).
    assert log.values == [b"m0", b"m1", b"m2"]
    assert log.timestamps == [born_ms, born_ms, born_ms + 5_000]


class FullAtEveryFirstTry(ProduceLog):
    """A client whose local queue is full at the first try of every record (the second, the
    single send's wait for room, takes it)."""

    def __init__(self, kafka: Any) -> None:
        super().__init__(kafka)
        self.tried: set[bytes] = set()

    def produce(self, topic: str, value: bytes, *args: Any, **kwargs: Any) -> None:
        if value not in self.tried:
            self.tried.add(value)
            raise BufferError("Local: Queue full")
        super().produce(topic, value, *args, **kwargs)


def test_a_batch_whose_hand_overs_all_wait_builds_each_record_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A batch larger than the local queue waits for room at hand-over after hand-over: the
    # records after each wait are dated after it, but building all the rest again at every
    # wait costs a batch of n messages n * n / 2 records (minutes for 100,000).
    clock = CountingClock()
    monkeypatch.setattr("bridge.client.records.time", clock)
    count = 600
    with Producer("pg", config=nowhere(send_msg_timeout_ms=1000)) as producer:
        log = FullAtEveryFirstTry(producer._sender.pump.kafka)
        producer._sender.pump.kafka = log
        producer.send_batch([Message("orders", f"m{i}".encode()) for i in range(count)])
        producer._sender.pump.kafka.purge()
    assert log.values == [f"m{i}".encode() for i in range(count)]
    assert clock.reads <= 4 * count, clock.reads
