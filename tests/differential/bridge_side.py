"""The bridge side: the workloads of ``RocketMQDriver.java``, line for line, through the
bridge's public API (``Producer``, ``TransactionMQProducer``, ``PushConsumer``, ``read_messages``,
and the operator view of parked transactions), producing the same events.

The rows of RocketMQ 5's client model run ``RocketMQV5Driver.java``'s workloads through the
bridge's ``SimpleConsumer`` and FIFO ``PushConsumer`` (``simple``, ``fifo``), and through
``bridge.v5.Producer``'s ``recall_message`` (``recall``); their messages are recorded as
RocketMQ 5's ``MessageView`` shows them (``group``, ``attempt``: the delivery attempt), with
``receive``, ``ack`` and ``changed`` events for the simple consumer and ``recall`` events for
what each recall returned or raised.

Events are dicts with ``ev`` (``sent``, ``ready``, ``execute``, ``check``, ``consume``,
``parked``, ``dlq``, ``selected``, ``invalid``, ``done``) and, for a message: ``key``,
``body``, ``topic``, ``tags``, ``reconsume``, ``msg_id``, ``props``, ``t`` (ms since the
workload started), ``since_sent`` (ms since its send began) and ``store_minus_born`` (ms from
its birth to its storage in the topic it was read from, on the broker's clock; the topics are
created with ``LogAppendTime``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from confluent_kafka.admin import AdminClient, NewTopic

from bridge import (
    ClientConfig,
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    FilterExpressionError,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    MessageSelector,
    MessageView,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.cli.admin.transactions import read_parked
from bridge.errors import BridgeError
from bridge.v5 import Message as V5Message
from bridge.v5 import Producer as V5Producer
from bridge.v5 import SendReceipt

Event = dict[str, Any]
V5_KEYS = ("ack", "late", "extend", "never")
"""The simple consumer workload's messages (see ``RocketMQV5Driver.simple``)."""
TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")


def _text(value: object) -> str:
    return value if isinstance(value, str) else repr(value)


class Recorder:
    """Collects events with times relative to the workload's start (ms)."""

    def __init__(self, workload: str) -> None:
        self.started = time.monotonic()
        self.started_epoch_ms = time.time_ns() // 1_000_000
        self.events: list[Event] = []
        self.sent_at: dict[str, int] = {}
        self.warm: set[str] = set()
        self._lock = threading.Lock()
        self.emit("start", workload=workload, epoch_ms=self.started_epoch_ms)

    def now(self) -> int:
        """Milliseconds since the workload started."""
        return int((time.monotonic() - self.started) * 1000)

    def emit(self, ev: str, **fields: Any) -> None:
        """Record one event."""
        with self._lock:
            self.events.append({"ev": ev, **fields})

    def message(self, ev: str, msg: MessageExt, **extra: Any) -> None:
        """Record a received message."""
        t = self.now()
        key = msg.keys[0] if msg.keys else None
        sent = self.sent_at.get(key) if key is not None else None
        store = msg.store_timestamp_ms
        self.emit(
            ev,
            key=key,
            body=msg.body.decode(errors="replace"),
            topic=msg.topic,
            tags=msg.tags,
            reconsume=msg.reconsume_times,
            msg_id=msg.msg_id,
            props={k: _text(v) for k, v in msg.properties.items()},
            t=t,
            since_sent=None if sent is None else t - sent,
            store_minus_born=None if store is None else store - msg.born_timestamp_ms,
            **extra,
        )

    def sending(self, key: str) -> None:
        """Record that ``key``'s send begins now (what ``since_sent`` counts from)."""
        self.sent_at[key] = self.now()

    def sent(self, key: str, **fields: Any) -> None:
        """Record that ``key``'s send returned now."""
        self.sent_at.setdefault(key, self.now())
        self.emit("sent", key=key, t=self.now(), **fields)

    def warmup(self, msg: MessageExt, instance: str | None = None) -> bool:
        """True (and recorded) for the warm-up message, which listeners skip."""
        if msg.keys != ["warmup"]:
            return False
        with self._lock:
            self.warm.add("warmup" if instance is None else f"warmup@{instance}")
        return True

    def await_warm(self, *names: str) -> None:
        """Wait until every listed consumer received the warm-up message."""
        if not await_(lambda: self.warm.issuperset(names), time.monotonic() + 120):
            raise RuntimeError(f"consumers not ready within 120 s: {self.warm}")
        self.emit("ready", t=self.now())


