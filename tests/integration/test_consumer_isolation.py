"""The push consumer keeps its guarantees around poison records, stuck listeners and
rebalances, against a real broker: a failed message whose copy cannot be built or sent, or a
record that cannot be decoded, never freezes its partition nor loses the rest of its batch;
held messages are bounded in bytes; a listener past ``consume_timeout`` is sent back; shutdown
is bounded; an orderly partition never has two listeners at once."""

from __future__ import annotations

import ctypes
import glob
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer

from bridge import ClientConfig, Message, MessageConst, MessageExt, Producer, read_messages
from bridge.client import resend as resend_module
from bridge.client import sender as sender_module
from bridge.consumer import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
    PushConsumer,
    send_back,
)
from bridge.consumer import retry_policy as retry_policy_module
from bridge.consumer.admin import read_dead_letters, replay_dead_letters
from bridge.consumer.fetcher import Fetcher
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.quarantine import QuarantinedRecord, read_quarantine
from tests.conftest import wait_until
from tests.integration.test_consumer import (
    committed,
    make_topic,
    send,
    start_consumer,
)
from topics.catalog import TopicSpec
from topics.naming import DLQ_GROUP_TOPIC_PREFIX, dlq_topic, retry_topic

# One worker runs the module: its coordinator (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_consumer_isolation")]

LEVELS = "1s 1s 1s 2s 3s"
"""Level 3 (a first retry) waits 1 s."""
TRACE = b"\xff\xfe\x00\x01"
"""A binary trace context, as another Kafka client writes it: not UTF-8."""


@pytest.fixture(scope="module")
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level=LEVELS,
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture()
def consumers() -> Iterator[list[PushConsumer]]:
    made: list[PushConsumer] = []
    yield made
    for consumer in made:
        consumer.shutdown()


def fetcher_of(consumer: PushConsumer) -> Fetcher:
    """The started consumer's fetcher: its partitions' queues and pauses."""
    assert consumer._fetcher is not None, "started"
    return consumer._fetcher


@pytest.fixture(scope="module")
def coordinator(config: ClientConfig) -> Iterator[Coordinator]:
    """Delivers send-backs (through the delay levels) to the retry topics."""
    settings = CoordinatorConfig(
        client=config, coordinator_id="consumer-isolation-tests", transaction_partitions=1,
        session_timeout_ms=6000,
    )  # fmt: skip
    with Coordinator(settings) as running:
        yield running


@dataclass
class Listener:
    """Records every message; fails the first delivery of the bodies in ``fail_first``;
    blocks the first delivery of the bodies in ``block_first`` until ``gate`` is set."""

    fail_first: frozenset[bytes] = frozenset()
    block_first: frozenset[bytes] = frozenset()
    gate: threading.Event = field(default_factory=threading.Event)
    seen: list[MessageExt] = field(default_factory=list)
    blocked: list[bytes] = field(default_factory=list)
    returned: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.seen.append(msg)
            first = sum(1 for m in self.seen if m.body == msg.body) == 1
        if first and msg.body in self.block_first:
            with self.lock:
                self.blocked.append(msg.body)
            self.gate.wait(60)
            with self.lock:
                self.returned.append(msg.body)
        if first and msg.body in self.fail_first:
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    def of(self, body: bytes) -> list[MessageExt]:
        with self.lock:
            return [m for m in self.seen if m.body == body]

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.seen]


def produce_raw(config: ClientConfig, topic: str, records: list[tuple[bytes, Any]]) -> None:
    """Write ``(value, headers)`` records with a plain confluent-kafka producer, in order."""
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    for value, headers in records:
        raw.produce(topic, value, headers=headers)
    assert raw.flush(10) == 0


