"""One delayed message that cannot be delivered never stops the others (isolation), and the
delay services' offsets survive failed rewinds and rebalances: exactly once, on time.

Poison records are written straight into the SCHEDULE and timer topics, as an older or foreign
client could: the producer's send-time checks must not be what keeps the coordinator alive.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import statistics
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.cli.admin.delays import delay_status
from bridge.codec import BORN_TIMESTAMP_HEADER, decode_envelope, encode_envelope
from bridge.coordinator import Coordinator
from bridge.coordinator.delay.service import ScheduleDeliveryService, TimerService
from bridge.delay.routing import SEND_ID_HEADER
from bridge.kafka.acls import await_acls_shown
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.kafka.quarantine import QuarantinedRecord, read_quarantine
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.message import MessageConst
from tests.conftest import wait_until
from tests.integration.test_delays import LEVELS, PRECISION_MS, SLACK_MS, coordinator_config
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker


def isolation_config(kafka_bootstrap: str, namespace: str, **kafka: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level=LEVELS,
        timer_precision_ms=PRECISION_MS,
        timer_max_delay_ms=86_400_000,
        kafka=kafka,
    )


def warm_up(config: ClientConfig, topic: str) -> None:
    """Return once both delay services own their partitions (a level and a timer arrived)."""
    with Producer("warmup", config=config) as producer:
        producer.send_sync(Message(topic, b"level", delay_time_level=1))
        timer = Message(topic, b"timer")
        timer.set_delay_time_ms(300)
        producer.send_sync(timer)
    assert len(list(read_messages(config, [topic], max_messages=2, timeout_ms=30_000))) == 2


def system_record(
    config: ClientConfig,
    real_topic: str,
    body: bytes,
    *,
    queue_id: int = -1,
    level: int = 0,
    deliver_ms: int = 0,
) -> tuple[str, int, bytes, list[tuple[str, bytes]], str]:
    """A SCHEDULE (``level``) or timer (``deliver_ms``) record as any client could write it:
    (topic, partition, value, headers, message id)."""
    msg_id = uuid.uuid4().hex
    props = {
        MessageConst.REAL_TOPIC: real_topic,
        MessageConst.REAL_QUEUE_ID: str(queue_id),
        MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: msg_id,
    }
    catalog = config.catalog(1)
    now = time.time_ns() // 1_000_000
    if level:
        props[MessageConst.DELAY_TIME_LEVEL] = str(level)
        value = encode_envelope(msg_id, body, props, now, "test")
        return catalog.topic(SystemTopic.SCHEDULE), level - 1, value, [], msg_id
    props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
    tier = config.delay_policy.route(deliver_ms, now)
    assert tier is not None
    value = encode_envelope(msg_id, body, props, now, "test")
    headers = [(MessageConst.TIMER_DELIVER_MS, str(deliver_ms).encode())]
    return catalog.topic(SystemTopic.TIMER), tier, value, headers, msg_id


def write(
    config: ClientConfig, record: tuple[str, int, bytes, list[tuple[str, bytes]], str]
) -> str:
    """Write a :func:`system_record` with a plain Kafka producer; return its message id."""
    topic, partition, value, headers, msg_id = record
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce(topic, value, msg_id.encode(), partition=partition, headers=list(headers))
    assert raw.flush(10) == 0
    return msg_id


def quarantined_ids(config: ClientConfig) -> dict[str, QuarantinedRecord]:
    """Quarantined SCHEDULE and timer records by message id: an envelope record's from its
    value, a header-format one's (a back-off copy) from its headers."""
    out = {}
    for kept in read_quarantine(config, timeout_ms=1000):
        if BORN_TIMESTAMP_HEADER in kept.headers:
            out[str(kept.headers[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX])] = kept
            continue
        try:
            out[decode_envelope(kept.value).msg_id] = kept
        except Exception:
            continue
    return out


