"""The producer against a topic whose ``max.message.bytes`` is below librdkafka's batches.

librdkafka puts several records of a partition in one request batch (up to ``batch.size``,
1,000,000 bytes), and the broker refuses a batch larger than the topic's
``max.message.bytes`` as a whole: MSG_SIZE_TOO_LARGE for every record in it. Records refused
that way are sent again alone, so only a record too large by itself fails, and each send's
callback or result tells its final outcome once.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from bridge import ClientConfig, Message, Producer, SendResult, SendStatus
from bridge.aio import Producer as AsyncProducer
from bridge.errors import KafkaClientError, SendError
from bridge.kafka.admin import TopicAdmin
from bridge.observability import BridgeMetrics, disable_metrics, enable_metrics
from tests.conftest import wait_until
from tests.integration.test_producer import raw_consume
from topics.catalog import TopicSpec

pytestmark = pytest.mark.broker

TOPIC_MAX_BYTES = 20_000
"""The test topic's ``max.message.bytes``: 50 messages of 1 KB take more together."""
BIG_AT = 25
"""The index of the one message too large for the topic by itself (30 KB)."""


def _topic(config: ClientConfig, unique: Callable[[str], str]) -> str:
    topic = unique("t")
    TopicAdmin(config).ensure_topics(
        [TopicSpec(topic, 1, {"max.message.bytes": str(TOPIC_MAX_BYTES)})]
    )
    return topic


def _messages(topic: str) -> list[Message]:
    """50 messages of 1 KB, each body its own, and one of 30 KB at :data:`BIG_AT`."""
    msgs = [Message(topic, b"%04d" % index * 256) for index in range(50)]
    msgs.insert(BIG_AT, Message(topic, os.urandom(30_000)))
    return msgs


