"""Schema fingerprints: fastavro's CRC-64-AVRO gives the Avro specification's values.

The oracle is the specification's own algorithm (a 64-bit Rabin fingerprint, written out here
as the specification gives it), so records written before fingerprints came from fastavro keep
their fingerprints: every shipped schema version must fingerprint the same both ways.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import fastavro
import fastavro.schema
import pytest

from topics.avro import SCHEMA_DIR, default_registry, schema_fingerprint

_EMPTY = 0xC15D213AA4D7A795


def _spec_crc64(data: bytes) -> int:
    """CRC-64-AVRO as the Avro specification writes it (``fingerprint64``)."""
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_the_specs_test_vector() -> None:
    # The specification's value for the schema "int" (Java's parsingFingerprint64).
    assert _spec_crc64(b'"int"') == 0x7275D51A3F395C8F
    assert (
        fastavro.schema.fingerprint('"int"', "CRC-64-AVRO")
        == struct.pack("<Q", 0x7275D51A3F395C8F).hex()
    )


SCHEMA_FILES = sorted(SCHEMA_DIR.glob("*.avsc"))


def test_every_schema_file_is_checked() -> None:
    assert len(SCHEMA_FILES) >= 2
    assert len(SCHEMA_FILES) == sum(
        len(default_registry().versions(n)) for n in default_registry().names()
    )


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=lambda p: p.name)
def test_fastavro_fingerprint_equals_the_spec_algorithm(path: Path) -> None:
    schema = json.loads(path.read_text())
    canonical = fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(schema))
    expected = struct.pack("<Q", _spec_crc64(canonical.encode("utf-8")))
    assert schema_fingerprint(schema) == expected
