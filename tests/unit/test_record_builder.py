"""The record builder: :func:`plain_headers` writes every plain record's headers (a send, a
batch, a copy, a replay) in one order, and the common case a ``send_async`` takes without
``prepare``'s checks is built exactly as ``prepare`` builds it, or left to ``prepare``, never
taken for a message ``prepare`` refuses."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge import ClientConfig, Message
from bridge.client.records import RecordBuilder, plain_headers, plain_record
from bridge.codec import PreparedRecord
from bridge.errors import BridgeError
from bridge.message import MessageConst
from bridge.serialization import Serializers
from tests.unit.test_producer_batch import _with, any_text


def builder(**settings: Any) -> RecordBuilder:
    """A builder without a Kafka client (only a partition's type is checked)."""
    return RecordBuilder(ClientConfig(**settings), Serializers(None, None), lambda: None)


def test_a_plain_record_has_its_id_born_host_properties_keys_then_tags_as_headers() -> None:
    msg = Message("orders", b"body", keys=["k1", "k2"], tags="TagA")
    msg.put_user_property("text", "naïve")
    msg.put_user_property("bin", b"\xff\x00")
    assert plain_headers(msg, "ID1", b"10.0.0.9") == [
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, b"ID1"),
        (MessageConst.BORN_HOST, b"10.0.0.9"),
        ("text", "naïve".encode()),
        ("bin", b"\xff\x00"),
        (MessageConst.KEYS, b"k1 k2"),
        (MessageConst.TAGS, b"TagA"),
    ]
    # A message with a body only, and empty tags: the id and born host alone.
    assert plain_headers(Message("orders", b"x", tags=""), "ID2", b"h") == [
        (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, b"ID2"),
        (MessageConst.BORN_HOST, b"h"),
    ]


def test_a_plain_records_key_is_the_sharding_key_else_the_keys() -> None:
    keyed = plain_record(Message("orders", b"x", keys="a b"), "ns.orders", "ID", 5, b"h", 2)
    assert (keyed.kafka_topic, keyed.key, keyed.value, keyed.partition) == (
        "ns.orders",
        b"a b",
        b"x",
        2,
    )
    assert keyed.born_timestamp_ms == 5 and keyed.msg_id == "ID"
    sharded = plain_record(Message("orders", b"x", keys="a", sharding_key="s"), "o", "I", 1, b"h")
    assert sharded.key == b"s"
    assert plain_record(Message("orders", b"x"), "o", "I", 1, b"h").key is None


def test_prepare_builds_the_headers_plain_headers_writes() -> None:
    records = builder(namespace="ns")
    msg = Message("orders", b"x", keys="k", tags="T", properties={"p": "v"})
    record = records.prepare(msg)
    assert list(record.headers) == plain_headers(msg, record.msg_id, records.born_host)


def test_a_batch_writes_the_headers_plain_headers_writes_in_runs_of_the_same_tags() -> None:
    # A batch calls plain_headers once per run of the same tags and copies the headers after
    # the id for the rest of the run: each record's headers are still what it writes.
    records = builder()
    tags_a, tags_b = "A", "B" * 20
    msgs = [
        Message("orders", b"1"),
        Message("orders", b"2"),
        Message("orders", b"3", tags=tags_a),
        Message("orders", b"4", tags=tags_a),
        Message("payments", b"5", tags=tags_a),
        Message("orders", b"6", tags=tags_b),
        Message("orders", b"7", keys="k", tags=tags_b),  # prepared alone: not a plain one
        Message("orders", b"8", tags=tags_b),
        Message("orders", b"9", tags=""),
        Message("orders", b"10"),
    ]
    prepared = records.check_batch(msgs, -1)
    assert [r is None for r in prepared] == [True] * 6 + [False] + [True] * 3
    built = records.batch_records(msgs, prepared, -1)
    assert [fields[2] for fields in built] == [msg.body for msg in msgs]
    for msg, fields in zip(msgs, built, strict=True):
        assert list(fields[3]) == plain_headers(msg, fields[4], records.born_host)
    # From the middle on (after a hand-over that waited), the same records but new ids.
    rest = records.batch_records(msgs, prepared, -1, 3)
    assert [fields[2] for fields in rest] == [msg.body for msg in msgs[3:]]
    for msg, fields in zip(msgs[3:], rest, strict=True):
        assert list(fields[3]) == plain_headers(msg, fields[4], records.born_host)
    assert not {fields[4] for fields in rest} & {fields[4] for fields in built[3:6]}


def test_the_common_case_needs_its_topic_built_for_once() -> None:
    records = builder(namespace="ns")
    msg = Message("orders", b"x", tags="T")
    assert records.common_record(msg) is None  # the topic is not mapped yet
    expected = records.prepare(msg)
    record = records.common_record(msg)
    assert record is not None
    assert comparable(record) == comparable(expected)
    assert record.msg_id != expected.msg_id
    assert list(record.headers) == plain_headers(msg, record.msg_id, records.born_host)


def comparable(record: PreparedRecord) -> tuple[Any, ...]:
    """A record without its id (the only part two builds of one message differ in, with the
    born time)."""
    headers = [(n, v) for n, v in record.headers if n != MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
    return record.kafka_topic, record.key, record.value, headers, record.partition


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
    ),
    tags=st.one_of(st.none(), any_text, st.integers(), st.binary(max_size=3), st.just("T" * 9000)),
    body=st.one_of(st.binary(max_size=3), st.just(b"x" * 2000), st.text(max_size=2)),
)
@example(topic="orders", tags="T", body=b"x")
@example(topic="orders", tags="", body="text")
@example(topic="orders", tags="T\udc00", body=b"x")
@example(topic="orders", tags="TagA", body=b"")
@example(topic="orders", tags=b"TagA", body=b"x")
@example(topic="orders", tags="\u6807\u7b7e", body=b"x")
def test_the_common_case_is_what_prepare_builds_and_never_what_it_refuses(
    topic: object, tags: object, body: object
) -> None:
    records = builder(namespace="ns", max_message_bytes=1000)
    msg = _with(topic, tags, body)
    try:
        expected = records.prepare(msg)  # maps the topic, if it may be sent to
    except BridgeError:
        refused = True
    else:
        refused = False
    record = records.common_record(msg)
    if refused:
        assert record is None
    elif record is not None:
        assert comparable(record) == comparable(expected)
