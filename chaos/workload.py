"""The workload of a fault-injection run: a steady, modest mix of every kind of operation the
bridge promises something about, each recorded in the history (:mod:`chaos.history`) with what
it was told and what every reader and listener saw.

Senders, one thread per kind, each at its own rate (operations per second) and with its own
``random.Random`` drawn from the run's seed, so a seed always gives the same operations (the
timing depends on the machine):

* ``tx``: :class:`~bridge.TransactionMQProducer` sends whose listener answers per message's
  intent (commit, rollback, UNKNOWN then COMMIT on check-back, UNKNOWN then ROLLBACK); every
  answer is a ``decide`` event;
* ``delay``: delay levels 1-3 (the run scales ``message_delay_level`` down, e.g. ``1s 2s 3s``);
* ``timer``: timers a few seconds ahead (absolute deliver times);
* ``consume``: plain sends to a topic a CLUSTERING :class:`~bridge.PushConsumer` handles; its
  listener fails each message ``fail_times`` times, some more than ``max_reconsume_times``
  (they end in the DLQ);
* ``orderly``: plain sends of a few sharding keys with increasing ``seq`` to a topic an orderly
  consumer handles; a share fail a few times in place;
* ``broadcast``: plain sends to a topic two BROADCASTING instances handle; a share fail (a
  BROADCASTING failure is dropped, as in RocketMQ);
* ``poison``: on demand (:meth:`Workload.send_poison`), records the README says are set aside
  without holding anything back: a delayed message to a topic that does not exist (auto
  creation off), a delayed message larger than its topic's ``max.message.bytes``, a malformed
  record in the SCHEDULE topic and one in the consumer group's retry topic (the last two
  written raw with confluent-kafka, as a foreign client would).

Producers and push consumers use the client bootstrap (the fault proxy's listener in a cluster
run, so network faults hit them); the readers, the measuring instrument, read the brokers
directly: a ``read_committed`` reader of the tx, delay and timer topics, a DLQ reader and a
QUARANTINE reader, each assigned every partition with its position kept in memory (no group:
a rebalance or a moved group coordinator never makes them read a record twice).
"""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic

from bridge import (
    BridgeError,
    ClientConfig,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    Producer,
    PushConsumer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
)
from bridge.codec import decode_envelope
from bridge.errors import SendTimeoutError
from chaos.history import ID_PROPERTY, HistoryWriter, now_ms
from topics.catalog import SystemTopic
from topics.naming import to_kafka_topic

logger = logging.getLogger(__name__)

TX_TOPIC: Final = "chaos-tx"
DELAY_TOPIC: Final = "chaos-delay"
TIMER_TOPIC: Final = "chaos-timer"
CONSUME_TOPIC: Final = "chaos-consume"
ORDERLY_TOPIC: Final = "chaos-orderly"
BROADCAST_TOPIC: Final = "chaos-broadcast"
SMALL_TOPIC: Final = "chaos-poison-small"
"""A real topic with a tiny ``max.message.bytes``: a delayed message larger than that is
poison for the delay service."""
MISSING_TOPIC: Final = "chaos-poison-missing"
"""Never created (the run's brokers do not create topics on first use)."""
SMALL_TOPIC_MAX_BYTES: Final = 1024

TX_GROUP: Final = "chaos-tx-producer"
PRODUCER_GROUP: Final = "chaos-producer"
CONSUME_GROUP: Final = "chaos-consume"
ORDERLY_GROUP: Final = "chaos-orderly"
BROADCAST_GROUP: Final = "chaos-broadcast"
BROADCAST_INSTANCES: Final = ("a", "b")

ORDER_KEYS: Final = ("order-0", "order-1", "order-2", "order-3")
ORDERLY_SUSPEND_MS: Final = 300
"""How long the orderly consumer waits before it retries a failed message in place, ms."""

POISON_KINDS: Final = ("missing_topic", "too_large", "malformed_schedule", "malformed_retry")
"""What is wrong with a poison record (the ``poison`` field of its ``send`` event)."""

