"""Deliveries a partition's next owner must count: the offset-commit metadata of a
:class:`~bridge.SimpleConsumer` (pure rules, no I/O).

A simple consumer commits, with each partition's offset, the offsets at or past it that it
handed out and that are not done (received and not acked, or sent back and the copy not yet
acknowledged), each with how many times it went out. Kafka keeps that text beside the offset
(the commit's ``metadata``), so when the consumer crashes or gives the partition up, the next
owner reads it with the committed offset and counts those deliveries: the message comes back
with its ``delivery_attempt`` raised by them, and a message that kills every consumer that
receives it reaches ``%DLQ%<group>`` after the group's maximum deliveries instead of going out
for ever (RocketMQ's broker counts a POP delivery the same way, in its revive log).

The text: :data:`PREFIX`, then comma-separated entries relative to the committed offset,
``d`` (offset + d went out once), ``d-e`` (offsets + d to + e, once each), and ``*k`` after
either for k times. Entries past :data:`MAX_METADATA_CHARS` are left out, farthest offsets
first (Kafka's ``offset.metadata.max.bytes`` is 4,096 by default; a longer text fails the
whole commit): those deliveries are then not counted after a crash, as before this existed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

PREFIX: Final = "rmq-deliveries:1;"
"""Starts the metadata this module writes (format version 1); other metadata is ignored."""
MAX_METADATA_CHARS: Final = 3_000
"""The longest metadata written, characters (under Kafka's default 4,096 bytes: all ASCII)."""
MAX_DECODED_OFFSETS: Final = 100_000
"""The most offsets read from one partition's metadata; more is not this module's (the leases
of one consumer are far fewer), and is ignored rather than held in memory."""
_ENTRY: Final = re.compile(r"(\d{1,12})(?:-(\d{1,12}))?(?:\*(\d{1,6}))?")


def encode(base: int, counts: Mapping[int, int]) -> tuple[str, int]:
    """The metadata for ``counts`` (offset -> deliveries not done) committed with offset
    ``base``, and how many offsets did not fit. Offsets below ``base`` and counts below 1 are
    left out (done, or never out); "" when nothing is left."""
    kept = sorted((o, c) for o, c in counts.items() if o >= base and c >= 1)
    if not kept:
        return "", 0
    entries: list[str] = []
    i = 0
    while i < len(kept):
        start, count = kept[i]
        j = i
        while j + 1 < len(kept) and kept[j + 1] == (kept[j][0] + 1, count):
            j += 1
        text = str(start - base) if j == i else f"{start - base}-{kept[j][0] - base}"
        entries.append(text if count == 1 else f"{text}*{count}")
        i = j + 1
    out = PREFIX
    for n, entry in enumerate(entries):
        candidate = out + ("," if n else "") + entry
        if len(candidate) > MAX_METADATA_CHARS:
            left = sum(_span(e) for e in entries[n:])
            return out, left
        out = candidate
    return out, 0


def _span(entry: str) -> int:
    match = _ENTRY.fullmatch(entry)
    assert match is not None  # written by encode
    first, last = int(match[1]), int(match[2] or match[1])
    return last - first + 1


def decode(base: int, text: str | None) -> dict[int, int]:
    """The counts in ``text``, metadata committed with offset ``base``: {} for metadata this
    module did not write (absent, another format) or that does not parse: a partition's
    metadata never stops its consumption."""
    if not text or not text.startswith(PREFIX):
        return {}
    body = text[len(PREFIX) :]
    if not body:
        return {}
    counts: dict[int, int] = {}
    for entry in body.split(","):
        match = _ENTRY.fullmatch(entry)
        if match is None:
            return {}
        first, last = int(match[1]), int(match[2] or match[1])
        count = int(match[3] or 1)
        if last < first or count < 1 or len(counts) + last - first >= MAX_DECODED_OFFSETS:
            return {}
        for offset in range(base + first, base + last + 1):
            counts[offset] = count
    return counts
