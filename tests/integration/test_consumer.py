"""The push consumer against a real broker: retry with back-off, DLQ, ack_index, tag filters,
broadcasting, orderly retry, rebalance, SIGKILL, a refused send-back, replay, quarantine."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from bridge import ClientConfig, FilterExpression, Message, MessageConst, MessageExt, Producer
from bridge.cli import cli
from bridge.consumer import (
    ConsumeConcurrentlyContext,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    PushConsumer,
)
from bridge.consumer.admin import dlq_summary, read_dead_letters, replay_dead_letters
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.kafka.quarantine import read_quarantine
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import SystemTopic, TopicSpec
from topics.naming import retry_topic

# One worker runs the module: its coordinator (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_consumer")]

LEVELS = "1s 1s 1s 2s 3s"
"""Level 3 (a first retry) waits 1 s, level 4 2 s, level 5 3 s."""
LEVEL_S = {3: 1.0, 4: 2.0, 5: 3.0}


@pytest.fixture(scope="module")
def retry_config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level=LEVELS,
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture(scope="module")
def coordinator(retry_config: ClientConfig) -> Iterator[Coordinator]:
    config = CoordinatorConfig(
        client=retry_config, coordinator_id="consumer-tests", transaction_partitions=1,
        session_timeout_ms=6000,
    )  # fmt: skip
    with Coordinator(config) as running:
        warm = f"warmup-{uuid.uuid4().hex[:6]}"
        with Producer("warmup", config=retry_config) as producer:
            producer.send_sync(Message(warm, b"w", delay_time_level=1))
        from bridge import read_messages

        assert len(list(read_messages(retry_config, [warm], max_messages=1))) == 1
        yield running


@dataclass
class Delivery:
    body: str
    at: float
    reconsume_times: int
    topic: str
    kafka_topic: str
    msg_id: str
    msg: MessageExt


@dataclass
class Recorder:
    """Records every delivery; ``decide(msg, n)`` (n: deliveries of that body so far, this
    one included) says whether it succeeds."""

    decide: Callable[[MessageExt, int], bool] = lambda msg, n: True
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            body = msg.body.decode()
            self.deliveries.append(
                Delivery(
                    body, time.time(), msg.reconsume_times, msg.topic, msg.kafka_topic,
                    msg.msg_id, msg,
                )
            )  # fmt: skip
            n = sum(1 for d in self.deliveries if d.body == body)
        return (
            ConsumeStatus.CONSUME_SUCCESS if self.decide(msg, n) else ConsumeStatus.RECONSUME_LATER
        )

    def of(self, body: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.body == body]

    def bodies(self) -> list[str]:
        with self.lock:
            return [d.body for d in self.deliveries]


def make_topic(config: ClientConfig, name: str, partitions: int = 1) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def send(config: ClientConfig, topic: str, bodies: list[str], **kwargs: Any) -> list[str]:
    with Producer("test_pg", config=config) as producer:
        return [producer.send_sync(Message(topic, b, **kwargs)).msg_id for b in bodies]


@pytest.fixture()
def consumers() -> Iterator[list[PushConsumer]]:
    made: list[PushConsumer] = []
    yield made
    for consumer in made:
        consumer.shutdown()


def start_consumer(
    made: list[PushConsumer],
    config: ClientConfig,
    group: str,
    topic: str,
    listener: Any,
    expression: str | FilterExpression = "*",
    **options: Any,
) -> PushConsumer:
    options.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    options.setdefault("persist_consumer_offset_interval_ms", 200)
    options.setdefault("send_back_retry_delay_ms", 300)
    consumer = PushConsumer(group, config=config, **options)
    consumer.subscribe(topic, listener, expression)
    consumer.start()
    made.append(consumer)
    return consumer


def committed(config: ClientConfig, group: str, topic: str, partition: int = 0) -> int:
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        return int(reader.committed([TopicPartition(topic, partition)], timeout=10)[0].offset)
    finally:
        reader.close()


@pytest.mark.check("G6")
def test_failing_n_times_gets_n_plus_one_deliveries_with_growing_gaps(
    retry_config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"))
    recorder = Recorder(lambda msg, n: n > 3)
    start_consumer(consumers, retry_config, unique("g"), topic, recorder)
    [msg_id] = send(retry_config, topic, ["m"], keys="k1", tags="TagA", properties={"p": "v"})
    wait_until(lambda: len(recorder.of("m")) == 4, timeout_s=60)
    got = recorder.of("m")
    assert [d.reconsume_times for d in got] == [0, 1, 2, 3]
    gaps = [b.at - a.at for a, b in itertools.pairwise(got)]
    for gap, level in zip(gaps, (3, 4, 5), strict=True):
        assert gap >= LEVEL_S[level], (gaps, level)
    assert gaps[0] < gaps[1] < gaps[2], gaps
    assert {d.topic for d in got} == {topic}, "the listener sees the original topic"
    assert {d.msg_id for d in got} == {msg_id}
    for d in got[1:]:
        assert d.kafka_topic == retry_topic(consumers[0].group, retry_config.namespace)
        assert d.msg.get_property(MessageConst.ORIGIN_MESSAGE_ID) == msg_id
        assert d.msg.get_property(MessageConst.RETRY_TOPIC) == topic
        assert (d.msg.keys, d.msg.tags, d.msg.user_properties) == (["k1"], "TagA", {"p": "v"})


def test_after_max_reconsume_times_the_message_sits_in_the_dlq(
    retry_config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"))
    group = unique("g")
    recorder = Recorder(lambda msg, n: False)
    consumer = start_consumer(
        consumers, retry_config, group, topic, recorder, max_reconsume_times=2
    )
    [msg_id] = send(retry_config, topic, ["doomed"], keys="order-9", tags="TagZ",
                    properties={"region": "eu"})  # fmt: skip
    wait_until(lambda: consumer.stats().dead_lettered == 1, timeout_s=60)
    assert [d.reconsume_times for d in recorder.of("doomed")] == [0, 1, 2]
    [letter] = read_dead_letters(retry_config, group)
    assert letter.topic == f"%DLQ%{group}"
    assert letter.msg_id == msg_id
    assert letter.body == b"doomed"
    assert (letter.keys, letter.tags, letter.user_properties) == (
        ["order-9"], "TagZ", {"region": "eu"},
    )  # fmt: skip
    assert letter.get_property(MessageConst.RETRY_TOPIC) == topic
    assert letter.get_property(MessageConst.ORIGIN_MESSAGE_ID) == msg_id
    assert letter.reconsume_times == 3
    [summary] = dlq_summary(retry_config, group)
    assert (summary.count, summary.origin_topics, summary.reconsume_depth) == (
        1, {topic: 1}, {3: 1},
    )  # fmt: skip
    wait_until(lambda: committed(retry_config, group, topic) == 1)


class AckHalf(MessageListenerConcurrently):
    """First delivery of a batch: acknowledge up to index 1 and ask for level 5."""

    def __init__(self) -> None:
        self.first_batches: list[list[str]] = []
        self.retried: list[tuple[str, float]] = []
        self.sent_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        with self.lock:
            if msgs[0].reconsume_times == 0:
                self.first_batches.append([m.body.decode() for m in msgs])
                for m in msgs:
                    self.sent_at[m.body.decode()] = time.time()
                context.ack_index = 1
                context.delay_level_when_next_consume = 5
            else:
                self.retried += [(m.body.decode(), time.time()) for m in msgs]
        return ConsumeStatus.CONSUME_SUCCESS


def test_ack_index_resends_only_the_tail_at_the_listeners_level(
    retry_config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"))
    bodies = [f"b{i}" for i in range(6)]
    send(retry_config, topic, bodies)
    listener = AckHalf()
    start_consumer(
        consumers, retry_config, unique("g"), topic, listener, consume_message_batch_max_size=6
    )
    wait_until(lambda: sum(len(b) for b in listener.first_batches) == 6, timeout_s=30)
    tails = {b for batch in listener.first_batches for b in batch[2:]}
    assert tails, f"every batch had at most 2 messages: {listener.first_batches}"
    wait_until(lambda: {b for b, _ in listener.retried} == tails, timeout_s=60)
    for body, at in listener.retried:
        assert at - listener.sent_at[body] >= LEVEL_S[5]
    assert len(listener.retried) == len(tails)


def test_tag_filters_deliver_only_matching_messages_and_commit_past_the_rest(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"))
    with Producer("test_pg", config=retry_config) as producer:
        for tag in ("TagA", "TagB", "TagC", None, "TagA"):
            producer.send_sync(Message(topic, f"{tag}", tags=tag))
    recorder = Recorder()
    group = unique("g")
    consumer = start_consumer(consumers, retry_config, group, topic, recorder, "TagA || TagC")
    wait_until(lambda: consumer.stats().filtered == 2 and len(recorder.bodies()) == 3)
    assert sorted(recorder.bodies()) == ["TagA", "TagA", "TagC"]
    wait_until(lambda: committed(retry_config, group, topic) == 5)


def test_broadcasting_gives_every_instance_every_message_and_drops_failures(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"), partitions=2)
    group = unique("g")
    bodies = [f"m{i}" for i in range(10)]
    send(retry_config, topic, bodies)
    recorders = [Recorder(lambda msg, n: False), Recorder(lambda msg, n: False)]
    instances = [
        start_consumer(
            consumers,
            retry_config,
            group,
            topic,
            r,
            instance_name=f"i{i}",
            message_model=MessageModel.BROADCASTING,
        )
        for i, r in enumerate(recorders)
    ]
    for consumer, recorder in zip(instances, recorders, strict=True):
        wait_until(lambda c=consumer: c.stats().dropped == 10)  # type: ignore[misc]
        assert sorted(recorder.bodies()) == sorted(bodies), "each once, no retry"
    assert retry_topic(group, retry_config.namespace) not in TopicAdmin(retry_config).list_topics()


class OrderlyRecorder(MessageListenerOrderly):
    def __init__(self, failures: dict[str, int]) -> None:
        self.failures = failures
        self.seen: list[tuple[str, float, int]] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        [msg] = msgs
        body = msg.body.decode()
        self.seen.append((body, time.time(), msg.reconsume_times))
        if self.failures.get(body, 0) > 0:
            self.failures[body] -= 1
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS


def test_orderly_retry_in_place_keeps_order_and_waits_the_suspend_time(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"))
    bodies = [f"o{i}" for i in range(8)]
    send(retry_config, topic, bodies)
    listener = OrderlyRecorder({"o3": 2})
    start_consumer(consumers, retry_config, unique("g"), topic, listener,
                   suspend_current_queue_time_millis=300)  # fmt: skip
    wait_until(lambda: len(listener.seen) == 10)
    order = [b for b, _, _ in listener.seen]
    assert order == ["o0", "o1", "o2", "o3", "o3", "o3", "o4", "o5", "o6", "o7"]
    threes = [(at, times) for b, at, times in listener.seen if b == "o3"]
    assert [times for _, times in threes] == [0, 1, 2]
    assert all(b[0] - a[0] >= 0.3 for a, b in itertools.pairwise(threes))


def test_orderly_message_out_of_retries_goes_to_the_dlq_and_order_goes_on(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"))
    group = unique("g")
    send(retry_config, topic, ["a", "poison", "c"])
    listener = OrderlyRecorder({"poison": 99})
    start_consumer(consumers, retry_config, group, topic, listener, max_reconsume_times=2,
                   suspend_current_queue_time_millis=100)  # fmt: skip
    wait_until(lambda: [b for b, _, _ in listener.seen][-1:] == ["c"])
    assert [b for b, _, _ in listener.seen] == ["a", "poison", "poison", "poison", "c"]
    [letter] = read_dead_letters(retry_config, group)
    assert (letter.body, letter.reconsume_times) == (b"poison", 3)


def test_a_rebalance_mid_stream_loses_and_skips_nothing(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"), partitions=4)
    group = unique("g")
    bodies = [f"r{i}" for i in range(400)]
    # Spread evenly: an empty partition would have no committed offset to count, and one the
    # second consumer gets could be empty of what is left.
    with Producer("test_pg", config=retry_config) as producer:
        for i, body in enumerate(bodies):
            producer.send_sync(Message(topic, body, tags="T"), partition=i % 4)

    def slow(msg: MessageExt, n: int) -> bool:
        time.sleep(0.03)  # the work a listener does: keeps the stream going while B joins
        return True

    first, second = Recorder(slow), Recorder(slow)
    start_consumer(consumers, retry_config, group, topic, first, consume_thread_count=4)
    wait_until(lambda: len(first.bodies()) >= 50)
    start_consumer(consumers, retry_config, group, topic, second, consume_thread_count=4)
    assert len(set(first.bodies())) < len(bodies) / 2, "B joined after the stream was done"
    wait_until(lambda: set(first.bodies()) | set(second.bodies()) == set(bodies), timeout_s=90)
    wait_until(lambda: len(second.bodies()) > 0)
    for consumer in consumers:
        consumer.shutdown()
    assert sum(committed(retry_config, group, topic, p) for p in range(4)) == 400


CONSUMER_SCRIPT = """
import os, sys, time
from bridge import ClientConfig, ConsumeStatus, PushConsumer, ConsumeFromWhere
config = ClientConfig(bootstrap_servers=sys.argv[1], namespace=sys.argv[2],
                      kafka={"session.timeout.ms": "6000"})
