"""The Spark ingest check (G7): every acknowledged committed transaction and acknowledged
delayed message a reader saw before the ingest started is in the job's rows exactly once,
any other at most once, a rolled-back one never; counted in the rows ``spark`` and ``all``.
:mod:`chaos.checker` states the rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.check_history import COMMIT, ROLLBACK, HistoryFormatError, describe, number
from chaos.check_ledger import Ledger
from chaos.check_report import (
    ALL_ROW,
    SPARK_DUPLICATED,
    SPARK_MISSING,
    SPARK_ROW,
    SPARK_VISIBLE_ROLLBACK,
)


class SparkCheck(Ledger):
    """The ``spark`` rule over the last ``spark`` event."""

    def _spark(self, spark: Mapping[str, Any]) -> None:
        raw_ids = spark.get("ids")
        if not isinstance(raw_ids, list):
            raise HistoryFormatError(f"a spark event needs a list 'ids': {describe(spark)}")
        raw_topics = spark.get("topics")
        topics = {str(x) for x in raw_topics} if isinstance(raw_topics, list) else set()
        counts: dict[str, int] = {}
        for value in raw_ids:
            counts[str(value)] = counts.get(str(value), 0) + 1
        spark_t = number(spark, "t") or self.run.end_t
        gate = number(spark, "start_t")
        if gate is None:
            drained = self.run.drained_t
            gate = drained if drained is not None and drained <= spark_t else spark_t
        row = self._row(SPARK_ROW)
        self._rows = [row, self._row(ALL_ROW)]
        self._names = (SPARK_ROW,)
        for op in self.run.ops.values():
            if op.kind == "tx":
                if op.decided == ROLLBACK:
                    if counts.get(op.id):
                        self._id, self._t = op.id, op.t
                        self._flag(SPARK_VISIBLE_ROLLBACK, "rolled back, yet in Spark's rows")
                    continue
                if op.decided is None:
                    continue
                committed_acked = op.decided == COMMIT and op.acknowledged
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