@pytest.mark.parametrize(
    ("error", "permanent"),
    [
        (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), True),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), True),
        (KafkaError(KafkaError._UNKNOWN_PARTITION), True),
        (KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, retriable=True), True),
        (KafkaError(KafkaError.POLICY_VIOLATION), True),
        (KafkaError(KafkaError._PURGE_QUEUE), False),
        (KafkaError(KafkaError._MSG_TIMED_OUT), False),
        (KafkaError(KafkaError._TRANSPORT), False),
        (KafkaError(KafkaError._FENCED, fatal=True), False),
        (KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, retriable=True), False),
        (KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED), False),
        (KafkaError(KafkaError._INCONSISTENT), False),
        (None, False),
    ],
)
def test_permanent_delivery_errors_are_told_from_transient_ones(
    error: KafkaError | None, permanent: bool
) -> None:
    assert is_permanent_delivery_error(error) is permanent


# Serial: it bounds lateness against the wall clock, which the other workers' load moves.
@pytest.mark.serial
def test_poison_of_every_kind_leaves_every_good_message_delivered_once_and_on_time(
    kafka_bootstrap: str, namespace: str, unique: Callable[[str], str]
) -> None:
    # The coordinator creates no topic: a missing topic is what a broker with
    # auto.create.topics.enable=false answers (the session broker has it on).
    config = isolation_config(kafka_bootstrap, namespace, **{"allow.auto.create.topics": "false"})
    good, warm, small, narrow, doomed = (
        unique(n) for n in ("good", "warm", "small", "narrow", "doomed")
    )
    absent = unique("absent")
    admin = TopicAdmin(config)
    admin.ensure_topics(
        [
            TopicSpec(good, 2, {"message.timestamp.type": "LogAppendTime"}),
            TopicSpec(warm, 1),
            TopicSpec(small, 1, {"max.message.bytes": "1024"}),
            TopicSpec(narrow, 1),
            TopicSpec(doomed, 1),
        ]
    )
    poisons: dict[str, tuple[str, str]] = {}
    """Message id -> (target topic, what its reason must say)."""
    sent: dict[str, tuple[float, float, int]] = {}
    """Body -> (time before its send, time after it, its delay in ms)."""
    with Coordinator(coordinator_config(config, "iso")):
        warm_up(config, warm)
        with Producer("pg", config=config) as producer:
            for i in range(30):
                body = f"g{i}"
                kind = i % 5
                msg = Message(good, body)
                if kind < 3:
                    msg.set_delay_time_level(kind + 1)
                    delay_ms = (kind + 1) * 1000
                else:
                    delay_ms = 800 if kind == 3 else 1700
                    msg.set_delay_time_ms(delay_ms)
                before = time.time()  # the message is born after this
                producer.send_sync(msg)
                sent[body] = (before, time.time(), delay_ms)
                now = time.time_ns() // 1_000_000
                poison = {
                    2: (system_record(config, "__consumer_offsets", b"p", queue_id=0, level=1),
                        "__consumer_offsets", "internal"),
                    6: (system_record(config, absent, b"p", deliver_ms=now + 1200),
                        absent, "does not exist"),
                    11: (system_record(config, narrow, b"p", queue_id=5, level=2),
                         narrow, "out of range"),
                    15: (system_record(config, small, b"p" * 5000, level=1),
                         small, "too large"),
                    19: (system_record(config, small, b"p" * 5000, deliver_ms=now + 600),
                         small, "too large"),
                    23: (system_record(config, doomed, b"p", queue_id=0, level=3),
                         doomed, "does not exist"),
                }.get(i)  # fmt: skip
                if poison is not None:
                    record, target, reason = poison
                    poisons[write(config, record)] = (target, reason)
                    if target == doomed:
                        admin.delete_topics([doomed])
                time.sleep(0.05)
        got: dict[str, list[float]] = {}
        for msg in read_messages(config, [good], max_messages=len(sent), timeout_ms=20_000):
            assert msg.store_timestamp_ms is not None
            got.setdefault(msg.body.decode(), []).append(msg.store_timestamp_ms / 1000)
        assert len(got) == len(sent), f"not delivered: {sorted(set(sent) - set(got))}"
        kept = wait_until(
            lambda: (found := quarantined_ids(config)).keys() >= poisons.keys() and found,
            timeout_s=30,
        )
    again = Counter(m.body.decode() for m in read_messages(config, [good], timeout_ms=2000))
    assert set(again.values()) == {1}, f"delivered twice: {[b for b, n in again.items() if n > 1]}"
    late: dict[str, float] = {}
    for body, (before, after, delay_ms) in sent.items():
        # Early is measured from before the send (a slow send_sync is no early delivery),
        # lateness from after it, as the coordinator sees the message no sooner.
        since_send_ms = (got[body][0] - before) * 1000
        assert delay_ms <= since_send_ms + 50, f"{body} early: {since_send_ms:.0f} ms < {delay_ms}"
        late[body] = (got[body][0] - after) * 1000 - delay_ms
    lateness_ms = list(late.values())
    print(
        f"good messages' lateness with poison in the stream: p50 "
        f"{statistics.median(lateness_ms):.0f} ms, max {max(lateness_ms):.0f} ms"
    )
    worst = sorted(late.items(), key=lambda kv: -kv[1])[:5]
    assert max(lateness_ms) <= PRECISION_MS + SLACK_MS, f"latest (body, ms): {worst}"
    for msg_id, (target, reason) in poisons.items():
        assert target in kept[msg_id].reason and reason in kept[msg_id].reason, kept[msg_id]


