"""Recall of a timer message before its time (RocketMQ 5.3's ``recall_message``): the recall
handle a send returns, the recall marker, and the one rule that says whether a marker keeps
its message from being delivered. Pure functions; the client's side is
:mod:`bridge.client.recall`, the coordinator's :mod:`bridge.coordinator.delay.recall_watch`.

The rule (:func:`recall_applies`): a marker applies iff the broker stored it (its
``LogAppendTime``, ``A``) more than :data:`RECALL_MARGIN_MS` before its message's time
(``A < due - RECALL_MARGIN_MS``). The client evaluates it on the timestamp of its own write's
acknowledgement and says *recalled* or raises :class:`~bridge.errors.RecallTooLateError`; the
coordinator evaluates it on the same timestamp when it reads the marker. Both read the same
two numbers, so they always agree.

What makes the coordinator's side exact: before the final delivery of timers due up to
``D``, it writes a tick to the recall topic (one partition) and reads the topic up to that
tick, once the tick's append time is at least ``D - RECALL_MARGIN_MS``. A marker with
``A < D - RECALL_MARGIN_MS`` was stored before the tick (the broker stamps a partition's
records in the order it stores them), so it was read before any of those messages is
delivered. Assumed: the broker's append times in that partition do not go back (one leader's
clock; a leader change to a broker whose clock is behind by more than the margin could break
it, as it would delay-level timing too).
"""

from __future__ import annotations

import base64
import binascii
import secrets
import struct
from dataclasses import dataclass
from typing import Final

from bridge.errors import InvalidArgumentError

__all__ = [
    "MARKER_DUE_HEADER",
    "MARKER_KIND_HEADER",
    "RECALL_HANDLE_VERSION",
    "RECALL_MARGIN_MS",
    "TICK_KEY",
    "RecallHandle",
    "decode_handle",
    "encode_handle",
    "marker_headers",
    "marker_key",
    "read_marker",
    "recall_applies",
    "tick_headers",
]

RECALL_MARGIN_MS: Final = 1000
"""A recall marker applies only when the broker stored it at least this long before its
message's time, ms. It is the client's and the coordinator's shared rule, so it is a constant
of the release rather than a setting (two processes with different values would disagree).
Larger: a recall close to the time is refused sooner; smaller: the coordinator waits for the
broker's clock nearer to the time before a delivery (a tick covers the messages due up to its
time plus this)."""
RECALL_HANDLE_VERSION: Final = 1
"""The first byte of a handle's decoded bytes: its layout."""
MARKER_KIND_HEADER: Final = "BRIDGE_RECALL"
"""Header of every record of the recall topic: ``marker`` or ``tick``."""
MARKER_DUE_HEADER: Final = "BRIDGE_RECALL_DUE_MS"
"""Header of a marker: its message's time (``TIMER_DELIVER_MS``), epoch ms."""
MARKER_TOPIC_HEADER: Final = "BRIDGE_RECALL_TOPIC"
"""Header of a marker: its message's topic, as the producer named it."""
TICK_KEY: Final = b"\x00tick"
"""The key of every coordinator's tick. The recall topic is ``compact,delete``: compaction
keeps the last tick only (one key), so a restarted coordinator reads the markers of the
retention and the ticks of the active segment rather than every tick of the retention. No
marker has this key (:func:`marker_key` ends each with a NUL and 16 hex digits)."""
_MARKER: Final = b"marker"
_TICK: Final = b"tick"
_FIELD_MAX: Final = 0xFFFF
_SUFFIX_LENGTH: Final = 17
_HEX: Final = frozenset(b"0123456789abcdef")
_DUE: Final = struct.Struct(">q")
_LENGTH: Final = struct.Struct(">H")


@dataclass(frozen=True, slots=True)
class RecallHandle:
    """What a recall handle says: the message's ``namespace``, ``topic`` (as the producer
    named it), ``message_id`` and time ``due_ms`` (epoch ms)."""

    namespace: str
    topic: str
    message_id: str
    due_ms: int


def encode_handle(handle: RecallHandle) -> str:
    """``handle`` as an opaque string: URL-safe base64 (no padding) of the version byte, the
    namespace, topic and message id (each a 2-byte big-endian length and UTF-8) and the time
    (8-byte big-endian signed ms)."""
    out = bytearray([RECALL_HANDLE_VERSION])
    for text in (handle.namespace, handle.topic, handle.message_id):
        raw = text.encode("utf-8")
        if len(raw) > _FIELD_MAX:
            raise InvalidArgumentError(f"recall handle field longer than {_FIELD_MAX} bytes")
        out += _LENGTH.pack(len(raw)) + raw
    out += _DUE.pack(handle.due_ms)
    return base64.urlsafe_b64encode(bytes(out)).rstrip(b"=").decode("ascii")


