"""Checks of push consumers (G6): concurrent ``consume`` (a success, the DLQ or QUARANTINE;
no DLQ copy before the retries are spent; no retry level skipped; the stall of each retry
from its back-off), ``orderly`` (the same, and first successes in ``seq`` order per key),
``broadcast`` (every observer at least once) and the ``poison`` records (G8, G9: quarantined,
in their own row). :mod:`chaos.checker` states the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from chaos.check_history import Call, Op
from chaos.check_ledger import Ledger
from chaos.check_report import (
    DLQ_AND_SUCCESS,
    NOT_QUARANTINED,
    POISON_ROW,
    PREMATURE_DLQ,
    RECONSUME_SKIPPED,
    REORDERED,
)

_FAILED_RESULTS: Final = frozenset({"fail", "raise"})


class ConsumerChecks(Ledger):
    """The ``consume``, ``orderly``, ``broadcast`` and ``poison`` rules over listener calls and
    the DLQ and QUARANTINE readers."""

    def _back_off_ms(self, op: Op, reconsume_times: int, *, orderly: bool) -> float:
        """How long after a failed call at ``reconsume_times`` the next one is due, ms: the
        orderly suspension, the retry level's delay, or nothing when the DLQ comes next."""
        if orderly:
            return self.settings.suspend_ms(op.group)
        limit = self.settings.max_reconsume(op.group, orderly=False)
        if limit is not None and reconsume_times >= limit:
            return 0.0
        return self.settings.retry_delay_ms(reconsume_times)

    def _ladder_stall(self, op: Op, calls: Sequence[Call], *, orderly: bool) -> tuple[float, float]:
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

    def _consumed(self, op: Op, orderly: bool) -> None:
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

    def _broadcast(self, op: Op, observers: Mapping[str, float]) -> None:
        self._begin(op, op.t)
        if not op.acknowledged:
            return
        per: dict[str, list[Call]] = {}
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

    def _poison(self, op: Op) -> None:
        self._begin(op, op.t, [POISON_ROW])
        if (
            op.expect == "quarantine"
            and op.acknowledged
            and self.run.drained_complete
            and op.id not in self.run.quarantine
        ):
            self._flag(NOT_QUARANTINED, "poison record never seen in QUARANTINE")
