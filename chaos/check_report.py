"""The checker's vocabulary and its verdict: the row names, the violation kinds and the table
column that counts each, a fault :class:`Window`, a :class:`Violation`, a table :class:`Row`
and the :class:`Report` with its fixed-width and Markdown renderings.

Nothing here reads a history or judges one; :mod:`chaos.checker` states the rules and
re-exports every public name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

DEFAULT_GRACE_S: Final = 30.0
"""How long after a fault ends its effects are still attributed to it, seconds."""

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
PARKED_WOULD_COMMIT: Final = "parked_would_commit"
EFFECT_LOST: Final = "effect_lost"
EFFECT_DUPLICATED: Final = "effect_duplicated"
WITHOUT_ROW: Final = "without_row"
FAILED_WORK_COMMITTED: Final = "failed_work_committed"
ROLLBACK_WITH_ROW: Final = "rollback_with_row"

COLUMN_OF_KIND: Final[Mapping[str, str]] = {
    LOST: "lost",
    SPARK_MISSING: "lost",
    DUPLICATED: "duplicated",
    SPARK_DUPLICATED: "duplicated",
    EARLY: "early",
    REORDERED: "reordered",
    STUCK: "stuck",
    PARKED_WOULD_COMMIT: "lost",
    EFFECT_LOST: "lost",
    EFFECT_DUPLICATED: "duplicated",
    WITHOUT_ROW: "other",
    FAILED_WORK_COMMITTED: "other",
    ROLLBACK_WITH_ROW: "other",
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
