"""The checker: decides from a whole history (:mod:`chaos.history`) whether a guarantee broke,
and tabulates what happened per nemesis.

It judges exactly what the README and ``docs/guarantees.md`` promise, one rule per kind of
operation (the ``kind`` of its ``send``). "Acknowledged" means the last ``ack`` of the send
says ``ok`` and not ``indeterminate``; a send without any ``ack`` is indeterminate.

Copies on a topic
    A reader observation is one position (``topic``, ``partition``, ``offset``) of the Kafka
    log: a reader that restarts and reads the same record again does not make a second copy, a
    second record with the same id does. An observation without a position counts as a copy of
    its own. A reader observation on a topic other than the one the message was sent to is
    ``wrong_topic``.

``tx`` (G1, G2, G3, G4)
    The final decision is the last ``decide`` whose status is COMMIT or ROLLBACK (an UNKNOWN
    after a decision changes nothing; both COMMIT and ROLLBACK recorded: either may apply, so
    at most one copy and nothing else is asked). Acknowledged and committed: exactly one copy
    (none: lost or stuck; more: ``duplicated``). Committed, acknowledged or not: no copy read
    before the first COMMIT answer (``early``: the workload records an answer in its
    listener, before the END record that answer leads to). Not acknowledged (failed or
    indeterminate) and committed: at most one copy, never lost. Rolled back: no copy at all
    (``visible_rollback``). No decision at all: no copy (``visible_undecided``), and an
    acknowledged one whose listener meant to answer on check-back (``unknown_then_*``) and
    was never checked while the run had at least ``transaction_timeout_ms +
    check_interval_ms + session_timeout_ms + kafka_transaction_timeout_ms`` + grace after its
    send to do so (up to the ``drained`` marker, else the history's end; defaults 6 s, 30 s,
    10 s, 10 s) is ``unchecked``. Its time is the first decision with the final status (the
    send's when there is none); commit-to-visible latency is the first copy's ``t`` minus
    that time.

``delay`` / ``timer`` (G2, G3, G5)
    Due at ``send.t + delay_ms`` (a lower bound of the true due time: the send's ``t`` is taken
    before the call). Acknowledged: exactly one copy; any reader observation before due is
    ``early`` (no slack: a reader sees a record only after it was delivered). Lateness is the
    first copy's ``t`` minus due, in ms. Not acknowledged: at most one copy.

``consume`` (G6; a concurrent push consumer, CLUSTERING)
    An acknowledged message must end in a listener call with result ``success``, in the DLQ (a
    ``dlq_reader`` observation) or in the QUARANTINE topic (a copy refused for good); none of
    them: lost or stuck. More than one success is a redelivery (column ``redelivered``, not a
    violation: consumers are at least once). In the DLQ and also consumed successfully is
    ``dlq_and_success``, unless a success came with ``reconsume_times`` above the group's
    ``max_reconsume_times`` (only a DLQ copy whose write failed is consumed again locally at
    that count, and such a write may have landed). In the DLQ although no call with
    ``reconsume_times`` at or above that maximum failed is ``premature_dlq``. With one message
    per listener call (``consume_message_batch_max_size`` 1, the default), a call at
    ``reconsume_times`` n > 0 without any call at n - 1 is ``reconsume_skipped``; values that
    repeat or go back are redeliveries and allowed. Whether a message whose ``fail_times``
    exceeds the maximum ends in the DLQ is not judged beyond this: a DLQ copy that cannot be
    written is consumed again, and the listener may then succeed (README).

``orderly`` (G6)
    As ``consume``, with ``max_reconsume_times`` unlimited unless the start config names one
    for the group. Per (``topic``, ``key``), the first successful consumptions of acknowledged
    messages that did not end in the DLQ or QUARANTINE, in file order, have increasing ``seq``:
    one consumed after a message of a later ``seq`` is ``reordered`` (one violation for the
    late one). A message never consumed at all is lost or stuck, not reordered.

``broadcast``
    Every acknowledged message reaches every broadcasting observer at least once: any listener
    call counts, since a failure is the explicit drop of BROADCASTING. The observers are those
    named in the start config's ``broadcast_observers`` (a list, or a map from name to the
    epoch ms from which it receives), else every observer that made a listener call for a
    ``broadcast`` message, receiving from the start. Missing at some observer: lost or stuck
    (one violation per message). Several successes at one observer: redelivered.

``poison`` (G8, G9)
    Never lost or stuck; counted only in their own row ``poison-records`` (not in ``all``).
    A send with ``expect: "quarantine"`` must end in a ``quarantine_reader`` observation
    (``not_quarantined``), judged only when the run drained completely: the README's rules
    depend on what is wrong with the record, which only the workload knows.

``spark`` (G7)
    The row ``spark``, when the history has a ``spark`` event (the last one counts): every
    acknowledged committed ``tx`` id, and every acknowledged ``delay``/``timer`` id whose topic
    the event's ``topics`` names (all of them when ``topics`` is empty), that a reader had seen
    before the ingest started (``start_t`` of the event, else the ``drained`` marker when
    earlier than the event, else the event's ``t``) appears exactly once among its ``ids``
    (``spark_missing``, ``spark_duplicated``); any other committed or delayed id at most once;
    a rolled-back id never (``spark_visible_rollback``). Ids of other kinds are ignored.
    These findings count in the rows ``spark`` and ``all`` only.

Lost, stuck, pending
    An expected observation that never came is *lost* when the ``drained`` phase event says the
    readers waited for everything (no ``gave_up``/``complete: false`` field, and no "gave up",
    "timeout" or "timed out" in its ``detail``), and *stuck* when the drain gave up or the
    history has no ``drained`` event (the run was cut short). Both are violations. One that was
    not due yet when the history ends (a delay due later, a consumer retry whose back-off had
    not run out) is *pending*: counted in :attr:`Report.pending`, not a violation.

Max stall
    Per row, the longest time (s) any expected observation waited past its due time, or until
    the history's end when it never came: ``tx``, from the decision; ``delay``/``timer``,
    from due; ``consume``/``orderly``/``broadcast``, the first listener call from the ack, each
    retry from the failed call plus its back-off (delay level ``3 + reconsume_times``, or the
    orderly suspension), and the DLQ copy from the last failed call.

Stall budget
    An observation that came, but later than the README's bound, is ``stalled`` (counted in
    ``stuck``). A fault may delay a message by its own length (the longest fault that struck
    while the message waited, from its due time, grace included), plus
    ``session_timeout_ms`` (a dead coordinator's partitions move), plus
    ``kafka_transaction_timeout_ms`` and the broker's ``transaction_abort_interval_ms``
    (Kafka's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by
    default: what a dead coordinator left open is aborted by then), plus
    :data:`STALL_MARGIN_MS` for rebalances and retries; ``stall_budget_ms`` in the start
    config replaces the sum of the last four. With the defaults (10 s each) that is 40 s plus
    that fault's length. One never observed is lost or stuck instead.

Nemesis windows
    A fault is the time from a ``nemesis`` ``start`` to the next ``end`` with the same name
    and target (the history's end when there is none). An operation counts in the row of every
    nemesis one of whose faults satisfies ``start <= its time <= end + grace`` (its time: the
    decision for ``tx``, due for ``delay``/``timer``, the send otherwise), in ``none`` when
    there is no such fault, and in ``all``. Its violations carry the same names.

The table
    One row per nemesis that struck, then ``none``, ``poison-records``, ``spark`` and ``all``;
    columns: faults, operations, acknowledged, then violations by column (``lost`` includes
    ``spark_missing``; ``duplicated`` includes ``spark_duplicated``; ``stuck`` includes
    ``unchecked``; ``other`` counts the rest: ``visible_rollback``, ``visible_undecided``,
    ``wrong_topic``, ``dlq_and_success``, ``premature_dlq``, ``reconsume_skipped``,
    ``not_quarantined``, ``spark_visible_rollback``), ``redelivered`` (operations consumed
    successfully more than once, not a violation), max stall (s), delay/timer lateness
    p50/p99/max (ms) and commit-to-visible latency p50/p99 (ms).

Percentiles are nearest-rank: the p-th of n sorted values is the one at rank ``ceil(p n / 100)``.
"""

