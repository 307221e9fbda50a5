"""The offset metadata of the timer partitions: which records above a partition's committed
offset were delivered already (out of order, from the final window; see
:mod:`bridge.coordinator.delay.fetch`). Written in the offset commit of the Kafka transaction that
delivers them, read when a partition is read again from its committed offset.
"""

from __future__ import annotations

from typing import Final

from bridge.errors import WireFormatError

METADATA_MAX_CHARS: Final = 3500
"""The longest offset metadata written, characters (the broker refuses more than its
``offset.metadata.max.bytes``, 4096 by default)."""
_METADATA_VERSION: Final = "w1"


def encode_done(base: int, high: int, undone: list[int]) -> str | None:
    """The offset metadata of a partition committed at ``base`` whose records below ``high``
    are all done but ``undone`` (sorted, each above ``base``): ``w1:<high - base>:<u - base>,...``
    (decimal). None when nothing above ``base`` is done."""
    if high <= base + 1 and not undone:
        return None
    return f"{_METADATA_VERSION}:{high - base}:" + ",".join(str(u - base) for u in undone)


def decode_done(base: int, metadata: str | None) -> tuple[int, set[int]]:
    """(high, the offsets not done) from the offset metadata of a partition committed at
    ``base`` (see :func:`encode_done`): records at ``base`` or above and below ``high`` that
    are not named are done. (0, empty) for no metadata or metadata not written here."""
    if not metadata or not metadata.startswith(_METADATA_VERSION + ":"):
        return 0, set()
    try:
        _, span, listed = metadata.split(":", 2)
        undone = {base + int(u) for u in listed.split(",") if u}
        high = base + int(span)
    except ValueError:
        raise WireFormatError(f"offset metadata {metadata[:80]!r} is malformed") from None
    if high <= base or any(not base < u < high for u in undone):
        raise WireFormatError(f"offset metadata {metadata[:80]!r} is out of range")
    return high, undone | {base}