def raw_headers(config: ClientConfig, topic: str, value: bytes) -> list[tuple[str, Any]]:
    """The headers of the first record of ``topic`` whose value is ``value``."""
    reader = RawConsumer({
        "bootstrap.servers": config.bootstrap_servers, "group.id": f"reader-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })  # fmt: skip
    reader.subscribe([topic])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is not None and record.error() is None and record.value() == value:
                headers = record.headers() or []
                return list(headers.items() if isinstance(headers, dict) else headers)
        pytest.fail(f"no record {value!r} in {topic}")
    finally:
        reader.close()


def quarantined(config: ClientConfig, source_topic: str) -> dict[bytes | None, QuarantinedRecord]:
    return {
        q.value: q
        for q in read_quarantine(config, timeout_ms=3000)
        if q.source_topic == source_topic
    }


# --- item 3: a failed message whose copy cannot be built or sent ----------------------------
def test_a_failed_message_with_a_binary_header_is_sent_back_byte_exact_and_its_partition_moves_on(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    produce_raw(
        config,
        topic,
        [(b"m0", [("trace-bin", TRACE)])] + [(f"m{i}".encode(), None) for i in range(1, 6)],
    )
    listener = Listener(fail_first=frozenset({b"m0"}))
    consumer = start_consumer(consumers, config, group, topic, listener)
    wait_until(lambda: len(listener.of(b"m0")) == 2, timeout_s=30)
    retried = listener.of(b"m0")[1]
    retry = retry_topic(group, config.namespace)
    assert retried.kafka_topic == retry
    assert retried.reconsume_times == 1
    assert retried.get_property("trace-bin") == TRACE
    assert ("trace-bin", TRACE) in raw_headers(config, retry, b"m0"), "the copy is byte-exact"
    assert sorted(listener.bodies()) == [b"m0", b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]
    wait_until(lambda: committed(config, group, topic) == 6)
    stats = consumer.stats()
    assert (stats.failed, stats.sent_back, stats.quarantined) == (1, 1, 0), stats


def test_a_reconsume_time_that_is_no_ascii_count_neither_freezes_nor_is_trusted(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    TopicAdmin(config).ensure_topics(config.catalog().group_specs(group))
    retry = retry_topic(group, config.namespace)
    superscript = "²".encode()  # str.isdigit() says yes, int() says no
    produce_raw(config, topic, [(b"sup", [("RECONSUME_TIME", superscript)]), (b"after", None)])
    produce_raw(config, retry, [
        (b"retry-sup", [("RETRY_TOPIC", topic.encode()), ("RECONSUME_TIME", superscript)]),
    ])  # fmt: skip
    listener = Listener(fail_first=frozenset({b"sup"}))
    consumer = start_consumer(consumers, config, group, topic, listener)
    wait_until(
        lambda: len(listener.of(b"sup")) == 2 and consumer.stats().quarantined == 1, timeout_s=30
    )
    again = listener.of(b"sup")[1]
    assert again.kafka_topic == retry
    assert again.get_property(MessageConst.RECONSUME_TIME) == "1"
    assert listener.of(b"retry-sup") == [], "a retry record with a bad count is not delivered"
    assert len(listener.of(b"after")) == 1
    wait_until(lambda: committed(config, group, topic) == 2)
    wait_until(lambda: committed(config, group, retry) == 2)  # the bad record and the copy
    assert "'²'" in quarantined(config, retry)[b"retry-sup"].reason


def test_retry_headers_another_client_wrote_on_a_real_topic_are_no_retry_history(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    produce_raw(config, topic, [
        # Records copied out of a retry topic or DLQ by a Kafka tool carry these.
        (b"counted", [("RECONSUME_TIME", b"3"), ("RECONSUME_TIME", b"16")]),
        (b"redirected", [
            ("RETRY_TOPIC", b"elsewhere"), ("ORIGIN_MESSAGE_ID", b"other-id"),
            ("ORIGIN_KAFKA_TOPIC", b"elsewhere"), ("ORIGIN_QUEUE_OFFSET", b"77"),
            ("trace-bin", TRACE),
        ]),
        (b"after", None),
    ])  # fmt: skip
    listener = Listener(fail_first=frozenset({b"counted", b"redirected"}))
    consumer = start_consumer(consumers, config, group, topic, listener)
    wait_until(
        lambda: len(listener.of(b"counted")) == 2 and len(listener.of(b"redirected")) == 2,
        timeout_s=30,
    )
    for body in (b"counted", b"redirected"):
        first, again = listener.of(body)
        assert (first.reconsume_times, again.reconsume_times) == (0, 1), body
        assert again.topic == topic, "retried under the topic it was read from"
        assert again.kafka_topic == retry_topic(group, config.namespace)
    first, again = listener.of(b"redirected")
    assert first.get_property(MessageConst.RETRY_TOPIC) is None
    assert again.get_property(MessageConst.ORIGIN_MESSAGE_ID) == first.msg_id
    assert again.get_property(MessageConst.ORIGIN_KAFKA_TOPIC) == topic
    assert again.get_property(MessageConst.ORIGIN_QUEUE_OFFSET) == "1"
    assert again.get_property("trace-bin") == TRACE, "other headers are kept"
    assert len(listener.of(b"after")) == 1
    wait_until(lambda: committed(config, group, topic) == 3)
    stats = consumer.stats()
    assert (stats.sent_back, stats.dead_lettered, stats.quarantined) == (2, 0, 0), stats


def test_a_consumer_of_a_dlq_reads_the_letters_with_their_retry_history(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    # Consuming %DLQ%<group> with a group of its own is RocketMQ's way of handling dead
    # letters: the retry-path headers there are the project's own, not another client's.
    group = unique("g")
    dlq = dlq_topic(group, config.namespace)
    make_topic(config, dlq)
    produce_raw(config, dlq, [
        (b"letter", [
            ("UNIQ_KEY", b"copy-id"), ("RECONSUME_TIME", b"16"), ("RETRY_TOPIC", b"orders"),
            ("ORIGIN_MESSAGE_ID", b"first-id"), ("CONSUMER_GROUP", group.encode()),
            ("ORIGIN_KAFKA_TOPIC", b"orders"), ("ORIGIN_QUEUE_OFFSET", b"7"),
        ]),
    ])  # fmt: skip
    listener = Listener()
    start_consumer(consumers, config, unique("auditors"), DLQ_GROUP_TOPIC_PREFIX + group, listener)
    wait_until(lambda: len(listener.seen) == 1)
    letter = listener.seen[0]
    assert letter.reconsume_times == 16
    assert {
        name: letter.get_property(name)
        for name in (
            MessageConst.RETRY_TOPIC, MessageConst.ORIGIN_MESSAGE_ID, "CONSUMER_GROUP",
            "ORIGIN_KAFKA_TOPIC", "ORIGIN_QUEUE_OFFSET",
        )
    } == {
        MessageConst.RETRY_TOPIC: "orders", MessageConst.ORIGIN_MESSAGE_ID: "first-id",
        "CONSUMER_GROUP": group, "ORIGIN_KAFKA_TOPIC": "orders", "ORIGIN_QUEUE_OFFSET": "7",
    }  # fmt: skip


def test_records_whose_uniq_key_is_not_utf8_get_distinct_ids(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    produce_raw(config, topic, [
        (b"a", [("UNIQ_KEY", b"\xff")]), (b"b", [("UNIQ_KEY", b"\xfe")]),
        (b"c", [("UNIQ_KEY", b"id-c")]),
    ])  # fmt: skip
    expected = {b"a": f"{topic}-0-0", b"b": f"{topic}-0-1", b"c": "id-c"}
    read = {m.body: m.msg_id for m in read_messages(config, [topic], max_messages=3)}
    assert read == expected
    listener = Listener()
    start_consumer(consumers, config, unique("g"), topic, listener)
    wait_until(lambda: len(listener.seen) == 3)
    assert {m.body: m.msg_id for m in listener.seen} == expected
    assert listener.of(b"a")[0].properties["UNIQ_KEY"] == b"\xff", "the header as it is"


def raw_keys(config: ClientConfig, topic: str) -> dict[bytes | None, Any]:
    """The key of every record of one-partition ``topic``, by value (the last one's)."""
    reader = RawConsumer({
        "bootstrap.servers": config.bootstrap_servers, "group.id": f"reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })  # fmt: skip
    reader.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    keys: dict[bytes | None, Any] = {}
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is None:
                continue
            if record.error() is not None:
                return keys  # the end of the partition
            keys[record.value()] = record.key()
        pytest.fail(f"the end of {topic} not reached")
    finally:
        reader.close()


def test_the_kafka_key_of_a_failed_record_is_kept_through_retry_dlq_and_replay(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    TopicAdmin(config).ensure_topics(config.catalog().group_specs(group))
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce(topic, b"text-key", key=b"user-42")
    raw.produce(topic, b"binary-key", key=b"\xff\x00k")
    raw.produce(topic, b"no-key")
    assert raw.flush(10) == 0
    seen: list[MessageExt] = []
    lock = threading.Lock()

    def fails(msg: MessageExt) -> ConsumeStatus:
        with lock:
            seen.append(msg)
        return ConsumeStatus.RECONSUME_LATER

    consumer = start_consumer(consumers, config, group, topic, fails, max_reconsume_times=1)
    wait_until(lambda: consumer.stats().dead_lettered == 3, timeout_s=30)
    expected = {b"text-key": b"user-42", b"binary-key": b"\xff\x00k", b"no-key": None}
    retry = retry_topic(group, config.namespace)
    assert raw_keys(config, retry) == expected
    assert raw_keys(config, dlq_topic(group, config.namespace)) == expected
    replay_dead_letters(config, group)
    replayed = raw_keys(config, topic)
    assert replayed == expected, "replayed to the origin topic keyed as the original was"


def test_a_copy_that_cannot_be_built_is_quarantined_and_one_that_cannot_be_sent_is_retried(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    names = ["unbuildable", "unsendable", "fine"]
    ids = dict(zip(names, send(config, topic, names), strict=True))
    build = send_back.send_back_record

    def unbuildable(msg: MessageExt, *args: Any, **kwargs: Any) -> Any:
        if msg.body == b"unbuildable":
            raise ValueError("this copy cannot be encoded")
        return build(msg, *args, **kwargs)

    monkeypatch.setattr(retry_policy_module, "send_back_record", unbuildable)
    send_record = sender_module.RecordSender.send_record_async
    raised: list[str] = []

    def refuses_once(
        self: sender_module.RecordSender,
        record: Any,
        partition: int,
        callback: Any,
        **kwargs: Any,
    ) -> None:
        if record.msg_id == ids["unsendable"] and not raised:
            raised.append(record.msg_id)
            raise RuntimeError("the client broke while sending")
        send_record(self, record, partition, callback, **kwargs)

    monkeypatch.setattr(sender_module.RecordSender, "send_record_async", refuses_once)
    listener = Listener(fail_first=frozenset({b"unbuildable", b"unsendable"}))
    consumer = start_consumer(consumers, config, group, topic, listener)
    wait_until(lambda: consumer.stats().quarantined == 1 and len(listener.of(b"unsendable")) == 2)
    wait_until(lambda: committed(config, group, topic) == 3)
    stats = consumer.stats()
    assert (stats.retried_locally, stats.consumed, stats.failed) == (1, 2, 2), stats
    assert len(listener.of(b"unbuildable")) == 1
    found = quarantined(config, topic)[b"unbuildable"]
    assert "this copy cannot be encoded" in found.reason
    assert found.headers.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == ids["unbuildable"]


@dataclass
class OrderlyFails(MessageListenerOrderly):
    """Fails every delivery of ``poison``; records the order of deliveries."""

    poison: bytes
    seen: list[bytes] = field(default_factory=list)

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        if any(m.body == self.poison for m in msgs):
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS


def test_an_orderly_message_whose_dlq_copy_cannot_be_built_is_quarantined_and_order_goes_on(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["a", "poison", "c"])
    build = send_back.send_back_record

    def unbuildable(msg: MessageExt, *args: Any, **kwargs: Any) -> Any:
        if msg.body == b"poison":
            raise ValueError("this copy cannot be encoded")
        return build(msg, *args, **kwargs)

    monkeypatch.setattr(retry_policy_module, "send_back_record", unbuildable)
    listener = OrderlyFails(b"poison")
    consumer = start_consumer(consumers, config, group, topic, listener, max_reconsume_times=0,
                              suspend_current_queue_time_millis=100)  # fmt: skip
    wait_until(lambda: listener.seen[-1:] == [b"c"] and consumer.stats().quarantined == 1)
    assert listener.seen == [b"a", b"poison", b"c"]
    wait_until(lambda: committed(config, group, topic) == 3)
    assert "this copy cannot be encoded" in quarantined(config, topic)[b"poison"].reason


# --- item 9: a record that cannot be decoded ------------------------------------------------
class _Header(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("val", ctypes.c_void_p), ("size", ctypes.c_ssize_t)]


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Value(ctypes.Union):
    _fields_ = [
        ("cstr", ctypes.c_char_p), ("i", ctypes.c_int), ("mem", _Mem), ("header", _Header),
        ("pad", ctypes.c_char * 64),
    ]  # fmt: skip


class _Vu(ctypes.Structure):
    """librdkafka's ``rd_kafka_vu_t``: one typed argument of ``rd_kafka_produceva``."""

    _fields_ = [("vtype", ctypes.c_int), ("u", _Value)]


_VTYPE_TOPIC, _VTYPE_VALUE, _VTYPE_MSGFLAGS, _VTYPE_HEADER = 1, 4, 7, 9
_MSG_F_COPY = 0x2


def produce_with_raw_header_names(
    bootstrap: str, topic: str, records: list[tuple[bytes, list[tuple[bytes, bytes]]]]
) -> None:
    """Write records whose header *names* are arbitrary bytes, through librdkafka's C API.

    confluent-kafka's Python ``produce`` cannot: it turns a ``bytes`` name into its
    ``repr`` (``"b'\\xff'"``) and crashes on a ``str`` name with a lone surrogate. Kafka itself
    takes any bytes, and clients in other languages (librdkafka, Go) write them.
    """
    libs = os.path.dirname(confluent_kafka.__file__) + ".libs"
    lib = ctypes.CDLL(glob.glob(os.path.join(libs, "librdkafka*.so*"))[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]  # fmt: skip
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Vu), ctypes.c_size_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    errors = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    assert lib.rd_kafka_conf_set(conf, b"bootstrap.servers", bootstrap.encode(), errors, 512) == 0
    handle = lib.rd_kafka_new(0, conf, errors, 512)
    assert handle, errors.value
    try:
        for value, headers in records:
            args = (_Vu * (3 + len(headers)))()
            keep = [ctypes.create_string_buffer(value, len(value))]
            args[0].vtype, args[0].u.cstr = _VTYPE_TOPIC, topic.encode()
            args[1].vtype = _VTYPE_VALUE
            args[1].u.mem.ptr, args[1].u.mem.size = (
                ctypes.cast(keep[0], ctypes.c_void_p),
                len(value),
            )
            args[2].vtype, args[2].u.i = _VTYPE_MSGFLAGS, _MSG_F_COPY
            for i, (name, data) in enumerate(headers, start=3):
                keep.append(ctypes.create_string_buffer(data, len(data)))
                args[i].vtype = _VTYPE_HEADER
                args[i].u.header.name = name
                args[i].u.header.val = ctypes.cast(keep[-1], ctypes.c_void_p)
                args[i].u.header.size = len(data)
            assert not lib.rd_kafka_produceva(handle, args, len(args)), "produce refused"
        assert lib.rd_kafka_flush(handle, 10_000) == 0, "not all records acknowledged"
    finally:
        lib.rd_kafka_destroy(handle)


def test_a_record_whose_headers_cannot_be_read_is_quarantined_and_its_batch_goes_on(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    good = [f"g{i}".encode() for i in range(6)]
    records: list[tuple[bytes, list[tuple[bytes, bytes]]]] = [(g, [(b"n", b"v")]) for g in good]
    # A header name that is not UTF-8: confluent-kafka raises converting it.
    records.insert(2, (b"bad-name", [(b"\xff\xfekey", b"v"), (b"fine", b"w")]))
    produce_with_raw_header_names(config.bootstrap_servers, topic, records)
    listener = Listener()
    consumer = start_consumer(consumers, config, group, topic, listener)
    wait_until(lambda: sorted(listener.bodies()) == good and consumer.stats().quarantined == 1)
    wait_until(lambda: committed(config, group, topic) == 7)
    found = quarantined(config, topic)[b"bad-name"]
    assert found.source_offset == 2
    assert "header" in found.reason, found.reason
    assert found.headers == {}, "headers that cannot be read are not carried"


def test_readers_show_a_record_whose_headers_cannot_be_read_without_them(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    records: list[tuple[bytes, list[tuple[bytes, bytes]]]] = [
        (b"before", [(b"n", b"v")]),
        (b"bad-name", [(b"\xff\xfekey", b"v")]),
        (b"after", [(b"n", b"w")]),
    ]
    produce_with_raw_header_names(config.bootstrap_servers, topic, records)
    got = {m.body: m.properties for m in read_messages(config, [topic], max_messages=3)}
    assert got == {b"before": {"n": "v"}, b"bad-name": {}, b"after": {"n": "w"}}


# --- item 8: bounds -----------------------------------------------------------------------
def test_held_bytes_pause_a_partition_long_before_the_message_count_does(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    bodies = [f"{i:04d}".encode() + b"x" * 100 * 1024 for i in range(200)]  # 20 MiB
    produce_raw(config, topic, [(b, None) for b in bodies])
    listener = Listener(block_first=frozenset(bodies))
    consumer = start_consumer(consumers, config, group, topic, listener,
                              consume_thread_count=1, pull_threshold_size_for_queue=1)  # fmt: skip
    key = (topic, 0)
    try:
        wait_until(lambda: key in fetcher_of(consumer).paused, timeout_s=15)
        pq = fetcher_of(consumer).queues[key]
        assert pq.held < consumer.settings.pull_threshold_for_queue
        # Over by one record at most: the rest of the poll is fetched again later.
        assert (1 << 20) <= pq.held_bytes < (1 << 20) + len(bodies[0]) + 1024, pq.held_bytes
    finally:
        listener.gate.set()
    wait_until(lambda: len(listener.bodies()) == len(bodies), timeout_s=30)
    assert sorted(listener.bodies()) == bodies, "each message exactly once, in the end"
    wait_until(lambda: committed(config, group, topic) == len(bodies))


def test_a_partition_holds_exactly_pull_threshold_for_queue_and_fetches_the_rest_later(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    bodies = [f"c{i:03d}".encode() for i in range(100)]
    produce_raw(config, topic, [(b, None) for b in bodies])
    listener = Listener(block_first=frozenset(bodies))
    consumer = start_consumer(consumers, config, group, topic, listener,
                              consume_thread_count=1, pull_threshold_for_queue=7)  # fmt: skip
    key = (topic, 0)
    try:
        wait_until(lambda: key in fetcher_of(consumer).paused, timeout_s=15)
        assert fetcher_of(consumer).queues[key].held == 7
    finally:
        listener.gate.set()
    wait_until(lambda: len(listener.bodies()) == len(bodies), timeout_s=30)
    assert sorted(listener.bodies()) == bodies
    wait_until(lambda: committed(config, group, topic) == len(bodies))


def test_a_listener_past_consume_timeout_is_sent_back_and_its_late_result_ignored(
    config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["stuck", "next"])
    # The stuck delivery returns RECONSUME_LATER when let go: that late result is ignored.
    listener = Listener(fail_first=frozenset({b"stuck"}), block_first=frozenset({b"stuck"}))
    consumer = start_consumer(consumers, config, group, topic, listener,
                              consume_timeout=0.05)  # minutes: 3 s  # fmt: skip
    try:
        wait_until(lambda: len(listener.of(b"stuck")) == 2, timeout_s=30)
        again = listener.of(b"stuck")[1]
        assert again.kafka_topic == retry_topic(group, config.namespace)
        assert again.reconsume_times == 1
        wait_until(lambda: committed(config, group, topic) == 2)
        assert listener.returned == [], "the first listener call still runs"
    finally:
        listener.gate.set()
    wait_until(lambda: listener.returned == [b"stuck"])
    consumer.shutdown(timeout_ms=10_000)  # lets the late result be processed, or ignored
    stats = consumer.stats()
    assert (stats.failed, stats.sent_back, stats.consumed) == (1, 1, 2), stats
    assert len(listener.of(b"stuck")) == 2


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_shutdown_called_from_a_listener_returns_at_once_and_a_second_call_waits_for_it(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    orderly: bool,
) -> None:  # fmt: skip
    # The listener shuts its own consumer down, then returns success. Waiting there for the
    # listeners to finish would wait for itself (for drain_timeout_ms, then abandon its own
    # message). The main thread's shutdown, called meanwhile, must not return before the
    # consumer is closed: by then the message is committed.
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["stop"])
    box: list[PushConsumer] = []
    took: list[float] = []
    called = threading.Event()

    def listener(msg: MessageExt) -> ConsumeStatus:
        called.set()
        started = time.monotonic()
        box[0].shutdown()
        took.append(time.monotonic() - started)
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        group,
        config=config,
        orderly=orderly,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        drain_timeout_ms=6000,
    )
    box.append(consumer)
    consumer.subscribe(topic, listener)
    consumer.start()
    consumers.append(consumer)
    assert called.wait(30)
    consumer.shutdown()
    assert took and took[0] < 2, f"shutdown in the listener took {took} s"
    assert committed(config, group, topic) == 1


def test_shutdown_is_bounded_by_a_hung_listener_and_never_commits_past_it(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="bridge.consumer")
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["hung", "ok1", "ok2"])
    listener = Listener(block_first=frozenset({b"hung"}))
    consumer = start_consumer(consumers, config, group, topic, listener, drain_timeout_ms=500,
                              consume_thread_count=3)  # fmt: skip
    try:
        wait_until(lambda: listener.blocked == [b"hung"] and len(listener.bodies()) == 3)
        stopper = threading.Thread(target=consumer.shutdown, daemon=True)
        started = time.monotonic()
        stopper.start()
        stopper.join(15)
        assert not stopper.is_alive(), "shutdown() waits for ever on a hung listener"
        assert time.monotonic() - started < 10
    finally:
        listener.gate.set()
    assert f"{topic}[0]" in caplog.text and "abandoned" in caplog.text, caplog.text
    assert committed(config, group, topic) <= 0, "the offset passed the abandoned message"
    again = Listener()
    start_consumer(consumers, config, group, topic, again)
    wait_until(lambda: b"hung" in again.bodies())


@dataclass
class OrderlyLog(MessageListenerOrderly):
    """Logs every call (who, partition, bodies, start, end); consumer ``A`` blocks its first
    call on each partition until ``gate`` is set."""

    name: str
    calls: list[tuple[str, int, list[bytes], float, float | None]]
    lock: threading.Lock
    gate: threading.Event
    blocked: set[int] = field(default_factory=set)

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        partition = context.message_queue.queue_id
        with self.lock:
            index = len(self.calls)
            self.calls.append(
                (self.name, partition, [m.body for m in msgs], time.monotonic(), None)
            )
            block = self.name == "A" and partition not in self.blocked
            self.blocked.add(partition)
        if block:
            self.gate.wait(60)
        with self.lock:
            self.calls[index] = (*self.calls[index][:4], time.monotonic())
        return ConsumeOrderlyStatus.SUCCESS


def test_an_orderly_partition_never_runs_two_listeners_when_it_moves_to_another_consumer(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=2)
    group = unique("g")
    with Producer("test_pg", config=config) as producer:
        for p in range(2):
            for i in range(5):
                producer.send_sync(Message(topic, f"p{p}-{i}"), partition=p)
    calls: list[tuple[str, int, list[bytes], float, float | None]] = []
    lock, gate = threading.Lock(), threading.Event()
    a = start_consumer(consumers, config, group, topic, OrderlyLog("A", calls, lock, gate),
                       drain_timeout_ms=500, consume_thread_count=4)  # fmt: skip
    try:
        wait_until(lambda: len(calls) == 2)  # A's first call on each partition, blocked
        start_consumer(consumers, config, group, topic, OrderlyLog("B", calls, lock, gate),
                       drain_timeout_ms=500, consume_thread_count=4)  # fmt: skip
        wait_until(
            lambda: all(pq.dropped for pq in list(fetcher_of(a).queues.values())), timeout_s=15
        )
        since = time.monotonic()
        # Either the next owner starts while A's listeners still run (the defect), or several
        # drain timeouts pass with nobody running the moved partitions.
        wait_until(lambda: len(calls) > 2 or time.monotonic() - since > 5, timeout_s=15)
        with lock:
            assert len(calls) == 2, f"a partition ran while its old listener still ran: {calls}"
    finally:
        gate.set()
    wanted = {f"p{p}-{i}".encode() for p in range(2) for i in range(5)}
    wait_until(lambda: {b for c in list(calls) for b in c[2]} >= wanted, timeout_s=30)
    wait_until(
        lambda: committed(config, group, topic, 0) + committed(config, group, topic, 1) == 10
    )
    with lock:
        for p in range(2):
            mine = sorted((c for c in calls if c[1] == p), key=lambda c: c[3])
            for before, after in itertools.pairwise(mine):
                assert before[4] is not None and before[4] <= after[3], f"overlap on {p}: {mine}"
            bodies = [b for c in mine for b in c[2]]
            assert bodies == [f"p{p}-{i}".encode() for i in range(5)], bodies


# --- a copy that can never be written (review finding 1) -----------------------------------
BIG_BODY = 2 << 20
"""A 2 MiB body: more than the 1 MB the SCHEDULE, DLQ and QUARANTINE topics take."""


@dataclass
class FailsAlways(Listener):
    """A :class:`Listener` that fails every delivery of the bodies in ``poison``."""

    poison: frozenset[bytes] = frozenset()

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        status = super().__call__(msg)
        return ConsumeStatus.RECONSUME_LATER if msg.body in self.poison else status


def test_a_failed_message_whose_copies_are_too_large_is_quarantined_without_its_value(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
) -> None:  # fmt: skip
    # The listener fails the 2 MiB message every time. The topic takes 5 MB records. A
    # consumer whose max_message_bytes is raised writes the 2 MiB retry copy and the broker
    # refuses it; one with the default limit is refused by its own producer at produce().
    # Either way the copy can never be written.
    big = config.replace(max_message_bytes=4 << 20)
    topic = unique("t")
    TopicAdmin(big).ensure_topics([TopicSpec(topic, 1, {"max.message.bytes": str(5 << 20)})])
    body = os.urandom(BIG_BODY)
    with Producer("test_pg", config=big) as producer:
        [big_id] = [producer.send_sync(Message(topic, body, keys="big-key")).msg_id]
        for name in ("after1", "after2"):
            producer.send_sync(Message(topic, name))
    runs = []
    for settings in (big, config):
        group = unique("g")
        listener = FailsAlways(poison=frozenset({body}))
        consumer = start_consumer(consumers, settings, group, topic, listener)
        runs.append((group, listener, consumer))
    for group, listener, consumer in runs:

        def moved_on(consumer: PushConsumer = consumer, group: str = group) -> bool:
            return consumer.stats().quarantined == 1 and committed(big, group, topic) == 3

        try:
            wait_until(moved_on, timeout_s=45)
        except pytest.fail.Exception:
            pytest.fail(
                f"group {group}: the partition is pinned behind the 2 MiB message: listener "
                f"called {len(listener.of(body))} times on it, committed offset "
                f"{committed(big, group, topic)} of 3, {consumer.stats()}"
            )
        assert len(listener.of(b"after1")) == len(listener.of(b"after2")) == 1
        # Consumed again locally after each refused copy, a bounded number of times.
        assert len(listener.of(body)) == 3, len(listener.of(body))
        stats = consumer.stats()
        assert (stats.failed, stats.sent_back, stats.consumed) == (3, 0, 2), stats
    found = {
        q.quarantined_by: q
        for q in read_quarantine(big, timeout_ms=3000)
        if q.source_topic == topic
    }
    assert set(found) == {f"consumer {group}" for group, _, _ in runs}, found
    for q in found.values():
        assert (q.source_partition, q.source_offset, q.key) == (0, 0, b"big-key")
        assert not q.value, "the copy too large to keep whole is kept without its value"
        assert "refused" in q.reason and "MSG_SIZE_TOO_LARGE" in q.reason, q.reason
        assert f"value of {len(body)} bytes" in q.reason, q.reason
        assert big_id in q.reason, q.reason


class OrderlyFailsAny(MessageListenerOrderly):
    """Fails every batch holding one of ``poison``; records each body's deliveries."""

    def __init__(self, poison: frozenset[bytes]) -> None:
        self.poison = poison
        self.seen: list[bytes] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        if any(m.body in self.poison for m in msgs):
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    def of(self, body: bytes) -> list[bytes]:
        return [b for b in self.seen if b == body]


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_copy_refused_only_for_the_size_of_its_batch_is_sent_alone_and_not_blamed(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    orderly: bool,
) -> None:  # fmt: skip
    # The group's DLQ takes records of 2,000 bytes at most. Two messages fail at once, with
    # no retries left: a small one and one of 5,000 bytes. Their DLQ copies share a request
    # batch (the concurrent consumer's copies linger; the orderly one sends a failed batch's
    # copies together), which the broker refuses as a whole (MSG_SIZE_TOO_LARGE for both).
    # The small copy is not too large: sent alone, it is dead-lettered, and its message is
    # neither consumed again nor quarantined.
    topic = unique("t")
    group = unique("g")
    TopicAdmin(config).ensure_topics(
        [
            TopicSpec(topic, 1),
            TopicSpec(config.catalog().dlq_topic(group), 1, {"max.message.bytes": "2000"}),
        ]
    )
    small, large = b"small-fails", os.urandom(5000)
    bodies = [small, large] if orderly else [small, large, b"after"]
    with Producer("test_pg", config=config) as producer:
        for body in bodies:
            producer.send_async(Message(topic, body))
        assert producer.flush() == 0
    poison = frozenset({small, large})
    listener: OrderlyFailsAny | FailsAlways
    if orderly:
        listener = OrderlyFailsAny(poison)
        options: dict[str, Any] = {
            "consume_message_batch_max_size": 2,
            "suspend_current_queue_time_millis": 100,
        }
    else:
        listener = FailsAlways(poison=poison)
        options = {}
    consumer = start_consumer(
        consumers, config, group, topic, listener, max_reconsume_times=0, **options
    )

    def moved_on() -> bool:
        stats = consumer.stats()
        done = stats.dead_lettered + stats.quarantined == 2
        return done and committed(config, group, topic) == len(bodies)

    wait_until(moved_on, timeout_s=45)
    stats = consumer.stats()
    assert (stats.dead_lettered, stats.quarantined) == (1, 1), stats
    assert len(listener.of(small)) == 1, "the small message was consumed again"
    dead = read_dead_letters(config, group, timeout_ms=3000)
    assert [m.body for m in dead] == [small], [len(m.body) for m in dead]
    [quarantined] = [q for q in read_quarantine(config, timeout_ms=3000) if q.source_topic == topic]
    assert quarantined.source_offset == 1, quarantined


def test_an_orderly_dlq_copy_too_large_even_alone_is_sent_alone_once_per_attempt(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The orderly consumer dead-letters with send_records_sync, which sends a copy refused
    # with its request batch again alone itself: the consumer sent it alone once more (two
    # alone sends of the same refused copy per attempt).
    topic = unique("t")
    group = unique("g")
    TopicAdmin(config).ensure_topics(
        [
            TopicSpec(topic, 1),
            TopicSpec(config.catalog().dlq_topic(group), 1, {"max.message.bytes": "2000"}),
        ]
    )
    small, large = b"small-fails", os.urandom(5000)
    with Producer("test_pg", config=config) as producer:
        for body in (small, large):
            producer.send_async(Message(topic, body))
        assert producer.flush() == 0
    send_alone = resend_module.AloneResender.send_all_sync
    alone_sends: list[int] = []

    def counted(self: resend_module.AloneResender, refused: list[Any], started: float) -> Any:
        alone_sends.extend(1 for r, _ in refused if len(r.value or b"") >= len(large))
        return send_alone(self, refused, started)

    monkeypatch.setattr(resend_module.AloneResender, "send_all_sync", counted)
    listener = OrderlyFailsAny(frozenset({small, large}))
    consumer = start_consumer(
        consumers, config, group, topic, listener, max_reconsume_times=0,
        consume_message_batch_max_size=2, suspend_current_queue_time_millis=100,
    )  # fmt: skip
    wait_until(lambda: committed(config, group, topic) == 2, timeout_s=45)
    stats = consumer.stats()
    assert (stats.dead_lettered, stats.quarantined) == (1, 1), stats
    # Each delivery of the large message tried its DLQ copy once, alone once.
    assert len(alone_sends) == len(listener.of(large)) == 3, (alone_sends, listener.seen)


def test_a_copy_sent_alone_is_acknowledged_before_the_shutdowns_commit(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
) -> None:  # fmt: skip
    # As above, but the consumer shuts down as soon as both messages have failed: the small
    # copy is sent again alone while the shutdown flushes the copies, and the commit must wait
    # for it too. Committed before it was acknowledged, the small message stayed uncommitted
    # while its copy was written after all: consumed again by the group, dead-lettered twice.
    topic = unique("t")
    group = unique("g")
    TopicAdmin(config).ensure_topics(
        [
            TopicSpec(topic, 1),
            TopicSpec(config.catalog().dlq_topic(group), 1, {"max.message.bytes": "2000"}),
        ]
    )
    small, large = b"small-fails", os.urandom(5000)
    with Producer("test_pg", config=config) as producer:
        for body in (small, large):
            producer.send_async(Message(topic, body))
        assert producer.flush() == 0
    box: list[PushConsumer] = []
    seen: list[bytes] = []
    both_failed = threading.Event()
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        with lock:
            seen.append(msg.body)
            if len(seen) == 2:
                box[0].shutdown()  # starts the shutdown; this listener's result still counts
                both_failed.set()
        return ConsumeStatus.RECONSUME_LATER

    consumer = start_consumer(consumers, config, group, topic, listener, max_reconsume_times=0)
    box.append(consumer)
    assert both_failed.wait(30)
    consumer.shutdown()  # returns once the shutdown the listener started has closed everything
    assert committed(config, group, topic) == 1, "the small message's offset was not committed"
    dead = read_dead_letters(config, group, timeout_ms=3000)
    assert [m.body for m in dead] == [small], [len(m.body) for m in dead]


def test_shutdown_after_a_failed_start_returns_at_once(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    # librdkafka refuses the property when the producer of copies is made: start() fails.
    # A shutdown() after it (as in a finally: block) has nothing to wait for.
    broken = config.replace(kafka={**config.kafka, "batch.num.messages": "0"})
    consumer = PushConsumer(unique("g"), config=broken)
    consumer.subscribe(unique("t"), lambda msg: ConsumeStatus.CONSUME_SUCCESS)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the refusal gives
        consumer.start()
    started = time.monotonic()
    consumer.shutdown()
    assert time.monotonic() - started < 2


_EXITS_AFTER_ITS_LISTENER_STOPS_IT = """
import sys, threading
from bridge import ClientConfig, ConsumeFromWhere, ConsumeStatus, PushConsumer
bootstrap, namespace, topic, group = sys.argv[1:5]
done = threading.Event()
seen = []
box = []
def listener(msg):
    seen.append(msg.body)
    if len(seen) == 5:
        box[0].shutdown()
        done.set()
    return ConsumeStatus.CONSUME_SUCCESS
consumer = PushConsumer(
    group, config=ClientConfig(bootstrap_servers=bootstrap, namespace=namespace),
    consume_thread_count=1, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    persist_consumer_offset_interval_ms=600_000,
)
box.append(consumer)
consumer.subscribe(topic, listener)
consumer.start()
assert done.wait(60)
"""


def test_a_process_ending_after_a_listener_stopped_its_consumer_commits_first(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    # The main thread ends right after a listener called shutdown(), which runs on a thread
    # of its own: the process must wait for that thread, which commits what was consumed.
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, [f"m{i}" for i in range(5)])
    args = [config.bootstrap_servers, config.namespace, topic, group]
    script = [sys.executable, "-c", _EXITS_AFTER_ITS_LISTENER_STOPS_IT, *args]
    ended = subprocess.run(script, capture_output=True, text=True, timeout=120, check=False)
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert committed(config, group, topic) == 5


# --- values a listener hands back through its context (review finding 6) -------------------
class FloatAck(MessageListenerConcurrently):
    """Acknowledges half of each batch with a float ``ack_index``."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        with self.lock:
            self.seen += [m.body for m in msgs]
        context.ack_index = len(msgs) / 2  # type: ignore[assignment]
        return ConsumeStatus.CONSUME_SUCCESS


def test_a_float_ack_index_fails_its_batch_and_neither_strands_the_rest_nor_pins_the_offset(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="bridge.consumer")
    topic = make_topic(config, unique("t"))
    group = unique("g")
    bodies = [f"m{i}" for i in range(8)]
    send(config, topic, bodies)
    listener = FloatAck()
    # One pool thread: the 4 requests of 2 messages run in one task, one after the other.
    consumer = start_consumer(consumers, config, group, topic, listener,
                              consume_thread_count=1, consume_message_batch_max_size=2)  # fmt: skip
    try:
        wait_until(lambda: committed(config, group, topic) == len(bodies), timeout_s=30)
    except pytest.fail.Exception:
        pytest.fail(
            f"committed offset {committed(config, group, topic)} of {len(bodies)}; the "
            f"listener saw {listener.seen}; {consumer.stats()}"
        )
    assert sorted(listener.seen) == sorted(b.encode() for b in bodies)
    stats = consumer.stats()
    assert (stats.consumed, stats.failed, stats.sent_back) == (0, 8, 8), stats
    assert "ack_index=1.0" in caplog.text, caplog.text


@dataclass
class OrderlyNoneSuspend(MessageListenerOrderly):
    """Suspends the first call with ``suspend_current_queue_time_millis = None``."""

    seen: list[bytes] = field(default_factory=list)

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        if len(self.seen) == 1:
            context.suspend_current_queue_time_millis = None  # type: ignore[assignment]
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS


def test_an_orderly_suspend_that_is_no_int_waits_the_default_and_the_partition_goes_on(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["a", "b", "c"])
    listener = OrderlyNoneSuspend()
    consumer = start_consumer(consumers, config, group, topic, listener,
                              suspend_current_queue_time_millis=200)  # fmt: skip
    try:
        wait_until(lambda: committed(config, group, topic) == 3, timeout_s=20)
    except pytest.fail.Exception:
        pytest.fail(
            f"committed offset {committed(config, group, topic)} of 3; the listener saw "
            f"{listener.seen}; {consumer.stats()}"
        )
    assert listener.seen == [b"a", b"a", b"b", b"c"]


@dataclass
class OrderlyRaisesOnce(MessageListenerOrderly):
    """Raises ``error`` on the first call for ``b``, consumes everything else."""

    error: type[BaseException]
    seen: list[bytes] = field(default_factory=list)

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        if msgs[0].body == b"b" and self.seen.count(b"b") == 1:
            raise self.error("listener bug")
        return ConsumeOrderlyStatus.SUCCESS


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("kind", ["listener", "callable"])
def test_an_orderly_listener_raising_system_exit_fails_its_batch_and_the_partition_goes_on(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    error: type[BaseException], kind: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, ["a", "b", "c", "d"])
    listener = OrderlyRaisesOnce(error)
    if kind == "listener":
        target: Any = listener
        options: dict[str, Any] = {}
    else:

        def target(msg: MessageExt) -> ConsumeOrderlyStatus:
            return listener.consume_message([msg], ConsumeOrderlyContext(MessageQueue(topic, 0)))

        options = {"orderly": True}
    with caplog.at_level(logging.WARNING, logger="bridge.consumer"):
        consumer = start_consumer(consumers, config, group, topic, target,
                                  suspend_current_queue_time_millis=200, **options)  # fmt: skip
        try:
            wait_until(lambda: committed(config, group, topic) == 4, timeout_s=20)
        except pytest.fail.Exception:
            pytest.fail(
                f"committed offset {committed(config, group, topic)} of 4; the listener saw "
                f"{listener.seen}; {consumer.stats()}"
            )
    assert listener.seen == [b"a", b"b", b"b", b"c", b"d"]
    stats = consumer.stats()
    assert (stats.consumed, stats.failed, stats.sent_back) == (4, 1, 0)
    assert any(r.exc_info and r.exc_info[0] is error for r in caplog.records)


# --- a listener that changes what it was handed ---------------------------------------------
class EmptiesConcurrently(MessageListenerConcurrently):
    """Consumes its batch, then empties the list it was handed."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        with self.lock:
            self.seen += [m.body for m in msgs]
        msgs.clear()
        return ConsumeStatus.CONSUME_SUCCESS


class EmptiesOrderly(MessageListenerOrderly):
    """Consumes its batch, then empties the list it was handed."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        msgs.reverse()
        del msgs[1:]
        return ConsumeOrderlyStatus.SUCCESS


class Relocates:
    """A per-message listener that consumes a message, then rewrites where it was read."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.seen.append(msg.body)
        msg.queue_offset = 1_000_000
        msg.topic = "elsewhere"
        msg.queue_id = 7
        return ConsumeStatus.CONSUME_SUCCESS


@pytest.mark.parametrize(
    ("make", "orderly", "batch"),
    [
        (EmptiesConcurrently, False, 4), (EmptiesOrderly, True, 4), (Relocates, False, 4),
        (Relocates, True, 4), (Relocates, False, 1),
    ],
    ids=[
        "batch-concurrent", "batch-orderly", "callable-concurrent", "callable-orderly",
        "callable-concurrent-one-by-one",
    ],
)  # fmt: skip
def test_a_listener_changing_its_messages_or_their_list_neither_stalls_nor_loses_them(
    make: Callable[[], EmptiesConcurrently | EmptiesOrderly | Relocates], orderly: bool,
    batch: int, config: ClientConfig, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    bodies = [f"m{i}".encode() for i in range(10)]
    produce_raw(config, topic, [(b, None) for b in bodies])
    listener = make()
    consumer = start_consumer(
        consumers, config, group, topic, listener, orderly=orderly,
        consume_message_batch_max_size=batch,
    )  # fmt: skip
    wait_until(lambda: committed(config, group, topic) == len(bodies))
    assert sorted(listener.seen) == bodies, "each consumed once"
    stats = consumer.stats()
    assert (stats.consumed, stats.failed) == (len(bodies), 0), stats


class OrderlyReturnsConcurrentSuccess(MessageListenerOrderly):
    """An orderly listener returning the concurrent enum's success."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.seen += [m.body for m in msgs]
        return ConsumeStatus.CONSUME_SUCCESS  # type: ignore[return-value]


def test_an_orderly_listener_returning_consume_success_is_not_retried_in_place_for_ever(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    bodies = [f"m{i}".encode() for i in range(5)]
    produce_raw(config, topic, [(b, None) for b in bodies])
    listener = OrderlyReturnsConcurrentSuccess()
    start_consumer(consumers, config, group, topic, listener, suspend_current_queue_time_millis=50)
    wait_until(lambda: committed(config, group, topic) == len(bodies))
    assert listener.seen == bodies


def test_a_listener_returning_no_status_is_a_failure_and_says_so(
    config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    group = unique("g")
    produce_raw(config, topic, [(b"m", None)])
    returned: list[object] = []

    def says_success(msg: MessageExt) -> Any:
        returned.append(msg.body)
        return "CONSUME_SUCCESS"

    with caplog.at_level(logging.WARNING, logger="bridge.consumer"):
        consumer = start_consumer(
            consumers, config, group, topic, says_success, max_reconsume_times=0
        )
        wait_until(lambda: consumer.stats().dead_lettered == 1)
    assert "listener returned 'CONSUME_SUCCESS'" in caplog.text, caplog.text
    [letter] = read_dead_letters(config, group)
    assert letter.get_property(MessageConst.CONSUME_FAILURE) == "'CONSUME_SUCCESS'"