from __future__ import annotations

import argparse
import bisect
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bridge.errors import InvalidArgumentError
from chaos.history import KINDS, NEMESES, read_history

DEFAULT_GRACE_S: Final = 30.0
"""How long after a fault ends its effects are still attributed to it, seconds."""

DEFAULT_DELAY_LEVELS_MS: Final = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip
"""RocketMQ's ``messageDelayLevel``, ms (the start config's ``delay_levels_ms`` overrides)."""

DEFAULT_MAX_RECONSUME_TIMES: Final = 16
"""A concurrent group's failures before the DLQ when the start config names none."""

FIRST_RETRY_LEVEL: Final = 3
"""A failed message with ``reconsume_times`` n is retried through delay level 3 + n."""

NONE_ROW: Final = "none"
ALL_ROW: Final = "all"
SPARK_ROW: Final = "spark"
POISON_ROW: Final = "poison-records"

# Violation kinds, grouped by the table column that counts them.
LOST: Final = "lost"
STUCK: Final = "stuck"
DUPLICATED: Final = "duplicated"
EARLY: Final = "early"
REORDERED: Final = "reordered"
UNCHECKED: Final = "unchecked"
VISIBLE_ROLLBACK: Final = "visible_rollback"
VISIBLE_UNDECIDED: Final = "visible_undecided"
WRONG_TOPIC: Final = "wrong_topic"
DLQ_AND_SUCCESS: Final = "dlq_and_success"
PREMATURE_DLQ: Final = "premature_dlq"
RECONSUME_SKIPPED: Final = "reconsume_skipped"
NOT_QUARANTINED: Final = "not_quarantined"
SPARK_MISSING: Final = "spark_missing"
SPARK_DUPLICATED: Final = "spark_duplicated"
SPARK_VISIBLE_ROLLBACK: Final = "spark_visible_rollback"
STALLED: Final = "stalled"

COLUMN_OF_KIND: Final[Mapping[str, str]] = {
    LOST: "lost",
    SPARK_MISSING: "lost",
    DUPLICATED: "duplicated",
    SPARK_DUPLICATED: "duplicated",
    EARLY: "early",
    REORDERED: "reordered",
    STUCK: "stuck",
    UNCHECKED: "stuck",
    STALLED: "stuck",
    VISIBLE_ROLLBACK: "other",
    VISIBLE_UNDECIDED: "other",
    WRONG_TOPIC: "other",
    DLQ_AND_SUCCESS: "other",
    PREMATURE_DLQ: "other",
    RECONSUME_SKIPPED: "other",
    NOT_QUARANTINED: "other",
    SPARK_VISIBLE_ROLLBACK: "other",
}
"""The table column (a :class:`Row` field) that counts each violation kind."""

