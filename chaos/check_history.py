"""The checker's one pass over a history: each ``send`` as an :class:`Op` with its acks and
decisions, reader copies per log position (:class:`Reads`), listener calls, DLQ and
QUARANTINE observations, fault windows, the start config, the drain marker, the Spark event
and the applications' databases, all in a :class:`Run`; and :class:`Windows`, which nemesis
names cover a time.

Shared by every check (:mod:`chaos.check_copies`, :mod:`chaos.check_consumers`,
:mod:`chaos.check_spark`); :mod:`chaos.checker` states the rules.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.errors import InvalidArgumentError
from chaos.check_report import NONE_ROW, Window
from chaos.history import KINDS, NEMESES

COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
CONFLICT: Final = "CONFLICT"
_GAVE_UP_WORDS: Final = ("gave up", "give up", "timeout", "timed out", "incomplete")


class HistoryFormatError(InvalidArgumentError):
    """An event the checker cannot read: a field it needs is missing or has the wrong type,
    a kind it does not know, an id sent twice."""


def describe(event: Mapping[str, Any]) -> str:
    """``event`` as text for an error message, at most 200 characters."""
    text = repr(dict(event))
    return text if len(text) <= 200 else text[:197] + "..."


def _req_id(event: Mapping[str, Any]) -> str:
    value = event.get("id")
    if type(value) is str:  # the common case first: ~10^6 calls in a long run
        return value
    if value is None or isinstance(value, bool | dict | list):
        raise HistoryFormatError(f"a {event.get('type')} event needs an 'id': {describe(event)}")
    return str(value)


def number(event: Mapping[str, Any], key: str) -> float | None:
    """The number at ``key`` as a float; None when absent; anything else is refused."""
    value = event.get(key)
    if type(value) is float or type(value) is int:
        return float(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HistoryFormatError(f"'{key}' must be a number: {describe(event)}")
    return float(value)


def _opt_int(event: Mapping[str, Any], key: str) -> int | None:
    value = number(event, key)
    return None if value is None else int(value)


def _opt_str(event: Mapping[str, Any], key: str) -> str | None:
    value = event.get(key)
    return None if value is None else str(value)


class Op:
    """One ``send`` and what the history says about it."""

    __slots__ = (
        "ack_ok",
        "ack_t",
        "acked_seen",
        "decided",
        "delay_ms",
        "expect",
        "fail_times",
        "first_t",
        "group",
        "id",
        "indeterminate",
        "intent",
        "key",
        "kind",
        "seq",
        "t",
        "topic",
    )

    def __init__(self, event: Mapping[str, Any], op_id: str) -> None:
        kind = event.get("kind")
        if kind not in KINDS:
            raise HistoryFormatError(f"send of {op_id}: unknown kind {kind!r}, not one of {KINDS}")
        t = number(event, "t")
        assert t is not None  # read_history guarantees 't'
        self.id = op_id
        self.kind: str = kind
        self.t = t
        self.topic = _opt_str(event, "topic")
        self.key = _opt_str(event, "key")
        self.seq = _opt_int(event, "seq")
        self.delay_ms = number(event, "delay_ms")
        if self.delay_ms is None and kind in ("delay", "timer"):
            raise HistoryFormatError(f"a {kind} send needs 'delay_ms': {describe(event)}")
        self.intent = _opt_str(event, "intent")
        self.fail_times = _opt_int(event, "fail_times")
        self.group = _opt_str(event, "group")
        self.expect = _opt_str(event, "expect")
        self.acked_seen = False
        self.ack_ok = False
        self.indeterminate = False
        self.ack_t: float | None = None
        self.decided: str | None = None
        """The last COMMIT or ROLLBACK, or CONFLICT when both were answered."""
        self.first_t: dict[str, float] = {}
        """First ``decide`` time per status."""

    @property
    def acknowledged(self) -> bool:
        return self.ack_ok and not self.indeterminate

    def outcome(self, event: Mapping[str, Any], t: float) -> None:
        """Apply an ``ack`` (the last one counts) or a ``decide`` at ``t``."""
        if event.get("type") == "ack":
            self.acked_seen = True
            self.ack_ok = event.get("ok") is True
            self.indeterminate = event.get("indeterminate") is True
            self.ack_t = t
            return
        status = str(event.get("status"))
        if status in (COMMIT, ROLLBACK):
            self.first_t.setdefault(status, t)
            both = COMMIT in self.first_t and ROLLBACK in self.first_t
            self.decided = CONFLICT if both else status


class Reads:
    """A reader's observations of one id: the first ``t`` per log position."""

    __slots__ = ("first_t", "positions", "topics")

    def __init__(self) -> None:
        self.positions: dict[tuple[Any, ...], float] = {}
        self.first_t = math.inf
        self.topics: set[str] = set()

    def add(self, t: float, position: tuple[Any, ...], topic: str | None) -> None:
        if position not in self.positions:
            self.positions[position] = t
        self.first_t = min(self.first_t, t)
        if topic is not None:
            self.topics.add(topic)

    @property
    def copies(self) -> int:
        return len(self.positions)


