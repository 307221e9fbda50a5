"""``Producer.send_batch`` against a real broker: every message's result in order, each where a
raw consumer finds it; a message that is not valid stops the whole batch before anything is
sent; a partition the topic does not have is refused; a delayed message in a batch goes where
its single send goes."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.client import send_results
from bridge.client.send_results import SendResult, SendStatus
from bridge.errors import InvalidArgumentError, InvalidMessageError, MessageTooLargeError
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst
from tests.clocks import CountingClock
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker


def _record_at(config: ClientConfig, topic: str, partition: int, offset: int) -> object:
    consumer = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "batch-check"})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                return record
        raise AssertionError(f"no record at {topic}[{partition}]@{offset}")
    finally:
        consumer.close()


def test_results_come_in_order_and_name_where_each_message_is(
    client_config: ClientConfig, unique: object
) -> None:
    orders, payments = unique("orders"), unique("payments")  # type: ignore[operator]
    TopicAdmin(client_config).ensure_topics([TopicSpec(orders, 3), TopicSpec(payments, 1)])
    msgs = [
        Message(orders if i % 3 else payments, f"m{i}".encode(), keys=f"k{i}", tags="T")
        for i in range(60)
    ]
    with Producer("pg", config=client_config) as producer:
        results = producer.send_batch(iter(msgs))
    assert len(results) == 60
    assert all(isinstance(r, SendResult) for r in results), results
    sent = [r for r in results if isinstance(r, SendResult)]
    assert [r.topic for r in sent] == [m.topic for m in msgs]
    assert {r.status for r in sent} == {SendStatus.SEND_OK}
    assert len({r.msg_id for r in sent}) == 60
    assert len({(r.topic, r.queue_id, r.offset) for r in sent}) == 60
    for index in (0, 1, 59):  # a raw consumer finds each message where its result says
        record = _record_at(
            client_config, sent[index].topic, sent[index].queue_id, sent[index].offset
        )
        assert record.value() == f"m{index}".encode()  # type: ignore[attr-defined]
        headers = dict(record.headers())  # type: ignore[attr-defined]
        assert headers[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == sent[index].msg_id.encode()
    received = list(read_messages(client_config, [orders, payments], max_messages=60))
    assert sorted(m.msg_id for m in received) == sorted(r.msg_id for r in sent)


def test_a_partition_keeps_a_batch_in_order(client_config: ClientConfig, topic: str) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 3)])
    with Producer("pg", config=client_config) as producer:
        results = producer.send_batch(
            [Message(topic, f"m{i}".encode(), keys=f"k{i}") for i in range(20)], partition=2
        )
    sent = [r for r in results if isinstance(r, SendResult)]
    assert [(r.queue_id, r.offset) for r in sent] == [(2, i) for i in range(20)]
    received = list(read_messages(client_config, [topic], max_messages=20))
    assert [m.body for m in received] == [f"m{i}".encode() for i in range(20)]


def test_a_bad_message_anywhere_in_a_batch_stops_all_of_it(
    client_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 2)])
    config = client_config.replace(max_message_bytes=1000)
    with Producer("pg", config=config) as producer:
        good = [Message(topic, b"first"), Message(topic, b"second", delay_time_level=1)]
        with pytest.raises(InvalidMessageError, match="body length is zero"):
            producer.send_batch([*good, Message(topic, b"")])
        with pytest.raises(MessageTooLargeError, match="1001 bytes"):
            producer.send_batch([*good, Message(topic, b"x" * 1001)])
        with pytest.raises(InvalidArgumentError, match=r"partition 5 of .* has 2 partitions"):
            producer.send_batch(good, partition=5)
        # Nothing of the above reached the topic; what follows does.
        [result] = producer.send_batch([Message(topic, b"after")])
    assert isinstance(result, SendResult)
    assert [m.body for m in read_messages(client_config, [topic], timeout_ms=3000)] == [b"after"]


def test_a_delayed_message_in_a_batch_goes_where_its_single_send_goes(
    client_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 1)])
    with Producer("pg", config=client_config) as producer:
        plain, delayed = producer.send_batch(
            [Message(topic, b"now"), Message(topic, b"later", delay_time_level=2)]
        )
    assert isinstance(plain, SendResult)
    assert isinstance(delayed, SendResult)
    assert delayed.topic == topic  # reported under its real topic, as send_sync reports it
    schedule = client_config.catalog().topic(SystemTopic.SCHEDULE)
    record = _record_at(client_config, schedule, delayed.queue_id, delayed.offset)
    assert record.topic() == schedule  # type: ignore[attr-defined]
    # No coordinator runs here: only the plain one is on the real topic.
    assert [m.body for m in read_messages(client_config, [topic], timeout_ms=3000)] == [b"now"]


def test_plain_messages_between_others_of_another_topic_each_go_to_their_own_topic(
    client_config: ClientConfig, unique: object
) -> None:
    """Plain messages of one topic (one str object, as a literal or a shared name gives) with a
    message of another topic, or a delayed one of theirs, between them: each record lands in
    its own message's topic, none in the topic of the message before it."""
    orders, payments = unique("orders"), unique("payments")  # type: ignore[operator]
    TopicAdmin(client_config).ensure_topics([TopicSpec(orders, 1), TopicSpec(payments, 1)])
    msgs = [
        Message(orders, b"o1"),
        Message(payments, b"p1", keys="k1"),
        Message(orders, b"o2"),
        Message(orders, b"o3", delay_time_level=1),
        Message(orders, b"o4"),
    ]
    with Producer("pg", config=client_config) as producer:
        results = producer.send_batch(msgs)
    sent = [r for r in results if isinstance(r, SendResult)]
    assert [r.topic for r in sent] == [orders, payments, orders, orders, orders]
    # Everything each topic holds (the delayed o3 may have been delivered to orders by now).
    bodies = {m.body for m in read_messages(client_config, [orders], timeout_ms=3000)}
    assert {b"o1", b"o2", b"o4"} <= bodies <= {b"o1", b"o2", b"o3", b"o4"}, bodies
    bodies = {m.body for m in read_messages(client_config, [payments], timeout_ms=3000)}
    assert bodies == {b"p1"}


