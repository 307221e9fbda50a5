"""Binary-safe properties: the header codec rules, and every copy a message goes through.

Kafka headers are bytes. A property decodes to ``str`` when its bytes are valid UTF-8 and
stays ``bytes`` otherwise; either is written back byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from bridge import ClientConfig, Message, MessageConst, MessageExt, codec
from bridge.client.records import plain_record
from bridge.consumer.model import retry_route
from bridge.consumer.send_back import ReplayTarget, replay_record, send_back_record
from bridge.delay.model import InvalidDelayError
from bridge.errors import InvalidMessageError, InvalidPropertyError
from bridge.message import parse_count
from bridge.transaction.model import committed_record
from topics.naming import dlq_topic, retry_topic

AWKWARD_VALUES: list[tuple[str, bytes]] = [
    ("binary trace context", b"\xff\xfe\x00\x01"),
    ("a lone NUL", b"\x00"),
    ("NULs around text", b"\x00abc\x00"),
    ("empty", b""),
    ("valid UTF-8", "grüße, 世界, 🎉".encode()),
    ("truncated UTF-8 sequence", b"caf\xc3"),
    ("overlong encoding of NUL", b"\xc0\x80"),
    ("UTF-8 of a surrogate (CESU-8)", b"\xed\xa0\x80"),
    ("beyond U+10FFFF", b"\xf4\x90\x80\x80"),
    ("Confluent schema id prefix", b"\x00\x00\x00\x00\x2a"),
    ("very long binary", bytes(range(256)) * 400),
    ("very long text", ("é" * 50_000).encode()),
]
IDS = [name for name, _ in AWKWARD_VALUES]


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("raw", [raw for _, raw in AWKWARD_VALUES], ids=IDS)
def test_a_header_value_decodes_to_text_only_when_it_is_utf8(raw: bytes) -> None:
    value = codec.header_value(raw)
    assert type(value) is (str if _is_utf8(raw) else bytes)
    assert codec.header_bytes(value) == raw


def test_a_null_header_is_empty_text_and_str_encodes_as_utf8() -> None:
    assert codec.header_value(None) == ""
    assert codec.header_bytes("ü") == b"\xc3\xbc"
    assert codec.header_bytes(b"\xff") == b"\xff"


def _received(headers: list[tuple[str, bytes | None]]) -> MessageExt:
    """A message as a consumer decodes a record another Kafka client wrote to ``orders``."""
    return MessageExt.received(
        "orders",
        b"payload",
        codec.decode_headers(headers),
        msg_id="orders-0-7",
        queue_id=0,
        queue_offset=7,
        born_timestamp_ms=1_700_000_000_000,
        store_timestamp_ms=None,
        kafka_topic="orders",
    )


FOREIGN_HEADERS: list[tuple[str, bytes | None]] = [
    (f"h{i}", raw) for i, (_, raw) in enumerate(AWKWARD_VALUES)
] + [("trace-bin", b"\xff\xfe\x00\x01"), ("text", "naïve".encode()), ("null", None)]
EXPECTED = {name: raw if raw is not None else b"" for name, raw in FOREIGN_HEADERS}


def _bytes_of(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, bytes | None]:
    return dict(headers)


def test_decoded_headers_keep_binary_values_as_bytes() -> None:
    msg = _received(FOREIGN_HEADERS)
    assert msg.get_property("trace-bin") == b"\xff\xfe\x00\x01"
    assert msg.get_property("text") == "naïve"
    assert msg.get_property("null") == ""


def test_a_dead_letter_copy_keeps_every_header_byte_exact() -> None:
    config = ClientConfig(namespace="ns")
    route = retry_route(16, 16)
    record = send_back_record(
        _received(FOREIGN_HEADERS), "g1", route, 16, config=config, born_host=b"h"
    )
    assert record.kafka_topic == dlq_topic("g1", "ns")
    written = _bytes_of(record.headers)
    for name, raw in EXPECTED.items():
        assert written[name] == raw, name


def test_a_retry_copy_carries_binary_values_through_the_schedule_envelope() -> None:
    config = ClientConfig(namespace="ns")
    record = send_back_record(
        _received(FOREIGN_HEADERS), "g1", retry_route(0, 16), 16, config=config, born_host=b"h"
    )
    waiting = codec.delayed_message(record.headers, record.value)
    assert waiting.get_property("trace-bin") == b"\xff\xfe\x00\x01"
    assert waiting.get_property("text") == "naïve"
    # What the schedule service writes to the retry topic when the delay is over.
    delivered = codec.real_record(waiting, "ns", frozenset({MessageConst.DELAY_TIME_LEVEL}))
    assert delivered.kafka_topic == retry_topic("g1", "ns")
    written = _bytes_of(delivered.headers)
    for name, raw in EXPECTED.items():
        assert written[name] == raw, name
    assert written[MessageConst.RECONSUME_TIME] == b"1"


@pytest.mark.parametrize("target", list(ReplayTarget))
def test_a_replayed_dead_letter_keeps_every_header_byte_exact(target: ReplayTarget) -> None:
    letter = _received([*FOREIGN_HEADERS, (MessageConst.RETRY_TOPIC, b"orders")])
    record = replay_record(letter, "g1", target, namespace="ns")
    written = _bytes_of(record.headers)
    for name, raw in EXPECTED.items():
        assert written[name] == raw, name


def test_a_committed_half_message_keeps_binary_properties() -> None:
    half = Message("orders", b"x")
    half.put_user_property("trace-bin", b"\xff\xfe\x00\x01")
    props = {**half.wire_properties(), MessageConst.REAL_TOPIC: "orders"}
    envelope = codec.encode_envelope("ID1", b"x", props, 1, "h")
    real = committed_record(codec.decode_envelope(envelope), "ns")
    assert _bytes_of(real.headers)["trace-bin"] == b"\xff\xfe\x00\x01"


def test_a_user_may_put_bytes_and_they_travel_as_they_are() -> None:
    msg = Message("orders", b"x", properties={"schema-id": b"\x00\x00\x00\x00\x2a"})
    msg.put_user_property("trace-bin", bytearray(b"\xff\xfe"))
    assert msg.get_property("trace-bin") == b"\xff\xfe"
    record = plain_record(msg, "orders", "ID", 1, b"h")
    written = _bytes_of(record.headers)
    assert written["schema-id"] == b"\x00\x00\x00\x00\x2a"
    assert written["trace-bin"] == b"\xff\xfe"


@pytest.mark.parametrize("value", ["\ud800", "ok\udcff", "\udfff tail"])
def test_a_lone_surrogate_in_a_property_is_refused_with_its_name(value: str) -> None:
    with pytest.raises(InvalidPropertyError, match="'trace'"):
        Message("orders", b"x", properties={"trace": value})
    with pytest.raises(InvalidPropertyError, match="'trace'"):
        Message("orders", b"x").put_user_property("trace", value)


def test_a_lone_surrogate_in_a_property_name_is_refused() -> None:
    with pytest.raises(InvalidPropertyError, match="name"):
        Message("orders", b"x").put_user_property("bad\ud800", "v")


def test_a_system_property_that_arrived_as_bytes_still_reads_as_text() -> None:
    # Another client wrote a reserved header name with bytes that are not UTF-8: the
    # properties keep them byte for byte, the system reads them as text (U+FFFD for bad bytes).
    msg = _received([(MessageConst.TAGS, b"Tag\xff"), (MessageConst.KEYS, b"k1 \xfe")])
    assert msg.tags == "Tag\ufffd"
    assert msg.keys == ["k1", "\ufffd"]
    assert msg.get_property(MessageConst.TAGS) == "Tag\ufffd"
    assert msg.properties[MessageConst.TAGS] == b"Tag\xff"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0),
        ("7", 7),
        ("0016", 16),
        (b"3", 3),
        ("2147483648", 2_147_483_648),
        ("²", None),
        ("\u0661\u0662", None),  # Arabic-Indic digits: isdigit() and int() accept them
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1 ", None),
        ("", None),
        (None, None),
        (b"\xff", None),
        ("9" * 5000, None),  # int() refuses more than 4300 digits
    ],
)
def test_parse_count_accepts_only_ascii_digits(
    raw: str | bytes | None, expected: int | None
) -> None:
    assert parse_count(raw) == expected


@pytest.mark.parametrize("raw", ["²", "\u0661", "-3", "x", "9" * 5000])
def test_a_malformed_reconsume_time_counts_as_zero(raw: str) -> None:
    msg = _received([(MessageConst.RECONSUME_TIME, raw.encode())])
    assert msg.reconsume_times == 0
    assert _received([(MessageConst.RECONSUME_TIME, b"4")]).reconsume_times == 4


def test_a_malformed_real_queue_id_lets_the_key_decide() -> None:
    props = {MessageConst.REAL_TOPIC: "orders", MessageConst.REAL_QUEUE_ID: "-²"}
    msg = codec.decode_envelope(codec.encode_envelope("ID1", b"x", props, 1, "h"))
    assert committed_record(msg, "ns").partition == -1


@pytest.mark.parametrize(
    ("setter", "value"),
    [
        ("set_delay_time_ms", math.nan),
        ("set_delay_time_ms", math.inf),
        ("set_delay_time_ms", -math.inf),
        ("set_delay_time_sec", math.nan),
        ("set_delay_time_sec", math.inf),
        ("set_deliver_time_ms", math.inf),
        ("set_deliver_time_ms", math.nan),
        ("set_deliver_time_ms", "soon"),
    ],
)
def test_non_finite_delays_are_invalid_delays(setter: str, value: object) -> None:
    msg = Message("orders", b"x")
    with pytest.raises(InvalidDelayError, match=setter.removeprefix("set_")):
        getattr(msg, setter)(value)
    assert not msg.is_delayed


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"keys": 5}, "keys"),
        ({"keys": [b"k"]}, "key"),
        ({"tags": 5}, "tags"),
        ({"tags": b"T"}, "tags"),
        ({"sharding_key": 5}, "sharding key"),
    ],
)
def test_non_string_keys_tags_and_sharding_keys_are_invalid(
    kwargs: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidMessageError, match=fragment):
        Message("orders", b"x", **kwargs)  # type: ignore[arg-type]
