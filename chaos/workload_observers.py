"""What the workload sees: the transaction listener, which answers per message's intent and
records each answer (``decide``), the orders application's database listener, which records
its answers too, and the readers, ``read_committed`` consumers of the real,
DLQ and QUARANTINE topics that record every copy of a workload message (``recv``) with the
id found in its headers or, in QUARANTINE, in the envelope it holds.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from sqlalchemy import Engine

from bridge import MessageExt, TransactionListener, TransactionStatus
from bridge.codec import decode_envelope
from bridge.db import DatabaseTransactionListener
from chaos.history import ID_PROPERTY, now_ms

if TYPE_CHECKING:
    from chaos.workload_state import WorkloadState

logger = logging.getLogger("chaos.workload")


def header_id(headers: Iterable[tuple[str, bytes | None]] | None) -> str | None:
    """The workload id in a record's headers, or None."""
    for name, value in headers or ():
        if name == ID_PROPERTY and value is not None:
            return value.decode("utf-8", "replace")
    return None


def prop_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class DecisionListener(TransactionListener):
    """Answers per message's intent and records each answer as a ``decide`` event."""

    def __init__(self, workload: WorkloadState) -> None:
        self._w = workload

    def _intent(self, msg: MessageExt) -> tuple[str | None, str | None]:
        wid = prop_text(msg.user_properties.get(ID_PROPERTY))
        spec = self._w.specs.get(wid) if wid else None
        return wid, spec.intent if spec else None

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        wid, intent = self._intent(msg)
        if self._w.database_is_down.is_set():
            intent = None  # the local transaction's outcome cannot be told: UNKNOWN
        status = {
            "commit": TransactionStatus.COMMIT,
            "rollback": TransactionStatus.ROLLBACK,
        }.get(intent or "", TransactionStatus.UNKNOWN)
        if wid:
            self._w.history.write("decide", id=wid, status=status.value, via="execute")
        return status

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        wid, intent = self._intent(msg)
        if self._w.database_is_down.is_set():
            intent = None
        if intent in ("commit", "unknown_then_commit"):
            status = TransactionStatus.COMMIT
        elif intent in ("rollback", "unknown_then_rollback"):
            status = TransactionStatus.ROLLBACK
        else:
            status = TransactionStatus.UNKNOWN
        if wid:
            self._w.history.write("decide", id=wid, status=status.value, via="check")
        return status


class Reader(threading.Thread):
    """A ``read_committed`` confluent-kafka consumer assigned every partition of ``topics``
    from the beginning (no group, positions in memory): records ``recv`` for every record that
    carries a workload id (``id_of`` finds it)."""

    def __init__(
        self,
        workload: WorkloadState,
        observer: str,
        role: str,
        topics: list[str],
        id_of: Callable[[Any], tuple[str | None, dict[str, str]]],
    ) -> None:
        super().__init__(name=f"chaos-reader-{observer}", daemon=True)
        self._w = workload
        self.observer = observer
        self.role = role
        self.topics = topics
        self._id_of = id_of
        self._stop_event = threading.Event()
        self.records = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stop_event.set()

    def _partitions(self, consumer: Consumer) -> list[TopicPartition]:
        """Every partition of the topics, waiting for topics that do not exist yet."""
        out: list[TopicPartition] = []
        for topic in self.topics:
            while not self._stop_event.is_set():
                try:
                    meta = consumer.list_topics(topic, timeout=5)
                    info = meta.topics.get(topic)
                    if info is not None and info.error is None and info.partitions:
                        out += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in info.partitions]
                        break
                except KafkaException:
                    pass
                self._stop_event.wait(0.5)
        return out

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self._w.config.reader_bootstrap,
                "group.id": f"chaos-{self.observer}-{uuid.uuid4().hex[:8]}",
                "client.id": f"chaos-{self.observer}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "logger": logging.getLogger("chaos.rdkafka"),
            }
        )
        try:
            consumer.assign(self._partitions(consumer))
            while not self._stop_event.is_set():
                for record in consumer.consume(100, 0.2):
                    error = record.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            logger.debug("%s: %s", self.observer, error.str())
                        continue
                    self._seen(record)
        except BaseException as exc:  # recorded; the run reports a reader that died
            self.error = exc
            logger.exception("reader %s failed", self.observer)
        finally:
            consumer.close()

    def _seen(self, record: Any) -> None:
        t = now_ms()
        try:
            wid, props = self._id_of(record)
        except Exception as exc:  # an unreadable record is no workload record
            logger.debug("%s: record without a readable id: %s", self.observer, exc)
            return
        if wid is None:
            return
        self.records += 1
        fields: dict[str, Any] = {
            "id": wid,
            "observer": self.observer,
            "role": self.role,
            "topic": record.topic(),
            "partition": record.partition(),
            "offset": record.offset(),
        }
        if props:
            fields["props"] = props
        self._w.history.write("recv", t=t, **fields)
        self._w.observed(wid, self.observer)


def plain_id(record: Any) -> tuple[str | None, dict[str, str]]:
    headers = record.headers() or []
    wid = header_id(headers)
    props = {}
    for name, value in headers:
        if name == "UNIQ_KEY" and value is not None:
            props["msg_id"] = value.decode("utf-8", "replace")
    return wid, props


def quarantine_id(record: Any) -> tuple[str | None, dict[str, str]]:
    """A QUARANTINE copy keeps the original record's headers; a delayed message's copy holds
    its SCHEDULE or timer envelope, whose properties carry the id."""
    headers = record.headers() or []
    props: dict[str, str] = {}
    for name, value in headers:
        if name in ("QUARANTINE_REASON", "QUARANTINE_SOURCE_TOPIC") and value is not None:
            props[name] = value.decode("utf-8", "replace")[:300]
    wid = header_id(headers)
    if wid is None and record.value():
        try:
            msg = decode_envelope(record.value())
            wid = prop_text(msg.properties.get(ID_PROPERTY))
        except Exception:
            wid = None
    if wid is None and record.key():
        key = record.key().decode("utf-8", "replace")
        if key.startswith("poison-"):
            wid = key
    return wid, props


class OrdersListener(DatabaseTransactionListener):
    """The orders application's :class:`~bridge.db.DatabaseTransactionListener`, recording
    each answer as a ``decide`` event. During a ``db_outage`` its database is away: the
    business work fails (ROLLBACK: no order row; the listener's fence leaves a ROLLBACK row in
    the log) and a check cannot read the log (UNKNOWN, asked again later)."""

    def __init__(self, workload: WorkloadState, engine: Engine) -> None:
        super().__init__(engine)
        self._w = workload

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        status = super().execute_local_transaction(msg, arg)
        self._decided(msg, status, "execute")
        return status

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        if self._w.database_is_down.is_set():
            status = TransactionStatus.UNKNOWN
        else:
            status = super().check_local_transaction(msg)
        self._decided(msg, status, "check")
        return status

    def _decided(self, msg: MessageExt, status: TransactionStatus, via: str) -> None:
        wid = prop_text(msg.user_properties.get(ID_PROPERTY))
        if not wid:
            return
        self._w.history.write("decide", id=wid, status=status.value, via=via)
        spec = self._w.specs.get(wid)
        if spec is not None and status is TransactionStatus.COMMIT:
            spec.committed = True  # its message and its effect are awaited by the drain