def test_targets_the_acls_deny_are_quarantined_and_the_others_flow(
    authorizing_broker: str, namespace: str, unique: Callable[[str], str]
) -> None:
    config = isolation_config(authorizing_broker, namespace)
    good, warm, denied, hidden = (unique(n) for n in ("good", "warm", "denied", "hidden"))
    stamped = TopicSpec(good, 1, {"message.timestamp.type": "LogAppendTime"})
    TopicAdmin(config).ensure_topics([stamped, *(TopicSpec(t, 1) for t in (warm, denied, hidden))])
    anyone = ("User:ANONYMOUS", "*")
    acls = [  # writes to `denied` fail when the transaction adds it; `hidden` is not even listed
        AclBinding(ResourceType.TOPIC, denied, ResourcePatternType.LITERAL, *anyone,
                   AclOperation.WRITE, AclPermissionType.DENY),
        AclBinding(ResourceType.TOPIC, denied, ResourcePatternType.LITERAL, *anyone,
                   AclOperation.DESCRIBE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, hidden, ResourcePatternType.LITERAL, *anyone,
                   AclOperation.ALL, AclPermissionType.DENY),
    ]  # fmt: skip
    admin = new_admin(config)
    for future in admin.create_acls(acls).values():
        future.result(10)
    await_acls_shown(admin, acls, 10_000)
    sent: dict[str, tuple[float, int]] = {}
    poisons: dict[str, str] = {}
    with Coordinator(coordinator_config(config, "acl")):
        warm_up(config, warm)
        with Producer("pg", config=config) as producer:
            for i in range(12):
                level = 1 + i % 2
                producer.send_sync(Message(good, f"g{i}", delay_time_level=level))
                sent[f"g{i}"] = (time.time(), level * 1000)
                target = {3: denied, 6: hidden}.get(i)
                if target is not None:
                    record = system_record(config, target, b"p", queue_id=0, level=level)
                    poisons[write(config, record)] = target
                time.sleep(0.05)
        got = {
            m.body.decode(): m.store_timestamp_ms or 0
            for m in read_messages(config, [good], max_messages=len(sent), timeout_ms=15_000)
        }
        assert got.keys() == sent.keys(), f"not delivered: {sorted(sent.keys() - got.keys())}"
        kept = wait_until(
            lambda: (found := quarantined_ids(config)).keys() >= poisons.keys() and found,
            timeout_s=30,
        )
    # A message that shared its Kafka transaction with a poison record is delivered in the
    # next one (docs/delays.md): one failed transaction later, its abort and re-read included.
    # Held back by the poison's back-offs (1 s, then 2 s, before the quarantine) it would be
    # seconds later.
    for body, (at, delay_ms) in sent.items():
        bound_ms = delay_ms + PRECISION_MS + SLACK_MS + FAILED_TRANSACTION_MS
        assert got[body] / 1000 - at <= bound_ms / 1000, body
    for msg_id, target in poisons.items():
        assert target in kept[msg_id].reason and "authorization" in kept[msg_id].reason


FAILED_TRANSACTION_MS = 500
"""What one Kafka transaction failed by a poison record may add to its other records'
lateness: the failure, the abort and the re-read. Without it, two full runs of the suite saw
the bound exceeded by 17 and 270 ms."""