def decode_handle(handle: object) -> RecallHandle:
    """The :class:`RecallHandle` ``handle`` encodes; :class:`InvalidArgumentError` naming the
    problem for anything else (not a string, not base64, another version, truncated or
    trailing bytes, text that is not UTF-8, an empty field)."""
    if not isinstance(handle, str):
        raise InvalidArgumentError(f"a recall handle must be a string, got {type(handle).__name__}")
    if not handle:
        raise InvalidArgumentError("the recall handle is empty")
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(
            f"not a recall handle (not URL-safe base64): {handle[:64]!r}"
        ) from None
    if not raw or raw[0] != RECALL_HANDLE_VERSION:
        version = raw[0] if raw else None
        raise InvalidArgumentError(
            f"not a recall handle of this release (layout version {version}, expected "
            f"{RECALL_HANDLE_VERSION}): {handle[:64]!r}"
        )
    at = 1
    fields: list[str] = []
    for name in ("namespace", "topic", "message id"):
        if at + _LENGTH.size > len(raw):
            raise InvalidArgumentError(f"recall handle truncated before its {name}")
        (length,) = _LENGTH.unpack_from(raw, at)
        at += _LENGTH.size
        if length == 0 or at + length > len(raw):
            raise InvalidArgumentError(f"recall handle has an empty or truncated {name}")
        try:
            fields.append(raw[at : at + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidArgumentError(f"recall handle's {name} is not UTF-8") from None
        at += length
    if at + _DUE.size != len(raw):
        raise InvalidArgumentError(
            "recall handle truncated in its time"
            if at + _DUE.size > len(raw)
            else "recall handle has bytes after its time"
        )
    (due_ms,) = _DUE.unpack_from(raw, at)
    return RecallHandle(fields[0], fields[1], fields[2], due_ms)


def recall_applies(append_ms: int, due_ms: int) -> bool:
    """Whether a recall marker the broker stored at ``append_ms`` keeps the message due at
    ``due_ms`` from being delivered (both epoch ms): ``append_ms < due_ms -``
    :data:`RECALL_MARGIN_MS`."""
    return append_ms < due_ms - RECALL_MARGIN_MS


def marker_headers(handle: RecallHandle) -> list[tuple[str, bytes | None]]:
    """The headers of the recall marker of ``handle`` (its key: :func:`marker_key`)."""
    return [
        (MARKER_KIND_HEADER, _MARKER),
        (MARKER_DUE_HEADER, str(handle.due_ms).encode("ascii")),
        (MARKER_TOPIC_HEADER, handle.topic.encode("utf-8")),
    ]


def marker_key(message_id: str) -> bytes:
    """The key of a new recall marker of ``message_id``: the id, NUL and 16 random hex
    digits. Unique per marker, so compaction never drops one (a second recall of a message,
    stored too late, would otherwise replace the first, which applied)."""
    return message_id.encode("utf-8") + b"\x00" + secrets.token_hex(8).encode("ascii")


def tick_headers() -> list[tuple[str, bytes | None]]:
    """The headers of a coordinator's tick (key :data:`TICK_KEY`, no value)."""
    return [(MARKER_KIND_HEADER, _TICK)]


def read_marker(
    key: bytes | None, headers: list[tuple[str, bytes | None]] | None
) -> tuple[str, int] | None:
    """(message id, due ms) of a recall-topic record that is a well-formed marker; None for
    a tick and for anything else (a record another client wrote is ignored, never
    applied)."""
    if not key or not headers:
        return None
    kind = due = None
    for name, value in headers:
        if name == MARKER_KIND_HEADER:
            kind = value
        elif name == MARKER_DUE_HEADER:
            due = value
    if kind != _MARKER or due is None:
        return None
    # marker_key's suffix (NUL, 16 hex digits) taken off; a key without it is the id itself.
    suffix = key[-_SUFFIX_LENGTH:]
    is_suffix = suffix[:1] == b"\x00" and all(c in _HEX for c in suffix[1:])
    message_id = key[:-_SUFFIX_LENGTH] if len(suffix) == _SUFFIX_LENGTH and is_suffix else key
    if not message_id:
        return None
    try:
        return message_id.decode("utf-8"), int(due)
    except (UnicodeDecodeError, ValueError):
        return None
