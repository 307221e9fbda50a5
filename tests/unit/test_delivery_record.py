"""The delay services' delivery record (``bridge.codec.delivery_record``) is the record the
general path builds (``real_record(decode_envelope(...))``): same topic, partition, key, value,
headers in the same order, id and born time, and the same typed error for what cannot be
delivered. The fast envelope reading (:func:`bridge.codec.envelope_fields`) reads v1 and v2
envelopes as the schema registry does and refuses the same bad bytes.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.codec import (
    ENVELOPE_SCHEMA,
    decode_envelope,
    delivery_record,
    encode_envelope,
    envelope_fields,
    real_record,
)
from bridge.errors import BridgeError, WireFormatError
from bridge.kafka.transactional import REMOVED_ON_DELIVERY
from bridge.message import MessageConst, PropertyValue
from topics.avro import default_registry

PROPERTY = settings(
    max_examples=400,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
names = st.one_of(
    st.sampled_from(
        [
            MessageConst.REAL_TOPIC,
            MessageConst.REAL_QUEUE_ID,
            MessageConst.KEYS,
            MessageConst.TAGS,
            MessageConst.SHARDING_KEY,
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
            MessageConst.BORN_HOST,
            MessageConst.TIMER_DELIVER_MS,
            MessageConst.DELAY_TIME_LEVEL,
            "DELIVERY_ATTEMPTS",
            "user",
        ]
    ),
    text.filter(bool),
)
values: st.SearchStrategy[PropertyValue] = st.one_of(
    text,
    st.sampled_from(["orders", "%RETRY%g1", "bad topic", "3", "-1", "k1  k2", " ", ""]),
    st.binary(max_size=8),
    st.just(b"\xff\xfeorders"),
)


def _outcome(fn: object) -> tuple[str, object]:
    try:
        return ("ok", tuple(fn()))  # type: ignore[operator]
    except BridgeError as exc:
        return (type(exc).__name__, str(exc))


@PROPERTY
@given(
    msg_id=text,
    body=st.binary(max_size=16),
    props=st.dictionaries(names, values, max_size=8),
    born=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    host=text,
)
@example(msg_id="id", body=b"b", props={"REAL_TOPIC": "orders"}, born=1, host="h")
@example(
    msg_id="id",
    body=b"",
    props={"REAL_TOPIC": b"orders", "REAL_QID": b"2", "KEYS": b" a  b ", "x": b"\xff"},
    born=0,
    host="",
)
def test_delivery_record_is_the_general_paths_record(
    msg_id: str, body: bytes, props: dict[str, PropertyValue], born: int, host: str
) -> None:
    data = encode_envelope(msg_id, body, props, born, host)
    expected = _outcome(lambda: real_record(decode_envelope(data), "ns", REMOVED_ON_DELIVERY))
    assert _outcome(lambda: delivery_record(data, "ns", REMOVED_ON_DELIVERY)) == expected


@PROPERTY
@given(
    msg_id=text,
    body=st.binary(max_size=16),
    props=st.dictionaries(names, values, max_size=6),
    born=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    host=text,
    version=st.sampled_from([None, 1]),
)
def test_envelope_fields_read_what_the_registry_reads(
    msg_id: str,
    body: bytes,
    props: dict[str, PropertyValue],
    born: int,
    host: str,
    version: int | None,
) -> None:
    text_only = {k: v for k, v in props.items() if isinstance(v, str)}
    record = {
        "msg_id": msg_id,
        "body": body,
        "properties": text_only if version == 1 else {},
        "born_timestamp_ms": born,
        "born_host": host,
    }
    if version is None:
        record["binary_properties"] = {k: v for k, v in props.items() if isinstance(v, bytes)}
    data = default_registry().encode(ENVELOPE_SCHEMA, record, version=version)
    fields = envelope_fields(data)
    resolved = default_registry().decode(ENVELOPE_SCHEMA, data)
    assert {"binary_properties": {}, **fields} == resolved


@PROPERTY
@given(cut=st.integers(min_value=0, max_value=80), extra=st.binary(min_size=1, max_size=4))
def test_bad_bytes_raise_what_the_registry_raises(cut: int, extra: bytes) -> None:
    data = encode_envelope("id", b"body", {"REAL_TOPIC": "orders", "k": b"\x00"}, 5, "h")
    for bad in (data[:cut], data + extra, data[:12] + b"\xff" * 9 + data[21:]):
        if bad == data:
            continue
        with pytest.raises(WireFormatError) as fast:
            envelope_fields(bad)
        with pytest.raises(WireFormatError) as general:
            default_registry().decode(ENVELOPE_SCHEMA, bad)
        assert (type(fast.value), str(fast.value)) == (type(general.value), str(general.value))


def test_a_null_value_is_refused_by_name() -> None:
    with pytest.raises(WireFormatError, match="null value"):
        delivery_record(None, "ns", REMOVED_ON_DELIVERY)
