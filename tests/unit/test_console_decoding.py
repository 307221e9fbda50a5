"""A dead letter's body through the deserializer ``bridge console --deserializer`` names:
JSON, Avro of a schema file, a confluent-kafka Deserializer of one's own; a body it cannot
read gives the reason, never an exception the page would answer with 500."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import fastavro
import pytest
from click.testing import CliRunner

from bridge.cli import cli
from bridge.cli.console.decoding import (
    DECODED_PREVIEW_CHARS,
    BodyDecodeError,
    DeserializerSpecError,
    parse_deserializer,
)

ORDER: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}


def _avro(schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return out.getvalue()


def test_json_bodies_are_shown_indented_and_others_say_why() -> None:
    json_reader = parse_deserializer("json")
    assert json.loads(json_reader.decode(b'{"order": 42}', "orders", [])) == {"order": 42}
    with pytest.raises(BodyDecodeError, match=r"json cannot read this body: not UTF-8 \(byte 0xff"):
        json_reader.decode(b"\xff\xfe", "orders", [])
    with pytest.raises(BodyDecodeError, match="JSONDecodeError"):
        json_reader.decode(b"order 42", "orders", [])


def test_avro_bodies_of_the_schema_are_read_and_others_refused(tmp_path: Path) -> None:
    schema_file = tmp_path / "order.avsc"
    schema_file.write_text(json.dumps(ORDER))
    avro = parse_deserializer(f"avro:{schema_file}")
    assert avro.name == "avro:order.avsc"
    body = _avro(ORDER, {"id": 7, "item": "tea"})
    assert json.loads(avro.decode(body, "orders", [])) == {"id": 7, "item": "tea"}
    with pytest.raises(BodyDecodeError, match=r"avro:order\.avsc cannot read this body"):
        avro.decode(body + b"\x00\x01", "orders", [])  # bytes left over: another schema
    with pytest.raises(BodyDecodeError, match=r"avro:order\.avsc cannot read this body"):
        avro.decode(b"", "orders", [])
    other: dict[str, Any] = {
        "type": "record",
        "name": "Flag",
        "fields": [{"name": "on", "type": "boolean"}],
    }
    with pytest.raises(BodyDecodeError):
        avro.decode(_avro(other, {"on": True}) + b"x", "orders", [])


def upper_text(data: bytes | None, ctx: object) -> str:
    """A deserializer as a consumer takes it, for the test below: sees the origin topic."""
    topic = getattr(ctx, "topic", "")
    if data is None or not data.isascii():
        raise ValueError("only ASCII here")
    return f"{topic}: {data.decode().upper()}"


def test_a_deserializer_of_ones_own_is_called_as_consumers_call_it() -> None:
    own = parse_deserializer(f"{__name__}:upper_text")
    assert json.loads(own.decode(b"tea", "orders", [("h", b"v")])) == "orders: TEA"
    with pytest.raises(BodyDecodeError, match="ValueError: only ASCII here"):
        own.decode("té".encode(), "orders", [])


def test_a_long_decoded_body_is_cut() -> None:
    text = parse_deserializer("json").decode(json.dumps("x" * 100_000).encode(), "t", [])
    assert len(text) < DECODED_PREVIEW_CHARS + 100 and text.endswith("more")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("yaml", "not a deserializer"),
        ("avro:", "not a deserializer"),
        ("avro:/nonexistent/order.avsc", "avro schema"),
        ("no_such_module_xyz:thing", "ModuleNotFoundError"),
        ("json:nothing", "AttributeError"),
        ("bridge.cli.console.decoding:DECODED_PREVIEW_CHARS", "not callable"),
        ("a b:c", "not a deserializer"),
    ],
)
def test_specs_that_name_no_deserializer(spec: str, why: str) -> None:
    with pytest.raises(DeserializerSpecError, match=why):
        parse_deserializer(spec)


def test_the_command_refuses_a_bad_deserializer_before_it_starts() -> None:
    result = CliRunner().invoke(cli, ["console", "-b", "127.0.0.1:1", "--deserializer", "yaml"])
    assert result.exit_code == 2
    assert "Invalid value for --deserializer: not a deserializer: 'yaml'" in result.output


def raw_keys(data: bytes | None, ctx: object) -> dict[bytes, int]:
    """A deserializer whose value has bytes keys (as msgpack's raw mode gives them)."""
    return {b"order": 42}


def a_cycle(data: bytes | None, ctx: object) -> list[object]:
    """A deserializer whose value contains itself."""
    value: list[object] = []
    value.append(value)
    return value


@pytest.mark.parametrize(("name", "why"), [("raw_keys", "TypeError"), ("a_cycle", "ValueError")])
def test_a_value_json_cannot_render_is_a_decode_error(name: str, why: str) -> None:
    # The letter's page catches BodyDecodeError only: anything else would be a 500.
    own = parse_deserializer(f"{__name__}:{name}")
    with pytest.raises(BodyDecodeError, match=f"read a value it cannot show: {why}"):
        own.decode(b"x", "orders", [])


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("raise RuntimeError('no registry url')\n", "RuntimeError: no registry url"),
        ("def (:\n", "SyntaxError"),
    ],
)
def test_a_deserializer_module_that_fails_to_import_is_a_spec_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, why: str
) -> None:
    # Importing runs the operator's module: whatever it raises names the flag's problem
    # (the command turns DeserializerSpecError into a usage error), never a traceback.
    (tmp_path / "broken_deserializer_mod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_deserializer_mod", raising=False)
    with pytest.raises(DeserializerSpecError, match=why):
        parse_deserializer("broken_deserializer_mod:deserialize")
