"""Kafka's serializer hooks against the real broker, with Confluent's own Avro serializers and
confluent-kafka's mock Schema Registry client (no registry server runs here): the serialized
bytes go through a consumer retry, the DLQ, a delayed delivery and a transaction unchanged,
and every (de)serialization names the user's topic, so the registry's subject is
``<topic>-value`` both ways."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import (
    MessageField,
    SerializationContext,
    StringDeserializer,
    StringSerializer,
)

from bridge import (
    ClientConfig,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.consumer import ConsumeFromWhere
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import DeserializationError, KafkaConfigError, SerializationError
from bridge.transaction import TransactionListener
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

ORDER_SCHEMA = """
{"type": "record", "name": "Order", "namespace": "shop",
 "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
"""
ORDER = {"id": 7, "item": "naïve café"}


@pytest.fixture()
def config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level="1s 1s 1s 1s",
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture()
def coordinator(config: ClientConfig) -> Iterator[Coordinator]:
    settings = CoordinatorConfig(
        client=config,
        coordinator_id=f"serde-{uuid.uuid4().hex[:6]}",
        transaction_partitions=1,
        session_timeout_ms=6000,
        check_interval_ms=1000,
    )
    with Coordinator(settings) as running:
        yield running


def collect(into: list[Any], what: str = "") -> Any:
    """A listener that keeps each message (or its attribute ``what``) and succeeds."""

    def listener(msg: MessageExt) -> ConsumeStatus:
        into.append(getattr(msg, what) if what else msg)
        return ConsumeStatus.CONSUME_SUCCESS

    return listener


class Recording:
    """A (de)serializer that records the context of every call, then calls ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.contexts: list[tuple[str, str]] = []

    def __call__(self, obj: Any, ctx: SerializationContext) -> Any:
        self.contexts.append((ctx.topic, ctx.field.value))
        return self.inner(obj, ctx)


@pytest.fixture()
def registry() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})


def producer(config: ClientConfig, registry: SchemaRegistryClient) -> Producer:
    return Producer(
        "serde_p",
        config=config,
        key_serializer=StringSerializer("utf_8"),
        value_serializer=AvroSerializer(registry, ORDER_SCHEMA),
    )


def consumer(
    config: ClientConfig, group: str, value_deserializer: Any, **options: Any
) -> PushConsumer:
    return PushConsumer(
        group,
        config=config,
        key_deserializer=StringDeserializer("utf_8"),
        value_deserializer=value_deserializer,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        **options,
    )