@pytest.mark.parametrize("handlers_kept", [send_results.HANDLERS_KEPT, 4])
def test_batches_one_after_another_and_side_by_side_each_get_their_own_results(
    client_config: ClientConfig, topic: str, handlers_kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Finished batches hand their report handlers to the next ones (the first handlers_kept of
    # them; longer batches make the rest): every result must still name where its own message
    # is, for batches of every size, from threads at once.
    monkeypatch.setattr(send_results, "HANDLERS_KEPT", handlers_kept)
    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 1)])
    sizes = [5, 1, 40, 3, 40, 12]
    outcomes: dict[int, SendResult | Exception] = {}
    with Producer("pg", config=client_config) as producer:

        def send(thread: int) -> None:
            for number, size in enumerate(sizes):
                msgs = [Message(topic, f"{thread}-{number}-{i}".encode()) for i in range(size)]
                for i, result in enumerate(producer.send_batch(msgs)):
                    outcomes[thread * 1000 + number * 100 + i] = result

        senders = [threading.Thread(target=send, args=(t,)) for t in range(3)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
    assert len(outcomes) == 3 * sum(sizes)
    sent = {key: r for key, r in outcomes.items() if isinstance(r, SendResult)}
    assert len(sent) == len(outcomes), [
        r for r in outcomes.values() if not isinstance(r, SendResult)
    ]
    assert len({(r.queue_id, r.offset) for r in sent.values()}) == len(sent)
    received = list(read_messages(client_config, [topic], max_messages=len(sent)))
    at = {(m.queue_id, m.queue_offset): m for m in received}
    for key, result in sent.items():
        thread, number, i = key // 1000, key % 1000 // 100, key % 100
        msg = at[(result.queue_id, result.offset)]
        assert msg.body == f"{thread}-{number}-{i}".encode()
        assert msg.msg_id == result.msg_id


def test_a_batch_many_times_the_local_queue_builds_each_record_a_bounded_number_of_times(
    client_config: ClientConfig, unique: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A local queue of 100 messages and a batch of 5,000: hand-overs wait for room again and
    # again; the records after each wait are dated after it without building the whole rest
    # of the batch at every wait.
    clock = CountingClock()
    monkeypatch.setattr("bridge.client.records.time", clock)
    orders = unique("orders")  # type: ignore[operator]
    TopicAdmin(client_config).ensure_topics([TopicSpec(orders, 1)])
    config = ClientConfig(
        bootstrap_servers=client_config.bootstrap_servers,
        namespace=client_config.namespace,
        kafka={"queue.buffering.max.messages": "100"},
    )
    count = 5000
    with Producer("pg", config=config) as producer:
        results = producer.send_batch([Message(orders, f"m{i}".encode()) for i in range(count)])
    sent = [r for r in results if isinstance(r, SendResult)]
    assert len(sent) == count, [r for r in results if not isinstance(r, SendResult)][:3]
    assert [r.offset for r in sent] == sorted(r.offset for r in sent)
    assert len({r.msg_id for r in sent}) == count
    assert clock.reads <= 4 * count, clock.reads
