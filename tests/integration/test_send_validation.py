"""What a producer refuses before anything is sent, each with a typed error naming the problem:
argument types, text that is not Unicode, delays that are not numbers, property blocks too
large for RocketMQ, internal and system topics, partitions the topic does not have."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.client.producer import MAX_PROPERTIES_BYTES
from bridge.delay.model import InvalidDelayError
from bridge.errors import (
    InvalidArgumentError,
    InvalidMessageError,
    InvalidPropertyError,
    InvalidTopicNameError,
    MessageTooLargeError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst
from tests.conftest import wait_until
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker


@pytest.fixture()
def producer(client_config: ClientConfig) -> Iterator[Producer]:
    with Producer("pg", config=client_config) as running:
        yield running


def _with_tags(topic: str, tags: object) -> Message:
    msg = Message(topic, b"x")
    msg.tags = tags  # type: ignore[assignment]  # what an untyped caller can do
    return msg


def _with_topic(topic: object) -> Message:
    msg = Message("placeholder", b"x")
    msg.topic = topic  # type: ignore[assignment]
    return msg


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda t: _with_topic(42), "topic must be a string, got int"),
        (lambda t: _with_topic(b"orders"), "topic must be a string, got bytes"),
        (lambda t: _with_topic(None), "topic must be a string, got NoneType"),
        (lambda t: _with_tags(t, 5), "tags must be a string, got int"),
        (lambda t: _with_tags(t, b"TagA"), "tags must be a string, got bytes"),
        (lambda t: _with_tags(t, "Tag\ud800"), "tags .* not valid Unicode"),
        (lambda t: Message(t, b"x", keys="k1 k\udc80"), "keys .* not valid Unicode"),
        (lambda t: Message(t, b"x", sharding_key="\ud83d"), "sharding key .* not valid Unicode"),
    ],
)
def test_wrong_types_and_lone_surrogates_are_invalid_messages(
    producer: Producer, topic: str, make: object, fragment: str
) -> None:
    msg = make(topic)  # type: ignore[operator]
    for send in (producer.send_sync, producer.send_async, producer.send_oneway):
        with pytest.raises(InvalidMessageError, match=fragment):
            send(msg)


def test_a_lone_surrogate_in_a_system_property_names_the_property(
    producer: Producer, topic: str
) -> None:
    msg = Message(topic, b"x")
    msg.put_system_property(MessageConst.ORIGIN_MESSAGE_ID, "id\udfff")
    with pytest.raises(InvalidPropertyError, match="ORIGIN_MESSAGE_ID"):
        producer.send_sync(msg)
    delayed = Message(topic, b"x", delay_time_level=1)
    delayed.put_system_property(MessageConst.ORIGIN_MESSAGE_ID, "id\udfff")
    with pytest.raises(InvalidPropertyError, match="ORIGIN_MESSAGE_ID"):
        producer.send_sync(delayed)


def test_a_timer_property_that_is_not_a_number_is_an_invalid_delay(
    producer: Producer, topic: str
) -> None:
    with pytest.raises(InvalidDelayError, match="set_delay_time_ms"):
        Message(topic, b"x").set_delay_time_ms(math.nan)
    msg = Message(topic, b"x")
    msg.put_system_property(MessageConst.TIMER_DELAY_MS, "inf")
    with pytest.raises(InvalidDelayError, match="TIMER_DELAY_MS"):
        producer.send_sync(msg)


def test_properties_keys_and_tags_count_toward_a_size_limit(producer: Producer, topic: str) -> None:
    huge = Message(topic, b"x", properties={"blob": "a" * 5_000_000})
    with pytest.raises(MessageTooLargeError, match="properties") as caught:
        producer.send_sync(huge)
    assert caught.value.max_bytes == MAX_PROPERTIES_BYTES
    assert caught.value.size_bytes > 5_000_000
    assert str(caught.value.size_bytes) in str(caught.value)
    assert str(MAX_PROPERTIES_BYTES) in str(caught.value)
    for msg in (
        Message(topic, b"x", keys=["k" * 20_000, "j" * 20_000]),
        Message(topic, b"x", tags="T" * 40_000),
        Message(topic, b"x", properties={f"p{i}": "v" * 1000 for i in range(40)}),
        # Multi-byte text is measured in bytes: 12,000 characters are 36,000 bytes.
        Message(topic, b"x", properties={"cjk": "世" * 12_000}),
        Message(topic, b"x", delay_time_level=1, properties={"blob": "a" * 40_000}),
    ):
        with pytest.raises(MessageTooLargeError, match="properties"):
            producer.send_sync(msg)
    # Just under the limit goes through; the body keeps its own limit.
    fits = Message(topic, b"x", properties={"blob": "a" * (MAX_PROPERTIES_BYTES - 200)})
    producer.send_sync(fits)
    big_body = Message(topic, b"b" * (producer.config.max_message_bytes + 1))
    with pytest.raises(MessageTooLargeError, match="body") as body_caught:
        producer.send_sync(big_body)
    assert body_caught.value.max_bytes == producer.config.max_message_bytes


@pytest.mark.parametrize(
    "name",
    [
        "__consumer_offsets",
        "__transaction_state",
        "__cluster_metadata",
        *(system.value for system in SystemTopic),
    ],
)
def test_internal_and_system_topics_are_refused(
    producer: Producer, client_config: ClientConfig, name: str
) -> None:
    for msg in (Message(name, b"x"), Message(name, b"x", delay_time_level=1)):
        with pytest.raises(InvalidTopicNameError, match=name):
            producer.send_sync(msg)
    system_names = {system.value for system in SystemTopic}
    if name in system_names:  # and by their Kafka name in the namespace
        kafka_name = client_config.catalog().topic(SystemTopic(name))
        with pytest.raises(InvalidTopicNameError):
            producer.send_sync(Message(kafka_name, b"x"))


def test_retry_and_dlq_topics_stay_writable(
    producer: Producer, client_config: ClientConfig, unique: object
) -> None:
    group = unique("g")  # type: ignore[operator]
    for name in (f"%RETRY%{group}", f"%DLQ%{group}"):
        producer.send_sync(Message(name, b"x"))
        (got,) = read_messages(client_config, [name], max_messages=1)
        assert got.topic == name


def _two_partitions(config: ClientConfig, topic: str) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 2)])
    return topic


def test_a_partition_the_topic_does_not_have_is_refused(
    producer: Producer, client_config: ClientConfig, topic: str
) -> None:
    _two_partitions(client_config, topic)
    assert producer.send_sync(Message(topic, b"x"), partition=1).queue_id == 1
    for msg in (
        Message(topic, b"x"),
        Message(topic, b"x", delay_time_level=1),
        _timer(topic, 60_000),
    ):
        with pytest.raises(InvalidArgumentError, match=rf"partition 2 of {topic}.* 2 partitions"):
            producer.send_sync(msg, partition=2)
        with pytest.raises(InvalidArgumentError, match="partition -2"):
            producer.send_async(msg, partition=-2)


def _timer(topic: str, delay_ms: int) -> Message:
    msg = Message(topic, b"x")
    msg.set_delay_time_ms(delay_ms)
    return msg


def test_a_topic_that_does_not_exist_yet_is_not_refused(
    producer: Producer, client_config: ClientConfig, unique: object
) -> None:
    # The broker auto-creates topics (with one partition here), as a send would.
    missing = unique("missing")  # type: ignore[operator]
    record = producer.prepare(Message(missing, b"x", delay_time_level=1), partition=0)
    assert record.partition == 0  # the SCHEDULE partition of level 1
    other = unique("missing")  # type: ignore[operator]
    assert producer.send_sync(Message(other, b"x"), partition=0).queue_id == 0
    (got,) = read_messages(client_config, [other], max_messages=1)
    assert got.body == b"x"


def test_partitions_added_to_a_topic_are_seen_at_once(
    producer: Producer, client_config: ClientConfig, topic: str
) -> None:
    _two_partitions(client_config, topic)
    producer.send_sync(Message(topic, b"x"), partition=0)  # the count (2) is now cached
    admin = AdminClient({"bootstrap.servers": client_config.bootstrap_servers})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    wait_until(lambda: TopicAdmin(client_config).list_topics().get(topic) == 4)
    assert producer.send_sync(Message(topic, b"x"), partition=3).queue_id == 3