def await_(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll ``condition`` until it holds or the monotonic ``deadline`` passes."""
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@dataclass(frozen=True, slots=True)
class BridgeEnv:
    """Where the bridge side runs: client settings (a namespace of its own, the scaled delay
    levels) with a coordinator already running on them."""

    client: ClientConfig

    def create_topic(self, topic: str, partitions: int = 4) -> None:
        """Create ``topic`` like RocketMQ's auto-created ones (4 queues), with the broker's
        append time as record time so that storage times can be compared."""
        admin = AdminClient({"bootstrap.servers": self.client.bootstrap_servers})
        new = NewTopic(topic, partitions, 1, config={"message.timestamp.type": "LogAppendTime"})
        for future in admin.create_topics([new]).values():
            future.result(30)

    def message(self, topic: str, name: str) -> Message:
        """The workloads' message: body and keys ``name``, tag ``T``, property ``p``."""
        return Message(topic, name, keys=name, tags="T", properties={"p": name})

    def push_consumer(self, group: str, **settings: Any) -> PushConsumer:
        """A push consumer reading from the first offset, as the driver's."""
        return PushConsumer(
            group,
            config=self.client,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            **settings,
        )


class _Recording(MessageListenerConcurrently):
    def __init__(
        self, rec: Recorder, fails: Callable[[MessageExt], bool], instance: str | None = None
    ) -> None:
        self.rec = rec
        self.fails = fails
        self.instance = instance

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        msg = msgs[0]
        if self.rec.warmup(msg, self.instance):
            return ConsumeStatus.CONSUME_SUCCESS
        fail = self.fails(msg)
        self.rec.message("consume", msg, fail=fail, instance=self.instance)
        return ConsumeStatus.RECONSUME_LATER if fail else ConsumeStatus.CONSUME_SUCCESS


class _Seed003(TransactionListener):
    """Seed 003's listener: UNKNOWN at first; on check, by index % 3: UNKNOWN, COMMIT,
    ROLLBACK."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.index = 0
        self.local: dict[str, int] = {}
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: Any) -> TransactionStatus:
        with self.lock:
            status, self.index = self.index % 3, self.index + 1
        self.local[msg.keys[0]] = status
        self.rec.emit("execute", key=msg.keys[0], t=self.rec.now())
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        status = self.local.get(msg.keys[0])
        answer = {0: TransactionStatus.UNKNOWN, 2: TransactionStatus.ROLLBACK}.get(
            status if status is not None else 1, TransactionStatus.COMMIT
        )
        self.rec.message("check", msg, answer=_ANSWERS[answer])
        return answer


_ANSWERS = {
    TransactionStatus.COMMIT: "COMMIT_MESSAGE",
    TransactionStatus.ROLLBACK: "ROLLBACK_MESSAGE",
    TransactionStatus.UNKNOWN: "UNKNOW",
}


def transaction(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    count: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """Seed 003's flow (see ``RocketMQDriver.transaction``)."""
    rec = Recorder("transaction")
    env.create_topic(topic)
    consumed = [0]

    def count_it(msg: MessageExt) -> bool:
        consumed[0] += 1
        return False

    with TransactionMQProducer(producer_group, _Seed003(rec), config=env.client) as producer:
        with Producer(f"{producer_group}_warmup", config=env.client) as plain:
            plain.send_sync(env.message(topic, "warmup"))
        consumer = env.push_consumer(consumer_group)
        consumer.subscribe(topic, _Recording(rec, count_it))
        with consumer:
            rec.await_warm("warmup")
            for i in range(count):
                msg = Message(topic, f"Hello RocketMQ {i}", keys=f"KEY{i}", tags=TAGS[i % 5])
                rec.sending(f"KEY{i}")
                result = producer.send_message_in_transaction(msg, None)
                rec.sent(
                    f"KEY{i}",
                    status=result.status.name,
                    local=_ANSWERS[result.local_transaction_state],
                    msg_id=result.msg_id,
                    transaction_id=result.transaction_id,
                )
                time.sleep(0.01)
            unknown, committed = (count + 2) // 3, (count + 1) // 3
            seen: dict[str, int] = {}

            def all_parked() -> bool:
                parked = _parked(env, topic)
                for msg in parked:
                    seen.setdefault(msg.keys[0], rec.now())
                return len(parked) >= unknown

            await_(
                lambda: all_parked() and consumed[0] >= committed,
                rec.started + deadline_ms / 1000,
            )
            time.sleep(quiet_ms / 1000)
            for msg in _parked(env, topic):
                key = msg.keys[0]
                rec.message(
                    "parked",
                    msg,
                    parked_since_sent=seen[key] - rec.sent_at[key] if key in seen else None,
                )
    rec.emit("done", t=rec.now())
    return rec.events


def _parked(env: BridgeEnv, topic: str) -> list[MessageExt]:
    return [
        m for m in read_parked(env.client, timeout_ms=2000) if m.get_property("REAL_TOPIC") == topic
    ]


def delay(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    messages: str,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """Delay levels and timers by name (see ``RocketMQDriver.delay``)."""
    rec = Recorder("delay")
    env.create_topic(topic)
    consumed = [0]

    def count_it(msg: MessageExt) -> bool:
        consumed[0] += 1
        return False

    names = messages.split(",")
    with Producer(producer_group, config=env.client) as producer:
        producer.send_sync(env.message(topic, "warmup"))
        rec.sent("warmup")
        consumer = env.push_consumer(consumer_group)
        consumer.subscribe(topic, _Recording(rec, count_it))
        with consumer:
            rec.await_warm("warmup")
            for name in names:
                msg = env.message(topic, name)
                wall = time.time_ns() // 1_000_000
                if name.startswith("level"):
                    msg.set_delay_time_level(int(name[5:].split("+")[0]))
                if "delayms" in name:
                    msg.set_delay_time_ms(int(name.split("delayms")[1]))
                elif name.startswith("delaysec"):
                    msg.set_delay_time_sec(int(name[8:]))
                elif name.startswith("atm"):
                    msg.set_deliver_time_ms(wall - int(name[3:]))
                elif name.startswith("at"):
                    msg.set_deliver_time_ms(wall + int(name[2:]))
                rec.sending(name)
                result = producer.send_sync(msg)
                rec.sent(name, status=result.status.name, msg_id=result.msg_id)
            await_(lambda: consumed[0] >= len(names), rec.started + deadline_ms / 1000)
            time.sleep(quiet_ms / 1000)
    rec.emit("done", t=rec.now())
    return rec.events


def _read_dlq(env: BridgeEnv, group: str) -> list[MessageExt]:
    return list(read_messages(env.client, [f"%DLQ%{group}"], timeout_ms=1500))


def retry(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    max_reconsume: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """The retry ladder (see ``RocketMQDriver.retry``)."""
    rec = Recorder("retry")
    env.create_topic(topic)

    def fails(msg: MessageExt) -> bool:
        return msg.keys == ["always"] or (msg.keys == ["once"] and msg.reconsume_times == 0)

    with Producer(producer_group, config=env.client) as producer:
        producer.send_sync(env.message(topic, "warmup"))
        consumer = env.push_consumer(consumer_group, max_reconsume_times=max_reconsume)
        consumer.subscribe(topic, _Recording(rec, fails))
        with consumer:
            rec.await_warm("warmup")
            for name in ("ok", "once", "always"):
                rec.sending(name)
                result = producer.send_sync(env.message(topic, name))
                rec.sent(name, status=result.status.name, msg_id=result.msg_id)
            await_(lambda: bool(_read_dlq(env, consumer_group)), rec.started + deadline_ms / 1000)
            time.sleep(quiet_ms / 1000)
            for msg in _read_dlq(env, consumer_group):
                rec.message("dlq", msg, dlq_topic=f"%DLQ%{consumer_group}")
    rec.emit("done", t=rec.now())
    return rec.events


class _Orderly(MessageListenerOrderly):
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.attempts: dict[str, int] = {}

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        msg = msgs[0]
        if self.rec.warmup(msg):
            return ConsumeOrderlyStatus.SUCCESS
        key = msg.keys[0]
        self.attempts[key] = n = self.attempts.get(key, 0) + 1
        fail = key == "m4" or (key == "m2" and n <= 2)
        self.rec.message("consume", msg, fail=fail)
        return (
            ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            if fail
            else ConsumeOrderlyStatus.SUCCESS
        )


def orderly(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    count: int,
    max_reconsume: int,
    suspend_ms: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """Orderly consumption of one partition (see ``RocketMQDriver.orderly``)."""
    rec = Recorder("orderly")
    env.create_topic(topic)
    listener = _Orderly(rec)
    with Producer(producer_group, config=env.client) as producer:
        producer.send_sync(env.message(topic, "warmup"), partition=0)
        consumer = env.push_consumer(
            consumer_group,
            max_reconsume_times=max_reconsume,
            suspend_current_queue_time_millis=suspend_ms,
        )
        consumer.subscribe(topic, listener)
        with consumer:
            rec.await_warm("warmup")
            for i in range(count):
                rec.sending(f"m{i}")
                result = producer.send_sync(env.message(topic, f"m{i}"), partition=0)
                rec.sent(f"m{i}", queue_id=result.queue_id)
            last = f"m{count - 1}"
            await_(
                lambda: last in listener.attempts and bool(_read_dlq(env, consumer_group)),
                rec.started + deadline_ms / 1000,
            )
            time.sleep(quiet_ms / 1000)
            for msg in _read_dlq(env, consumer_group):
                rec.message("dlq", msg, dlq_topic=f"%DLQ%{consumer_group}")
    rec.emit("done", t=rec.now())
    return rec.events


def broadcasting(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """Two BROADCASTING instances of one group (see ``RocketMQDriver.broadcasting``)."""
    rec = Recorder("broadcasting")
    env.create_topic(topic)
    consumed = [0]
    lock = threading.Lock()

    def bad(msg: MessageExt) -> bool:
        with lock:
            consumed[0] += 1
        return msg.keys == ["bad"]

    with Producer(producer_group, config=env.client) as producer:
        producer.send_sync(env.message(topic, "warmup"))
        consumers = []
        for instance in ("a", "b"):
            consumer = env.push_consumer(
                consumer_group, message_model=MessageModel.BROADCASTING, instance_name=instance
            )
            consumer.subscribe(topic, _Recording(rec, bad, instance))
            consumer.start()
            consumers.append(consumer)
        try:
            rec.await_warm("warmup@a", "warmup@b")
            for name in ("ok1", "bad", "ok2"):
                rec.sending(name)
                result = producer.send_sync(env.message(topic, name))
                rec.sent(name, status=result.status.name, msg_id=result.msg_id)
            await_(lambda: consumed[0] >= 6, rec.started + deadline_ms / 1000)
            time.sleep(quiet_ms / 1000)
        finally:
            for consumer in consumers:
                consumer.shutdown()
    rec.emit("done", t=rec.now())
    return rec.events


def sql(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    **rows: str,
) -> list[Event]:
    """SQL92 property filters (see ``RocketMQDriver.sql``): the messages ``m0``, ``m1``, ...
    are sent, then each expression ``e0``, ``e1``, ... either is refused by ``subscribe``
    (``invalid``) or gets a push consumer of its own, whose listener records the messages the
    filter lets through (``selected``, once every message was consumed or filtered out). The
    consumers are BROADCASTING ones: dozens of them start without a group join or group
    topics each, and the filter is the same in both modes (the integration tests run it
    CLUSTERING)."""
    rec = Recorder("sql")
    env.create_topic(topic)
    messages = [parse_qs(rows[f"m{i}"]) for i in range(len(rows)) if f"m{i}" in rows]
    with Producer(producer_group, config=env.client) as producer:
        for fields in messages:
            key, keys, tags = fields.pop("key"), fields.pop("keys"), fields.pop("tags", None)
            producer.send_sync(Message(topic, key, keys=keys, tags=tags, properties=fields))
            rec.sent(key)
    expressions = [unquote(rows[f"e{i}"]) for i in range(len(rows)) if f"e{i}" in rows]
    running: list[tuple[int, str, PushConsumer, list[str]]] = []
    try:
        for index, expression in enumerate(expressions):
            consumer = env.push_consumer(
                f"{consumer_group}_{index}", message_model=MessageModel.BROADCASTING
            )
            selected: list[str] = []
            listener = _Selected(selected)
            try:
                consumer.subscribe(topic, listener, MessageSelector.by_sql(expression))
            except FilterExpressionError as exc:
                rec.emit("invalid", index=index, expression=expression, error=str(exc))
                continue
            consumer.start()
            running.append((index, expression, consumer, selected))
        for index, expression, consumer, selected in running:
            stats = consumer.stats
            if not await_(
                lambda s=stats: s().consumed + s().filtered >= len(messages),  # type: ignore[misc]
                time.monotonic() + 120,
            ):
                raise RuntimeError(f"{expression!r}: not every message seen: {stats()}")
            rec.emit("selected", index=index, expression=expression, keys=",".join(selected))
    finally:
        for _, _, consumer, _ in running:
            consumer.shutdown()
    rec.emit("done", t=rec.now())
    return rec.events


class _Selected:
    """Records the bodies (the keys) of the messages a filter let through."""

    def __init__(self, into: list[str]) -> None:
        self.into = into
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.into.append(msg.body.decode())
        return ConsumeStatus.CONSUME_SUCCESS


def parse_qs(text: str) -> dict[str, str]:
    """``k=v&k=v`` with URL-encoded keys and values (what the driver reads too)."""
    return dict(
        (unquote(k), unquote(v)) for k, _, v in (p.partition("=") for p in text.split("&") if p)
    )


# --- RocketMQ 5's client model (RocketMQV5Driver.java) --------------------------------------


def _view(rec: Recorder, ev: str, view: MessageView, **extra: Any) -> None:
    """Record a message as RocketMQ 5's ``MessageView`` shows it."""
    t = rec.now()
    key = view.keys[0] if view.keys else None
    sent = rec.sent_at.get(key) if key is not None else None
    rec.emit(
        ev,
        key=key,
        body=view.body.decode(errors="replace"),
        topic=view.topic,
        tags=view.tag,
        group=view.message_group,
        attempt=view.delivery_attempt,
        msg_id=view.message_id,
        props={k: _text(v) for k, v in view.properties.items()},
        t=t,
        since_sent=None if sent is None else t - sent,
        **extra,
    )


def simple(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    invisible_ms: int,
    extend_ms: int,
    max_attempts: int,
    await_ms: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """The simple consumer workload (see ``RocketMQV5Driver.simple``), through the bridge's
    ``SimpleConsumer``."""
    rec = Recorder("simple")
    env.create_topic(topic)
    invisible, extend = invisible_ms / 1000, extend_ms / 1000
    deadline = rec.started + deadline_ms / 1000
    consumer = SimpleConsumer(
        env.client,
        consumer_group,
        {topic: "*"},
        await_ms / 1000,
        max_delivery_attempts=max_attempts,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    with Producer(producer_group, config=env.client) as producer, consumer:
        rec.sending("warmup")
        producer.send_sync(env.message(topic, "warmup"))
        warm = False
        while not warm and time.monotonic() < deadline:
            for view in consumer.receive(16, invisible):
                warm |= view.keys == ["warmup"]
                consumer.ack(view)
        if not warm:
            raise RuntimeError("the warm-up message never came")
        rec.emit("ready", t=rec.now())
        for name in V5_KEYS:
            rec.sending(name)
            result = producer.send_sync(env.message(topic, name))
            rec.sent(name, msg_id=result.msg_id)
        acked: set[str] = set()
        never_seen = 0
        done_at: float | None = None
        while time.monotonic() < deadline and (
            done_at is None or time.monotonic() < done_at + quiet_ms / 1000
        ):
            for view in consumer.receive(16, invisible):
                key = view.keys[0]
                _view(rec, "receive", view)
                if key == "ack" or (key in ("late", "extend") and view.delivery_attempt > 1):
                    consumer.ack(view)
                    acked.add(key)
                    rec.emit("ack", key=key, t=rec.now())
                elif key == "extend":
                    consumer.change_invisible_duration(view, extend)
                    rec.emit("changed", key=key, t=rec.now(), ms=extend_ms)
                elif key == "never":
                    never_seen = view.delivery_attempt
            if done_at is None and len(acked) == 3 and never_seen >= max_attempts:
                done_at = time.monotonic()
    for msg in _read_dlq(env, consumer_group):
        rec.message("dlq", msg, dlq_topic=f"%DLQ%{consumer_group}")
    rec.emit("done", t=rec.now())
    return rec.events


def fifo(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    groups: str,
    per_group: int,
    work_ms: int,
    threads: int,
    max_attempts: int,
    backoff_ms: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """FIFO message groups (see ``RocketMQV5Driver.fifo``), through the bridge's FIFO
    ``PushConsumer`` on a topic of one partition."""
    rec = Recorder("fifo")
    env.create_topic(topic, partitions=1)
    names = groups.split(",")
    running: dict[str, int] = {}
    consumed: set[str] = set()
    failed_attempts = [0]
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        key = msg.keys[0]
        if key == "warmup":
            consumed.add(key)
            return ConsumeStatus.CONSUME_SUCCESS
        group = msg.message_group or ""
        attempt = msg.reconsume_times + 1
        with lock:
            running[group] = in_group = running.get(group, 0) + 1
        fail = key == "g1-1" or (key == "g2-1" and attempt == 1)
        t = rec.now()
        rec.emit(
            "consume", key=key, group=group, attempt=attempt, t=t, fail=fail, in_group=in_group,
            since_sent=t - rec.sent_at[key], props={k: _text(v) for k, v in msg.properties.items()},
        )  # fmt: skip
        time.sleep(work_ms / 1000)
        with lock:
            running[group] -= 1
        if fail:
            if key == "g1-1":
                failed_attempts[0] = attempt
            return ConsumeStatus.RECONSUME_LATER
        consumed.add(key)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = env.push_consumer(
        consumer_group,
        fifo=True,
        max_reconsume_times=max_attempts - 1,
        suspend_current_queue_time_millis=backoff_ms,
        consume_thread_count=threads,
    )
    consumer.subscribe(topic, listener)
    with Producer(producer_group, config=env.client) as producer, consumer:
        rec.sending("warmup")
        producer.send_sync(Message(topic, "warmup", keys="warmup", message_group="warmup"))
        if not await_(lambda: "warmup" in consumed, rec.started + deadline_ms / 1000):
            raise RuntimeError("the warm-up message never came")
        rec.emit("ready", t=rec.now())
        for i in range(per_group):
            for group in names:
                name = f"{group}-{i}"
                msg = Message(
                    topic, name, keys=name, tags="T", properties={"p": name}, message_group=group
                )
                rec.sending(name)
                result = producer.send_sync(msg)
                rec.sent(name, msg_id=result.msg_id)
        expected = len(names) * per_group  # all but g1-1, plus the warm-up
        await_(
            lambda: len(consumed) >= expected and failed_attempts[0] >= max_attempts,
            rec.started + deadline_ms / 1000,
        )
        time.sleep(quiet_ms / 1000)
    for msg in _read_dlq(env, consumer_group):
        rec.message("dlq", msg, dlq_topic=f"%DLQ%{consumer_group}")
    rec.emit("done", t=rec.now())
    return rec.events


def _send_timer(
    rec: Recorder, producer: V5Producer, topic: str, name: str, due_epoch_ms: int
) -> SendReceipt:
    """Send the workloads' message as a timer due at ``due_epoch_ms`` and record its receipt
    (see ``RocketMQV5Driver.sendTimer``)."""
    msg = V5Message(
        topic, name, tag="T", keys=name, properties={"p": name},
        delivery_timestamp=due_epoch_ms / 1000,
    )  # fmt: skip
    rec.sending(name)
    receipt = producer.send(msg)
    handle = receipt.recall_handle is not None
    rec.sent(name, msg_id=receipt.message_id, due_ms=due_epoch_ms, handle=handle)
    return receipt


def _recall_one(
    rec: Recorder, producer: V5Producer, topic: str, name: str, receipt: SendReceipt, due_ms: int
) -> None:
    """Recall ``name`` and record what the call returned or raised, and how long before its
    due time (epoch ms) the call began (see ``RocketMQV5Driver.recallOne``)."""
    before = due_ms - time.time_ns() // 1_000_000
    assert receipt.recall_handle is not None, name
    try:
        msg_id = producer.recall_message(topic, receipt.recall_handle)
    except BridgeError as exc:
        rec.emit(
            "recall", key=name, t=rec.now(), before_due_ms=before, ok=False,
            error=type(exc).__name__, message=str(exc),
        )  # fmt: skip
    else:
        rec.emit("recall", key=name, t=rec.now(), before_due_ms=before, ok=True, msg_id=msg_id)


def recall(
    env: BridgeEnv,
    *,
    topic: str,
    producer_group: str,
    consumer_group: str,
    due_ms: int,
    late_due_ms: int,
    invisible_ms: int,
    await_ms: int,
    deadline_ms: int,
    quiet_ms: int,
) -> list[Event]:
    """Recall of timer messages (see ``RocketMQV5Driver.recall``), through
    ``bridge.v5.Producer.recall_message`` and the bridge's ``SimpleConsumer``.
    ``producer_group`` is unused: a v5 producer has none."""
    rec = Recorder("recall")
    env.create_topic(topic)
    invisible = invisible_ms / 1000
    deadline = rec.started + deadline_ms / 1000
    consumer = SimpleConsumer(
        env.client,
        consumer_group,
        {topic: "*"},
        await_ms / 1000,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    with V5Producer(env.client, topics=topic) as producer, consumer:
        _send_timer(rec, producer, topic, "warmup", time.time_ns() // 1_000_000 + 200)
        warm = False
        while not warm and time.monotonic() < deadline:
            for view in consumer.receive(16, invisible):
                warm |= view.keys == ["warmup"]
                consumer.ack(view)
        if not warm:
            raise RuntimeError("the warm-up message never came")
        rec.emit("ready", t=rec.now())
        due = time.time_ns() // 1_000_000 + due_ms
        late_due = time.time_ns() // 1_000_000 + late_due_ms
        receipts = {
            name: _send_timer(rec, producer, topic, name, due)
            for name in ("kept", "recalled-1", "recalled-2")
        }
        receipts["late"] = _send_timer(rec, producer, topic, "late", late_due)
        for name in ("recalled-1", "recalled-2"):
            _recall_one(rec, producer, topic, name, receipts[name], due)
        got: set[str] = set()
        quiet_until = due + quiet_ms
        while time.monotonic() < deadline and not (
            {"kept", "late"} <= got and time.time_ns() // 1_000_000 >= quiet_until
        ):
            for view in consumer.receive(16, invisible):
                key = view.keys[0]
                _view(rec, "receive", view)
                consumer.ack(view)
                if key == "late" and key not in got:
                    got.add(key)
                    _recall_one(rec, producer, topic, key, receipts[key], late_due)
                else:
                    got.add(key)
    rec.emit("done", t=rec.now())
    return rec.events
