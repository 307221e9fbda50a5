"""The check of the ``db`` kind (G13, exactly-once effects end to end): the orders database,
the real topic and the inventory database agree, and so do the orders listener's answers.
:mod:`chaos.checker` states the rule.
"""

from __future__ import annotations

from chaos.check_copies import CopyChecks
from chaos.check_history import COMMIT, ROLLBACK, Op
from chaos.check_report import (
    DUPLICATED,
    EARLY,
    EFFECT_DUPLICATED,
    EFFECT_LOST,
    FAILED_WORK_COMMITTED,
    ROLLBACK_WITH_ROW,
    STUCK,
    VISIBLE_UNDECIDED,
    WITHOUT_ROW,
)


class DatabaseChecks(CopyChecks):
    """The ``db`` rule over the order rows, the answers, the reader's copies and the effect
    rows."""

    def _db(self, op: Op) -> None:
        database = self.run.database
        if database is None:
            # The applications' databases were not read (the run ended early): the message
            # alone is judged, as a transaction's.
            self._tx(op)
            return
        committed_t = op.first_t.get(COMMIT)
        t = committed_t if committed_t is not None else op.t
        self._begin(op, t)
        reads = self.run.reads.get(op.id)
        copies = reads.copies if reads else 0
        effects = database.effects.get(op.id, 0)
        if reads:
            self._wrong_topic(op, reads)
        if op.id not in database.orders:
            if committed_t is not None:
                self._flag(WITHOUT_ROW, "answered COMMIT, yet no order row")
            elif copies:
                self._flag(WITHOUT_ROW, f"no order row, yet read {copies} time(s)")
            if effects:
                self._flag(WITHOUT_ROW, f"no order row, yet applied {effects} time(s)")
            return
        if op.intent == "rollback":
            self._flag(FAILED_WORK_COMMITTED, "its business work failed, yet its row committed")
        if ROLLBACK in op.first_t:
            self._flag(ROLLBACK_WITH_ROW, "answered ROLLBACK, yet its order row committed")
        if committed_t is None:
            if copies:
                self._flag(VISIBLE_UNDECIDED, f"never answered COMMIT, yet read {copies} time(s)")
            else:
                self._missing(t, "an order row committed: a COMMIT answer")
            return
        drained_t = self.run.drained_t
        if drained_t is not None and committed_t > drained_t:
            # Committed after the drain stopped waiting (a send outlived the end of the load):
            # what follows its answer was not waited for.
            self.pending += 1
            return
        if reads is None:
            self._missing(t, "an order row committed: its message")
            return
        if reads.first_t < committed_t:
            ahead = committed_t - reads.first_t
            self._flag(EARLY, f"read {ahead:.0f} ms before its first COMMIT answer")
        self._stall(reads.first_t - t, t)
        for row in self._rows:
            row.visible_ms.append(reads.first_t - t)
        if copies > 1:
            self._flag(DUPLICATED, f"an order row, read at {copies} positions")
        if effects == 0:
            # Read while the inventory application ran: it was due to apply it.
            if self.run.drained_complete:
                self._flag(EFFECT_LOST, "an order row and its message, never applied")
            else:
                self._flag(STUCK, "an order row and its message, not applied (drain incomplete)")
        elif effects > 1:
            self._flag(EFFECT_DUPLICATED, f"applied {effects} times")

    def _db_unmatched(self) -> int:
        """Order or effect rows of no ``db`` operation (an effect of a message without its
        workload id, say): counted with the unmatched ids."""
        database = self.run.database
        if database is None:
            return 0
        ids = {op.id for op in self.run.ops.values() if op.kind == "db"}
        return len(database.orders - ids) + len(set(database.effects) - ids)
