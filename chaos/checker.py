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
    that time. Parked in the check-max topic (a ``parked_reader`` observation) although its
    intent is ``commit`` or ``unknown_then_commit`` is ``parked_would_commit`` (column
    ``lost``): its producer answers COMMIT whenever asked once a ``db_outage`` is over, and
    every fault of a run is shorter than ``transaction_check_max`` check intervals.

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

``db`` (G13)
    Judged against the ``database`` event (the orders and inventory databases read after the
    applications stopped); without one, as a ``tx``. An order row with no copy on the topic is
    lost or stuck, with more than one ``duplicated``; a copy read before the first COMMIT
    answer is ``early``; a row and its copy without an effect row is ``effect_lost`` (``stuck``
    when the drain was incomplete), more than one effect row ``effect_duplicated``. No order
    row: a COMMIT answer, a copy or an effect row is ``without_row`` (a message or an effect
    the database never committed). A row whose business work was meant to fail (intent
    ``rollback``) is ``failed_work_committed``; a row answered ROLLBACK (on execute or on a
    check) is ``rollback_with_row``; a row never answered COMMIT is lost or stuck, or
    ``visible_undecided`` when read. Whether the send was acknowledged does not matter: the
    row decides (a commit whose outcome the listener could not tell is answered from the
    transaction log on check-back). An order first answered COMMIT after the ``drained``
    marker (a send that outlived the load) is pending for what follows. Order and effect rows
    of no ``db`` send count as unmatched ids. Its time is the first COMMIT answer (the send's
    when there is none).

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
    ``not_quarantined``, ``spark_visible_rollback``, ``without_row``,
    ``failed_work_committed``, ``rollback_with_row``; ``lost`` also counts ``effect_lost``
    and ``duplicated`` ``effect_duplicated``), ``redelivered`` (operations consumed
    successfully more than once, not a violation), max stall (s), delay/timer lateness
    p50/p99/max (ms) and commit-to-visible latency p50/p99 (ms).

Percentiles are nearest-rank: the p-th of n sorted values is the one at rank ``ceil(p n / 100)``.

The code: :mod:`chaos.check_history` reads the history in one pass, :mod:`chaos.check_settings`
reads the start config, :mod:`chaos.check_ledger` keeps the per-row bookkeeping and the stall
budget, :mod:`chaos.check_copies` (``tx``, ``delay``, ``timer``), :mod:`chaos.check_database`
(``db``),
:mod:`chaos.check_consumers` (``consume``, ``orderly``, ``broadcast``, ``poison``) and
:mod:`chaos.check_spark` hold the rules of each family, :mod:`chaos.check_report` the rows,
violations and the table. This module combines them and re-exports every public name.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bridge.errors import InvalidArgumentError
from chaos.check_consumers import ConsumerChecks
from chaos.check_database import DatabaseChecks
from chaos.check_history import HistoryFormatError, collect
from chaos.check_report import (
    ALL_ROW,
    COLUMN_OF_KIND,
    COLUMNS,
    DEFAULT_GRACE_S,
    DLQ_AND_SUCCESS,
    DUPLICATED,
    EARLY,
    EFFECT_DUPLICATED,
    EFFECT_LOST,
    FAILED_WORK_COMMITTED,
    LOST,
    NONE_ROW,
    NOT_QUARANTINED,
    POISON_ROW,
    PREMATURE_DLQ,
    RECONSUME_SKIPPED,
    REORDERED,
    ROLLBACK_WITH_ROW,
    SPARK_DUPLICATED,
    SPARK_MISSING,
    SPARK_ROW,
    SPARK_VISIBLE_ROLLBACK,
    STALLED,
    STUCK,
    UNCHECKED,
    VISIBLE_ROLLBACK,
    VISIBLE_UNDECIDED,
    WITHOUT_ROW,
    WRONG_TOPIC,
    Report,
    Row,
    Violation,
    Window,
    percentile,
)
from chaos.check_settings import (
    DEFAULT_DELAY_LEVELS_MS,
    DEFAULT_MAX_RECONSUME_TIMES,
    FIRST_RETRY_LEVEL,
    STALL_MARGIN_MS,
)
from chaos.check_spark import SparkCheck
from chaos.history import read_history

__all__ = [
    "ALL_ROW",
    "COLUMNS",
    "COLUMN_OF_KIND",
    "DEFAULT_DELAY_LEVELS_MS",
    "DEFAULT_GRACE_S",
    "DEFAULT_MAX_RECONSUME_TIMES",
    "DLQ_AND_SUCCESS",
    "DUPLICATED",
    "EARLY",
    "EFFECT_DUPLICATED",
    "EFFECT_LOST",
    "FAILED_WORK_COMMITTED",
    "FIRST_RETRY_LEVEL",
    "LOST",
    "NONE_ROW",
    "NOT_QUARANTINED",
    "POISON_ROW",
    "PREMATURE_DLQ",
    "RECONSUME_SKIPPED",
    "REORDERED",
    "ROLLBACK_WITH_ROW",
    "SPARK_DUPLICATED",
    "SPARK_MISSING",
    "SPARK_ROW",
    "SPARK_VISIBLE_ROLLBACK",
    "STALLED",
    "STALL_MARGIN_MS",
    "STUCK",
    "UNCHECKED",
    "VISIBLE_ROLLBACK",
    "VISIBLE_UNDECIDED",
    "WITHOUT_ROW",
    "WRONG_TOPIC",
    "HistoryFormatError",
    "Report",
    "Row",
    "Violation",
    "Window",
    "check",
    "check_file",
    "main",
    "percentile",
]


class _Judge(DatabaseChecks, ConsumerChecks, SparkCheck):
    """Every rule over one run: each operation by its kind, then the orderly order across
    operations, then the Spark rows."""

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
            elif op.kind == "db":
                self._db(op)
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
            + self._db_unmatched()
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
    return _Judge(collect(events), grace_s).judge()


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
