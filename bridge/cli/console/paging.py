"""Pages through a partitioned topic, apart from Kafka: a cursor (the next offset of each
partition) as it travels in a URL, the filter of dead letters the console and ``bridge dlq
replay`` share, and the rendering of a body as text or hex."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.consumer.admin import _chosen as replay_chooses
from bridge.message import MessageExt

DEFAULT_PAGE_SIZE: Final = 50
"""Letters a page shows unless the URL asks for another count."""

MAX_PAGE_SIZE: Final = 500
"""The most letters one page holds: the bound on what a page keeps in memory."""

SCAN_BUDGET: Final = 20_000
"""Records a filtered page reads at most looking for matches before it returns what it has
(with a cursor to read on): a page never scans a whole large DLQ for a rare match."""

HEX_PREVIEW_BYTES: Final = 64 * 1024
"""The most bytes of a body the body view renders, bytes."""


class CursorError(ValueError):
    """A cursor from a URL that is not ``partition:offset`` pairs."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where the next page starts: the next offset of each partition (a partition not named
    starts at its first retained record)."""

    positions: Mapping[int, int] = field(default_factory=dict)

    def encode(self) -> str:
        """``p:o,p:o``, partitions ascending; empty for the first page."""
        return ",".join(f"{p}:{o}" for p, o in sorted(self.positions.items()))

    @classmethod
    def decode(cls, text: str | None) -> Cursor:
        """The cursor :meth:`encode` wrote; :class:`CursorError` for anything else."""
        if not text:
            return cls({})
        positions: dict[int, int] = {}
        for part in text.split(","):
            p, sep, o = part.partition(":")
            partition, offset = number(p), number(o)
            if not sep or partition is None or offset is None or partition in positions:
                raise CursorError(f"not a cursor: {text!r}")
            positions[partition] = offset
        return cls(positions)

    def start(self, partition: int, low: int) -> int:
        """The offset to read ``partition`` from: the cursor's, never below ``low``."""
        return max(self.positions.get(partition, low), low)


MAX_NUMBER: Final = 2**63 - 1
"""The largest number a URL or form may give (a partition, an offset): Kafka's offsets are
64-bit, and Python refuses to convert a text of more than 4,300 digits at all."""


def number(text: str | None) -> int | None:
    """``text`` as a number when it is plain ASCII digits (not "²", which ``isdigit()``
    accepts) naming at most :data:`MAX_NUMBER`; else None."""
    if not text or len(text) > len(str(MAX_NUMBER)) or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= MAX_NUMBER else None


def page_size(text: str | None) -> int:
    """The page size a URL asks for, within 1 and :data:`MAX_PAGE_SIZE`
    (:data:`DEFAULT_PAGE_SIZE` when it asks for none or for something that is no number)."""
    try:
        size = int(text) if text else DEFAULT_PAGE_SIZE
    except ValueError:
        return DEFAULT_PAGE_SIZE
    return min(max(size, 1), MAX_PAGE_SIZE)


def _terms(text: str | None) -> tuple[str, ...]:
    """Terms of a filter field: separated by commas or white space, empty ones left out."""
    return tuple(t for t in (text or "").replace(",", " ").split() if t)


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """The dead letters a page or a replay chooses: one of ``keys``, one of ``tags`` and one
    of ``msg_ids`` (its id or its origin message id) for each given, as ``bridge dlq replay
    --key --tag --id`` chooses them."""

    keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    msg_ids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, keys: str | None, tags: str | None, msg_ids: str | None) -> LetterFilter:
        """A filter from form fields, each a list separated by commas or spaces."""
        return cls(_terms(keys), _terms(tags), _terms(msg_ids))

    @property
    def empty(self) -> bool:
        return not (self.keys or self.tags or self.msg_ids)

    def matches(self, msg: MessageExt) -> bool:
        return replay_chooses(msg, self.keys, self.tags, self.msg_ids)

    def query(self) -> dict[str, Any]:
        """The filter as URL query fields (none for an empty one)."""
        out: dict[str, Any] = {"keys": " ".join(self.keys), "tags": " ".join(self.tags)}
        out["ids"] = " ".join(self.msg_ids)
        return {k: v for k, v in out.items() if v}


def parse_refs(values: Collection[str]) -> list[tuple[int, int]]:
    """``partition@offset`` references of selected letters, in order, each once;
    :class:`CursorError` for one that is not."""
    out: list[tuple[int, int]] = []
    for value in values:
        p, sep, o = value.partition("@")
        partition, offset = number(p), number(o)
        if not sep or partition is None or offset is None:
            raise CursorError(f"not a letter reference: {value!r}")
        ref = (partition, offset)
        if ref not in out:
            out.append(ref)
    return out


def body_text(body: bytes) -> tuple[str, bool]:
    """A body as text, and whether it was valid UTF-8 (else undecodable bytes are replaced)."""
    try:
        return body.decode("utf-8"), True
    except UnicodeDecodeError:
        return body.decode("utf-8", errors="replace"), False


def hex_dump(body: bytes, width: int = 16) -> str:
    """``body`` (its first :data:`HEX_PREVIEW_BYTES`) as lines of offset, hex and ASCII."""
    lines = []
    shown = body[:HEX_PREVIEW_BYTES]
    for start in range(0, len(shown), width):
        chunk = shown[start : start + width]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hexes:<{width * 3 - 1}}  {text}")
    if len(body) > len(shown):
        lines.append(f"... {len(body) - len(shown)} more bytes")
    return "\n".join(lines)
