"""SCHEDULE and timer records in the header format (value = the body, routing in headers) are
delivered as the same real-topic record as the Avro envelope the previous version wrote for the
same message: same topic, partition, key, value, headers in the same order, id and born time.
A header-format record that cannot be delivered raises a typed error naming the problem (the
delay services quarantine it); the two formats are told apart by headers alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge import ClientConfig, Message
from bridge.codec import (
    BORN_TIMESTAMP_HEADER,
    PreparedRecord,
    decode_envelope,
    delayed_headers,
    delayed_message,
    delivery_record,
    encode_envelope,
    header_bytes,
    header_delivery_record,
    is_header_format,
)
from bridge.coordinator.delay.delivery import send_key
from bridge.coordinator.delay.fetch import Held
from bridge.delay.routing import SEND_ID_HEADER, delayed_record
from bridge.errors import MalformedRecordError
from bridge.kafka.transactional import REMOVED_ON_DELIVERY
from bridge.message import DELAY_PROPERTIES, MessageConst, PropertyValue, property_text
from topics.errors import InvalidTopicNameError

PROPERTY = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CONFIG = ClientConfig(namespace="ns", timer_max_delay_ms=86_400_000)
BORN = 1_700_000_000_000


def envelope_value(
    msg: Message, msg_id: str, born_ms: int, born_host: str, partition: int
) -> bytes | None:
    """The SCHEDULE or timer value the previous version wrote for ``msg`` (its
    ``delayed_record``: the message as a ``MessageEnvelope``), None when a timer is due."""
    props = msg.wire_properties()
    raw_level = props.get(MessageConst.DELAY_TIME_LEVEL)
    level = int(raw_level) if raw_level else 0
    props.update(
        {
            MessageConst.REAL_TOPIC: msg.topic,
            MessageConst.REAL_QUEUE_ID: str(partition),
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: msg_id,
        }
    )
    if level > 0:
        for name in DELAY_PROPERTIES:
            props.pop(name, None)
        props[MessageConst.DELAY_TIME_LEVEL] = str(CONFIG.delay_policy.clamp_level(level))
        return encode_envelope(msg_id, msg.body, props, born_ms, born_host)
    deliver_ms = CONFIG.delay_policy.deliver_time_ms(
        born_ms=born_ms,
        deliver_ms=_text(props.get(MessageConst.TIMER_DELIVER_MS)),
        delay_ms=_text(props.get(MessageConst.TIMER_DELAY_MS)),
        delay_sec=_text(props.get(MessageConst.TIMER_DELAY_SEC)),
    )
    for name in DELAY_PROPERTIES:
        props.pop(name, None)
    props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
    return encode_envelope(msg_id, msg.body, props, born_ms, born_host)


def _text(value: PropertyValue | None) -> str | None:
    return None if value is None else property_text(value)


def both_deliveries(
    msg: Message, msg_id: str = "ID1", host: str = "10.0.0.1", partition: int = -1
) -> tuple[PreparedRecord, PreparedRecord]:
    """(old path, new path): the real-topic records the delay services build from the
    envelope record and from the header-format record of ``msg``."""
    new = delayed_record(msg, msg_id, BORN, host, partition=partition, config=CONFIG)
    assert new is not None
    assert is_header_format(new.headers)
    old_value = envelope_value(msg, msg_id, BORN, host, partition)
    old = delivery_record(old_value, "ns", REMOVED_ON_DELIVERY)
    delivered = header_delivery_record(list(new.headers), new.value, "ns", REMOVED_ON_DELIVERY)
    # The message either record holds: the same, but for bytes values that are UTF-8, which
    # headers give back as text (as on any real topic).
    waiting, before = delayed_message(new.headers, new.value), decode_envelope(old_value)
    assert (waiting.topic, waiting.msg_id, waiting.body, waiting.keys, waiting.tags) == (
        before.topic,
        before.msg_id,
        before.body,
        before.keys,
        before.tags,
    )
    assert (waiting.born_timestamp_ms, waiting.born_host) == (
        before.born_timestamp_ms,
        before.born_host,
    )
    assert {k: header_bytes(v) for k, v in waiting.properties.items()} == {
        k: header_bytes(v) for k, v in before.properties.items()
    }
    return old, delivered


def _message(
    body: bytes,
    keys: list[str],
    tags: str | None,
    props: dict[str, PropertyValue],
    sharding: str | bytes | None,
    level: int,
    delay_ms: int,
) -> Message:
    msg = Message("orders", body, keys=keys or None, tags=tags)
    for name, value in props.items():
        msg.put_system_property(name, value)  # any name, as another client could write
    if sharding is not None:
        msg.put_system_property(MessageConst.SHARDING_KEY, sharding)
    if level:
        msg.set_delay_time_level(level)
    else:
        msg.set_delay_time_ms(delay_ms)
    return msg


text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=10)
user_names = st.one_of(
    st.sampled_from(["a", "trace", "BRIDGE_SEND_ID", BORN_TIMESTAMP_HEADER, "DELIVERY_ATTEMPTS"]),
    st.text(alphabet="abcxyz_-", min_size=1, max_size=8),
)
values: st.SearchStrategy[PropertyValue] = st.one_of(
    text, st.binary(max_size=8), st.sampled_from([b"\xff\xfe\x00", b"", "", "naïve"])
)


@PROPERTY
@given(
    body=st.binary(max_size=16),
    keys=st.lists(st.text(alphabet="abé", min_size=1, max_size=4), max_size=3),
    tags=st.one_of(st.none(), st.sampled_from(["", "TagA", "a||b"])),
    props=st.dictionaries(user_names, values, max_size=6),
    sharding=st.one_of(st.none(), text, st.binary(max_size=6)),
    level=st.integers(0, 20),
    delay_ms=st.integers(1_000, 3_600_000),
    partition=st.sampled_from([-1, 0, 3]),
    host=st.sampled_from(["10.0.0.1", "", "höst"]),
)
@example(
    body=b"",
    keys=[],
    tags=None,
    props={"bin": b"\xff\xfe", "text": "x"},
    sharding=None,
    level=3,
    delay_ms=1000,
    partition=-1,
    host="h",
)
@example(
    body=b"\x00\xff",
    keys=["k1", "k2"],
    tags="TagA",
    props={},
    sharding=b"\xfe\xff",
    level=0,
    delay_ms=5000,
    partition=2,
    host="h",
)
def test_the_header_format_delivers_what_the_envelope_delivered(
    body: bytes,
    keys: list[str],
    tags: str | None,
    props: dict[str, PropertyValue],
    sharding: str | bytes | None,
    level: int,
    delay_ms: int,
    partition: int,
    host: str,
) -> None:
    msg = _message(body, keys, tags, props, sharding, level, delay_ms)
    old, new = both_deliveries(msg, "ID-" + str(len(body)), host, partition)
    assert tuple(new) == tuple(old)
    assert new.headers == old.headers  # names, bytes and order
    assert new.value is body or new.value == body


@pytest.mark.parametrize(
    "prepare",
    [
        lambda m: m.put_user_property("bin", b"\xff\xfe\x00\x01"),
        lambda m: m.put_user_property("utf8-bytes", "é".encode()),
        lambda m: m.put_system_property(MessageConst.SHARDING_KEY, ""),
        lambda m: m.put_system_property(MessageConst.SHARDING_KEY, b"\xff"),
        lambda m: m.put_system_property(MessageConst.KEYS, " a  b "),
        lambda m: m.put_system_property(MessageConst.KEYS, b"\xff a"),
        lambda m: None,
    ],
)
def test_named_cases_deliver_alike(prepare: Any) -> None:
    for delayed in (True, False):
        msg = Message("orders", b"", tags="T")
        prepare(msg)
        if delayed:
            msg.set_delay_time_level(2)
        else:
            msg.set_delay_time_sec(30)
        old, new = both_deliveries(msg)
        assert tuple(new) == tuple(old)


def test_the_record_is_the_body_with_routing_and_born_time_in_headers() -> None:
    msg = Message("orders", b"\xffbody", keys="k1")
    msg.put_user_property("bin", b"\xfe")
    msg.set_delay_time_level(2)
    record = delayed_record(msg, "ID9", BORN, "h", partition=1, config=CONFIG)
    assert record is not None
    assert record.value == b"\xffbody"
    assert record.key == b"ID9"
    names = [name for name, _ in record.headers]
    assert names[:3] == [SEND_ID_HEADER, BORN_TIMESTAMP_HEADER, "UNIQ_KEY"]
    headers = dict(record.headers)
    assert headers[BORN_TIMESTAMP_HEADER] == str(BORN).encode()
    assert headers[MessageConst.REAL_TOPIC] == b"orders"
    assert headers[MessageConst.REAL_QUEUE_ID] == b"1"
    assert headers[MessageConst.DELAY_TIME_LEVEL] == b"2"
    assert headers["bin"] == b"\xfe"
    real = header_delivery_record(record.headers, record.value, "ns", REMOVED_ON_DELIVERY)
    # Stamped when delivered (a topic's retention counts from then), born time in a header.
    assert real.born_timestamp_ms == 0
    assert real.partition == 1
    assert real.key == b"k1"
    # Text properties first, then bytes ones: the order the envelope delivered them in.
    assert real.headers == [
        (BORN_TIMESTAMP_HEADER, str(BORN).encode()),
        ("UNIQ_KEY", b"ID9"),
        ("BORN_HOST", b"h"),
        ("KEYS", b"k1"),
        ("bin", b"\xfe"),
    ]


def test_an_envelope_record_is_never_taken_for_the_header_format() -> None:
    # What the previous version wrote as headers, whatever the envelope holds.
    assert not is_header_format([(SEND_ID_HEADER, b"abc")])
    assert not is_header_format([(MessageConst.TIMER_DELIVER_MS, b"1"), (SEND_ID_HEADER, b"x")])
    assert not is_header_format([])


def test_a_property_named_like_the_send_id_is_not_a_send_id() -> None:
    msg = Message("orders", b"x")
    msg.put_user_property(SEND_ID_HEADER, "user-value")
    msg.set_delay_time_level(1)
    record = delayed_record(msg, "ID1", BORN, "h", partition=-1, config=CONFIG)
    assert record is not None
    held = Held(None, 0, 5, list(record.headers), None)
    key = send_key(held)
    assert key is not None and key[1] != b"user-value"
    # A coordinator's copy (no send id before the born time) has none, whatever follows it.
    copy = [h for h in record.headers if h != record.headers[0]]
    assert send_key(Held(None, 0, 5, copy, None)) is None
    real = header_delivery_record(record.headers, record.value, "ns", REMOVED_ON_DELIVERY)
    assert dict(real.headers)[SEND_ID_HEADER] == b"user-value"


def _headers(**overrides: bytes | None) -> list[tuple[str, bytes | None]]:
    base = delayed_headers(
        [],
        "ID1",
        "h",
        {
            MessageConst.REAL_TOPIC: "orders",
            MessageConst.REAL_QUEUE_ID: "0",
            MessageConst.DELAY_TIME_LEVEL: "1",
        },
        BORN,
    )
    out = []
    for name, value in base:
        if name in overrides:
            if overrides[name] is not None:
                out.append((name, overrides[name]))
            continue
        out.append((name, value))
    return out


@pytest.mark.parametrize(
    ("headers", "error", "match"),
    [
        (_headers(REAL_QID=b"two"), MalformedRecordError, "REAL_QID is not a partition"),
        (_headers(REAL_QID=b"-2"), MalformedRecordError, "REAL_QID is not a partition"),
        (_headers(REAL_QID=b"\xff"), MalformedRecordError, "REAL_QID is not UTF-8"),
        (_headers(REAL_TOPIC=b"bad topic!"), InvalidTopicNameError, "bad topic"),
        (_headers(REAL_TOPIC=b"\xff\xfe"), MalformedRecordError, "REAL_TOPIC is not UTF-8"),
        (_headers(REAL_TOPIC=None), MalformedRecordError, "no REAL_TOPIC"),
        (_headers(UNIQ_KEY=None), MalformedRecordError, "no UNIQ_KEY"),
        (_headers(UNIQ_KEY=b"\xff"), MalformedRecordError, "UNIQ_KEY is not UTF-8"),
        (_headers(BRIDGE_BORN_MS=b"soon"), MalformedRecordError, "BRIDGE_BORN_MS is not a time"),
        (_headers(BRIDGE_BORN_MS=None), MalformedRecordError, "no BRIDGE_BORN_MS"),
    ],
)
def test_a_malformed_header_format_record_raises_a_typed_error_naming_it(
    headers: list[tuple[str, bytes | None]], error: type[Exception], match: str
) -> None:
    assert is_header_format(headers)
    with pytest.raises(error, match=match):
        header_delivery_record(headers, b"body", "ns", REMOVED_ON_DELIVERY)


def test_a_missing_real_qid_lets_the_key_decide() -> None:
    real = header_delivery_record(_headers(REAL_QID=None), b"b", "ns", REMOVED_ON_DELIVERY)
    assert real.partition == -1
    assert real.kafka_topic == "orders"
