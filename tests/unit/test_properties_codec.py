"""Properties of the record codec with arbitrary properties (``bridge.codec``, ``bridge.message``).

What the modules promise (their docstrings, the README, G8 and G10 in docs/guarantees.md): a
property value is text or bytes; text travels as UTF-8 and bytes as they are, and a header reads
back as ``str`` when its bytes are valid UTF-8, else as the ``bytes``, so every value is written
back byte for byte; a header name repeated in one record keeps its last value; the system
topics' envelope keeps text and bytes apart; and bad input (a lone surrogate, a reserved name, a
value that is neither text nor bytes, properties over 32,767 bytes) is refused before anything is
sent with a typed error from ``bridge.errors``, never another exception. Bytes that are not an
envelope are refused with a ``WireFormatError`` (the record goes to quarantine).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from bridge import ClientConfig, Message, MessageConst, MessageExt, Producer
from bridge.client.records import plain_record
from bridge.codec import (
    BORN_TIMESTAMP_HEADER,
    copied_born_timestamp,
    decode_envelope,
    decode_headers,
    encode_envelope,
    header_bytes,
    header_value,
    message_from_record,
    stamped_copy,
    undecoded_message,
)
from bridge.errors import (
    BridgeError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidPropertyError,
    MessageTooLargeError,
    WireFormatError,
)
from bridge.message import RESERVED_PROPERTIES, PropertyValue, is_unicode

PROPERTY = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
"""Fixed examples (no example database, nothing random between runs)."""

MAX_PROPERTIES_BYTES = 32_767
"""The most a RocketMQ broker takes for properties, keys and tags encoded (README)."""

unicode_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]))
"""Text that is valid Unicode (no lone surrogate)."""
surrogates = st.characters(categories=["Cs"])
"""Lone surrogates: Python strings hold them, UTF-8 cannot (``st.characters()`` leaves them out)."""
any_text = st.lists(st.one_of(st.characters(), surrogates), max_size=10).map("".join)
"""Any Python string, lone surrogates (U+D800-U+DFFF) included."""
awkward_bytes = st.one_of(
    st.binary(max_size=24),
    st.sampled_from(
        [b"", b"\x00", b"\xff\xfe\x00\x01", b"caf\xc3", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90"]
    ),
    unicode_text.map(str.encode),
)
"""Bytes: random, awkward (truncated, overlong, surrogate, beyond U+10FFFF), and valid UTF-8."""
large_values = st.integers(1, 40_000).map(lambda n: b"\xff" * n)
"""Values up to and beyond what fits in the properties of one message."""
user_names = st.one_of(
    st.text(alphabet="abcXYZ-_.:019", min_size=1, max_size=12),
    unicode_text.filter(bool).map(lambda s: s[:12]),
).filter(
    lambda n: (
        n not in RESERVED_PROPERTIES
        and n != MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS
        and "\x00" not in n
    )  # refused: a Kafka header name ends at NUL
)
"""Names a user may give a property."""
user_values: st.SearchStrategy[PropertyValue] = st.one_of(
    unicode_text.map(lambda s: s[:24]), awkward_bytes
)


@dataclass
class _Record:
    """A consumed record as confluent-kafka hands it over (only what decoding reads)."""

    _topic: str
    _value: bytes | None
    _headers: Sequence[tuple[str, bytes | None]]

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._headers)


def as_view(raw: bytes) -> memoryview:
    return memoryview(raw)


def as_bytes(properties: dict[str, PropertyValue]) -> dict[str, bytes]:
    """What each property is on the wire."""
    return {name: header_bytes(value) for name, value in properties.items()}


@PROPERTY
@given(raw=awkward_bytes)
def test_a_header_reads_as_text_only_when_it_is_utf8_and_writes_back_byte_for_byte(
    raw: bytes,
) -> None:
    value = header_value(raw)
    try:
        raw.decode("utf-8")
        assert isinstance(value, str)
    except UnicodeDecodeError:
        assert isinstance(value, bytes)
    assert header_bytes(value) == raw


@PROPERTY
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "KEYS", "trace-bin"]), st.one_of(st.none(), awkward_bytes)
        ),
        max_size=8,
    )
)
def test_a_repeated_header_name_keeps_its_last_value(
    headers: list[tuple[str, bytes | None]],
) -> None:
    decoded = decode_headers(headers)
    last = {name: raw for name, raw in headers}
    assert set(decoded) == set(last)
    for name, raw in last.items():
        assert header_bytes(decoded[name]) == (raw if raw is not None else b"")


_FIRST_READS: dict[str, Callable[[MessageExt], object]] = {
    "properties": lambda m: m.properties,
    "get_property": lambda m: m.get_property(MessageConst.TAGS),
    "keys": lambda m: m.keys,
    "tags": lambda m: m.tags,
    "msg_id": lambda m: m.msg_id,
    "born_host": lambda m: m.born_host,
    "reconsume_times": lambda m: m.reconsume_times,
    "repr": repr,
    "put_system_property": lambda m: m.put_system_property("X", "y"),
    "set tags": lambda m: setattr(m, "tags", "T"),
}
"""Ways a listener may first touch a received message's decoded parts."""