DEFAULT_RATES: Final[Mapping[str, float]] = {
    "tx": 4.0,
    "delay": 2.0,
    "timer": 2.0,
    "consume": 4.0,
    "orderly": 3.0,
    "broadcast": 2.0,
}
"""Operations per second of each kind: about 17 in all, what 2 cores running three brokers and
two coordinators besides keep up with comfortably."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What the workload sends, how fast, and where."""

    seed: int
    client_bootstrap: str
    """Producers and push consumers connect here (the fault proxy in a cluster run)."""
    reader_bootstrap: str
    """Readers and topic administration connect here (the brokers directly)."""
    namespace: str = "rmq"
    message_delay_level: str = "1s 2s 3s"
    """RocketMQ's ``messageDelayLevel``, scaled down; the coordinators use the same."""
    timer_precision_ms: int = 500
    max_reconsume_times: int = 2
    """Of the CLUSTERING consumer: a message failed more often goes to the DLQ."""
    replication_factor: int = 3
    min_insync_replicas: int = 2
    partitions: int = 4
    """Of each workload topic (the broadcast topic has 2)."""
    rates: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    """Operations per second per kind; a kind at 0 is not sent."""
    send_msg_timeout_ms: int = 3000

    def client_config(self, bootstrap: str | None = None) -> ClientConfig:
        """The bridge client settings (same delay table and precision as the coordinators)."""
        return ClientConfig(
            bootstrap_servers=bootstrap or self.client_bootstrap,
            namespace=self.namespace,
            message_delay_level=self.message_delay_level,
            timer_precision_ms=self.timer_precision_ms,
            send_msg_timeout_ms=self.send_msg_timeout_ms,
        )

    @property
    def delay_levels_ms(self) -> list[int]:
        """The delay of each level, ms."""
        return list(self.client_config().delay_policy.level_delays_ms)


@dataclass(slots=True)
class Spec:
    """What one operation is meant to do (kept in memory for the listeners and the drain)."""

    id: str
    kind: str
    intent: str | None = None
    fail_times: int = 0
    key: str | None = None
    seq: int | None = None
    poison: str | None = None


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]


def _indeterminate(exc: BaseException) -> bool:
    """A send that failed this way may still have been stored."""
    if isinstance(exc, SendTimeoutError):
        return True
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text or "_msg_timed_out" in text


def header_id(headers: Iterable[tuple[str, bytes | None]] | None) -> str | None:
    """The workload id in a record's headers, or None."""
    for name, value in headers or ():
        if name == ID_PROPERTY and value is not None:
            return value.decode("utf-8", "replace")
    return None


def _prop_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class _Listener(TransactionListener):
    """Answers per message's intent and records each answer as a ``decide`` event."""

    def __init__(self, workload: Workload) -> None:
        self._w = workload

    def _intent(self, msg: MessageExt) -> tuple[str | None, str | None]:
        wid = _prop_text(msg.user_properties.get(ID_PROPERTY))
        spec = self._w.specs.get(wid) if wid else None
        return wid, spec.intent if spec else None

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        wid, intent = self._intent(msg)
        status = {
            "commit": TransactionStatus.COMMIT,
            "rollback": TransactionStatus.ROLLBACK,
        }.get(intent or "", TransactionStatus.UNKNOWN)
        if wid:
            self._w.history.write("decide", id=wid, status=status.value, via="execute")
        return status

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        wid, intent = self._intent(msg)
        if intent in ("commit", "unknown_then_commit"):
            status = TransactionStatus.COMMIT
        elif intent in ("rollback", "unknown_then_rollback"):
            status = TransactionStatus.ROLLBACK
        else:
            status = TransactionStatus.UNKNOWN
        if wid:
            self._w.history.write("decide", id=wid, status=status.value, via="check")
        return status