@dataclass(frozen=True, slots=True)
class Database:
    """A ``database`` event: the ids of the order rows, and the effect rows per id."""

    orders: frozenset[str]
    effects: Mapping[str, int]

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> Database:
        orders, effects = event.get("orders"), event.get("effects")
        if not isinstance(orders, list) or not isinstance(effects, dict):
            raise HistoryFormatError(
                f"a database event needs 'orders' (a list) and 'effects' (an object): "
                f"{describe(event)}"
            )
        counts: dict[str, int] = {}
        for key, value in effects.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise HistoryFormatError(
                    f"database effects of {key!r} must be a count: {describe(event)}"
                )
            counts[str(key)] = value
        return cls(frozenset(str(o) for o in orders), counts)


Call = tuple[float, str, int | None, str]
"""A listener call: ``t``, observer, ``reconsume_times``, result."""


@dataclass
class Run:
    """Everything one pass over the events collects."""

    ops: dict[str, Op] = field(default_factory=dict)
    reads: dict[str, Reads] = field(default_factory=dict)
    calls: dict[str, list[Call]] = field(default_factory=dict)
    first_success: list[str] = field(default_factory=list)
    """Ids in the order of their first successful listener call."""
    dlq: dict[str, float] = field(default_factory=dict)
    quarantine: dict[str, float] = field(default_factory=dict)
    parked: dict[str, float] = field(default_factory=dict)
    """Id -> when a reader of the check-max topic first saw it parked there."""
    windows: list[Window] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    spark: Mapping[str, Any] | None = None
    database: Database | None = None
    """What the ``db`` kind's applications committed (the last ``database`` event)."""
    drained_t: float | None = None
    drained_complete: bool = False
    end_t: float = -math.inf
    unmatched: int = 0


def _drain_complete(event: Mapping[str, Any]) -> bool:
    if event.get("gave_up") is True or event.get("complete") is False:
        return False
    detail = str(event.get("detail") or "").lower()
    return not any(word in detail for word in _GAVE_UP_WORDS)