@PROPERTY
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
                    MessageConst.KEYS,
                    MessageConst.TAGS,
                    MessageConst.BORN_HOST,
                    MessageConst.RECONSUME_TIME,
                    BORN_TIMESTAMP_HEADER,
                    "trace-bin",
                    "a",
                ]
            ),
            st.one_of(
                st.none(), awkward_bytes, st.sampled_from([b"k1 k2", b" ", b"7", b"1600000000000"])
            ),
        ),
        max_size=8,
    ),
    value=st.one_of(st.none(), st.binary(max_size=8)),
    first=st.sampled_from(sorted(_FIRST_READS)),
    first_delivery=st.booleans(),
)
def test_a_message_decoded_on_first_use_is_the_message_decoded_at_once(
    headers: list[tuple[str, bytes | None]], value: bytes | None, first: str, first_delivery: bool
) -> None:
    if first_delivery:  # as the push consumer's intake reads a record of a real topic
        headers = [(name, raw) for name, raw in headers if name != MessageConst.RECONSUME_TIME]
    record = _Record("bc.orders", value, headers)
    eager = message_from_record(record)
    eager.topic = "orders"
    lazy = undecoded_message(
        record, "orders", "bc.orders", 0, record.headers(), first_delivery=first_delivery
    )
    assert (lazy.body, lazy.queue_offset, lazy.topic) == (eager.body, 7, "orders")
    assert _FIRST_READS[first](lazy) == _FIRST_READS[first](eager)
    assert lazy == eager and repr(lazy) == repr(eager)
    assert type(lazy) is MessageExt, "decoded once, a plain MessageExt from then on"
    for name in (
        "msg_id",
        "born_host",
        "queue_id",
        "born_timestamp_ms",
        "store_timestamp_ms",
        "kafka_topic",
    ):
        assert getattr(lazy, name) == getattr(eager, name), name