class Flaky:
    """A real Kafka client with one method that fails once when armed (fault injection)."""

    def __init__(self, real: Any, method: str, error: KafkaError) -> None:
        self._real = real
        self._method = method
        self._error = error
        self.armed = False
        self.fired = threading.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name != self._method:
            return attr

        def once(*args: Any, **kwargs: Any) -> Any:
            if self.armed:
                self.armed = False
                self.fired.set()
                raise KafkaException(self._error)
            return attr(*args, **kwargs)

        return once


@pytest.fixture()
def level_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return isolation_config(kafka_bootstrap, namespace)


def test_a_rewind_that_cannot_read_committed_offsets_loses_nothing(
    level_config: ClientConfig, topic: str
) -> None:
    with Coordinator(coordinator_config(level_config, "rewind")) as coordinator:
        warm_up(level_config, f"{topic}-warm")
        (service,) = [s for s in coordinator.services if isinstance(s, ScheduleDeliveryService)]
        producer = Flaky(service._producer, "commit_transaction", KafkaError(KafkaError._TIMED_OUT))
        consumer = Flaky(service._consumer, "committed", KafkaError(KafkaError._TIMED_OUT))
        service._producer, service._consumer = producer, cast(Consumer, consumer)
        producer.armed = consumer.armed = True
        with Producer("pg", config=level_config) as sender:
            sender.send_sync(Message(topic, b"first", delay_time_level=1))
            assert producer.fired.wait(20) and consumer.fired.wait(20)
            sender.send_sync(Message(topic, b"second", delay_time_level=1))
        got = list(read_messages(level_config, [topic], timeout_ms=5000))
    assert sorted(m.body for m in got) == [b"first", b"second"]
    # A transient failure is retried as it is: no delivery attempt counted, nothing set aside.
    assert all("DELIVERY_ATTEMPTS" not in m.properties for m in got)
    assert not list(read_quarantine(level_config, timeout_ms=500))


def test_rebalances_under_load_deliver_every_message_exactly_once(
    level_config: ClientConfig, topic: str
) -> None:
    count = 0
    stop = threading.Event()

    def send() -> None:
        nonlocal count
        with Producer("pg", config=level_config) as producer:
            while not stop.is_set():
                for _ in range(20):
                    msg = Message(topic, f"m{count}")
                    if count % 2:
                        msg.set_delay_time_level(1)
                    else:
                        msg.set_delay_time_ms(1000)
                    producer.send_async(msg)
                    count += 1
                assert producer.flush(10_000) == 0
                time.sleep(0.1)

    with Coordinator(coordinator_config(level_config, "a")):
        warm_up(level_config, f"{topic}-warm")
        sender = threading.Thread(target=send)
        sender.start()
        try:
            for name in ("b", "c"):
                time.sleep(1.5)
                joined = Coordinator(coordinator_config(level_config, name))
                joined.start()
                time.sleep(2.5)
                joined.stop()
            time.sleep(1)
        finally:
            stop.set()
            sender.join()
        # Static members that left keep their partitions for the session timeout (6 s).
        bodies = [
            m.body.decode()
            for m in read_messages(level_config, [topic], max_messages=count, timeout_ms=30_000)
        ]
        bodies += [m.body.decode() for m in read_messages(level_config, [topic], timeout_ms=3000)][
            len(bodies) :
        ]
    twice = sorted(b for b, n in Counter(bodies).items() if n > 1)
    assert not twice, f"{len(twice)} of {count} delivered twice, e.g. {twice[:5]}"
    assert len(bodies) == count, f"{count - len(set(bodies))} of {count} lost"