out = os.open(sys.argv[5], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def listener(msg):
    time.sleep(0.01)
    os.write(out, msg.body + b"\\n")
    return ConsumeStatus.CONSUME_SUCCESS
consumer = PushConsumer(sys.argv[3], config=config, consume_thread_count=8,
                        consume_message_batch_max_size=4,
                        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                        persist_consumer_offset_interval_ms=100)
consumer.subscribe(sys.argv[4], listener)
consumer.start()
while True:
    time.sleep(1)
"""


def test_a_consumer_killed_mid_batch_loses_and_skips_nothing(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"), partitions=3)
    group = unique("g")
    bodies = [f"k{i}" for i in range(600)]
    send(retry_config, topic, bodies)
    log = tmp_path / "processed"
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSUMER_SCRIPT, retry_config.bootstrap_servers,
         retry_config.namespace, group, topic, str(log)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: log.exists() and len(log.read_text().split()) >= 150, timeout_s=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    before = log.read_text().split()
    assert len(set(before)) < len(bodies), "the kill came after all the work"
    recorder = Recorder()
    start_consumer(consumers, retry_config, group, topic, recorder)
    wait_until(lambda: set(before) | set(recorder.bodies()) == set(bodies), timeout_s=60)
    skipped_and_redone = set(before) & set(recorder.bodies())
    assert len(skipped_and_redone) < len(before), "everything done before the kill was redone"


def set_topic_config(config: ClientConfig, topic: str, name: str, value: str) -> None:
    resource = ConfigResource(
        ResourceType.TOPIC, topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    admin = new_admin(config)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)


def test_a_refused_send_back_keeps_the_message_until_it_goes_through(
    retry_config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"))
    group = unique("g")
    schedule = retry_config.catalog().topic(SystemTopic.SCHEDULE)
    set_topic_config(retry_config, schedule, "max.message.bytes", "64")
    restored = False
    try:
        recorder = Recorder(lambda msg, n: msg.kafka_topic != topic)
        consumer = start_consumer(consumers, retry_config, group, topic, recorder)
        send(retry_config, topic, ["keep-me"])
        wait_until(lambda: consumer.stats().retried_locally >= 2, timeout_s=30)
        assert all(d.kafka_topic == topic for d in recorder.of("keep-me"))
        assert committed(retry_config, group, topic) <= 0, "the offset passed a kept message"
        set_topic_config(retry_config, schedule, "max.message.bytes", "1048588")
        restored = True
        wait_until(lambda: consumer.stats().consumed == 1, timeout_s=60)
    finally:
        if not restored:
            set_topic_config(retry_config, schedule, "max.message.bytes", "1048588")
    final = recorder.of("keep-me")[-1]
    assert final.kafka_topic == retry_topic(group, retry_config.namespace)
    assert consumer.stats().sent_back == 1
    wait_until(lambda: committed(retry_config, group, topic) == 1)


def test_dead_letters_replayed_to_their_origin_are_delivered_again(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"))
    group = unique("g")
    recorder = Recorder(lambda msg, n: n > 1)  # each body fails its first delivery only
    consumer = start_consumer(consumers, retry_config, group, topic, recorder,
                              max_reconsume_times=0)  # fmt: skip
    ids = {}
    for key in ("k1", "k2"):
        [ids[key]] = send(retry_config, topic, [f"body-{key}"], keys=key)
    wait_until(lambda: consumer.stats().dead_lettered == 2)
    # The command line shows them, then replays only k1.
    runner = CliRunner()
    env = {"KAFKA_BOOTSTRAP_SERVERS": retry_config.bootstrap_servers,
           "BRIDGE_NAMESPACE": retry_config.namespace}  # fmt: skip
    status = runner.invoke(cli, ["dlq", "status", "--group", group], env=env)
    assert status.exit_code == 0, status.output
    assert group in status.output and topic in status.output
    replay = runner.invoke(cli, ["dlq", "replay", "--group", group, "--key", "k1"], env=env)
    assert replay.exit_code == 0, replay.output
    assert "replayed 1" in replay.output
    wait_until(lambda: len(recorder.of("body-k1")) == 2)
    again = recorder.of("body-k1")[-1]
    assert again.kafka_topic == topic and again.msg_id == ids["k1"]
    assert again.reconsume_times == 0
    assert again.msg.get_property(MessageConst.RETRY_TOPIC) is None
    assert consumer.stats().consumed == 1
    assert len(recorder.of("body-k2")) == 1, "k2 was not replayed"
    replayed = replay_dead_letters(retry_config, group, msg_ids=[ids["k2"]], dry_run=True)
    assert [m.msg_id for m in replayed] == [ids["k2"]]


def test_malformed_retry_records_are_quarantined_with_their_reason(
    retry_config: ClientConfig, consumers: list[PushConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(retry_config, unique("t"))
    group = unique("g")
    TopicAdmin(retry_config).ensure_topics(retry_config.catalog().group_specs(group))
    retry = retry_topic(group, retry_config.namespace)
    raw = RawProducer({"bootstrap.servers": retry_config.bootstrap_servers})
    raw.produce(retry, b"no origin", headers=[("RECONSUME_TIME", b"1")])
    raw.produce(retry, b"bad count", headers=[("RETRY_TOPIC", topic.encode()),
                                              ("RECONSUME_TIME", b"many")])  # fmt: skip
    raw.flush(10)
    send(retry_config, topic, ["good"])
    recorder = Recorder()
    consumer = start_consumer(consumers, retry_config, group, topic, recorder)
    wait_until(lambda: consumer.stats().quarantined == 2 and recorder.bodies() == ["good"])
    wait_until(lambda: committed(retry_config, group, retry) == 2)
    found = {
        q.value: q.reason
        for q in read_quarantine(retry_config, timeout_ms=3000)
        if q.source_topic == retry
    }
    assert "RETRY_TOPIC" in found[b"no origin"]
    assert "'many'" in found[b"bad count"]


class RaisesOnce(MessageListenerConcurrently):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        self.seen += [m.reconsume_times for m in msgs]
        if msgs[0].reconsume_times == 0:
            raise RuntimeError("the database is down")
        return ConsumeStatus.CONSUME_SUCCESS


def test_a_listener_exception_counts_as_reconsume_later(
    retry_config: ClientConfig, coordinator: Coordinator, consumers: list[PushConsumer],
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(retry_config, unique("t"))
    listener = RaisesOnce()
    consumer = start_consumer(consumers, retry_config, unique("g"), topic, listener)
    send(retry_config, topic, ["boom"])
    wait_until(lambda: listener.seen == [0, 1], timeout_s=30)
    stats = consumer.stats()
    assert (stats.failed, stats.sent_back, stats.consumed) == (1, 1, 1)