def test_a_copy_reads_its_born_time_from_its_first_header_and_was_stored_when_stamped() -> None:
    msg = Message("orders", b"late", keys="k1")
    msg.put_user_property(BORN_TIMESTAMP_HEADER, "a user's value")  # not the born time
    copy = stamped_copy(plain_record(msg, "bc.orders", "ID1", 1_600_000_000_000, b"h"))
    assert copy.born_timestamp_ms == 0, "the writer's clock stamps it"
    assert copy.headers[0] == (BORN_TIMESTAMP_HEADER, b"1600000000000")
    record = _Record("bc.orders", copy.value, copy.headers)  # stamped at 1_700_000_000_000
    eager = message_from_record(record)
    lazy = undecoded_message(record, "orders", "bc.orders", 0, record.headers())
    for got in (eager, lazy):
        assert (got.born_timestamp_ms, got.store_timestamp_ms) == (
            1_600_000_000_000,
            1_700_000_000_000,
        )
        assert (got.msg_id, got.born_host, got.keys) == ("ID1", "h", ["k1"])
        assert got.properties[BORN_TIMESTAMP_HEADER] == "a user's value"
    # A plain record (its first header is UNIQ_KEY): the timestamp is its born time.
    plain = plain_record(msg, "bc.orders", "ID1", 1_600_000_000_000, b"h")
    assert copied_born_timestamp(plain.headers) is None
    read = message_from_record(_Record("bc.orders", plain.value, plain.headers))
    assert (read.born_timestamp_ms, read.store_timestamp_ms) == (1_700_000_000_000, None)


@pytest.mark.parametrize("raw", [None, b"", b"0", b"-5", b"soon", b"1" * 19, b"\xff"])
def test_a_first_header_of_that_name_that_is_no_time_is_a_property(raw: bytes | None) -> None:
    headers = [(BORN_TIMESTAMP_HEADER, raw), ("UNIQ_KEY", b"ID2")]
    assert copied_born_timestamp(headers) is None
    msg = message_from_record(_Record("bc.orders", b"x", headers))
    assert msg.born_timestamp_ms == 1_700_000_000_000
    assert BORN_TIMESTAMP_HEADER in msg.properties


@PROPERTY
@given(
    properties=st.dictionaries(user_names, st.one_of(user_values, large_values), max_size=6),
    body=st.binary(min_size=1, max_size=64),
    keys=st.lists(st.text(alphabet="ab1-é", min_size=1, max_size=5), max_size=3),
    tags=st.one_of(st.none(), st.text(alphabet="TagA-ü", min_size=1, max_size=6)),
)
def test_a_sent_message_reads_back_with_every_property_byte_for_byte(
    properties: dict[str, PropertyValue], body: bytes, keys: list[str], tags: str | None
) -> None:
    msg = Message("orders", body, keys=keys, tags=tags, properties=properties)
    try:
        record = Producer("pg").prepare(msg)
    except MessageTooLargeError:
        size = sum(len(n.encode()) + len(header_bytes(v)) + 2 for n, v in properties.items())
        assert size > MAX_PROPERTIES_BYTES - 200  # own headers, keys and tags take the rest
        return
    received = message_from_record(_Record(record.kafka_topic, record.value, record.headers))
    assert received.msg_id == record.msg_id
    assert received.body == body
    assert received.keys == keys
    assert received.tags == tags
    assert as_bytes({n: received.properties[n] for n in properties}) == as_bytes(properties)


@PROPERTY
@given(
    name=st.one_of(
        any_text, st.sampled_from(sorted(RESERVED_PROPERTIES)), st.integers(), st.none()
    ),
    value=st.one_of(
        any_text,
        awkward_bytes,
        awkward_bytes.map(bytearray),
        awkward_bytes.map(as_view),
        st.integers(),
        st.floats(),
        st.none(),
        st.lists(st.integers(), max_size=2),
    ),
)
@example(name="trace", value="\ud800")
@example(name="bad\udfff", value="v")
@example(name="", value="v")
def test_a_property_is_kept_as_text_or_bytes_or_refused_with_a_typed_error(
    name: object, value: object
) -> None:
    msg = Message("orders", b"x")
    try:
        msg.put_user_property(name, value)  # type: ignore[arg-type]
    except InvalidPropertyError as exc:
        assert repr(name) in str(exc) or "name" in str(exc)
        assert not isinstance(value, str | bytes | bytearray | memoryview) or (
            not isinstance(name, str)
            or not name
            or name in RESERVED_PROPERTIES
            or not is_unicode(name)
            or (isinstance(value, str) and not is_unicode(value))
            or (name == MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS and not isinstance(value, str))
        )
        return
    assert isinstance(name, str)
    kept = msg.get_property(name)
    assert kept == (bytes(value) if isinstance(value, bytearray | memoryview) else value)
    assert isinstance(kept, str | bytes)