class Stashing:
    """A real consumer that keeps back the records of one partition it fetched (while
    ``armed``) and hands them out in a later ``consume`` once ``release`` is set: records
    fetched before a rebalance that the application sees after it."""

    def __init__(self, real: Any, partition: int, count: int) -> None:
        self._real = real
        self._partition = partition
        self._count = count
        self.stash: list[Any] = []
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _keep_back(self, records: list[Any]) -> list[Any]:
        out = []
        for record in records:
            mine = record.error() is None and record.partition() == self._partition
            if mine and len(self.stash) < self._count:
                self.stash.append(record)
            else:
                out.append(record)
        return out

    def poll(self, timeout: float) -> Any:
        if self.release.is_set() and self.stash:
            return self.stash.pop(0)
        record = self._real.poll(timeout)
        kept = self._keep_back([record] if record is not None else [])
        return kept[0] if kept else None

    def consume(self, count: int, timeout: float) -> list[Any]:
        records = self._keep_back(self._real.consume(count, timeout))
        if self.release.is_set() and self.stash:
            records, self.stash = self.stash + records, []
        return records


def test_records_fetched_before_a_rebalance_are_not_delivered_twice(
    level_config: ClientConfig, topic: str
) -> None:
    with Coordinator(coordinator_config(level_config, "first")) as first:
        warm_up(level_config, f"{topic}-warm")
        (service,) = [s for s in first.services if isinstance(s, ScheduleDeliveryService)]
        real = service._consumer
        assert real is not None
        stashing = Stashing(real, partition=2, count=5)  # delay level 3: 3 s
        service._consumer = cast(Consumer, stashing)
        with Producer("pg", config=level_config) as producer:
            for i in range(5):
                producer.send_sync(Message(topic, f"m{i}", delay_time_level=3))
        wait_until(lambda: len(stashing.stash) == 5, timeout_s=10)
        with Coordinator(coordinator_config(level_config, "second")):
            # The group rebalanced: the first coordinator owns fewer partitions.
            wait_until(lambda: len(real.assignment()) < 3, timeout_s=20)
            stashing.release.set()
            bodies = [m.body for m in read_messages(level_config, [topic], timeout_ms=6000)]
    assert sorted(bodies) == [f"m{i}".encode() for i in range(5)]


# --- a record with a header key that is not UTF-8 -----------------------------------------------
# confluent-kafka cannot write one (a bytes key is sent as its repr, a str key with a lone
# surrogate crashes the process), but other clients can, and reading it makes
# ``Message.headers()`` raise SystemError. This writes it with a Produce request by hand.


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | 0x80 if n else low)
        if not n:
            return bytes(out)


