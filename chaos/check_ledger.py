"""The checker's bookkeeping, shared by every check: which rows an operation counts in (the
nemesis windows its time falls in, and ``all``), flagging a :class:`~chaos.check_report.Violation`
in those rows, the longest stall per row and the stall budget (``stalled``), and an expected
observation that never came (lost, stuck or pending).

The checks of each guarantee family are mixins over :class:`Ledger`
(:mod:`chaos.check_copies`, :mod:`chaos.check_consumers`, :mod:`chaos.check_spark`);
:mod:`chaos.checker` combines them and states the rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.check_history import Op, Run, Windows
from chaos.check_report import (
    ALL_ROW,
    COLUMN_OF_KIND,
    LOST,
    NONE_ROW,
    STALLED,
    STUCK,
    Row,
    Violation,
)
from chaos.check_settings import Settings


class Ledger:
    """One judgement's state: the run, the settings and fault windows, the rows and violations
    so far, and the operation being judged."""

    def __init__(self, run: Run, grace_s: float) -> None:
        self.run = run
        self.grace_ms = grace_s * 1000.0
        self.settings = Settings(run.config)
        self.windows = Windows(run.windows, self.grace_ms)
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

    def _begin(self, op: Op, t: float, rows: Sequence[str] | None = None) -> None:
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

    def _begin_again(self, op: Op) -> None:
        """Point the bookkeeping at ``op`` again without counting it a second time."""
        self._id = op.id
        self._t = op.t
        self._names = self.windows.at(op.t)
        self._rows = [self._row(name) for name in [*self._names, ALL_ROW]]