@PROPERTY
@given(
    topic=st.one_of(st.just("orders"), any_text),
    keys=st.lists(any_text.filter(lambda k: bool(k) and " " not in k), max_size=2),
    tags=st.one_of(st.none(), any_text, st.integers(), st.binary(max_size=3)),
    sharding_key=st.one_of(st.none(), any_text),
    system=st.dictionaries(
        st.one_of(any_text, st.sampled_from(sorted(RESERVED_PROPERTIES))),
        st.one_of(any_text, awkward_bytes, st.integers()),
        max_size=2,
    ),
)
@example(topic="orders", keys=["k\ud800"], tags=None, sharding_key=None, system={})
@example(topic="orders", keys=[], tags="T\udc00", sharding_key=None, system={})
@example(topic="orders", keys=[], tags=None, sharding_key="\ud800", system={})
def test_whatever_a_message_holds_the_producer_builds_it_or_names_the_problem(
    topic: str,
    keys: list[str],
    tags: object,
    sharding_key: str | None,
    system: dict[str, object],
) -> None:
    # Content the setters do not check (set_tags, put_system_property, keys with a lone
    # surrogate) reaches prepare(): it is refused with a typed error, never another exception.
    msg = Message(topic, b"x", keys=keys, sharding_key=sharding_key)
    msg.set_tags(tags)  # type: ignore[arg-type]
    for name, value in system.items():
        msg.put_system_property(name, value)  # type: ignore[arg-type]
    try:
        Producer("pg", config=ClientConfig(namespace="ns")).prepare(msg)
    except BridgeError:
        return


@PROPERTY
@given(
    properties=st.dictionaries(
        st.one_of(user_names, st.sampled_from(sorted(RESERVED_PROPERTIES))),
        st.one_of(user_values, large_values),
        max_size=6,
    ),
    msg_id=st.text(alphabet="0123456789ABCDEF", max_size=32),
    body=st.binary(max_size=64),
    born_ms=st.integers(-(2**63), 2**63 - 1),
    born_host=unicode_text.map(lambda s: s[:20]),
)
def test_the_envelope_keeps_text_and_bytes_apart_and_whole(
    properties: dict[str, PropertyValue], msg_id: str, body: bytes, born_ms: int, born_host: str
) -> None:
    decoded = decode_envelope(encode_envelope(msg_id, body, properties, born_ms, born_host))
    assert decoded.properties == properties, "same values, same types"
    assert (decoded.msg_id, decoded.body) == (msg_id, body)
    assert (decoded.born_timestamp_ms, decoded.born_host) == (born_ms, born_host)


@PROPERTY
@given(
    name=st.one_of(st.just("trace"), any_text.filter(bool)),
    value=st.one_of(any_text, awkward_bytes),
    where=st.sampled_from(["name", "value", "msg_id", "born_host", "none"]),
    bad=surrogates,
)
def test_a_lone_surrogate_anywhere_in_an_envelope_is_a_typed_error(
    name: str, value: PropertyValue, where: str, bad: str
) -> None:
    msg_id, born_host = "ID", "host"
    if where == "name":
        name += bad
    elif where == "value":
        value = (value.decode("utf-8", "replace") if isinstance(value, bytes) else value) + bad
    elif where == "msg_id":
        msg_id += bad
    elif where == "born_host":
        born_host += bad
    try:
        envelope = encode_envelope(msg_id, b"x", {name: value}, 1, born_host)
    except InvalidPropertyError as exc:
        assert repr(name) in str(exc), "names the property"
        return
    except InvalidArgumentError:
        assume(where != "none")
        return
    assert decode_envelope(envelope).properties == {name: value}