def _varbytes(b: bytes | None) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def produce_with_raw_headers(
    bootstrap: str,
    topic: str,
    partition: int,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    """Write one record (magic 2, Produce v3, acks=all) whose header keys are any bytes."""
    record = b"\x00" + _varint(0) + _varint(0) + _varbytes(key) + _varbytes(value)
    record += _varint(len(headers)) + b"".join(_varbytes(k) + _varbytes(v) for k, v in headers)
    now = time.time_ns() // 1_000_000
    tail = struct.pack(">hiqqqhii", 0, 0, now, now, -1, -1, -1, 1) + _varint(len(record)) + record
    batch = struct.pack(">ib", 0, 2) + struct.pack(">I", _crc32c(tail)) + tail
    batch = struct.pack(">qi", 0, len(batch)) + batch
    name = topic.encode()
    body = struct.pack(">hhii", -1, -1, 10_000, 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">iii", 1, partition, len(batch)) + batch
    request = struct.pack(">hhih", 0, 3, 1, 4) + b"test" + body
    host, port = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", sock.recv(4))[0]
        data = b""
        while len(data) < size:
            data += sock.recv(size - len(data))
    at = 8 + 2 + len(name) + 4 + 4  # correlation id, topic count, name, partition count, index
    (error,) = struct.unpack(">h", data[at : at + 2])
    assert error == 0, f"produce failed with Kafka error {error}"


@pytest.fixture()
def timer_coordinator(level_config: ClientConfig, topic: str) -> Iterator[Coordinator]:
    with Coordinator(coordinator_config(level_config, "hdr")) as running:
        warm_up(level_config, f"{topic}-warm")
        yield running


def test_timer_records_whose_headers_cannot_be_read_do_not_stop_the_timer(
    level_config: ClientConfig, timer_coordinator: Coordinator, topic: str
) -> None:
    timer_topic = timer_coordinator.config.catalog.topic(SystemTopic.TIMER)
    due = time.time_ns() // 1_000_000 + 500
    _, tier, value, _, msg_id = system_record(level_config, topic, b"readable", deliver_ms=due)
    bad_key = [(b"\xff\xfe", b"\x00\x01"), (MessageConst.TIMER_DELIVER_MS.encode(), b"0")]
    produce_with_raw_headers(
        level_config.bootstrap_servers, timer_topic, tier, None, value, bad_key
    )
    produce_with_raw_headers(
        level_config.bootstrap_servers, timer_topic, tier, b"k", b"junk", bad_key
    )
    with Producer("pg", config=level_config) as producer:
        after = Message(topic, b"after")
        after.set_delay_time_ms(300)
        producer.send_sync(after)
    got = {
        m.body: m for m in read_messages(level_config, [topic], max_messages=2, timeout_ms=20_000)
    }
    assert set(got) == {b"readable", b"after"}
    assert got[b"readable"].msg_id == msg_id
    (kept,) = wait_until(
        lambda: [k for k in read_quarantine(level_config, timeout_ms=1000) if k.value == b"junk"],
        timeout_s=20,
    )
    assert kept.source_topic == timer_topic
    assert "headers" in kept.reason
    assert kept.key == b"k"
    assert not next(s for s in timer_coordinator.services if isinstance(s, TimerService)).stopped
    # One that waits long in tier 12 (7 min): the status shows its tier time.
    produce_with_raw_headers(level_config.bootstrap_servers, timer_topic, 12, None, value, bad_key)
    (tier12,) = [q for q in delay_status(level_config) if q.kind == "tier" and q.index == 12]
    assert tier12.pending == 1 and tier12.next_due_ms is not None


# --- deliveries that only time out, and bridge-made copies that do not fit -------------------


class _Report:
    """What a delivery report carries about a record that never reached the broker."""

    def __init__(self, topic: str, partition: int) -> None:
        self._topic, self._partition = topic, partition

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


class Unacknowledged:
    """Fault injection on a real transactional producer: records to ``topic`` are never
    acknowledged while ``stuck`` is set, as when the partition's leader is offline. They are
    not sent; as librdkafka does, their delivery reports say ``_MSG_TIMED_OUT`` once
    ``message.timeout.ms`` has passed at commit, or purged when the transaction is aborted.
    Records to other topics go to the broker as usual. Several producers may share one."""

    def __init__(self, topic: str, message_timeout_s: float) -> None:
        self.topic = topic
        self.message_timeout_s = message_timeout_s
        self.stuck = True
        self.tries: list[float] = []
        """When a record to ``topic`` was produced while stuck (monotonic s)."""

    def wrap(self, real: Any) -> Any:
        fault = self

        class Producer:
            def __init__(self) -> None:
                self.held: list[tuple[Callable[..., None], int]] = []

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
                if fault.stuck and topic == fault.topic:
                    fault.tries.append(time.monotonic())
                    self.held.append((kwargs["on_delivery"], kwargs.get("partition", -1)))
                    return
                real.produce(topic, *args, **kwargs)

            def begin_transaction(self) -> None:
                self.held = []
                real.begin_transaction()

            def commit_transaction(self, *args: Any) -> None:
                if self.held:
                    # The wait for an acknowledgement that never comes (message.timeout.ms).
                    time.sleep(fault.message_timeout_s)
                    self._report(KafkaError._MSG_TIMED_OUT)
                    raise KafkaException(
                        KafkaError(
                            KafkaError._MSG_TIMED_OUT,
                            "1 message(s) timed out",
                            txn_requires_abort=True,
                        )
                    )
                real.commit_transaction(*args)

            def abort_transaction(self, *args: Any) -> None:
                self._report(KafkaError._PURGE_QUEUE)
                real.abort_transaction(*args)

            def _report(self, code: int) -> None:
                held, self.held = self.held, []
                for on_delivery, partition in held:
                    on_delivery(KafkaError(code), _Report(fault.topic, partition))

        return Producer()


def test_a_delivery_that_only_times_out_does_not_hold_the_others_back(
    level_config: ClientConfig, topic: str
) -> None:
    stuck_topic, good = f"{topic}-stuck", f"{topic}-good"
    TopicAdmin(level_config).ensure_topics(
        [TopicSpec(stuck_topic, 1), TopicSpec(good, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    fault = Unacknowledged(stuck_topic, level_config.send_msg_timeout_ms / 1000)
    sent: dict[str, tuple[float, int]] = {}
    with Coordinator(coordinator_config(level_config, "slow")) as coordinator:
        warm_up(level_config, f"{topic}-warm")
        for service in coordinator.services:
            if isinstance(service, (ScheduleDeliveryService, TimerService)):
                service._producer = fault.wrap(service._producer)
        with Producer("pg", config=level_config) as producer:
            producer.send_sync(Message(stuck_topic, b"stuck", delay_time_level=1))
            for i in range(16):
                level = 1 + i % 2
                producer.send_sync(Message(good, f"g{i}", delay_time_level=level))
                sent[f"g{i}"] = (time.time(), level * 1000)
                time.sleep(0.25)
        got = {
            m.body.decode(): (m.store_timestamp_ms or 0) / 1000
            for m in read_messages(level_config, [good], max_messages=len(sent), timeout_ms=20_000)
        }
        assert got.keys() == sent.keys(), f"not delivered: {sorted(sent.keys() - got.keys())}"
        wait_until(lambda: len(fault.tries) >= 3, timeout_s=30)
        fault.stuck = False  # the partition is back
        (delivered,) = list(
            read_messages(level_config, [stuck_topic], max_messages=1, timeout_ms=30_000)
        )
        tries = list(fault.tries)
        again = list(read_messages(level_config, [stuck_topic], timeout_ms=2000))
    late_ms = {body: (got[body] - at) * 1000 - delay_ms for body, (at, delay_ms) in sent.items()}
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(tries)]
    print(
        f"good messages' lateness with a delivery that times out: p50 "
        f"{statistics.median(late_ms.values()):.0f} ms, max {max(late_ms.values()):.0f} ms; "
        f"tries of the stuck one {gaps} s apart"
    )
    assert max(late_ms.values()) <= PRECISION_MS + SLACK_MS, sorted(
        late_ms.items(), key=lambda kv: -kv[1]
    )[:5]
    # Retried with a growing back-off, then delivered once, its delivery properties removed.
    assert gaps[1] > gaps[0] + 0.5, gaps
    assert delivered.body == b"stuck" and len(again) == 1
    assert "DELIVERY_ATTEMPTS" not in delivered.properties
    assert "DELIVERY_ERROR" not in delivered.properties
    # A timeout is not the message's fault: never quarantined.
    assert not list(read_quarantine(level_config, timeout_ms=500))


def test_a_near_limit_record_whose_copies_do_not_fit_is_quarantined_without_its_body(
    kafka_bootstrap: str, namespace: str, unique: Callable[[str], str]
) -> None:
    config = isolation_config(kafka_bootstrap, namespace)
    coordinator = coordinator_config(config, "fit")
    limit = 20_000
    tight = (SystemTopic.SCHEDULE, SystemTopic.TIMER, SystemTopic.QUARANTINE)
    admin = TopicAdmin(config)
    admin.ensure_topics(
        dataclasses.replace(spec, configs={**spec.configs, "max.message.bytes": str(limit)})
        if spec.system in tight
        else spec
        for spec in coordinator.catalog.system_specs()
    )
    small, good, warm = unique("small"), unique("good"), unique("warm")
    admin.ensure_topics(
        [
            TopicSpec(small, 1, {"max.message.bytes": "1024"}),
            TopicSpec(good, 1, {"message.timestamp.type": "LogAppendTime"}),
            TopicSpec(warm, 1),
        ]
    )
    # Random bytes: compression cannot make the copies fit.
    near = system_record(config, small, os.urandom(limit - 400), queue_id=0, level=1)
    assert limit - 300 < len(near[2]) < limit - 150
    sent: dict[str, tuple[float, int]] = {}
    with Coordinator(coordinator):
        warm_up(config, warm)
        msg_id = write(config, near)
        with Producer("pg", config=config) as producer:
            for i in range(10):
                level = 1 + i % 2
                producer.send_sync(Message(good, f"g{i}", delay_time_level=level))
                sent[f"g{i}"] = (time.time(), level * 1000)
                time.sleep(0.2)
        got = {
            m.body.decode(): (m.store_timestamp_ms or 0) / 1000
            for m in read_messages(config, [good], max_messages=len(sent), timeout_ms=20_000)
        }
        assert got.keys() == sent.keys(), f"not delivered: {sorted(sent.keys() - got.keys())}"
        (kept,) = wait_until(
            lambda: [k for k in read_quarantine(config, timeout_ms=1000) if small in k.reason],
            timeout_s=30,
        )
    # The record ahead of them costs three refused writes (the delivery, the full copy, the
    # copy without its body), each an aborted transaction: on a busy 2-core machine up to about
    # half a second each. A record that held the others back would cost level delays.
    poison_slack_ms = SLACK_MS + 1500
    for body, (at, delay_ms) in sent.items():
        late_s = got[body] - at - delay_ms / 1000
        assert late_s <= (PRECISION_MS + poison_slack_ms) / 1000, (body, late_s)
    # Kept without its body, which did not fit: where it came from, how big it was, why.
    assert kept.value is None
    assert kept.source_topic == coordinator.catalog.topic(SystemTopic.SCHEDULE)
    assert kept.source_partition == 0 and kept.source_offset >= 0
    assert kept.omitted_bytes >= len(near[2])
    assert "too large" in kept.reason.lower() and str(kept.omitted_bytes) in kept.reason
    assert kept.key == msg_id.encode()


def test_one_send_stored_twice_is_delivered_once(level_config: ClientConfig, topic: str) -> None:
    """librdkafka's idempotent producer can store one send twice when a send times out during
    a leader change (its epoch bump, confluentinc/librdkafka#4953; the fault suite's rolling
    restart showed it): two records identical but for their append time, one send id. They
    deliver one message, whether the second comes in the same pass or after the first was
    delivered."""
    config = level_config
    with Coordinator(coordinator_config(config, "twice")):
        warm_up(config, f"{topic}-warm")
        now = time.time_ns() // 1_000_000
        level = sent_once(system_record(config, topic, b"level", level=1))
        timer = sent_once(system_record(config, topic, b"timer", deliver_ms=now + 1500))
        write(config, level)
        write(config, timer)
        write(config, timer)  # the same pass: due together
        write(config, sent_once(system_record(config, topic, b"between", level=1)))
        first = sorted(m.body for m in read_messages(config, [topic], max_messages=3))
        write(config, level)  # after the first copy was delivered
        write(config, sent_once(system_record(config, topic, b"after", level=1)))
        later = [m.body for m in read_messages(config, [topic], timeout_ms=4000)]
    assert first == [b"between", b"level", b"timer"]
    assert sorted(later) == [b"after", b"between", b"level", b"timer"], later


def sent_once(
    record: tuple[str, int, bytes, list[tuple[str, bytes]], str],
) -> tuple[str, int, bytes, list[tuple[str, bytes]], str]:
    """``record`` with the send id a producer stamps on each record it builds."""
    topic, partition, value, headers, msg_id = record
    return topic, partition, value, [*headers, (SEND_ID_HEADER, uuid.uuid4().hex.encode())], msg_id


def test_identical_records_of_two_sends_and_hops_into_their_own_tier_are_all_delivered(
    level_config: ClientConfig, topic: str
) -> None:
    """Only one send id makes a second copy: two sends whose records are otherwise byte for
    byte the same (a dead letter replayed and failing again builds its first retry record
    again) are two messages, and a timer hop back into its own tier (a producer clock ahead of
    the broker's: a 440 ms timer routed to tier 0 has 520 ms left by the broker's) is the
    coordinator's own copy, not a second send."""
    config = level_config
    with Coordinator(coordinator_config(config, "hops")):
        warm_up(config, f"{topic}-warm")
        now = time.time_ns() // 1_000_000
        t, _, value, headers, msg_id = system_record(config, topic, b"skewed", deliver_ms=now + 520)
        write(config, sent_once((t, 0, value, headers, msg_id)))
        again = system_record(config, topic, b"again", level=1)
        write(config, sent_once(again))
        first = [m.body for m in read_messages(config, [topic], max_messages=2)]
        write(config, sent_once(again))
        got = [m.body for m in read_messages(config, [topic], timeout_ms=4000)]
    assert sorted(first) == [b"again", b"skewed"]
    assert sorted(got) == [b"again", b"again", b"skewed"], got
