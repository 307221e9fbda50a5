"""Avro encoding of system-topic records.

Every record in a system topic is written in Avro's *single object encoding*: the two bytes
``C3 01``, the writer schema's 8-byte CRC-64-AVRO fingerprint (little-endian), then the
Avro binary body. A reader looks the fingerprint up among every schema version it knows and
resolves the record into the newest version of that schema, so fields can be added (with a
default) without stopping the world. A record whose marker, fingerprint or body cannot be
read raises a :class:`~topics.errors.WireFormatError` subclass naming the problem; the
services quarantine such records instead of dropping them.

Schemas live beside this module as ``schemas/<Name>.v<N>.avsc``; every version stays there
for as long as records written with it may still be read.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import fastavro
import fastavro.schema

from topics.errors import InvalidArgumentError, MalformedRecordError, UnknownSchemaError

SINGLE_OBJECT_MARKER = b"\xc3\x01"
HEADER_LENGTH = len(SINGLE_OBJECT_MARKER) + 8
SCHEMA_DIR = Path(__file__).with_name("schemas")

_FILE_NAME = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[0-9]+)\.avsc$")


def schema_fingerprint(schema: Mapping[str, Any]) -> bytes:
    """The 8 fingerprint bytes of a schema's parsing canonical form: the Avro specification's
    CRC-64-AVRO, little-endian (fastavro gives them as hex)."""
    canonical = fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(dict(schema)))
    return bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """One version of one named record schema."""

    name: str
    version: int
    parsed: Any
    fingerprint: bytes
    source: Mapping[str, Any]
    """The schema as written in its ``.avsc`` file (what other Avro readers, e.g. Spark's
    ``from_avro``, take as JSON)."""


class SchemaRegistry:
    """Every known version of every system-record schema, looked up by name or fingerprint."""

    def __init__(self, schemas: Mapping[tuple[str, int], Mapping[str, Any]]) -> None:
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        self._by_version: dict[tuple[str, int], SchemaVersion] = {}
        self._latest: dict[str, SchemaVersion] = {}
        for (name, version), schema in sorted(schemas.items()):
            full_name = schema.get("name")
            if full_name != name:
                raise InvalidArgumentError(
                    f"schema {name} v{version} declares the record name {full_name!r}"
                )
            entry = SchemaVersion(
                name=name,
                version=version,
                parsed=fastavro.parse_schema(dict(schema)),
                fingerprint=schema_fingerprint(schema),
                source=schema,
            )
            self._by_fingerprint[entry.fingerprint] = entry
            self._by_version[(name, version)] = entry
            self._latest[name] = entry

    @classmethod
    def from_directory(cls, directory: Path = SCHEMA_DIR) -> SchemaRegistry:
        """Load every ``<Name>.v<N>.avsc`` file of ``directory``."""
        found: dict[tuple[str, int], Mapping[str, Any]] = {}
        for path in sorted(directory.glob("*.avsc")):
            m = _FILE_NAME.match(path.name)
            if m is None:
                raise InvalidArgumentError(f"schema file {path} is not named <Name>.v<N>.avsc")
            found[(m.group("name"), int(m.group("version")))] = json.loads(path.read_text())
        return cls(found)

    def names(self) -> frozenset[str]:
        """The names of every known record schema."""
        return frozenset(self._latest)

    def versions(self, name: str) -> list[SchemaVersion]:
        """Every known version of the schema ``name``, oldest first."""
        found = [v for (n, _), v in sorted(self._by_version.items()) if n == name]
        if not found:
            raise UnknownSchemaError(f"no schema named {name!r} is known")
        return found

    def latest(self, name: str) -> SchemaVersion:
        """The newest version of the schema ``name``."""
        try:
            return self._latest[name]
        except KeyError:
            raise UnknownSchemaError(f"no schema named {name!r} is known") from None

    def version(self, name: str, version: int) -> SchemaVersion:
        """Version ``version`` of the schema ``name``."""
        try:
            return self._by_version[(name, version)]
        except KeyError:
            raise UnknownSchemaError(f"no schema {name!r} v{version} is known") from None

    def encode(self, name: str, record: Mapping[str, Any], version: int | None = None) -> bytes:
        """Encode ``record`` with the newest version of ``name`` (single object encoding), or
        with ``version``: a writer may keep writing an older version while the record fits
        it, so that readers which do not know the newer one yet can still read it."""
        schema = self.latest(name) if version is None else self.version(name, version)
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MARKER)
        buf.write(schema.fingerprint)
        try:
            fastavro.schemaless_writer(buf, schema.parsed, dict(record))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"record does not fit schema {name}: {exc}") from exc
        return buf.getvalue()

    def decode_any(self, data: bytes | None) -> tuple[str, dict[str, Any]]:
        """Decode a record of any known schema; return its schema name and the record."""
        return self._decode(None, data)

    def decode(self, name: str, data: bytes | None) -> dict[str, Any]:
        """Decode a record written with any known version of ``name`` into its newest version.

        Raises :class:`MalformedRecordError` or :class:`UnknownSchemaError` with the reason.
        """
        return self._decode(name, data)[1]

    def _decode(self, expected: str | None, data: bytes | None) -> tuple[str, dict[str, Any]]:
        what = f"a {expected} record" if expected else "a system record"
        if data is None:
            raise MalformedRecordError(f"expected {what}, found a null value")
        if len(data) < HEADER_LENGTH or data[:2] != SINGLE_OBJECT_MARKER:
            raise MalformedRecordError(
                f"expected {what} in Avro single object encoding "
                f"(marker C3 01), found {data[:HEADER_LENGTH].hex(' ') or 'no bytes'}"
            )
        writer = self._by_fingerprint.get(bytes(data[2:HEADER_LENGTH]))
        if writer is None:
            raise UnknownSchemaError(
                f"record's schema fingerprint {data[2:HEADER_LENGTH].hex()} is unknown here "
                "(written by a newer version?)"
            )
        if expected is not None and writer.name != expected:
            raise MalformedRecordError(f"expected {what}, found a {writer.name} record")
        reader = self._latest[writer.name]
        stream = io.BytesIO(data)
        stream.seek(HEADER_LENGTH)
        try:
            record = cast(
                dict[str, Any], fastavro.schemaless_reader(stream, writer.parsed, reader.parsed)
            )
        except Exception as exc:  # fastavro raises a wide range of errors on bad bytes
            raise MalformedRecordError(
                f"cannot decode {writer.name} v{writer.version}: {exc!r}"
            ) from exc
        if stream.tell() != len(data):
            raise MalformedRecordError(
                f"{len(data) - stream.tell()} trailing bytes after a {writer.name} record"
            )
        return writer.name, record


@cache
def default_registry() -> SchemaRegistry:
    """The registry of the schemas shipped in ``topics/schemas``."""
    return SchemaRegistry.from_directory()
