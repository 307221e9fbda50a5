"""The workload's shared state: what each operation was meant to do, which were acknowledged,
what every observer has seen so far (for the drain), the id counters, and the ``send`` and
``ack`` events every sender writes. :class:`~chaos.workload.Workload` builds on it.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from typing import Any

from confluent_kafka import Producer as KafkaProducer
from sqlalchemy import Engine

from bridge import Producer, PushConsumer, TransactionMQProducer
from bridge.errors import SendTimeoutError
from chaos.history import HistoryWriter
from chaos.workload_observers import Reader
from chaos.workload_spec import BROADCAST_INSTANCES, CONSUME_GROUP, Spec, WorkloadConfig
from topics.catalog import SystemTopic
from topics.naming import to_kafka_topic


def error_text(exc: BaseException) -> str:
    """``exc`` on one line for an ``ack`` event's ``error``, at most 500 characters."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]


def is_indeterminate(exc: BaseException) -> bool:
    """A send that failed this way may still have been stored."""
    if isinstance(exc, SendTimeoutError):
        return True
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text or "_msg_timed_out" in text


class WorkloadState:
    """The bookkeeping of one run's workload, shared by its senders, listeners and readers."""

    def __init__(self, config: WorkloadConfig, history: HistoryWriter) -> None:
        self.config = config
        self.history = history
        self.specs: dict[str, Spec] = {}
        self._lock = threading.Lock()
        self._acked: dict[str, bool] = {}
        """id -> ok (only definite outcomes; indeterminate ones are not waited for)."""
        self._seen: dict[str, set[str]] = defaultdict(set)
        self._counters: dict[str, int] = defaultdict(int)
        self._seq: dict[str, int] = defaultdict(int)
        self._stop_load = threading.Event()
        self.database_is_down = threading.Event()
        """Set during a ``db_outage``: the listener answers UNKNOWN to everything."""
        self._threads: list[threading.Thread] = []
        self._readers: list[Reader] = []
        self._consumers: list[PushConsumer] = []
        self._producer: Producer | None = None
        self._tx_producer: TransactionMQProducer | None = None
        self._db_producer: TransactionMQProducer | None = None
        self._databases: tuple[Engine, Engine] | None = None
        """The orders and inventory databases of the ``db`` kind, once started."""
        self._db_calls = 0
        """Inventory listener calls running now."""
        self._db_calls_changed = threading.Condition()
        self._raw: KafkaProducer | None = None
        self._poison_rng = random.Random(f"{config.seed}-poison")
        self._poison_lock = threading.Lock()
        client = config.client_config()
        catalog = client.catalog()
        self.schedule_topic = catalog.topic(SystemTopic.SCHEDULE)
        self.quarantine_topic = catalog.topic(SystemTopic.QUARANTINE)
        self.parked_topic = catalog.topic(SystemTopic.CHECK_MAX)
        self.retry_topic = to_kafka_topic(f"%RETRY%{CONSUME_GROUP}", config.namespace)
        self.dlq_topic = to_kafka_topic(f"%DLQ%{CONSUME_GROUP}", config.namespace)

    # --- bookkeeping ----------------------------------------------------------------------
    def _new_id(self, kind: str) -> str:
        with self._lock:
            self._counters[kind] += 1
            return f"{kind}-{self._counters[kind]:05d}"

    def observed(self, wid: str, tag: str) -> None:
        """Note that ``tag`` (an observer, or ``<observer>:success``) saw ``wid``."""
        with self._lock:
            self._seen[wid].add(tag)

    def _expected_tags(self, spec: Spec) -> list[set[str]]:
        """What must be seen of an acknowledged operation: each set is one requirement
        (any tag of it satisfies it)."""
        kind = spec.kind
        committed = kind != "tx" or spec.intent in ("commit", "unknown_then_commit")
        if kind == "consume" and spec.fail_times > self.config.max_reconsume_times:
            kind = "consume-dlq"
        fixed = {
            "tx": [{"reader"}] if committed else [],
            "delay": [{"reader"}],
            "timer": [{"reader"}],
            "consume": [{"consume:success"}],
            "consume-dlq": [{"dlq"}],
            "orderly": [{"orderly:success"}],
            "broadcast": [{f"broadcast-{i}"} for i in BROADCAST_INSTANCES],
            "poison": [{"quarantine"}],
            "db": [{"reader"}, {"db-effect"}] if spec.committed else [],
        }
        return fixed.get(kind, [])

    def outstanding(self) -> dict[str, list[str]]:
        """Acknowledged operations whose expected observations have not all arrived, by kind."""
        out: dict[str, list[str]] = defaultdict(list)
        with self._lock:
            acked = [wid for wid, ok in self._acked.items() if ok]
            # An order committed by the check-back after its send failed is awaited too.
            acked += [
                wid
                for wid, spec in self.specs.items()
                if spec.kind == "db" and spec.committed and not self._acked.get(wid)
            ]
            for wid in acked:
                spec = self.specs[wid]
                seen = self._seen.get(wid, set())
                if any(not (need & seen) for need in self._expected_tags(spec)):
                    out[spec.kind].append(wid)
        return {k: sorted(v) for k, v in out.items()}

    def counts(self) -> dict[str, int]:
        """Operations sent per kind so far."""
        with self._lock:
            return dict(self._counters)

    def _record_send(self, spec: Spec, topic: str, t: float | None = None, **extra: Any) -> None:
        with self._lock:
            self.specs[spec.id] = spec
        self.history.write(
            "send", t=t, id=spec.id, kind=spec.kind, topic=topic, key=spec.key, seq=spec.seq,
            **extra,
        )  # fmt: skip

    def _record_ack(self, wid: str, ok: bool, *, msg_id: str | None = None,
                    error: BaseException | str | None = None,
                    indeterminate: bool = False) -> None:  # fmt: skip
        fields: dict[str, Any] = {"id": wid, "ok": ok, "indeterminate": indeterminate}
        if msg_id is not None:
            fields["msg_id"] = msg_id
        if error is not None:
            fields["error"] = error if isinstance(error, str) else error_text(error)
        self.history.write("ack", **fields)
        if not indeterminate:
            with self._lock:
                self._acked[wid] = ok