def collect(events: Iterable[Mapping[str, Any]]) -> Run:
    """One pass over ``events`` in file order: every send with its acks and decisions (an
    ack or decide written before its send waits for it), every observation, fault window, the
    start config, the drain marker and the last Spark event."""
    run = Run()
    open_faults: dict[tuple[str, str], list[float]] = {}
    seen_success: set[str] = set()
    before_send: dict[str, list[Mapping[str, Any]]] = {}
    ops = run.ops
    for event in events:
        etype = event.get("type")
        t = number(event, "t")
        if t is None:
            raise HistoryFormatError(f"an event needs 't': {describe(event)}")
        run.end_t = max(t, run.end_t)
        if etype == "recv":
            op_id = _req_id(event)
            role = event.get("role")
            if role == "reader":
                reads = run.reads.get(op_id)
                if reads is None:
                    reads = run.reads[op_id] = Reads()
                offset = event.get("offset")
                topic = _opt_str(event, "topic")
                position: tuple[Any, ...] = (
                    (topic, event.get("partition"), offset)
                    if offset is not None
                    else ("#", len(reads.positions))
                )
                reads.add(t, position, topic)
            elif role == "listener":
                result = str(event.get("result"))
                call = (t, str(event.get("observer")), _opt_int(event, "reconsume_times"), result)
                run.calls.setdefault(op_id, []).append(call)
                if result == "success" and op_id not in seen_success:
                    seen_success.add(op_id)
                    run.first_success.append(op_id)
            elif role == "dlq_reader":
                run.dlq.setdefault(op_id, t)
            elif role == "quarantine_reader":
                run.quarantine.setdefault(op_id, t)
            elif role == "parked_reader":
                run.parked.setdefault(op_id, t)
            else:
                raise HistoryFormatError(f"recv with unknown role {role!r}: {describe(event)}")
        elif etype == "send":
            op_id = _req_id(event)
            if op_id in ops:
                raise HistoryFormatError(f"id {op_id} is sent twice: {describe(event)}")
            sent = ops[op_id] = Op(event, op_id)
            for early in before_send.pop(op_id, ()):
                sent.outcome(early, float(early["t"]))
        elif etype in ("ack", "decide"):
            op_id = _req_id(event)
            op = ops.get(op_id)
            if op is None:  # written before its send: applied when the send comes
                before_send.setdefault(op_id, []).append(event)
            else:
                op.outcome(event, t)
        elif etype == "nemesis":
            name = str(event.get("name"))
            key = (name, str(event.get("target")))
            if event.get("phase") == "start":
                open_faults.setdefault(key, []).append(t)
            elif event.get("phase") == "end" and open_faults.get(key):
                start = open_faults[key].pop(0)
                run.windows.append(Window(name, key[1], start, t, True))
        elif etype == "spark":
            run.spark = event
        elif etype == "database":
            run.database = Database.of(event)
        elif etype == "phase":
            marker = event.get("name")
            if marker == "start" and isinstance(event.get("config"), dict):
                run.config = dict(event["config"])
            elif marker == "drained":
                run.drained_t = t
                run.drained_complete = _drain_complete(event)
    for (name, target), starts in open_faults.items():
        run.windows += [Window(name, target, s, run.end_t, False) for s in starts]
    run.windows.sort(key=lambda w: (w.start_ms, w.name))
    return run


# --- windows --------------------------------------------------------------------------------


class Windows:
    """Which nemesis names cover a time: per name, the union of ``[start, end + grace]``."""

    def __init__(self, windows: Sequence[Window], grace_ms: float) -> None:
        self._faults = sorted((w.start_ms, w.end_ms, w.end_ms + grace_ms) for w in windows)
        spans: dict[str, list[tuple[float, float]]] = {}
        for w in windows:
            spans.setdefault(w.name, []).append((w.start_ms, w.end_ms + grace_ms))
        known = [n for n in NEMESES if n in spans]
        self.names: list[str] = known + sorted(n for n in spans if n not in NEMESES)
        self._starts: dict[str, list[float]] = {}
        self._ends: dict[str, list[float]] = {}
        for name in self.names:
            merged: list[tuple[float, float]] = []
            for start, end in sorted(spans[name]):
                if merged and start <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], end))
                else:
                    merged.append((start, end))
            self._starts[name] = [s for s, _ in merged]
            self._ends[name] = [e for _, e in merged]

    def longest_fault_between(self, since: float, until: float) -> float:
        """The length (ms) of the longest fault that struck while something waited from
        ``since`` to ``until`` (one starting by ``until`` whose window, end + grace, reaches
        ``since``); 0 when none did."""
        longest = 0.0
        for start, end, window_end in self._faults:
            if start > until:
                break
            if window_end >= since:
                longest = max(longest, end - start)
        return longest

    def at(self, t: float) -> tuple[str, ...]:
        """The names whose faults cover ``t``, or ``("none",)``."""
        hit: list[str] = []
        for name in self.names:
            i = bisect.bisect_right(self._starts[name], t) - 1
            if i >= 0 and t <= self._ends[name][i]:
                hit.append(name)
        return tuple(hit) or (NONE_ROW,)