def _end_offset(config: ClientConfig, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": config.bootstrap_servers, "group.id": "watermarks"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


def _check_outcomes(
    config: ClientConfig, topic: str, msgs: list[Message], outcomes: list[Any]
) -> None:
    """Only the big message failed, with the broker's refusal of its size; every other one
    is stored once, where its result says, under its own id."""
    failed = {i: o for i, o in enumerate(outcomes) if not isinstance(o, SendResult)}
    assert list(failed) == [BIG_AT], {i: str(o) for i, o in failed.items()}
    assert isinstance(failed[BIG_AT], SendError)
    assert "MSG_SIZE_TOO_LARGE" in str(failed[BIG_AT])
    stored = raw_consume(config.bootstrap_servers, topic, len(msgs) - 1)
    assert _end_offset(config, topic) == len(msgs) - 1  # nothing stored twice
    by_offset = {record.offset(): record for record in stored}
    for index, outcome in enumerate(outcomes):
        if index == BIG_AT:
            continue
        record = by_offset[outcome.offset]
        assert record.value() == msgs[index].body
        assert dict(record.headers())["UNIQ_KEY"] == outcome.msg_id.encode()


def _send_async(producer: Producer, msgs: list[Message]) -> list[Any]:
    calls: list[list[Any]] = [[] for _ in msgs]
    lock = threading.Lock()

    def called(index: int, outcome: Any) -> None:
        with lock:
            calls[index].append(outcome)

    for index, msg in enumerate(msgs):
        producer.send_async(msg, partial(called, index), partial(called, index))
    assert producer.flush() == 0
    wait_until(lambda: all(calls), timeout_s=30)
    assert [len(c) for c in calls] == [1] * len(msgs)  # once each, with the final outcome
    return [c[0] for c in calls]


def _send_batch(producer: Producer, msgs: list[Message]) -> list[Any]:
    return list(producer.send_batch(msgs))


def _send_records_sync(producer: Producer, msgs: list[Message]) -> list[Any]:
    records = producer.prepare_batch(msgs)
    outcomes: list[Any] = []
    results = producer._sender.send_records_sync(records)
    for msg, record, result in zip(msgs, records, results, strict=True):
        if isinstance(result, KafkaClientError):
            outcomes.append(result)
        else:
            partition, offset = result
            outcomes.append(
                SendResult(SendStatus.SEND_OK, record.msg_id, offset, msg.topic, partition)
            )
    return outcomes


@pytest.mark.parametrize(
    "send",
    [_send_async, _send_batch, _send_records_sync],
    ids=["send_async", "send_batch", "send_records_sync"],
)
def test_only_the_message_too_large_by_itself_fails(
    client_config: ClientConfig,
    unique: Callable[[str], str],
    send: Callable[[Producer, list[Message]], list[Any]],
) -> None:
    topic = _topic(client_config, unique)
    msgs = _messages(topic)
    with Producer("pg", config=client_config) as producer:
        outcomes = send(producer, msgs)
    _check_outcomes(client_config, topic, msgs, outcomes)


def test_oneway_sends_refused_with_their_batch_are_stored(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = _topic(client_config, unique)
    msgs = _messages(topic)
    with Producer("pg", config=client_config) as producer:
        for msg in msgs:
            producer.send_oneway(msg)
        assert producer.flush() == 0
    stored = raw_consume(client_config.bootstrap_servers, topic, len(msgs) - 1)
    expected = [m.body for i, m in enumerate(msgs) if i != BIG_AT]
    assert sorted(record.value() for record in stored) == sorted(expected)
    assert _end_offset(client_config, topic) == len(msgs) - 1


def test_a_message_too_large_by_itself_fails_its_sync_send(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = _topic(client_config, unique)
    with Producer("pg", config=client_config) as producer:
        with pytest.raises(SendError, match="MSG_SIZE_TOO_LARGE"):
            producer.send_sync(Message(topic, os.urandom(30_000)))
        assert producer.send_sync(Message(topic, b"small")).offset == 0


def test_the_asyncio_producer_sends_refused_messages_alone_too(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = _topic(client_config, unique)
    msgs = _messages(topic)

    async def main() -> list[Any]:
        async with AsyncProducer("pg", config=client_config) as producer:
            return await producer.send_batch(msgs)

    outcomes = asyncio.run(main())
    _check_outcomes(client_config, topic, msgs, outcomes)


def test_send_record_async_resending_alone_reports_only_a_records_own_refusal(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    # The push consumer's copies go this way: each callback gets one report, the final one,
    # so a MSG_SIZE_TOO_LARGE it gets is the record's own and not its batch's.
    topic = _topic(client_config, unique)
    msgs = _messages(topic)
    calls: list[list[Any]] = [[] for _ in msgs]
    lock = threading.Lock()

    def reported(index: int, err: Any, kmsg: Any) -> None:
        with lock:
            calls[index].append(err if err is not None else kmsg.offset())

    with Producer("pg", config=client_config) as producer:
        records = producer.prepare_batch(msgs)
        for index, record in enumerate(records):
            producer._sender.send_record_async(
                record, record.partition, partial(reported, index), resend_alone=True
            )
        assert producer.flush() == 0
    assert [len(c) for c in calls] == [1] * len(msgs)  # once each, with the final outcome
    outcomes = [c[0] for c in calls]
    failed = {i: o for i, o in enumerate(outcomes) if not isinstance(o, int)}
    assert list(failed) == [BIG_AT], {i: str(o) for i, o in failed.items()}
    assert failed[BIG_AT].name() == "MSG_SIZE_TOO_LARGE"
    stored = raw_consume(client_config.bootstrap_servers, topic, len(msgs) - 1)
    assert _end_offset(client_config, topic) == len(msgs) - 1  # nothing stored twice
    by_offset = {record.offset(): record for record in stored}
    for index, offset in enumerate(outcomes):
        if index != BIG_AT:
            assert by_offset[offset].value() == msgs[index].body


@pytest.fixture()
def metrics() -> Iterator[BridgeMetrics]:
    """Recording on in this process, in a registry of this test's own."""
    disable_metrics()
    yield enable_metrics(CollectorRegistry())
    disable_metrics()


def _send_sync(producer: Producer, msgs: list[Message]) -> list[Any]:
    outcomes: list[Any] = []
    for msg in msgs:
        try:
            outcomes.append(producer.send_sync(msg))
        except SendError as exc:
            outcomes.append(exc)
    return outcomes


@pytest.mark.parametrize(
    "send",
    [_send_sync, _send_async, _send_batch],
    ids=["send_sync", "send_async", "send_batch"],
)
def test_a_send_sent_again_alone_is_one_sample_of_its_cost(
    client_config: ClientConfig,
    unique: Callable[[str], str],
    metrics: BridgeMetrics,
    send: Callable[[Producer, list[Message]], list[Any]],
) -> None:
    # rocketmq_send_cost_time has one sample per send, from the send to its outcome: a
    # refusal of its request batch followed by its send alone is one send, not a failed one
    # and then another.
    topic = _topic(client_config, unique)
    msgs = _messages(topic)
    with Producer("pg", config=client_config) as producer:
        outcomes = send(producer, msgs)
    assert sum(not isinstance(o, SendResult) for o in outcomes) == 1
    get = metrics.registry.get_sample_value
    labels = {"namespace": metrics.namespace, "topic": topic}
    samples = {
        status: get("rocketmq_send_cost_time_count", {**labels, "invocation_status": status})
        for status in ("success", "failure")
    }
    assert samples == {"success": len(msgs) - 1, "failure": 1}


@pytest.mark.parametrize("client_id", [None, "app-client"], ids=["group", "users-client-id"])
def test_the_producer_sending_again_alone_has_a_client_id_of_its_own(
    client_config: ClientConfig,
    unique: Callable[[str], str],
    metrics: BridgeMetrics,
    client_id: str | None,
) -> None:
    # Kafka client metrics are labelled by client.id: sharing the group's (or the one the
    # user set), the second producer's statistics overwrote the first one's series.
    topic = _topic(client_config, unique)
    kafka = {"statistics.interval.ms": "100"}
    group = unique("pg").replace("-", "_")
    if client_id is not None:
        client_id = unique(client_id)
        kafka["client.id"] = client_id
    config = client_config.replace(kafka=kafka)
    first = client_id or group
    get = metrics.registry.get_sample_value
    with Producer(group, config=config) as producer:
        _send_batch(producer, _messages(topic))
        wait_until(
            lambda: all(
                get("bridge_kafka_producer_queue_messages", {"client": client}) is not None
                for client in (first, f"{first}-alone")
            ),
            timeout_s=30,
        )