class _Reader(threading.Thread):
    """A ``read_committed`` confluent-kafka consumer assigned every partition of ``topics``
    from the beginning (no group, positions in memory): records ``recv`` for every record that
    carries a workload id (``id_of`` finds it)."""

    def __init__(
        self,
        workload: Workload,
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


def _plain_id(record: Any) -> tuple[str | None, dict[str, str]]:
    headers = record.headers() or []
    wid = header_id(headers)
    props = {}
    for name, value in headers:
        if name == "UNIQ_KEY" and value is not None:
            props["msg_id"] = value.decode("utf-8", "replace")
    return wid, props


def _quarantine_id(record: Any) -> tuple[str | None, dict[str, str]]:
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
            wid = _prop_text(msg.properties.get(ID_PROPERTY))
        except Exception:
            wid = None
    if wid is None and record.key():
        key = record.key().decode("utf-8", "replace")
        if key.startswith("poison-"):
            wid = key
    return wid, props


class Workload:
    """Senders, push consumers and readers of one run, all writing to ``history``.

    ``start()`` starts the consumers and readers and then the senders; ``stop_load()`` stops
    the senders; ``drain(timeout_s)`` waits for every expected observation; ``stop()`` stops
    everything (bounded)."""

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
        self._threads: list[threading.Thread] = []
        self._readers: list[_Reader] = []
        self._consumers: list[PushConsumer] = []
        self._producer: Producer | None = None
        self._tx_producer: TransactionMQProducer | None = None
        self._raw: KafkaProducer | None = None
        self._poison_rng = random.Random(f"{config.seed}-poison")
        self._poison_lock = threading.Lock()
        client = config.client_config()
        catalog = client.catalog()
        self.schedule_topic = catalog.topic(SystemTopic.SCHEDULE)
        self.quarantine_topic = catalog.topic(SystemTopic.QUARANTINE)
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
        }
        return fixed.get(kind, [])

    def outstanding(self) -> dict[str, list[str]]:
        """Acknowledged operations whose expected observations have not all arrived, by kind."""
        out: dict[str, list[str]] = defaultdict(list)
        with self._lock:
            acked = [wid for wid, ok in self._acked.items() if ok]
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

    # --- setup ----------------------------------------------------------------------------
    def create_topics(self) -> None:
        """Create the workload's real topics (replicated as configured); idempotent."""
        cfg = self.config
        admin = AdminClient({"bootstrap.servers": cfg.reader_bootstrap})
        base = {"min.insync.replicas": str(cfg.min_insync_replicas)}
        topics = [
            NewTopic(t, cfg.partitions, cfg.replication_factor, config=base)
            for t in (TX_TOPIC, DELAY_TOPIC, TIMER_TOPIC, CONSUME_TOPIC, ORDERLY_TOPIC)
        ]
        topics.append(NewTopic(BROADCAST_TOPIC, 2, cfg.replication_factor, config=base))
        topics.append(
            NewTopic(
                SMALL_TOPIC, 1, cfg.replication_factor,
                config={**base, "max.message.bytes": str(SMALL_TOPIC_MAX_BYTES)},
            )
        )  # fmt: skip
        futures = admin.create_topics(topics, request_timeout=30)
        for future in futures.values():
            try:
                future.result(timeout=60)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        deadline = time.monotonic() + 60
        names = {t.topic for t in topics}
        while time.monotonic() < deadline:
            meta = admin.list_topics(timeout=10)
            ready = {
                n
                for n in names
                if n in meta.topics
                and meta.topics[n].error is None
                and all(p.leader >= 0 for p in meta.topics[n].partitions.values())
            }
            if ready == names:
                return
            time.sleep(0.5)
        raise BridgeError(f"workload topics not ready within 60 s: {sorted(names - ready)}")

    def start(self) -> None:
        """Start producers, push consumers and readers, then the senders."""
        cfg = self.config
        client = cfg.client_config()
        self._producer = Producer(PRODUCER_GROUP, config=client)
        self._producer.start()
        self._tx_producer = TransactionMQProducer(
            TX_GROUP, _Listener(self), config=client, check_thread_pool_size=2
        )
        self._tx_producer.start()
        self._raw = KafkaProducer(
            {
                "bootstrap.servers": cfg.reader_bootstrap,
                "client.id": "chaos-poison",
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": cfg.send_msg_timeout_ms * 3,
                "logger": logging.getLogger("chaos.rdkafka"),
            }
        )
        self._start_consumers(client)
        plain = [TX_TOPIC, DELAY_TOPIC, TIMER_TOPIC]
        self._readers = [
            _Reader(self, "reader", "reader", plain, _plain_id),
            _Reader(self, "dlq", "dlq_reader", [self.dlq_topic], _plain_id),
            _Reader(
                self, "quarantine", "quarantine_reader", [self.quarantine_topic], _quarantine_id
            ),
        ]
        for reader in self._readers:
            reader.start()
        senders: dict[str, Callable[[random.Random], None]] = {
            "tx": self._send_tx,
            "delay": self._send_delay,
            "timer": self._send_timer,
            "consume": self._send_consume,
            "orderly": self._send_orderly,
            "broadcast": self._send_broadcast,
        }
        for kind, send in senders.items():
            rate = cfg.rates.get(kind, 0.0)
            if rate <= 0:
                continue
            thread = threading.Thread(
                target=self._sender_loop, args=(kind, rate, send), name=f"chaos-send-{kind}",
                daemon=True,
            )  # fmt: skip
            self._threads.append(thread)
            thread.start()

    def _start_consumers(self, client: ClientConfig) -> None:
        cfg = self.config
        common: dict[str, Any] = {
            "config": client,
            "consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            "consume_thread_count": 4,
            "drain_timeout_ms": 3000,
        }
        consume = PushConsumer(
            CONSUME_GROUP, max_reconsume_times=cfg.max_reconsume_times,
            send_back_retry_delay_ms=1000, **common,
        )  # fmt: skip
        consume.subscribe(CONSUME_TOPIC, self._listener("consume", CONSUME_GROUP, orderly=False))
        orderly = PushConsumer(
            ORDERLY_GROUP,
            orderly=True,
            suspend_current_queue_time_millis=ORDERLY_SUSPEND_MS,
            **common,
        )
        orderly.subscribe(ORDERLY_TOPIC, self._listener("orderly", ORDERLY_GROUP, orderly=True))
        self._consumers = [consume, orderly]
        for instance in BROADCAST_INSTANCES:
            broadcast = PushConsumer(
                BROADCAST_GROUP, message_model=MessageModel.BROADCASTING, instance_name=instance,
                **common,
            )  # fmt: skip
            broadcast.subscribe(
                BROADCAST_TOPIC,
                self._listener(f"broadcast-{instance}", BROADCAST_GROUP, orderly=False),
            )
            self._consumers.append(broadcast)
        for consumer in self._consumers:
            consumer.start()

    def _listener(
        self, observer: str, group: str, *, orderly: bool
    ) -> Callable[[MessageExt], ConsumeStatus | ConsumeOrderlyStatus]:
        broadcast = observer.startswith("broadcast-")
        ok: ConsumeStatus | ConsumeOrderlyStatus = (
            ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeStatus.CONSUME_SUCCESS
        )
        again: ConsumeStatus | ConsumeOrderlyStatus = (
            ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if orderly
            else ConsumeStatus.RECONSUME_LATER
        )

        def listen(msg: MessageExt) -> ConsumeStatus | ConsumeOrderlyStatus:
            t = now_ms()
            wid = _prop_text(msg.user_properties.get(ID_PROPERTY))
            spec = self.specs.get(wid) if wid else None
            if wid is None or spec is None:
                return ok
            times = msg.reconsume_times
            # Broadcasting drops a failure: it fails once, the first time it is seen.
            fail = spec.fail_times > 0 if broadcast else times < spec.fail_times
            result = "fail" if fail else "success"
            self.history.write(
                "recv", t=t, id=wid, observer=observer, role="listener", topic=msg.kafka_topic,
                partition=msg.queue_id, offset=msg.queue_offset, reconsume_times=times,
                group=group, result=result, props={"msg_id": msg.msg_id},
            )  # fmt: skip
            self.observed(wid, observer)
            if not fail:
                self.observed(wid, f"{observer}:success")
            return again if fail else ok

        return listen

    # --- senders --------------------------------------------------------------------------
    def _sender_loop(self, kind: str, rate: float, send: Callable[[random.Random], None]) -> None:
        rng = random.Random(f"{self.config.seed}-{kind}")
        interval = 1.0 / rate
        next_at = time.monotonic() + rng.uniform(0, interval)
        while not self._stop_load.wait(max(0.0, next_at - time.monotonic())):
            try:
                send(rng)
            except Exception:  # a bug in the workload: logged, the load goes on
                logger.exception("sender %s failed", kind)
            # No catch-up burst after a blocked send: the next one is an interval from now.
            next_at = max(next_at + interval * rng.uniform(0.7, 1.3), time.monotonic())

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
            fields["error"] = error if isinstance(error, str) else _error_text(error)
        self.history.write("ack", **fields)
        if not indeterminate:
            with self._lock:
                self._acked[wid] = ok

    def _sync(self, spec: Spec, msg: Message) -> None:
        assert self._producer is not None
        try:
            result = self._producer.send_sync(msg)
        except BridgeError as exc:
            self._record_ack(spec.id, False, error=exc, indeterminate=_indeterminate(exc))
            return
        self._record_ack(spec.id, True, msg_id=result.msg_id)

    def _message(self, topic: str, wid: str, **kwargs: Any) -> Message:
        msg = Message(topic, f"{wid} {uuid.uuid4().hex}".encode(), **kwargs)
        msg.put_user_property(ID_PROPERTY, wid)
        return msg

    def _send_tx(self, rng: random.Random) -> None:
        assert self._tx_producer is not None
        intent = rng.choices(
            ("commit", "rollback", "unknown_then_commit", "unknown_then_rollback"),
            weights=(40, 20, 25, 15),
        )[0]
        spec = Spec(self._new_id("tx"), "tx", intent=intent)
        self._record_send(spec, TX_TOPIC, intent=intent)
        msg = self._message(TX_TOPIC, spec.id, keys=spec.id)
        try:
            result = self._tx_producer.send_message_in_transaction(msg, spec.id)
        except BridgeError as exc:
            self._record_ack(spec.id, False, error=exc, indeterminate=_indeterminate(exc))
            return
        self._record_ack(spec.id, True, msg_id=result.msg_id)

    def _send_delay(self, rng: random.Random) -> None:
        level = rng.randint(1, 3)
        spec = Spec(self._new_id("delay"), "delay")
        delay_ms = self.config.delay_levels_ms[level - 1]
        self._record_send(spec, DELAY_TOPIC, delay_ms=delay_ms, level=level)
        self._sync(spec, self._message(DELAY_TOPIC, spec.id, keys=spec.id, delay_time_level=level))

    def _send_timer(self, rng: random.Random) -> None:
        delay_ms = rng.randint(1000, 5000)
        spec = Spec(self._new_id("timer"), "timer")
        t = float(math.floor(now_ms()))
        msg = self._message(TIMER_TOPIC, spec.id, keys=spec.id)
        msg.set_deliver_time_ms(int(t) + delay_ms)
        self._record_send(spec, TIMER_TOPIC, t=t, delay_ms=delay_ms)
        self._sync(spec, msg)

    def _send_consume(self, rng: random.Random) -> None:
        # Most succeed at once; some after a retry or two; a share end in the DLQ.
        fail_times = rng.choices((0, 1, 2, 3), weights=(60, 15, 10, 15))[0]
        spec = Spec(self._new_id("consume"), "consume", fail_times=fail_times)
        self._record_send(spec, CONSUME_TOPIC, fail_times=fail_times, group=CONSUME_GROUP)
        self._sync(spec, self._message(CONSUME_TOPIC, spec.id, keys=spec.id))

    def _send_orderly(self, rng: random.Random) -> None:
        key = rng.choice(ORDER_KEYS)
        fail_times = rng.choices((0, 1, 2), weights=(80, 12, 8))[0]
        with self._lock:
            seq = self._seq[key]
            self._seq[key] += 1
        spec = Spec(self._new_id("orderly"), "orderly", fail_times=fail_times, key=key, seq=seq)
        self._record_send(spec, ORDERLY_TOPIC, fail_times=fail_times, group=ORDERLY_GROUP)
        self._sync(spec, self._message(ORDERLY_TOPIC, spec.id, sharding_key=key))

    def _send_broadcast(self, rng: random.Random) -> None:
        fail_times = rng.choices((0, 1), weights=(80, 20))[0]
        spec = Spec(self._new_id("broadcast"), "broadcast", fail_times=fail_times)
        self._record_send(spec, BROADCAST_TOPIC, fail_times=fail_times, group=BROADCAST_GROUP)
        self._sync(spec, self._message(BROADCAST_TOPIC, spec.id, keys=spec.id))

    # --- poison ---------------------------------------------------------------------------
    def send_poison(self, count: int) -> list[str]:
        """Send ``count`` poison records (kinds in turn, starting where the seed says); return
        their ids."""
        ids = []
        with self._poison_lock:
            for _ in range(count):
                ids.append(self._send_one_poison(self._poison_rng.choice(POISON_KINDS)))
        return ids

    def _send_one_poison(self, what: str) -> str:
        spec = Spec(self._new_id("poison"), "poison", poison=what)
        wid = spec.id
        if what == "missing_topic":
            self._record_send(spec, MISSING_TOPIC, poison=what, expect="quarantine")
            msg = self._message(MISSING_TOPIC, wid, keys=wid)
            msg.set_delay_time_ms(1000)
            self._sync(spec, msg)
        elif what == "too_large":
            self._record_send(spec, SMALL_TOPIC, poison=what, expect="quarantine")
            msg = Message(SMALL_TOPIC, b"x" * (SMALL_TOPIC_MAX_BYTES * 4), keys=wid,
                          delay_time_level=1)  # fmt: skip
            msg.put_user_property(ID_PROPERTY, wid)
            self._sync(spec, msg)
        elif what == "malformed_schedule":
            self._record_send(spec, self.schedule_topic, poison=what, expect="quarantine")
            self._raw_send(wid, self.schedule_topic, 0, b"\x00 not a SCHEDULE envelope", [])
        else:  # malformed_retry: RECONSUME_TIME is no count
            self._record_send(spec, self.retry_topic, poison=what, expect="quarantine")
            self._raw_send(
                wid, self.retry_topic, None, b"poison retry record",
                [("RETRY_TOPIC", CONSUME_TOPIC.encode()), ("RECONSUME_TIME", b"many")],
            )  # fmt: skip
        return wid

    def _raw_send(
        self, wid: str, topic: str, partition: int | None, value: bytes,
        headers: list[tuple[str, bytes]],
    ) -> None:  # fmt: skip
        assert self._raw is not None
        done = threading.Event()
        outcome: list[KafkaError | None] = []

        def report(err: KafkaError | None, _: Any) -> None:
            outcome.append(err)
            done.set()

        kwargs: dict[str, Any] = {"partition": partition} if partition is not None else {}
        try:
            self._raw.produce(
                topic, value, wid.encode(), headers=[(ID_PROPERTY, wid.encode()), *headers],
                on_delivery=report, **kwargs,
            )  # fmt: skip
        except (KafkaException, BufferError) as exc:
            self._record_ack(wid, False, error=exc)
            return
        deadline = time.monotonic() + self.config.send_msg_timeout_ms * 4 / 1000
        while not done.is_set() and time.monotonic() < deadline:
            self._raw.poll(0.1)
        if not outcome:
            self._record_ack(wid, False, error="no delivery report", indeterminate=True)
        elif outcome[0] is not None:
            err = outcome[0]
            self._record_ack(
                wid, False, error=f"{err.name()}: {err.str()}",
                indeterminate=err.code() == KafkaError._MSG_TIMED_OUT,
            )  # fmt: skip
        else:
            self._record_ack(wid, True)

    # --- end ------------------------------------------------------------------------------
    def stop_load(self) -> None:
        """Stop the senders (each finishes the send it is in)."""
        self._stop_load.set()
        for thread in self._threads:
            thread.join(self.config.send_msg_timeout_ms / 1000 * 3 + 5)

    def drain(self, timeout_s: float, poll_s: float = 0.5) -> tuple[bool, str]:
        """Wait until every acknowledged operation's expected observations arrived, or
        ``timeout_s`` passed; (all arrived, detail)."""
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        while True:
            missing = self.outstanding()
            if not missing:
                took = time.monotonic() - started
                return True, f"every expected observation arrived in {took:.1f} s"
            if time.monotonic() >= deadline:
                parts = []
                for kind, ids in sorted(missing.items()):
                    more = ", ..." if len(ids) > 5 else ""
                    parts.append(f"{kind}: {len(ids)} ({', '.join(ids[:5])}{more})")
                return False, f"gave up after {timeout_s:.0f} s; still missing " + "; ".join(parts)
            time.sleep(poll_s)

    def reader_errors(self) -> list[str]:
        """Readers that died (their observations stop there)."""
        return [f"{r.observer}: {r.error!r}" for r in self._readers if r.error is not None]

    def stop(self) -> None:
        """Stop everything, each step bounded; safe to call twice and after a failed start."""
        self._stop_load.set()
        for consumer in self._consumers:
            try:
                consumer.shutdown(3000)
            except Exception:
                logger.exception("stopping push consumer %s", consumer.group)
        if self._tx_producer is not None:
            try:
                self._tx_producer.shutdown(2000)
            except Exception:
                logger.exception("stopping the transaction producer")
        if self._producer is not None:
            try:
                self._producer.shutdown(2000)
            except Exception:
                logger.exception("stopping the producer")
        if self._raw is not None:
            self._raw.flush(2)
        for reader in self._readers:
            reader.stop()
        for reader in self._readers:
            reader.join(10)