_COMMIT: Final = "COMMIT"
_ROLLBACK: Final = "ROLLBACK"
_CONFLICT: Final = "CONFLICT"
_FAILED_RESULTS: Final = frozenset({"fail", "raise"})
_GAVE_UP_WORDS: Final = ("gave up", "give up", "timeout", "timed out", "incomplete")


class HistoryFormatError(InvalidArgumentError):
    """An event the checker cannot read: a field it needs is missing or has the wrong type,
    a kind it does not know, an id sent twice."""


@dataclass(frozen=True)
class Window:
    """One fault: ``name`` (a nemesis), ``target``, from ``start_ms`` to ``end_ms`` (epoch ms;
    ``ended`` is False when the history has no ``end`` for it and ``end_ms`` is its end)."""

    name: str
    target: str
    start_ms: float
    end_ms: float
    ended: bool


@dataclass(frozen=True)
class Violation:
    """A broken rule: its ``kind`` (one of :data:`COLUMN_OF_KIND`), the workload ``id`` of the
    operation, what was wrong (``detail``), the operation's time ``t_ms`` (epoch ms, as used
    for windows) and the ``windows`` (nemesis names, or ``("none",)``) it falls in; the spark
    check's violations have ``("spark",)``."""

    kind: str
    id: str
    detail: str
    t_ms: float
    windows: tuple[str, ...]

    def line(self) -> str:
        """One line naming the id and what was wrong."""
        return f"{self.kind:<22} {self.id}  [{','.join(self.windows)}]  {self.detail}"


@dataclass
class Row:
    """The figures of one row of the table: counts of operations, stalls in s, lateness and
    latency samples in ms."""

    name: str
    faults: int = 0
    """Faults of this nemesis (every fault in ``all``)."""
    operations: int = 0
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    early: int = 0
    reordered: int = 0
    stuck: int = 0
    redelivered: int = 0
    other: int = 0
    max_stall_s: float = 0.0
    max_stall_id: str | None = None
    """The operation that waited ``max_stall_s``."""
    lateness_ms: list[float] = field(default_factory=list, repr=False)
    """First copy minus due of each acknowledged delay or timer seen (negative: early)."""
    visible_ms: list[float] = field(default_factory=list, repr=False)
    """First copy minus commit decision of each acknowledged committed transaction seen."""

    @property
    def violations(self) -> int:
        """Every violation counted in this row."""
        return self.lost + self.duplicated + self.early + self.reordered + self.stuck + self.other

    @property
    def lateness_p50_ms(self) -> float | None:
        return percentile(self.lateness_ms, 50)

    @property
    def lateness_p99_ms(self) -> float | None:
        return percentile(self.lateness_ms, 99)

    @property
    def lateness_max_ms(self) -> float | None:
        return max(self.lateness_ms) if self.lateness_ms else None

    @property
    def visible_p50_ms(self) -> float | None:
        return percentile(self.visible_ms, 50)

    @property
    def visible_p99_ms(self) -> float | None:
        return percentile(self.visible_ms, 99)

    def cells(self) -> list[str]:
        """The row as table cells, in :data:`COLUMNS` order."""
        return [
            self.name,
            "-" if self.name in (NONE_ROW, POISON_ROW, SPARK_ROW) else str(self.faults),
            str(self.operations),
            str(self.acknowledged),
            str(self.lost),
            str(self.duplicated),
            str(self.early),
            str(self.reordered),
            str(self.stuck),
            str(self.redelivered),
            str(self.other),
            f"{self.max_stall_s:.1f}",
            _ms(self.lateness_p50_ms),
            _ms(self.lateness_p99_ms),
            _ms(self.lateness_max_ms),
            _ms(self.visible_p50_ms),
            _ms(self.visible_p99_ms),
        ]


