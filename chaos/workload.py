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
* ``db``: an orders application places orders through a ``DatabaseTransactionListener`` over
  an SQLite database (its row and its message together; 15% fail their business rule and roll
  back), and an inventory application applies each through an ``IdempotentListener`` over a
  second one (an effect row per handler run), when the config names ``database_dir``;
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

The parts: :mod:`chaos.workload_spec` (topics, groups, rates, the config),
:mod:`chaos.workload_state` (what was sent, acknowledged and seen),
:mod:`chaos.workload_senders` (the sender loops and poison records),
:mod:`chaos.workload_observers` (the transaction listener and the readers) and
:mod:`chaos.workload_spark` (the Spark ingest); this module starts and stops them, holds the
push consumers' listeners and re-exports every public name.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, NewTopic

from bridge import (
    BridgeError,
    ClientConfig,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageExt,
    MessageModel,
    Producer,
    PushConsumer,
    TransactionMQProducer,
)
from bridge.db import IdempotentListener
from chaos.history import ID_PROPERTY, now_ms
from chaos.workload_database import apply_order, committed, open_databases
from chaos.workload_observers import (
    DecisionListener,
    OrdersListener,
    Reader,
    header_id,
    plain_id,
    prop_text,
    quarantine_id,
)
from chaos.workload_senders import WorkloadSenders
from chaos.workload_spark import SPARK_TIMEOUT_S, run_spark_ingest, spark_ingest_main
from chaos.workload_spec import (
    BROADCAST_GROUP,
    BROADCAST_INSTANCES,
    BROADCAST_TOPIC,
    CONSUME_GROUP,
    CONSUME_TOPIC,
    DB_CONSUME_GROUP,
    DB_PRODUCER_GROUP,
    DB_TOPIC,
    DEFAULT_RATES,
    DELAY_TOPIC,
    MISSING_TOPIC,
    ORDER_KEYS,
    ORDERLY_GROUP,
    ORDERLY_SUSPEND_MS,
    ORDERLY_TOPIC,
    POISON_KINDS,
    PRODUCER_GROUP,
    SMALL_TOPIC,
    SMALL_TOPIC_MAX_BYTES,
    TIMER_TOPIC,
    TX_GROUP,
    TX_TOPIC,
    Spec,
    WorkloadConfig,
)

__all__ = [
    "BROADCAST_GROUP",
    "BROADCAST_INSTANCES",
    "BROADCAST_TOPIC",
    "CONSUME_GROUP",
    "CONSUME_TOPIC",
    "DB_CONSUME_GROUP",
    "DB_PRODUCER_GROUP",
    "DB_TOPIC",
    "DEFAULT_RATES",
    "DELAY_TOPIC",
    "MISSING_TOPIC",
    "ORDERLY_GROUP",
    "ORDERLY_SUSPEND_MS",
    "ORDERLY_TOPIC",
    "ORDER_KEYS",
    "POISON_KINDS",
    "PRODUCER_GROUP",
    "SMALL_TOPIC",
    "SMALL_TOPIC_MAX_BYTES",
    "SPARK_TIMEOUT_S",
    "TIMER_TOPIC",
    "TX_GROUP",
    "TX_TOPIC",
    "Spec",
    "Workload",
    "WorkloadConfig",
    "header_id",
    "run_spark_ingest",
    "spark_ingest_main",
]

logger = logging.getLogger(__name__)


class Workload(WorkloadSenders):
    """Senders, push consumers and readers of one run, all writing to ``history``.

    ``start()`` starts the consumers and readers and then the senders; ``stop_load()`` stops
    the senders; ``drain(timeout_s)`` waits for every expected observation; ``stop()`` stops
    everything (bounded)."""

    # --- setup ----------------------------------------------------------------------------
    def create_topics(self) -> None:
        """Create the workload's real topics (replicated as configured); idempotent."""
        cfg = self.config
        admin = AdminClient({"bootstrap.servers": cfg.reader_bootstrap})
        base = {"min.insync.replicas": str(cfg.min_insync_replicas)}
        topics = [
            NewTopic(t, cfg.partitions, cfg.replication_factor, config=base)
            for t in (TX_TOPIC, DELAY_TOPIC, TIMER_TOPIC, CONSUME_TOPIC, ORDERLY_TOPIC, DB_TOPIC)
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
            TX_GROUP, DecisionListener(self), config=client, check_thread_pool_size=2
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
        if self._start_databases(client):
            plain.append(DB_TOPIC)
        self._readers = [
            Reader(self, "reader", "reader", plain, plain_id),
            Reader(self, "dlq", "dlq_reader", [self.dlq_topic], plain_id),
            Reader(self, "quarantine", "quarantine_reader", [self.quarantine_topic], quarantine_id),
            Reader(self, "parked", "parked_reader", [self.parked_topic], quarantine_id),
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
            "db": self._send_db,
        }
        for kind, send in senders.items():
            rate = cfg.rates.get(kind, 0.0)
            if rate <= 0 or (kind == "db" and self._databases is None):
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

    def _start_databases(self, client: ClientConfig) -> bool:
        """Start the ``db`` kind's two applications (when the config names a directory for
        their databases and a rate): the orders producer and the inventory consumer."""
        cfg = self.config
        if cfg.database_dir is None or cfg.rates.get("db", 0.0) <= 0:
            return False
        orders_db, inventory_db = self._databases = open_databases(cfg.database_dir)
        self._db_producer = TransactionMQProducer(
            DB_PRODUCER_GROUP, OrdersListener(self, orders_db), config=client,
            check_thread_pool_size=2,
        )  # fmt: skip
        self._db_producer.start()
        inbox = IdempotentListener(inventory_db, DB_CONSUME_GROUP, apply_order)

        def listen(msg: MessageExt) -> ConsumeStatus:
            with self._db_calls_changed:
                self._db_calls += 1
            try:
                status = inbox(msg)
            finally:
                with self._db_calls_changed:
                    self._db_calls -= 1
                    self._db_calls_changed.notify_all()
            wid = prop_text(msg.user_properties.get(ID_PROPERTY))
            if wid and status is ConsumeStatus.CONSUME_SUCCESS:
                self.observed(wid, "db-effect")  # its effect row is committed (or was)
            return status

        inventory = PushConsumer(
            DB_CONSUME_GROUP, config=client, max_reconsume_times=cfg.max_reconsume_times,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            consume_thread_count=4, drain_timeout_ms=3000,
        )  # fmt: skip
        inventory.subscribe(DB_TOPIC, listen)
        inventory.start()
        self._consumers.append(inventory)
        return True

    def record_database(self, timeout_s: float = 30.0) -> None:
        """Write the ``database`` event: what the ``db`` kind's applications committed. Call
        once they stopped (:meth:`stop`); a listener call its consumer's shutdown left running
        is waited for (up to ``timeout_s`` seconds, else the event says how many still ran),
        so that no effect comes after the event."""
        if self._databases is None:
            return
        with self._db_calls_changed:
            self._db_calls_changed.wait_for(lambda: self._db_calls == 0, timeout_s)
            running = self._db_calls
        self.history.write("database", running=running, **committed(*self._databases))
        for engine in self._databases:
            engine.dispose()

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
            wid = prop_text(msg.user_properties.get(ID_PROPERTY))
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
        for thread in self._threads:  # a sender still in a send: its answers come first
            thread.join(self.config.send_msg_timeout_ms / 1000 * 3 + 5)
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
        if self._db_producer is not None:
            try:
                self._db_producer.shutdown(2000)
            except Exception:
                logger.exception("stopping the orders producer")
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
