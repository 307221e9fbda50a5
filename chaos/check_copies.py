"""Checks of the messages a reader counts copies of on a topic: transactions (``tx``: G1-G4,
exactly one copy when committed, none when rolled back or undecided, never before the first
COMMIT answer, checked back in time) and delayed messages (``delay``/``timer``: G2, G3, G5,
exactly one copy, never before due, lateness per row). :mod:`chaos.checker` states the rules.
"""

from __future__ import annotations

from chaos.check_history import COMMIT, ROLLBACK, Op, Reads
from chaos.check_ledger import Ledger
from chaos.check_report import (
    DUPLICATED,
    EARLY,
    PARKED_WOULD_COMMIT,
    UNCHECKED,
    VISIBLE_ROLLBACK,
    VISIBLE_UNDECIDED,
    WRONG_TOPIC,
)


class CopyChecks(Ledger):
    """The ``tx``, ``delay`` and ``timer`` rules over a reader's copies."""

    def _wrong_topic(self, op: Op, reads: Reads) -> None:
        wrong = sorted(reads.topics - {op.topic}) if op.topic is not None else []
        if wrong:
            self._flag(WRONG_TOPIC, f"sent to {op.topic}, read from {', '.join(wrong)}")

    def _tx(self, op: Op) -> None:
        decided = op.decided
        t = op.t
        if decided is not None and decided in op.first_t:
            t = op.first_t[decided]
        self._begin(op, t)
        reads = self.run.reads.get(op.id)
        copies = reads.copies if reads else 0
        if reads:
            self._wrong_topic(op, reads)
        if op.id in self.run.parked and op.intent in ("commit", "unknown_then_commit"):
            # Its producer answers COMMIT whenever asked, the database being back: it was
            # parked unasked (every fault of a run is shorter than transaction_check_max
            # check intervals).
            self._flag(PARKED_WOULD_COMMIT, "parked in the check-max topic; its producer commits")
        if decided == ROLLBACK:
            if copies:
                self._flag(VISIBLE_ROLLBACK, f"rolled back, yet read {copies} time(s)")
            return
        if decided is None:
            if copies:
                self._flag(VISIBLE_UNDECIDED, f"never committed, yet read {copies} time(s)")
            self._unchecked(op)
            return
        if decided == COMMIT and reads is not None and reads.first_t < t:
            ahead = t - reads.first_t
            self._flag(EARLY, f"read {ahead:.0f} ms before its first COMMIT answer")
        if decided == COMMIT and op.acknowledged:
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

    def _unchecked(self, op: Op) -> None:
        if not op.acknowledged or not (op.intent or "").startswith("unknown"):
            return
        horizon = self.run.drained_t if self.run.drained_t is not None else self.run.end_t
        s = self.settings
        bound = op.t + s.check_bound_ms + self.grace_ms
        if horizon > bound:
            waited = (horizon - op.t) / 1000.0
            self._flag(UNCHECKED, f"answered UNKNOWN, no check answer in {waited:.0f} s")

    def _delayed(self, op: Op) -> None:
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
