"""The history of one fault-injection run: every operation the workload attempted, every
outcome it was told, every value a reader or listener observed, and every fault, as JSON lines.

The checker (:mod:`chaos.checker`) decides from this file alone, so a run can be checked again
later, or a history written by hand can test the checker. Times are wall-clock epoch
milliseconds (``t``, float) taken on this machine: the workload, the readers and the nemeses all
run here, so their clocks agree.

Every message the workload sends carries its workload id in the user property
:data:`ID_PROPERTY`, so an observation names the operation it belongs to whatever copy of the
message (retry, DLQ, delayed delivery) it saw.

Event types (``type`` field) and their fields, besides ``t``:

``send``
    An attempt: ``id`` (unique per run), ``kind`` (:data:`KINDS`), ``topic`` (the RocketMQ
    name it was sent to), ``key`` (sharding key or ``None``), ``seq`` (position of this message
    among the messages of ``key`` from this sender, for ordering checks; ``None`` when order
    is not promised), and per kind: ``delay_ms`` (``delay``/``timer``: the wait asked for,
    counted from this event's ``t``), ``intent`` (``tx``: :data:`TX_INTENTS`; ``db``:
    :data:`DB_INTENTS`), ``fail_times``
    (``consume``: how many times the listener answers RECONSUME_LATER before success; a value
    at or above the group's ``max_reconsume_times`` + 1 means it must end in the DLQ),
    ``group`` (``consume``: the consumer group meant to handle it), ``poison`` (``poison``:
    what is wrong with it).
``ack``
    The outcome of a ``send``: ``id``, ``ok`` (bool), ``msg_id`` (when ok), ``error`` (the
    error's type and text when not ok), ``indeterminate`` (bool: the send may or may not have
    happened, e.g. a timeout).
``decide``
    A transaction listener's answer: ``id``, ``status`` (``COMMIT``/``ROLLBACK``/``UNKNOWN``),
    ``via`` (``execute`` or ``check``).
``recv``
    An observation: ``id``, ``observer`` (a name), ``role`` (:data:`ROLES`), ``topic`` (the
    Kafka topic it was read from), ``partition``, ``offset``, ``reconsume_times`` (for a
    listener), ``group`` (for a listener), ``result`` (for a listener: ``success``, ``fail``
    or ``raise``), ``props`` (optional: selected properties the observer saw).
``nemesis``
    A fault: ``name`` (:data:`NEMESES`), ``phase`` (``start`` or ``end``), ``target`` (what was
    hit, e.g. ``node-2`` or ``coordinator-1``), ``detail`` (free text).
``spark``
    The Spark ingest at the end: ``ids`` (the workload ids of every row it wrote, repeats
    included), ``topics`` (the topics it read).
``database``
    What the ``db`` kind's two applications committed, read once they stopped (after the
    drain): ``orders`` (the ids of every order row in the orders database), ``effects`` (id ->
    how many effect rows the inventory database holds for it: one per handler run that
    committed; the table has no unique key, so a second run shows), ``running`` (inventory
    listener calls still running when it was read: 0 unless its consumer's shutdown left one
    running past the wait).
``phase``
    Run markers: ``name`` is ``start``, ``load_end`` (no more sends after this), ``drained``
    (the readers waited for everything expected, or gave up), ``end``; ``detail`` optional.
    ``config`` (on ``start``): the settings the checker needs, e.g. ``max_reconsume_times``,
    ``timer_precision_ms``, ``delay_levels_ms``, ``transaction_timeout_ms``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO

ID_PROPERTY: Final = "chaos_id"
"""The user property that carries a message's workload id."""

KINDS: Final = ("tx", "delay", "timer", "consume", "orderly", "broadcast", "poison", "db")
"""``tx``: a transactional send; ``delay``: a delay-level send; ``timer``: a timer send;
``consume``: a plain send to a topic a concurrent push consumer handles; ``orderly``: a plain
send to a topic an orderly push consumer handles (``seq`` set); ``broadcast``: a plain send
to a topic a broadcasting consumer handles; ``poison``: a record that cannot be delivered,
sent to show it holds nothing else back; ``db``: an order placed through a
``DatabaseTransactionListener`` (its row and its message together) that an inventory
application applies through an ``IdempotentListener``."""

DB_INTENTS: Final = ("commit", "rollback")
"""``db``: the order's business work succeeds, or fails its business rule (raises), which
rolls back the database transaction and the half message."""

TX_INTENTS: Final = ("commit", "rollback", "unknown_then_commit", "unknown_then_rollback")
"""What the workload's transaction listener answers for one message: at once on execute, or
UNKNOWN on execute and the rest on the first check-back."""

ROLES: Final = ("reader", "listener", "dlq_reader", "quarantine_reader", "parked_reader")
"""``reader``: a ``read_committed`` Kafka consumer of the real topics (exactly-once checks);
``listener``: a push consumer's listener call; ``dlq_reader``: a reader of a DLQ topic;
``quarantine_reader``: a reader of the QUARANTINE topic; ``parked_reader``: a reader of the
check-max topic (transactions parked after their checks)."""

NEMESES: Final = (
    "coordinator_kill",
    "coordinator_pause",
    "leader_kill",
    "rolling_restart",
    "net_latency",
    "net_drop",
    "net_partition",
    "disk_full",
    "poison",
    "db_outage",
)


def now_ms() -> float:
    """Wall-clock epoch milliseconds."""
    return time.time() * 1000.0


class HistoryWriter:
    """Append events to a JSON-lines file; safe to call from many threads. Each line is flushed,
    so a run killed half way still leaves a readable history."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, type_: str, **fields: Any) -> None:
        """Record one event of ``type_`` now (``t`` is filled in unless given)."""
        event = {"t": fields.pop("t", None) or now_ms(), "type": type_, **fields}
        line = json.dumps(event, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_history(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a history file, in file order. A last line cut short by a crash is
    skipped; any other line that is not a JSON object raises ``ValueError`` naming it."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                return
            raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from exc
        if not isinstance(event, dict) or "type" not in event or "t" not in event:
            raise ValueError(f"{path}:{number}: an event needs 't' and 'type'")
        yield event