@PROPERTY
@given(
    data=st.data(),
    properties=st.dictionaries(user_names, user_values, max_size=4),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "cut", "insert"]), st.integers(0, 10**6), st.integers(0, 255)
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_bytes_that_are_not_an_envelope_are_refused_with_a_wire_format_error(
    data: st.DataObject, properties: dict[str, PropertyValue], edits: list[tuple[str, int, int]]
) -> None:
    envelope = bytearray(encode_envelope("ID", b"body", properties, 1, "h"))
    for kind, where, byte in edits:
        at = where % (len(envelope) + 1)
        if kind == "flip" and at < len(envelope):
            envelope[at] ^= byte or 1
        elif kind == "cut":
            del envelope[at:]
        else:
            envelope[at:at] = bytes([byte])
        if not envelope:
            break
    try:
        msg = decode_envelope(bytes(envelope))
    except WireFormatError:
        return
    assert isinstance(msg, MessageExt)


@PROPERTY
@given(body=st.one_of(any_text, st.binary(max_size=8), st.integers(), st.none()))
def test_a_body_is_bytes_or_text_as_utf8_or_refused_with_a_typed_error(body: object) -> None:
    for build in (
        lambda: Message("orders", body),  # type: ignore[arg-type]
        lambda: Message("orders").set_body(body),  # type: ignore[arg-type]
    ):
        try:
            msg = build()
        except InvalidMessageError:
            assert not isinstance(body, bytes)
            continue
        if isinstance(msg, Message):
            assert msg.body == (body.encode() if isinstance(body, str) else body)


# --- regressions found by the properties above -------------------------------------------------


def test_a_text_body_with_a_lone_surrogate_is_an_invalid_message() -> None:
    # It raised UnicodeEncodeError from the Message constructor.
    with pytest.raises(InvalidMessageError, match="U\\+D800 at index 2"):
        Message("orders", "ok\ud800")
    with pytest.raises(InvalidMessageError, match="surrogate"):
        Message("orders", b"x").set_body("\udfff")


def test_a_header_property_found_before_another_thread_decoded_the_message_still_reads() -> None:
    # The interleaving the threaded test below hits now and then: a thread finds a lazy
    # property on the undecoded class, another thread decodes the message (its class becomes
    # MessageExt) before the first calls the property.
    headers = [(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, b"ID"), (MessageConst.TAGS, b"T")]
    msg = undecoded_message(_Record("t", b"x", headers), "t", "t", 0, headers)
    found = {name: vars(type(msg))[name] for name in ("msg_id", "tags", "_properties")}
    assert msg.msg_id == "ID" and type(msg) is MessageExt  # decoded by "the other thread"
    assert found["msg_id"].fget(msg) == "ID"
    assert found["tags"].fget(msg) == "T"
    found["tags"].fset(msg, "U")
    assert msg.tags == "U"


def test_threads_reading_one_undecoded_message_at_once_all_see_it_decoded() -> None:
    headers = [(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, b"ID"), (MessageConst.TAGS, b"T")]
    msgs = [
        undecoded_message(_Record("t", b"x", headers), "t", "t", 0, headers) for _ in range(300)
    ]
    seen: list[tuple[str, str | None, int]] = []
    start = threading.Barrier(4)

    def read() -> None:
        start.wait()
        for msg in msgs:
            seen.append((msg.msg_id, msg.tags, len(msg.properties)))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=read) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert set(seen) == {("ID", "T", 2)} and len(seen) == 1200


def test_a_copy_of_a_message_with_no_born_time_carries_no_born_header() -> None:
    msg = Message("orders", b"x")
    copy = stamped_copy(plain_record(msg, "bc.orders", "ID3", 0, b"h"))
    assert copy.born_timestamp_ms == 0
    assert [name for name, _ in copy.headers][:1] == ["UNIQ_KEY"]