COLUMNS: Final = (
    "nemesis",
    "faults",
    "operations",
    "acknowledged",
    "lost",
    "duplicated",
    "early",
    "reordered",
    "stuck",
    "redelivered",
    "other",
    "max stall (s)",
    "late p50 (ms)",
    "late p99 (ms)",
    "late max (ms)",
    "visible p50 (ms)",
    "visible p99 (ms)",
)
"""The table's columns: ``late`` is timer/delay lateness, ``visible`` commit-to-visible."""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p * len(ordered) / 100))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Report:
    """What the checker found: a :class:`Row` per nemesis (plus ``none``, ``poison-records``,
    ``spark`` when there is something to show, and ``all``: every operation but the poison
    records, and every violation, the spark check's included), every :class:`Violation`, the
    fault :class:`Window` s, whether the run drained completely, how many expected
    observations were not due yet (``pending``), and how many ids were observed but never sent
    (``unmatched_ids``: leftovers of an earlier run, or a history cut before its sends)."""

    rows: dict[str, Row]
    violations: list[Violation]
    windows: list[Window]
    drained: bool
    pending: int = 0
    unmatched_ids: int = 0
    grace_s: float = DEFAULT_GRACE_S

    @property
    def ok(self) -> bool:
        """True iff no violation was found."""
        return not self.violations

    def row(self, name: str) -> Row:
        """The row ``name`` (a nemesis, ``none``, ``all``, ``spark``, ``poison-records``)."""
        return self.rows[name]

    def by_kind(self) -> dict[str, int]:
        """Violations per kind."""
        counts: dict[str, int] = {}
        for v in self.violations:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        return counts

    def _table_rows(self) -> list[list[str]]:
        return [row.cells() for row in self.rows.values()]

    def _summary(self) -> str:
        state = "drained" if self.drained else "not drained (missing = stuck)"
        n = len(self.violations)
        verdict = "OK" if self.ok else f"{n} violation{'' if n == 1 else 's'}"
        return (
            f"{verdict}; {state}; {self.pending} pending; "
            f"{self.unmatched_ids} unmatched ids; grace {self.grace_s:g} s"
        )

    def _stall_line(self) -> str:
        stalls = [
            f"{row.name} {row.max_stall_s:.1f} s ({row.max_stall_id})"
            for row in self.rows.values()
            if row.max_stall_id is not None
        ]
        return "longest stall: " + ("; ".join(stalls) or "none")

    def _violation_lines(self, limit: int) -> list[str]:
        if not self.violations:
            return []
        shown = self.violations[:limit]
        lines = [f"violations (first {len(shown)} of {len(self.violations)}):"]
        lines += [v.line() for v in shown]
        return lines

    def render(self, max_violations: int = 20) -> str:
        """A fixed-width table, a summary line, then the first ``max_violations`` violations,
        one a line."""
        table = [list(COLUMNS), *self._table_rows()]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]

        def fmt(cells: list[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
            return "  ".join([first, *rest])

        lines = [fmt(table[0]), "  ".join("-" * w for w in widths)]
        lines += [fmt(r) for r in table[1:]]
        lines.append(self._summary())
        lines.append(self._stall_line())
        lines += self._violation_lines(max_violations)
        return "\n".join(lines) + "\n"

    def render_markdown(self, max_violations: int = 20) -> str:
        """The same as a Markdown table (for the README), the summary, and the first
        ``max_violations`` violations as a list."""
        lines = ["| " + " | ".join(COLUMNS) + " |"]
        lines.append("| --- | " + " | ".join("---:" for _ in COLUMNS[1:]) + " |")
        lines += ["| " + " | ".join(r) + " |" for r in self._table_rows()]
        lines += ["", self._summary(), "", self._stall_line()]
        if self.violations:
            shown = self.violations[:max_violations]
            lines += ["", f"Violations (first {len(shown)} of {len(self.violations)}):", ""]
            lines += [f"- `{v.kind}` `{v.id}` [{', '.join(v.windows)}]: {v.detail}" for v in shown]
        return "\n".join(lines) + "\n"


# --- reading events ------------------------------------------------------------------------


def _describe(event: Mapping[str, Any]) -> str:
    text = repr(dict(event))
    return text if len(text) <= 200 else text[:197] + "..."


def _req_id(event: Mapping[str, Any]) -> str:
    value = event.get("id")
    if type(value) is str:  # the common case first: ~10^6 calls in a long run
        return value
    if value is None or isinstance(value, bool | dict | list):
        raise HistoryFormatError(f"a {event.get('type')} event needs an 'id': {_describe(event)}")
    return str(value)


def _num(event: Mapping[str, Any], key: str) -> float | None:
    value = event.get(key)
    if type(value) is float or type(value) is int:
        return float(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HistoryFormatError(f"'{key}' must be a number: {_describe(event)}")
    return float(value)


def _opt_int(event: Mapping[str, Any], key: str) -> int | None:
    value = _num(event, key)
    return None if value is None else int(value)


def _opt_str(event: Mapping[str, Any], key: str) -> str | None:
    value = event.get(key)
    return None if value is None else str(value)


class _Op:
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
        t = _num(event, "t")
        assert t is not None  # read_history guarantees 't'
        self.id = op_id
        self.kind: str = kind
        self.t = t
        self.topic = _opt_str(event, "topic")
        self.key = _opt_str(event, "key")
        self.seq = _opt_int(event, "seq")
        self.delay_ms = _num(event, "delay_ms")
        if self.delay_ms is None and kind in ("delay", "timer"):
            raise HistoryFormatError(f"a {kind} send needs 'delay_ms': {_describe(event)}")
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
        if status in (_COMMIT, _ROLLBACK):
            self.first_t.setdefault(status, t)
            both = _COMMIT in self.first_t and _ROLLBACK in self.first_t
            self.decided = _CONFLICT if both else status


class _Reads:
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


_Call = tuple[float, str, int | None, str]
"""A listener call: ``t``, observer, ``reconsume_times``, result."""


@dataclass
class _Run:
    """Everything one pass over the events collects."""

    ops: dict[str, _Op] = field(default_factory=dict)
    reads: dict[str, _Reads] = field(default_factory=dict)
    calls: dict[str, list[_Call]] = field(default_factory=dict)
    first_success: list[str] = field(default_factory=list)
    """Ids in the order of their first successful listener call."""
    dlq: dict[str, float] = field(default_factory=dict)
    quarantine: dict[str, float] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    spark: Mapping[str, Any] | None = None
    drained_t: float | None = None
    drained_complete: bool = False
    end_t: float = -math.inf
    unmatched: int = 0


def _drain_complete(event: Mapping[str, Any]) -> bool:
    if event.get("gave_up") is True or event.get("complete") is False:
        return False
    detail = str(event.get("detail") or "").lower()
    return not any(word in detail for word in _GAVE_UP_WORDS)


def _collect(events: Iterable[Mapping[str, Any]]) -> _Run:
    run = _Run()
    open_faults: dict[tuple[str, str], list[float]] = {}
    seen_success: set[str] = set()
    before_send: dict[str, list[Mapping[str, Any]]] = {}
    ops = run.ops
    for event in events:
        etype = event.get("type")
        t = _num(event, "t")
        if t is None:
            raise HistoryFormatError(f"an event needs 't': {_describe(event)}")
        run.end_t = max(t, run.end_t)
        if etype == "recv":
            op_id = _req_id(event)
            role = event.get("role")
            if role == "reader":
                reads = run.reads.get(op_id)
                if reads is None:
                    reads = run.reads[op_id] = _Reads()
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
            else:
                raise HistoryFormatError(f"recv with unknown role {role!r}: {_describe(event)}")
        elif etype == "send":
            op_id = _req_id(event)
            if op_id in ops:
                raise HistoryFormatError(f"id {op_id} is sent twice: {_describe(event)}")
            sent = ops[op_id] = _Op(event, op_id)
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


class _Windows:
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


# --- configuration --------------------------------------------------------------------------


def _config_int(
    config: Mapping[str, Any], key: str, group: str | None, *, shared: bool = True
) -> int | None:
    """``key`` for ``group``: from ``config["groups"][group]``, from ``config[key]`` when it is
    a map by group, else (``shared``) from ``config[key]`` itself."""
    groups = config.get("groups")
    value: Any = None
    if isinstance(groups, dict) and isinstance(groups.get(group), dict):
        value = groups[group].get(key)
    if value is None:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get(group)
        elif not shared:
            value = None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


STALL_MARGIN_MS: Final = 10_000.0
"""Room in the stall budget for rebalances, metadata refreshes and client retries, ms."""


class _Settings:
    """What the start config says, with the bridge's defaults."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        levels = config.get("delay_levels_ms")
        self.delay_levels_ms: tuple[float, ...] = (
            tuple(float(x) for x in levels)
            if isinstance(levels, list)
            and levels
            and all(isinstance(x, int | float) for x in levels)
            else tuple(float(x) for x in DEFAULT_DELAY_LEVELS_MS)
        )
        self.transaction_timeout_ms = float(config.get("transaction_timeout_ms") or 6_000)
        self.check_interval_ms = float(config.get("check_interval_ms") or 30_000)
        self.check_bound_ms = (
            self.transaction_timeout_ms
            + self.check_interval_ms
            + float(config.get("session_timeout_ms") or 10_000)
            + float(config.get("kafka_transaction_timeout_ms") or 10_000)
        )
        """The first check is due ``transaction_timeout_ms`` after the send, the next one
        ``check_interval_ms`` later; a crashed coordinator's partitions move after
        ``session_timeout_ms`` and its open Kafka transaction aborts after
        ``kafka_transaction_timeout_ms`` (README, G4)."""
        budget = config.get("stall_budget_ms")
        self.stall_budget_ms = (
            float(budget)
            if isinstance(budget, int | float) and not isinstance(budget, bool)
            else float(config.get("session_timeout_ms") or 10_000)
            + float(config.get("kafka_transaction_timeout_ms") or 10_000)
            + float(config.get("transaction_abort_interval_ms") or 10_000)
            + STALL_MARGIN_MS
        )
        """How long past due an observation may come before it is ``stalled``, ms, on top
        of the length of the fault it fell in."""
        self._max: dict[tuple[str | None, bool], int | None] = {}

    def max_reconsume(self, group: str | None, *, orderly: bool) -> int | None:
        """The group's ``max_reconsume_times``; None: unlimited."""
        key = (group, orderly)
        if key not in self._max:
            if orderly:
                value = _config_int(self.config, "max_reconsume_times", group, shared=False)
                limit = None if value is None or value < 0 else value
            else:
                value = _config_int(self.config, "max_reconsume_times", group)
                limit = DEFAULT_MAX_RECONSUME_TIMES if value is None or value < 0 else value
            self._max[key] = limit
        return self._max[key]

    def one_per_call(self, group: str | None) -> bool:
        size = _config_int(self.config, "consume_message_batch_max_size", group)
        return size is None or size == 1

    def suspend_ms(self, group: str | None) -> float:
        value = _config_int(self.config, "suspend_current_queue_time_millis", group)
        return float(value if value is not None and value >= 0 else 1_000)

    def retry_delay_ms(self, reconsume_times: int) -> float:
        level = min(FIRST_RETRY_LEVEL + reconsume_times, len(self.delay_levels_ms))
        return self.delay_levels_ms[max(level, 1) - 1]

    def broadcast_observers(self, seen: set[str], start_t: float) -> dict[str, float]:
        named = self.config.get("broadcast_observers")
        if isinstance(named, dict):
            return {
                str(k): float(v) if isinstance(v, int | float) else start_t
                for k, v in named.items()
            }
        if isinstance(named, list):
            return {str(k): start_t for k in named}
        return dict.fromkeys(sorted(seen), start_t)


# --- judging --------------------------------------------------------------------------------


class _Judge:
    def __init__(self, run: _Run, grace_s: float) -> None:
        self.run = run
        self.grace_ms = grace_s * 1000.0
        self.settings = _Settings(run.config)
        self.windows = _Windows(run.windows, self.grace_ms)
        self.rows: dict[str, Row] = {}
        for name in [*self.windows.names, NONE_ROW]:
            self.rows[name] = Row(name)
        for window in run.windows:
            self.rows[window.name].faults += 1
        self._row(ALL_ROW).faults = len(run.windows)
        self.violations: list[Violation] = []
        self.pending = 0
        # Set per operation while it is judged.
        self._names: tuple[str, ...] = ()
        self._rows: list[Row] = []
        self._t = 0.0
        self._id = ""
        self._stalled = ""

    # -- per-operation bookkeeping --

    def _begin(self, op: _Op, t: float, rows: Sequence[str] | None = None) -> None:
        self._id = op.id
        self._t = t
        if rows is None:
            self._names = self.windows.at(t)
            rows = [*self._names, ALL_ROW]
        else:
            self._names = tuple(rows)
        self._rows = [self._row(name) for name in rows]
        for row in self._rows:
            row.operations += 1
            if op.acknowledged:
                row.acknowledged += 1

    def _row(self, name: str) -> Row:
        row = self.rows.get(name)
        if row is None:
            row = self.rows[name] = Row(name)
        return row

    def _flag(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, self._id, detail, self._t, self._names))
        column = COLUMN_OF_KIND[kind]
        for row in self._rows:
            setattr(row, column, getattr(row, column) + 1)

    def _stall(self, waited_ms: float, due_t: float, *, came: bool = True) -> None:
        seconds = max(waited_ms, 0.0) / 1000.0
        for row in self._rows:
            if seconds > row.max_stall_s:
                row.max_stall_s = seconds
                row.max_stall_id = self._id
        if not came or self._stalled == self._id:
            return  # one never observed is lost or stuck; one violation per operation
        faults_ms = self.windows.longest_fault_between(due_t, due_t + waited_ms)
        allowed_ms = self.settings.stall_budget_ms + faults_ms
        if waited_ms > allowed_ms:
            self._stalled = self._id
            self._flag(
                STALLED,
                f"observed {waited_ms / 1000:.1f} s after it was due; the bound here is "
                f"{allowed_ms / 1000:.1f} s",
            )

    def _missing(self, due_t: float, what: str) -> None:
        """An expected observation due at ``due_t`` never came."""
        if due_t > self.run.end_t:
            self.pending += 1
            return
        self._stall(self.run.end_t - due_t, due_t, came=False)
        if self.run.drained_complete:
            self._flag(LOST, f"{what}: never observed (the run drained)")
        else:
            self._flag(STUCK, f"{what}: not observed when the history ends (drain incomplete)")

    # -- copies on a topic (tx, delay, timer) --

    def _wrong_topic(self, op: _Op, reads: _Reads) -> None:
        wrong = sorted(reads.topics - {op.topic}) if op.topic is not None else []
        if wrong:
            self._flag(WRONG_TOPIC, f"sent to {op.topic}, read from {', '.join(wrong)}")

    def _tx(self, op: _Op) -> None:
        decided = op.decided
        t = op.t
        if decided is not None and decided in op.first_t:
            t = op.first_t[decided]
        self._begin(op, t)
        reads = self.run.reads.get(op.id)
        copies = reads.copies if reads else 0
        if reads:
            self._wrong_topic(op, reads)
        if decided == _ROLLBACK:
            if copies:
                self._flag(VISIBLE_ROLLBACK, f"rolled back, yet read {copies} time(s)")
            return
        if decided is None:
            if copies:
                self._flag(VISIBLE_UNDECIDED, f"never committed, yet read {copies} time(s)")
            self._unchecked(op)
            return
        if decided == _COMMIT and reads is not None and reads.first_t < t:
            ahead = t - reads.first_t
            self._flag(EARLY, f"read {ahead:.0f} ms before its first COMMIT answer")
        if decided == _COMMIT and op.acknowledged:
            if reads is None:
                self._missing(t, "committed")
                return
            self._stall(reads.first_t - t, t)
            for row in self._rows:
                row.visible_ms.append(reads.first_t - t)
            if copies > 1:
                self._flag(DUPLICATED, f"committed, read at {copies} positions")
            return
        if copies > 1:  # not acknowledged, or decisions that conflict: at most once
            self._flag(DUPLICATED, f"read at {copies} positions (at most 1 allowed)")

    def _unchecked(self, op: _Op) -> None:
        if not op.acknowledged or not (op.intent or "").startswith("unknown"):
            return
        horizon = self.run.drained_t if self.run.drained_t is not None else self.run.end_t
        s = self.settings
        bound = op.t + s.check_bound_ms + self.grace_ms
        if horizon > bound:
            waited = (horizon - op.t) / 1000.0
            self._flag(UNCHECKED, f"answered UNKNOWN, no check answer in {waited:.0f} s")

    def _delayed(self, op: _Op) -> None:
        due = op.t + max(op.delay_ms or 0.0, 0.0)
        self._begin(op, due)
        reads = self.run.reads.get(op.id)
        if reads:
            self._wrong_topic(op, reads)
        if not op.acknowledged:
            if reads and reads.copies > 1:
                self._flag(DUPLICATED, f"read at {reads.copies} positions (at most 1 allowed)")
            return
        if reads is None:
            self._missing(due, f"{op.kind} due at +{(due - op.t) / 1000:.1f} s")
            return
        lateness = reads.first_t - due
        self._stall(lateness, due)
        for row in self._rows:
            row.lateness_ms.append(lateness)
        if lateness < 0:
            self._flag(EARLY, f"read {-lateness:.0f} ms before due (+{(due - op.t):.0f} ms)")
        if reads.copies > 1:
            self._flag(DUPLICATED, f"read at {reads.copies} positions")

    # -- push consumers --

    def _back_off_ms(self, op: _Op, reconsume_times: int, *, orderly: bool) -> float:
        """How long after a failed call at ``reconsume_times`` the next one is due, ms: the
        orderly suspension, the retry level's delay, or nothing when the DLQ comes next."""
        if orderly:
            return self.settings.suspend_ms(op.group)
        limit = self.settings.max_reconsume(op.group, orderly=False)
        if limit is not None and reconsume_times >= limit:
            return 0.0
        return self.settings.retry_delay_ms(reconsume_times)

    def _ladder_stall(
        self, op: _Op, calls: Sequence[_Call], *, orderly: bool
    ) -> tuple[float, float]:
        """The longest wait past due of the calls made (sorted by time) and when that call
        was due, ms: the first from the ack, each next ``reconsume_times`` from the first
        failed call before it plus its back-off."""
        start = op.ack_t if op.ack_t is not None else op.t
        worst, worst_due = calls[0][0] - start, start
        first_of: dict[int, float] = {}
        failed_at: dict[int, float] = {}
        for t, _, r, result in calls:
            if r is None:
                continue
            first_of.setdefault(r, t)
            if result in _FAILED_RESULTS:
                failed_at.setdefault(r, t)
        for r, t in failed_at.items():
            nxt = first_of.get(r + 1)
            if nxt is not None:
                due = t + self._back_off_ms(op, r, orderly=orderly)
                if nxt - due > worst:
                    worst, worst_due = nxt - due, due
        return worst, worst_due

    def _consumed(self, op: _Op, orderly: bool) -> None:
        self._begin(op, op.t)
        if not op.acknowledged:
            return
        calls = sorted(self.run.calls.get(op.id, ()))
        successes = [c for c in calls if c[3] == "success"]
        dlq_t = self.run.dlq.get(op.id)
        quarantined = op.id in self.run.quarantine
        limit = self.settings.max_reconsume(op.group, orderly=orderly)
        if len(successes) > 1:
            for row in self._rows:
                row.redelivered += 1
        if calls:
            stall, due = self._ladder_stall(op, calls, orderly=orderly)
            if dlq_t is not None and dlq_t - calls[-1][0] > stall:
                stall, due = dlq_t - calls[-1][0], calls[-1][0]
            self._stall(stall, due)
        if not successes and dlq_t is None and not quarantined:
            due = op.ack_t if op.ack_t is not None else op.t
            if calls:
                t, _, r, result = calls[-1]
                due = t
                if result in _FAILED_RESULTS and r is not None:
                    due = t + self._back_off_ms(op, r, orderly=orderly)
            self._missing(due, f"{op.kind} ({len(calls)} failed calls)")
            return
        if dlq_t is not None and successes:
            above = limit is not None and any(c[2] is not None and c[2] > limit for c in successes)
            if not above:
                n = len(successes)
                self._flag(DLQ_AND_SUCCESS, f"in the DLQ and consumed successfully {n} time(s)")
        if dlq_t is not None:
            spent = limit is not None and any(
                c[3] in _FAILED_RESULTS and c[2] is not None and c[2] >= limit for c in calls
            )
            if not spent:
                shown = "unlimited" if limit is None else str(limit)
                self._flag(PREMATURE_DLQ, f"in the DLQ without a failed call at reconsume {shown}")
        if self.settings.one_per_call(op.group):
            values = {c[2] for c in calls if c[2] is not None}
            skipped = sorted(v for v in values if v > 0 and v - 1 not in values)
            if skipped:
                self._flag(
                    RECONSUME_SKIPPED,
                    f"reconsume_times {skipped[0]} seen without {skipped[0] - 1} "
                    f"(seen: {sorted(values)})",
                )

    def _orderly_order(self) -> None:
        """Per (topic, key): first successes of acknowledged, not dead-lettered messages in
        increasing ``seq``."""
        ops = self.run.ops
        highest: dict[tuple[str | None, str | None], tuple[int, str]] = {}
        for op_id in self.run.first_success:
            op = ops.get(op_id)
            if (
                op is None
                or op.kind != "orderly"
                or op.seq is None
                or not op.acknowledged
                or op_id in self.run.dlq
                or op_id in self.run.quarantine
            ):
                continue
            key = (op.topic, op.key)
            top = highest.get(key)
            if top is not None and op.seq < top[0]:
                self._begin_again(op)
                self._flag(
                    REORDERED,
                    f"key {op.key!r} seq {op.seq} consumed after seq {top[0]} ({top[1]})",
                )
            elif top is None or op.seq > top[0]:
                highest[key] = (op.seq, op_id)

    def _begin_again(self, op: _Op) -> None:
        """Point the bookkeeping at ``op`` again without counting it a second time."""
        self._id = op.id
        self._t = op.t
        self._names = self.windows.at(op.t)
        self._rows = [self._row(name) for name in [*self._names, ALL_ROW]]

    def _broadcast(self, op: _Op, observers: Mapping[str, float]) -> None:
        self._begin(op, op.t)
        if not op.acknowledged:
            return
        per: dict[str, list[_Call]] = {}
        for call in sorted(self.run.calls.get(op.id, ())):
            per.setdefault(call[1], []).append(call)
        missing = [name for name, since in observers.items() if op.t >= since and name not in per]
        if any(sum(1 for c in calls if c[3] == "success") > 1 for calls in per.values()):
            for row in self._rows:
                row.redelivered += 1
        start = op.ack_t if op.ack_t is not None else op.t
        for calls in per.values():
            self._stall(calls[0][0] - start, start)
        if missing:
            self._missing(start, f"broadcast missing at {', '.join(missing)}")

    def _poison(self, op: _Op) -> None:
        self._begin(op, op.t, [POISON_ROW])
        if (
            op.expect == "quarantine"
            and op.acknowledged
            and self.run.drained_complete
            and op.id not in self.run.quarantine
        ):
            self._flag(NOT_QUARANTINED, "poison record never seen in QUARANTINE")

    # -- spark --

    def _spark(self, spark: Mapping[str, Any]) -> None:
        raw_ids = spark.get("ids")
        if not isinstance(raw_ids, list):
            raise HistoryFormatError(f"a spark event needs a list 'ids': {_describe(spark)}")
        raw_topics = spark.get("topics")
        topics = {str(x) for x in raw_topics} if isinstance(raw_topics, list) else set()
        counts: dict[str, int] = {}
        for value in raw_ids:
            counts[str(value)] = counts.get(str(value), 0) + 1
        spark_t = _num(spark, "t") or self.run.end_t
        gate = _num(spark, "start_t")
        if gate is None:
            drained = self.run.drained_t
            gate = drained if drained is not None and drained <= spark_t else spark_t
        row = self._row(SPARK_ROW)
        self._rows = [row, self._row(ALL_ROW)]
        self._names = (SPARK_ROW,)
        for op in self.run.ops.values():
            if op.kind == "tx":
                if op.decided == _ROLLBACK:
                    if counts.get(op.id):
                        self._id, self._t = op.id, op.t
                        self._flag(SPARK_VISIBLE_ROLLBACK, "rolled back, yet in Spark's rows")
                    continue
                if op.decided is None:
                    continue
                committed_acked = op.decided == _COMMIT and op.acknowledged
            elif op.kind in ("delay", "timer"):
                if topics and op.topic not in topics:
                    continue
                committed_acked = op.acknowledged
            else:
                continue
            n = counts.get(op.id, 0)
            self._id, self._t = op.id, op.t
            reads = self.run.reads.get(op.id)
            expected = committed_acked and reads is not None and reads.first_t <= gate
            if expected:
                row.operations += 1
                row.acknowledged += 1
            if expected and n == 0:
                self._flag(SPARK_MISSING, "on its topic before the ingest, not in Spark's rows")
            elif n > 1:
                self._flag(SPARK_DUPLICATED, f"{n} rows in Spark's output")

    # -- all --

    def judge(self) -> Report:
        run = self.run
        start_t = min((op.t for op in run.ops.values()), default=0.0)
        seen_broadcast = {
            call[1]
            for op in run.ops.values()
            if op.kind == "broadcast"
            for call in run.calls.get(op.id, ())
        }
        observers = self.settings.broadcast_observers(seen_broadcast, start_t)
        for op in run.ops.values():
            if op.kind == "tx":
                self._tx(op)
            elif op.kind in ("delay", "timer"):
                self._delayed(op)
            elif op.kind in ("consume", "orderly"):
                self._consumed(op, orderly=op.kind == "orderly")
            elif op.kind == "broadcast":
                self._broadcast(op, observers)
            else:
                self._poison(op)
        self._orderly_order()
        if run.spark is not None:
            self._spark(run.spark)
        ids = run.ops.keys()
        run.unmatched = (
            sum(1 for i in run.reads if i not in ids)
            + sum(1 for i in run.calls if i not in ids)
            + sum(1 for i in run.dlq if i not in ids)
            + sum(1 for i in run.quarantine if i not in ids)
        )
        order = [*self.windows.names, NONE_ROW, POISON_ROW, SPARK_ROW, ALL_ROW]
        rows = {name: self._row(name) for name in order if name in self.rows or name == ALL_ROW}
        return Report(
            rows=rows,
            violations=sorted(self.violations, key=lambda v: (v.t_ms, v.id, v.kind)),
            windows=list(run.windows),
            drained=run.drained_complete,
            pending=self.pending,
            unmatched_ids=run.unmatched,
            grace_s=self.grace_ms / 1000.0,
        )


def check(events: Iterable[Mapping[str, Any]], *, grace_s: float = DEFAULT_GRACE_S) -> Report:
    """Judge the ``events`` of one run (in file order; see :func:`chaos.history.read_history`)
    with faults' effects attributed to them for ``grace_s`` seconds after they end."""
    if not math.isfinite(grace_s) or grace_s < 0:
        raise InvalidArgumentError(f"grace_s must be a finite number >= 0 seconds, not {grace_s}")
    return _Judge(_collect(events), grace_s).judge()


def check_file(path: Path, *, grace_s: float = DEFAULT_GRACE_S) -> Report:
    """:func:`check` on the history file at ``path``."""
    return check(read_history(path), grace_s=grace_s)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chaos.checker HISTORY``: print the report; exit 1 on any violation."""
    parser = argparse.ArgumentParser(prog="python -m chaos.checker", description=main.__doc__)
    parser.add_argument("history", type=Path)
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, help="seconds")
    parser.add_argument("--violations", type=int, default=20, help="how many to list")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    report = check_file(args.history, grace_s=args.grace)
    text = (report.render_markdown if args.markdown else report.render)(args.violations)
    sys.stdout.write(text)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