def test_a_retried_message_is_deserialized_with_its_own_topic(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    with producer(config, registry) as p:
        p.send_sync(Message(topic, value=ORDER, key="customer-1"))
    assert registry.get_subjects() == [f"{topic}-value"]
    deserializer = Recording(AvroDeserializer(registry))
    seen: list[tuple[int, object, object, bytes]] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        seen.append((msg.reconsume_times, msg.value, msg.key, msg.body))
        return ConsumeStatus.RECONSUME_LATER if len(seen) == 1 else ConsumeStatus.CONSUME_SUCCESS

    c = consumer(config, "serde_retry", deserializer)
    c.subscribe(topic, listener)
    with c:
        wait_until(lambda: len(seen) >= 2, timeout_s=60)
    (first_times, first_value, first_key, first_body), (times, value, key, body) = seen[:2]
    assert (first_times, times) == (0, 1)
    assert first_value == value == ORDER
    assert first_key == key == "customer-1"
    assert body == first_body and body[0] == 0  # Confluent's wire format: magic byte, schema id
    # Both deliveries (the first from the topic, the second from %RETRY%) name the topic.
    assert deserializer.contexts[:2] == [(topic, "value"), (topic, "value")]


def test_a_dead_letter_keeps_the_serialized_bytes(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    group = "serde_dlq"
    with producer(config, registry) as p:
        p.send_sync(Message(topic, value=ORDER, key="customer-2"))
    failures: list[int] = []

    def always_fails(msg: MessageExt) -> ConsumeStatus:
        assert msg.value == ORDER
        failures.append(msg.reconsume_times)
        return ConsumeStatus.RECONSUME_LATER

    c = consumer(config, group, AvroDeserializer(registry), max_reconsume_times=1)
    c.subscribe(topic, always_fails)
    with c:
        wait_until(lambda: c.stats().dead_lettered == 1, timeout_s=60)
    assert failures == [0, 1]
    (letter,) = read_messages(config, [f"%DLQ%{group}"], max_messages=1, timeout_ms=30_000)
    ctx = SerializationContext(topic, MessageField.VALUE)
    assert AvroDeserializer(registry)(letter.body, ctx) == ORDER
    assert letter.kafka_key() == b"customer-2"
    # A consumer of the DLQ deserializes with the topic the message was first sent to.
    deserializer = Recording(AvroDeserializer(registry))
    letters: list[MessageExt] = []
    dlq = consumer(config, "serde_dlq_reader", deserializer)
    dlq.subscribe(f"%DLQ%{group}", collect(letters))
    with dlq:
        wait_until(lambda: letters, timeout_s=60)
    assert (letters[0].value, letters[0].key) == (ORDER, "customer-2")
    assert deserializer.contexts[0] == (topic, "value")


def test_a_delayed_and_a_timer_message_arrive_as_serialized(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    serializer = Recording(AvroSerializer(registry, ORDER_SCHEMA))
    with Producer("serde_delay_p", config=config, value_serializer=serializer) as p:
        p.send_sync(Message(topic, value=ORDER, delay_time_level=1))
        timer = Message(topic, value={"id": 8, "item": "timer"})
        timer.set_delay_time_ms(1500)
        p.send_sync(timer)
    assert serializer.contexts == [(topic, "value"), (topic, "value")]  # never SCHEDULE/timer
    delivered = read_messages(config, [topic], max_messages=2, timeout_ms=60_000)
    ctx = SerializationContext(topic, MessageField.VALUE)
    values = sorted(AvroDeserializer(registry)(m.body, ctx)["id"] for m in delivered)
    assert values == [7, 8]


class Commit(TransactionListener):
    def __init__(self) -> None:
        self.values: list[object] = []

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        self.values.append(msg.value)
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


def test_a_transactional_message_commits_the_serialized_bytes(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    listener = Commit()
    with TransactionMQProducer(
        "serde_tx",
        listener,
        config=config,
        key_serializer=StringSerializer("utf_8"),
        value_serializer=AvroSerializer(registry, ORDER_SCHEMA),
    ) as p:
        result = p.send_message_in_transaction(Message(topic, value=ORDER, key="k-tx"))
    assert result.local_transaction_state is TransactionStatus.COMMIT
    assert listener.values == [ORDER]
    received: list[MessageExt] = []
    c = consumer(config, "serde_tx_reader", AvroDeserializer(registry))
    c.subscribe(topic, collect(received))
    with c:
        wait_until(lambda: received, timeout_s=60)
    assert (received[0].value, received[0].key) == (ORDER, "k-tx")
    assert received[0].kafka_key() == b"k-tx"


def test_a_serializer_that_raises_sends_nothing(
    config: ClientConfig, registry: SchemaRegistryClient, topic: str
) -> None:
    listener = Commit()
    bad = {"id": "not a long", "item": 1}
    with pytest.raises(SerializationError) as raised, producer(config, registry) as p:
        p.send_sync(Message(topic, value=bad))
    assert (raised.value.topic, raised.value.field) == (topic, "value")
    assert topic in str(raised.value)
    with (
        TransactionMQProducer(
            "serde_tx_bad",
            listener,
            config=config,
            value_serializer=AvroSerializer(registry, ORDER_SCHEMA),
        ) as tx,
        pytest.raises(SerializationError),
    ):
        tx.send_message_in_transaction(Message(topic, value=bad))
    assert listener.values == []  # no half message, no local transaction
    assert list(read_messages(config, [topic], max_messages=1, timeout_ms=3000)) == []


class DownOnce:
    """A deserializer in front of a Schema Registry that is down for its first call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, data: bytes | None, ctx: SerializationContext) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("schema registry unavailable")
        return self.inner(data, ctx)


def test_a_deserializer_that_fails_once_gets_the_value_on_the_retry(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    with producer(config, registry) as p:
        p.send_sync(Message(topic, value=ORDER, key="customer-3"))
    failures: list[DeserializationError] = []
    seen: list[tuple[int, object]] = []

    def listener(msg: MessageExt) -> ConsumeStatus:
        try:
            value = msg.value
        except DeserializationError as exc:
            failures.append(exc)
            raise
        seen.append((msg.reconsume_times, value))
        return ConsumeStatus.CONSUME_SUCCESS

    c = consumer(config, "serde_down_once", DownOnce(AvroDeserializer(registry)))
    c.subscribe(topic, listener)
    with c:
        wait_until(lambda: seen, timeout_s=60)
        stats = c.stats()
    assert seen == [(1, ORDER)]  # retried through %RETRY%, deserialized then
    (failure,) = failures
    assert (failure.topic, failure.field) == (topic, "value")
    assert isinstance(failure.__cause__, ConnectionError)
    assert stats.quarantined == 0


def test_a_record_the_deserializer_always_refuses_is_dead_lettered_and_the_others_go_on(
    config: ClientConfig, coordinator: Coordinator, registry: SchemaRegistryClient, topic: str
) -> None:
    group = "serde_poison"
    with Producer("serde_raw", config=config) as p:
        p.send_sync(Message(topic, b"not avro at all"))
    with producer(config, registry) as p:
        for i in range(3):
            p.send_sync(Message(topic, value={"id": i, "item": "ok"}))
    ids: list[int] = []
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        value = msg.value  # raises for the record that is not Avro: a failure, retried
        with lock:
            ids.append(value["id"])  # type: ignore[index]
        return ConsumeStatus.CONSUME_SUCCESS

    c = consumer(config, group, AvroDeserializer(registry), max_reconsume_times=1)
    c.subscribe(topic, listener)
    with c:
        wait_until(lambda: len(ids) == 3 and c.stats().dead_lettered == 1, timeout_s=60)
        stats = c.stats()
    assert sorted(ids) == [0, 1, 2]
    assert stats.quarantined == 0
    (letter,) = read_messages(config, [f"%DLQ%{group}"], max_messages=1, timeout_ms=30_000)
    assert letter.body == b"not avro at all"  # the bytes intact, for `bridge dlq replay`


def test_a_confluent_kafka_config_dict_is_taken_as_it_is(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    shared = {
        "bootstrap.servers": kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 2,
        "compression.type": "lz4",
        "error_cb": lambda err: None,
    }
    base = ClientConfig(namespace=namespace)
    with Producer("serde_conf", config=base, kafka_config=shared) as p:
        assert p.config.bootstrap_servers == kafka_bootstrap
        p.send_sync(Message(topic, b"from a Kafka config"))
    received: list[bytes] = []
    c = PushConsumer(
        "serde_conf_c",
        config=base,
        kafka_config={
            **shared,
            "group.id": "serde_conf_c",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
        },
    )
    c.subscribe(topic, collect(received, "body"))
    with c:
        wait_until(lambda: received, timeout_s=60)
    assert received == [b"from a Kafka config"]
    with pytest.raises(KafkaConfigError) as raised:
        Producer("serde_conf", kafka_config={**shared, "enable.idempotence": False})
    assert raised.value.setting == "enable.idempotence"