SPARK_TIMEOUT_S: Final = 240


def run_spark_ingest(bootstrap: str, topics: list[str], work_dir: Path,
                     timeout_s: float = SPARK_TIMEOUT_S) -> tuple[list[str], str]:  # fmt: skip
    """Run the project's ingest job (``available-now``, read_committed) over ``topics`` in a
    child process and read back the workload id of every row it wrote; (ids, detail)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / "spark-ids.json"
    cmd = [
        sys.executable, "-m", "chaos", "spark-ingest", "--bootstrap-servers", bootstrap,
        "--topics", ",".join(topics), "--work-dir", str(work_dir), "--out", str(out),
    ]  # fmt: skip
    log = (work_dir / "spark.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BridgeError(f"the Spark ingest did not finish within {timeout_s:.0f} s") from None
    if code != 0 or not out.is_file():
        tail = (work_dir / "spark.log").read_text(errors="replace").splitlines()[-20:]
        raise BridgeError(f"the Spark ingest failed (exit {code}): " + "\n".join(tail))
    ids = json.loads(out.read_text())
    return ids, f"{len(ids)} rows in {time.monotonic() - started:.0f} s"


def spark_ingest_main(bootstrap: str, topics: list[str], work_dir: Path, out: Path) -> None:
    """In the child process: run the ingest job into ``work_dir`` and write the workload ids
    of its rows (a JSON list, repeats kept) to ``out``."""
    # Only in the Spark child: the run itself never loads PySpark.
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    from spark_jobs.common import spark_session  # noqa: PLC0415
    from spark_jobs.ingest import IngestConfig, start_ingest  # noqa: PLC0415

    spark = spark_session("chaos-ingest", master="local[2]")
    try:
        config = IngestConfig(
            bootstrap_servers=bootstrap,
            output=str(work_dir / "table"),
            checkpoint=str(work_dir / "checkpoint"),
            topics=tuple(topics),
        )
        start_ingest(spark, config).awaitTermination()
        rows = (
            spark.read.parquet(config.output)
            .select(F.col("properties").getItem(ID_PROPERTY).alias("id"))
            .collect()
        )
        ids = [row["id"] for row in rows if row["id"] is not None]
        out.write_text(json.dumps(ids))
    finally:
        spark.stop()
