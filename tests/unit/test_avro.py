"""Avro single object encoding of system records: round trip, evolution, bad bytes."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro.schema
import pytest

from bridge.codec import decode_envelope, encode_envelope, envelope_to_message
from bridge.message import MessageConst
from topics.avro import (
    HEADER_LENGTH,
    SCHEMA_DIR,
    SchemaRegistry,
    default_registry,
    schema_fingerprint,
)
from topics.errors import InvalidArgumentError, MalformedRecordError, UnknownSchemaError

V1 = {
    "type": "record",
    "name": "Sample",
    "fields": [{"name": "id", "type": "string"}, {"name": "count", "type": "long"}],
}
V2 = {
    "type": "record",
    "name": "Sample",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "count", "type": "long"},
        {"name": "note", "type": "string", "default": "none"},
    ],
}


def test_envelope_round_trip_keeps_everything() -> None:
    props = {MessageConst.REAL_TOPIC: "orders", MessageConst.TAGS: "TagA", "user": "ü"}
    data = encode_envelope("ID1", b"\x00\xffbody", props, 1_700_000_000_123, "10.0.0.1")
    assert data[:2] == b"\xc3\x01"
    msg = decode_envelope(data)
    assert msg.topic == "orders"
    assert msg.msg_id == "ID1"
    assert msg.body == b"\x00\xffbody"
    assert msg.properties == props
    assert msg.tags == "TagA"
    assert msg.born_timestamp_ms == 1_700_000_000_123
    assert msg.born_host == "10.0.0.1"


ENVELOPE = "MessageEnvelope"


def _envelope_v1_only() -> SchemaRegistry:
    """The registry of a bridge that knows MessageEnvelope v1 only (before binary properties)."""
    v1 = json.loads((SCHEMA_DIR / "MessageEnvelope.v1.avsc").read_text())
    return SchemaRegistry({(ENVELOPE, 1): v1})


def test_an_envelope_with_text_properties_only_is_written_in_v1() -> None:
    # Readers that do not know v2 yet (a rolling upgrade) still read every such record.
    props = {MessageConst.REAL_TOPIC: "orders", "user": "ü"}
    data = encode_envelope("ID1", b"body", props, 1, "h")
    assert data[2:HEADER_LENGTH] == default_registry().version(ENVELOPE, 1).fingerprint
    assert _envelope_v1_only().decode(ENVELOPE, data)["properties"] == props
    assert default_registry().decode(ENVELOPE, data)["binary_properties"] == {}


def test_binary_properties_are_written_in_v2_and_read_back_byte_for_byte() -> None:
    props: dict[str, str | bytes] = {
        MessageConst.REAL_TOPIC: "orders",
        "text": "naïve",
        "trace-bin": b"\xff\xfe\x00\x01",
        "empty-bytes": b"",
        "utf8-bytes": "ü".encode(),
    }
    data = encode_envelope("ID1", b"body", props, 1, "h")
    latest = default_registry().latest(ENVELOPE)
    assert latest.version >= 2
    assert data[2:HEADER_LENGTH] == latest.fingerprint
    msg = decode_envelope(data)
    assert msg.properties == props
    assert {name: type(value) for name, value in msg.properties.items()} == {
        name: type(value) for name, value in props.items()
    }
    with pytest.raises(UnknownSchemaError, match="unknown"):
        _envelope_v1_only().decode(ENVELOPE, data)


def test_a_v1_envelope_resolves_into_the_newest_version() -> None:
    record = {
        "msg_id": "OLD",
        "body": b"x",
        "properties": {MessageConst.REAL_TOPIC: "orders", MessageConst.TAGS: "T"},
        "born_timestamp_ms": 5,
        "born_host": "h",
    }
    written_by_v1 = _envelope_v1_only().encode(ENVELOPE, record)
    fields = default_registry().decode(ENVELOPE, written_by_v1)
    assert fields == {**record, "binary_properties": {}}
    msg = envelope_to_message(fields)
    assert (msg.topic, msg.tags, msg.msg_id) == ("orders", "T", "OLD")


def test_an_unknown_version_cannot_be_written() -> None:
    with pytest.raises(UnknownSchemaError, match="v99"):
        default_registry().encode(ENVELOPE, {}, version=99)


def test_every_shipped_schema_loads_and_has_a_distinct_fingerprint() -> None:
    registry = default_registry()
    assert {"MessageEnvelope", "OpRecord"} <= registry.names()
    fingerprints = {registry.latest(n).fingerprint for n in registry.names()}
    assert len(fingerprints) == len(registry.names())


def test_fingerprint_is_the_specs_crc64_little_endian() -> None:
    # fastavro renders the fingerprint as the hex of its little-endian bytes; the Avro
    # specification's CRC-64-AVRO itself is checked in test_fingerprint.py.
    canonical = fastavro.schema.to_parsing_canonical_form(fastavro.schema.parse_schema(V1))
    assert schema_fingerprint(V1) == bytes.fromhex(
        fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
    )


def test_old_records_decode_into_the_new_schema_with_defaults() -> None:
    old = SchemaRegistry({("Sample", 1): V1})
    new = SchemaRegistry({("Sample", 1): V1, ("Sample", 2): V2})
    written_by_old = old.encode("Sample", {"id": "a", "count": 3})
    assert new.decode("Sample", written_by_old) == {"id": "a", "count": 3, "note": "none"}
    written_by_new = new.encode("Sample", {"id": "b", "count": 4, "note": "x"})
    assert new.decode("Sample", written_by_new)["note"] == "x"


def test_a_record_from_a_newer_writer_is_an_unknown_schema() -> None:
    old = SchemaRegistry({("Sample", 1): V1})
    new = SchemaRegistry({("Sample", 1): V1, ("Sample", 2): V2})
    with pytest.raises(UnknownSchemaError, match="unknown"):
        old.decode("Sample", new.encode("Sample", {"id": "b", "count": 4, "note": "x"}))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (None, "null value"),
        (b"", "no bytes"),
        (b"plain text, not avro", "marker C3 01"),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02a\x06", "unknown"),
    ],
)
def test_malformed_bytes_raise_typed_errors(data: bytes | None, fragment: str) -> None:
    registry = SchemaRegistry({("Sample", 1): V1})
    with pytest.raises((MalformedRecordError, UnknownSchemaError), match=fragment):
        registry.decode("Sample", data)


def test_truncated_and_padded_records_are_malformed() -> None:
    registry = SchemaRegistry({("Sample", 1): V1})
    good = registry.encode("Sample", {"id": "abc", "count": 99})
    with pytest.raises(MalformedRecordError, match="cannot decode"):
        registry.decode("Sample", good[: HEADER_LENGTH + 2])
    with pytest.raises(MalformedRecordError, match="trailing"):
        registry.decode("Sample", good + b"\x00")


def test_a_record_of_another_schema_is_refused() -> None:
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}
    registry = SchemaRegistry({("Sample", 1): V1, ("Other", 1): other})
    with pytest.raises(MalformedRecordError, match="found a Other record"):
        registry.decode("Sample", registry.encode("Other", {"x": 1}))


def test_encoding_a_record_that_does_not_fit_names_the_schema() -> None:
    registry = SchemaRegistry({("Sample", 1): V1})
    with pytest.raises(InvalidArgumentError, match="Sample"):
        registry.encode("Sample", {"id": "a", "count": "not a number"})


def test_schema_files_must_be_versioned(tmp_path: Path) -> None:
    (tmp_path / "Sample.avsc").write_text(json.dumps(V1))
    with pytest.raises(InvalidArgumentError, match=r"<Name>\.v<N>\.avsc"):
        SchemaRegistry.from_directory(tmp_path)
