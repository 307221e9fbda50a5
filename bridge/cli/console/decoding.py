"""Dead-letter bodies through a deserializer named when the console starts
(``bridge console --deserializer``), apart from Kafka and the web app: JSON, Avro with a
schema file, or a confluent-kafka ``Deserializer`` of your own, as the consumers take it
(docs/serialization.md). A body it cannot read gives :class:`BodyDecodeError` with the reason,
which the letter's page shows beside its text and hex views."""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import fastavro
import fastavro.schema
from confluent_kafka.serialization import MessageField, SerializationContext

Headers = list[tuple[str, str | bytes | None]]
"""A record's headers as confluent-kafka gives them to a deserializer."""

DECODED_PREVIEW_CHARS: Final = 64 * 1024
"""The most characters of a decoded body the letter's page renders."""


class BodyDecodeError(ValueError):
    """A body the configured deserializer cannot read; the message says why."""


class DeserializerSpecError(ValueError):
    """A ``--deserializer`` value that names no deserializer the console can build."""


@dataclass(frozen=True, slots=True)
class BodyDeserializer:
    """A named way to read a body into a value shown as indented JSON."""

    name: str
    """What the page calls it: ``json``, ``avro:<schema file>``, ``<module>:<name>``."""
    read: Callable[[bytes, str, Headers], Any]
    """(body, origin topic, headers) -> the value; raises anything on bytes it cannot read."""

    def decode(self, body: bytes, topic: str, headers: Headers) -> str:
        """``body`` read and rendered (at most :data:`DECODED_PREVIEW_CHARS` characters);
        :class:`BodyDecodeError` naming the deserializer and the reason when it cannot be."""
        try:
            value = self.read(body, topic, headers)
        except Exception as exc:  # a deserializer of the operator's may raise anything
            raise BodyDecodeError(f"{self.name} cannot read this body: {_reason(exc)}") from exc
        try:
            text = json.dumps(value, indent=2, ensure_ascii=False, default=_shown)
        except (TypeError, ValueError, RecursionError) as exc:
            # A value JSON cannot render: keys that are bytes (msgpack's raw mode), a cycle,
            # nesting deeper than the encoder recurses. The page says so, never a 500.
            raise BodyDecodeError(
                f"{self.name} read a value it cannot show: {_reason(exc)}"
            ) from exc
        if len(text) > DECODED_PREVIEW_CHARS:
            text = text[:DECODED_PREVIEW_CHARS] + f"\n... {len(text) - DECODED_PREVIEW_CHARS} more"
        return text


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    return f"{type(exc).__name__}: {exc}"


def _shown(value: object) -> str:
    """How a value JSON has no type for is shown (bytes as their hex)."""
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _json(body: bytes, topic: str, headers: Headers) -> Any:
    return json.loads(body.decode("utf-8"))


def _avro(schema_file: str) -> Callable[[bytes, str, Headers], Any]:
    try:
        schema = fastavro.schema.load_schema(schema_file)
    except Exception as exc:  # fastavro raises its own errors (a missing file among them)
        raise DeserializerSpecError(f"avro schema {schema_file}: {_reason(exc)}") from exc

    def read(body: bytes, topic: str, headers: Headers) -> Any:
        stream = io.BytesIO(body)
        value = fastavro.schemaless_reader(stream, schema, None)
        left = len(body) - stream.tell()
        if left:
            # Avro binary has no marker: a body of another schema often reads "fine" for a
            # while; bytes left over say it was not this one.
            raise ValueError(
                f"{left} bytes left over after a record of the schema (another schema?)"
            )
        return value

    return read


def _imported(spec: str) -> Callable[[bytes, str, Headers], Any]:
    module_name, _, attr = spec.partition(":")
    try:
        deserializer = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # importing runs the module's own code: it may raise anything
        raise DeserializerSpecError(f"{spec}: {_reason(exc)}") from exc
    if not callable(deserializer):
        raise DeserializerSpecError(f"{spec} is not a deserializer (not callable)")

    def read(body: bytes, topic: str, headers: Headers) -> Any:
        return deserializer(body, SerializationContext(topic, MessageField.VALUE, headers))

    return read


def parse_deserializer(spec: str) -> BodyDeserializer:
    """The deserializer ``spec`` names: ``json`` (UTF-8 JSON), ``avro:<file.avsc>`` (Avro
    binary without header, of that writer schema), or ``<module>:<name>`` (a confluent-kafka
    ``Deserializer`` object importable as that, e.g. an ``AvroDeserializer`` of your Schema
    Registry, called as the consumers call ``value_deserializer``: with the origin topic and
    ``MessageField.VALUE``). :class:`DeserializerSpecError` for anything else."""
    if spec == "json":
        return BodyDeserializer("json", _json)
    kind, sep, rest = spec.partition(":")
    if kind == "avro" and sep and rest:
        return BodyDeserializer(f"avro:{Path(rest).name}", _avro(rest))
    if sep and kind and rest and all(p.isidentifier() for p in (*kind.split("."), rest)):
        return BodyDeserializer(spec, _imported(spec))
    raise DeserializerSpecError(
        f"not a deserializer: {spec!r} (json, avro:<schema file>, or <module>:<name>)"
    )
