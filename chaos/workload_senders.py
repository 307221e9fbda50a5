"""The workload's senders: one loop per kind at its rate with its own seeded
``random.Random``, each operation recorded (``send``, then ``ack``) around a bridge send, and
the poison records sent on demand (some raw, through confluent-kafka, as a foreign client
would write them).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from bridge import BridgeError, Message
from chaos.history import ID_PROPERTY, now_ms
from chaos.workload_database import place_order
from chaos.workload_spec import (
    BROADCAST_GROUP,
    BROADCAST_TOPIC,
    CONSUME_GROUP,
    CONSUME_TOPIC,
    DB_TOPIC,
    DELAY_TOPIC,
    MISSING_TOPIC,
    ORDER_KEYS,
    ORDERLY_GROUP,
    ORDERLY_TOPIC,
    POISON_KINDS,
    SMALL_TOPIC,
    SMALL_TOPIC_MAX_BYTES,
    TIMER_TOPIC,
    TX_TOPIC,
    Spec,
)
from chaos.workload_state import WorkloadState, is_indeterminate

logger = logging.getLogger("chaos.workload")


class WorkloadSenders(WorkloadState):
    """The sender loops and the poison records over the shared state."""

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

    def _sync(self, spec: Spec, msg: Message) -> None:
        assert self._producer is not None
        try:
            result = self._producer.send_sync(msg)
        except BridgeError as exc:
            self._record_ack(spec.id, False, error=exc, indeterminate=is_indeterminate(exc))
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
            self._record_ack(spec.id, False, error=exc, indeterminate=is_indeterminate(exc))
            return
        self._record_ack(spec.id, True, msg_id=result.msg_id)

    def _send_db(self, rng: random.Random) -> None:
        assert self._db_producer is not None
        intent = rng.choices(("commit", "rollback"), weights=(85, 15))[0]
        spec = Spec(self._new_id("db"), "db", intent=intent)
        self._record_send(spec, DB_TOPIC, intent=intent)
        msg = self._message(DB_TOPIC, spec.id, keys=spec.id)
        work = place_order(
            spec.id, msg.body.decode(), refuse=intent == "rollback",
            database_away=self.database_is_down.is_set(),
        )  # fmt: skip
        try:
            result = self._db_producer.send_message_in_transaction(msg, work)
        except BridgeError as exc:
            self._record_ack(spec.id, False, error=exc, indeterminate=is_indeterminate(exc))
            return
        # A COMMIT answer (here or on check-back) marked it committed (OrdersListener).
        self._record_ack(spec.id, True, msg_id=result.msg_id)

    def database_down(self, down: bool) -> None:
        """Take the application's database away (``db_outage``), or bring it back."""
        if down:
            self.database_is_down.set()
        else:
            self.database_is_down.clear()

    def send_storm(self, count: int, threads: int = 4) -> list[str]:
        """Send ``count`` transactions meant to commit on check-back (``unknown_then_commit``)
        from ``threads`` threads at once, as the application goes on taking orders while its
        database is away; their ids."""
        assert self._tx_producer is not None
        producer = self._tx_producer
        ids: list[str] = []

        def work(n: int) -> None:
            for _ in range(n):
                if self._stop_load.is_set():
                    return
                spec = Spec(self._new_id("tx"), "tx", intent="unknown_then_commit")
                self._record_send(spec, TX_TOPIC, intent=spec.intent, storm=True)
                msg = self._message(TX_TOPIC, spec.id, keys=spec.id)
                try:
                    result = producer.send_message_in_transaction(msg, spec.id)
                except BridgeError as exc:
                    self._record_ack(spec.id, False, error=exc, indeterminate=is_indeterminate(exc))
                    continue
                self._record_ack(spec.id, True, msg_id=result.msg_id)
                with self._lock:
                    ids.append(spec.id)

        shares = [count // threads + (1 if i < count % threads else 0) for i in range(threads)]
        workers = [
            threading.Thread(target=work, args=(n,), name=f"chaos-storm-{i}", daemon=True)
            for i, n in enumerate(shares)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return ids

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
