"""The serializer hooks' pure rules: what a message given ``value=``/``key=`` becomes, the
typed errors of a failing serializer, and how a confluent-kafka config dict is sorted."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given
from hypothesis import strategies as st

from bridge import ClientConfig, Message, MessageConst, MessageExt, Producer
from bridge.aio import Producer as AioProducer
from bridge.aio.consumer import on_loop
from bridge.aio.runner import LoopRunner
from bridge.codec import PreparedRecord, decode_headers
from bridge.config import PROTECTED_KAFKA_PROPERTIES
from bridge.consumer.config import PushConsumerConfig
from bridge.consumer.model import ConsumeFromWhere, ConsumeStatus
from bridge.consumer.push_consumer import PushConsumer
from bridge.errors import (
    BridgeError,
    DeserializationError,
    InvalidMessageError,
    KafkaConfigError,
    SerializationError,
    WireFormatError,
)
from bridge.kafka_config import (
    REFUSED_SETTINGS,
    REQUIRED_VALUES,
    apply_kafka_config,
    pick_hook,
    split_kafka_config,
)
from bridge.serialization import Deserializers, Serializers
from tests.unit.test_properties_codec import PROPERTY


def _tagged(obj: Any, ctx: SerializationContext) -> bytes:
    ctx.headers.append(("__value_schema_id", b"\x01\x02"))  # type: ignore[union-attr]
    return f"{ctx.topic}/{ctx.field.value}/{obj}".encode()


def test_a_value_and_key_become_body_and_record_key_with_the_messages_topic() -> None:
    msg = Message("orders", value=42, key="c-1", tags="TagA", properties={"p": "v"})
    sent = Serializers(_tagged, _tagged).apply(msg)
    assert sent.body == b"orders/value/42"
    assert sent.kafka_key() == b"orders/key/c-1"
    assert sent.get_property("__value_schema_id") == b"\x01\x02"
    assert (sent.tags, sent.get_property("p")) == ("TagA", "v")
    assert (msg.body, msg.value, msg.key) == (b"", 42, "c-1")  # the given message is kept


def test_a_message_with_a_body_is_sent_as_it_is() -> None:
    msg = Message("orders", b"raw")
    assert Serializers(_tagged, _tagged).apply(msg) is msg


def test_bytes_values_need_no_serializer_and_objects_do() -> None:
    assert Serializers(None, None).apply(Message("t", value=b"raw")).body == b"raw"
    with pytest.raises(SerializationError, match="no value_serializer") as raised:
        Serializers(None, None).apply(Message("t", value={"a": 1}))
    assert (raised.value.topic, raised.value.field) == ("t", "value")


def test_a_serializer_that_raises_names_the_topic_and_field() -> None:
    def fails(obj: Any, ctx: SerializationContext) -> bytes:
        raise ValueError("no schema")

    with pytest.raises(SerializationError, match=r"'orders' \(key\).*no schema") as raised:
        Serializers(fails, _tagged).apply(Message("orders", value=1, key=2))
    assert isinstance(raised.value.__cause__, ValueError)
    assert raised.value.field == "key"


@pytest.mark.parametrize("returned", [None, b"", "text", 5])
def test_a_serializer_returning_no_bytes_is_refused(returned: object) -> None:
    with pytest.raises(SerializationError):
        Serializers(None, lambda obj, ctx: returned).apply(Message("t", value=1))  # type: ignore[arg-type, return-value]


def test_value_and_key_exclude_body_and_sharding_key() -> None:
    with pytest.raises(InvalidMessageError, match="either body"):
        Message("t", b"x", value=1)
    with pytest.raises(InvalidMessageError, match="either sharding_key"):
        Message("t", value=1, key=2, sharding_key="k")
    with pytest.raises(InvalidMessageError, match="key= needs value="):
        Message("t", key=2)


@pytest.mark.parametrize("key", [b"\xff\x00bin", bytearray(b"\xfe"), "text"])
def test_a_sharding_key_may_be_bytes(key: str | bytes | bytearray) -> None:
    msg = Message("t", b"x", sharding_key=key)  # type: ignore[arg-type]
    expected = key.encode() if isinstance(key, str) else bytes(key)
    assert msg.kafka_key() == expected
    assert msg.sharding_key == (key if isinstance(key, str) else bytes(key))
    with pytest.raises(InvalidMessageError, match="text or bytes"):
        Message("t", b"x", sharding_key=5)  # type: ignore[arg-type]


def test_a_consumer_deserializes_with_the_topic_first_sent_to() -> None:
    contexts: list[tuple[str, str]] = []

    def record(data: bytes | None, ctx: SerializationContext) -> object:
        contexts.append((ctx.topic, ctx.field.value))
        return data

    msg = Message("%DLQ%g", b"body")
    msg.put_system_property(MessageConst.RETRY_TOPIC, "orders")
    Deserializers(record, record).apply(msg, b"key", [("h", b"v")])
    assert (msg.value, msg.key) == (b"body", b"key")
    assert contexts == [("orders", "key"), ("orders", "value")]


def test_a_deserializer_that_raises_names_topic_and_field_and_is_no_wire_format_error() -> None:
    def fails(data: bytes | None, ctx: SerializationContext) -> object:
        raise ValueError("bad magic byte")

    with pytest.raises(DeserializationError, match=r"'orders' \(value\)") as raised:
        Deserializers(None, fails).apply(Message("orders", b"x"), None, None)
    assert raised.value.field == MessageField.VALUE.value
    assert isinstance(raised.value.__cause__, ValueError)
    # A WireFormatError means "quarantine": a deserializer's failure is retried instead.
    assert not isinstance(raised.value, WireFormatError)
    assert isinstance(raised.value, BridgeError)


class _DownOnce:
    """A deserializer whose registry is down for its first call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, data: bytes | None, ctx: SerializationContext) -> object:
        self.calls.append(threading.current_thread().name)
        if len(self.calls) == 1:
            raise ConnectionError("schema registry unreachable")
        return ("decoded", data)


def test_a_consumed_message_is_deserialized_on_first_read_then_kept() -> None:
    down_once = _DownOnce()
    msg = MessageExt("orders", b"body")
    Deserializers(None, down_once).defer(msg, None, [("h", b"v")])
    assert down_once.calls == []  # nothing runs where the record is polled
    assert "value=<not yet deserialized>" in repr(msg)
    with pytest.raises(DeserializationError, match=r"'orders' \(value\).*unreachable"):
        msg.value  # noqa: B018  # the read raises, in the listener
    assert msg.value == ("decoded", b"body")  # read again: tried again
    assert msg.value == ("decoded", b"body")
    assert msg.key is None
    assert len(down_once.calls) == 2  # kept once made
    assert "value=<tuple>" in repr(msg)


def _consumed(record: PreparedRecord) -> MessageExt:
    """``record`` as a consumer reads it (its headers as properties)."""
    return MessageExt("orders", record.value or b"", properties=decode_headers(record.headers))


def _key_reader(data: bytes | None, ctx: SerializationContext) -> object:
    assert data is not None
    if not data.startswith(b"\x00"):
        raise ValueError("unknown magic byte")
    return data[1:].decode()


def _key_writer(obj: Any, ctx: SerializationContext) -> bytes:
    return b"\x00" + str(obj).encode()


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        (Message("orders", value=1, keys="order-7"), None),  # the record key is KEYS' text
        (Message("orders", value=1, key=7, keys="order-7"), "7"),
        (Message("orders", b"v", sharding_key=b"\x00s"), "s"),
    ],
)
def test_the_key_is_deserialized_only_where_a_key_serializer_may_have_written_it(
    msg: Message, expected: object
) -> None:
    producer = Producer(
        "g",
        bootstrap_servers="127.0.0.1:1",
        key_serializer=_key_writer,
        value_serializer=lambda obj, ctx: b"v",
    )
    record = producer.prepare(msg)
    consumed = _consumed(record)
    Deserializers(_key_reader, None).apply(consumed, record.key, record.headers)
    assert consumed.key == expected


def test_another_clients_record_key_is_deserialized() -> None:
    consumed = MessageExt("orders", b"v")  # no UNIQ_KEY: not written by this bridge
    Deserializers(_key_reader, None).apply(consumed, b"\x00k", [])
    assert consumed.key == "k"


def test_a_forwarded_message_keeps_its_bytes_on_every_send_path() -> None:
    """A consumed message carries its body and its deserialized value: it is sent with the
    body, never serialized again (the transactional producer's path included)."""
    calls: list[object] = []

    def serializer(obj: Any, ctx: SerializationContext) -> bytes:
        calls.append(obj)
        return b"RESERIALIZED"

    forwarded = MessageExt("orders", b"raw-avro-bytes")
    Deserializers(None, lambda data, ctx: {"id": 7}).apply(forwarded, None, None)
    forwarded.topic = "audit"
    for producer in (
        Producer("g", bootstrap_servers="127.0.0.1:1"),
        Producer("g", bootstrap_servers="127.0.0.1:1", value_serializer=serializer),
    ):
        assert producer.serialized(forwarded) is forwarded
        assert producer.prepare(forwarded).value == b"raw-avro-bytes"
    assert calls == []
    assert Serializers(None, serializer).apply(forwarded) is forwarded
    assert forwarded.value == {"id": 7}


def test_messages_compare_their_key_and_value_and_show_them() -> None:
    assert Message("t", value={"a": 1}) != Message("t", value={"b": 2})
    assert Message("t", value={"a": 1}, key=1) != Message("t", value={"a": 1}, key=2)
    assert Message("t", value={"a": 1}, key=1) == Message("t", value={"a": 1}, key=1)
    assert "value=<dict>" in repr(Message("t", value={"a": 1}))
    assert "key=<int>" in repr(Message("t", value={"a": 1}, key=1))
    assert "value=" not in repr(Message("t", b"x"))


def test_the_asyncio_producer_serializes_on_a_worker_thread() -> None:
    threads: list[str] = []

    def serializer(obj: Any, ctx: SerializationContext) -> bytes:
        threads.append(threading.current_thread().name)
        return b"x"

    async def main() -> tuple[str, bytes | None, bytes | None]:
        producer = AioProducer("g", bootstrap_servers="127.0.0.1:1", value_serializer=serializer)
        serialized = await producer.prepare(Message("orders", value=1))
        plain = await producer.prepare(Message("orders", b"raw"))
        return threading.current_thread().name, serialized.value, plain.value

    loop_thread, serialized, plain = asyncio.run(main())
    assert (serialized, plain) == (b"x", b"raw")
    assert threads and loop_thread not in threads


def test_the_asyncio_consumer_deserializes_off_the_loop_before_an_async_listener() -> None:
    down_once = _DownOnce()
    runner = LoopRunner("test consumer")
    loop = asyncio.new_event_loop()
    runner.bind(loop)
    looping = threading.Thread(target=loop.run_forever, name="loop", daemon=True)
    looping.start()
    seen: list[object] = []

    async def listener(msg: MessageExt) -> ConsumeStatus:
        seen.append(msg.value)
        return ConsumeStatus.CONSUME_SUCCESS

    try:
        wrapped = on_loop(listener, runner)
        assert callable(wrapped)
        msg = MessageExt("orders", b"body")
        Deserializers(None, down_once).defer(msg, None, None)
        # The registry is down: the call fails as a listener's exception would (retried).
        with pytest.raises(DeserializationError):
            wrapped(msg)
        assert seen == []
        assert wrapped(msg) == ConsumeStatus.CONSUME_SUCCESS
        assert seen == [("decoded", b"body")]
        assert "loop" not in down_once.calls
    finally:
        loop.call_soon_threadsafe(loop.stop)
        looping.join(5)
        loop.close()


# --- the confluent-kafka config dict --------------------------------------------------------


def test_a_typical_kafka_config_is_taken() -> None:
    parts = split_kafka_config(
        {
            "bootstrap.servers": "k1:9092,k2:9092",
            "group.id": "g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.idempotence": True,
            "acks": -1,
            "linger.ms": 20,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "compression.type": "zstd",
            "socket.keepalive.enable": True,
        }
    )
    assert parts.fields == {"bootstrap_servers": "k1:9092,k2:9092", "linger_ms": 20}
    assert (parts.group_id, parts.from_first_offset) == ("g", True)
    assert parts.kafka == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "compression.type": "zstd",
        "socket.keepalive.enable": "true",
    }
    config = apply_kafka_config(ClientConfig(), parts)
    assert config.bootstrap_servers == "k1:9092,k2:9092"
    assert config.kafka["compression.type"] == "zstd"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("enable.idempotence", False),
        ("acks", 1),
        ("isolation.level", "read_uncommitted"),
        ("enable.auto.commit", True),
        ("partitioner", "consistent"),
        ("partition.assignment.strategy", "cooperative-sticky"),
        ("group.protocol", "consumer"),
        ("delivery.report.only.error", True),
        ("auto.offset.reset", "error"),
        ("linger.ms", "soon"),
        *[(name, "x") for name in REFUSED_SETTINGS],
    ],
)
def test_a_setting_the_bridge_owns_is_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(KafkaConfigError) as raised:
        split_kafka_config({"client.id": "app", name.upper(): value})
    assert raised.value.setting == name.upper()
    assert name.upper() in str(raised.value)


_VALUES = st.one_of(st.text(max_size=20), st.integers(), st.booleans())


@PROPERTY
@given(st.dictionaries(st.sampled_from(sorted(PROTECTED_KAFKA_PROPERTIES)), _VALUES, max_size=6))
def test_a_protected_property_never_reaches_the_client_config_unsorted(
    conf: dict[str, Any],
) -> None:
    """Every property ``ClientConfig.kafka`` refuses is taken, accepted or refused by name
    here: a config dict never fails with ClientConfig's generic refusal."""
    try:
        parts = split_kafka_config(conf)
    except KafkaConfigError as exc:
        assert exc.setting in conf
        return
    assert not set(parts.kafka) & set(PROTECTED_KAFKA_PROPERTIES)
    try:
        apply_kafka_config(ClientConfig(), parts)
    except KafkaConfigError:
        raise
    except Exception as exc:  # a field value out of range (linger_ms=-1): named by its field
        assert any(field in str(exc) for field in parts.fields)


_FREE = st.from_regex(r"[a-z]{2,8}(\.[a-z]{2,8}){1,3}", fullmatch=True).filter(
    lambda n: (
        n not in PROTECTED_KAFKA_PROPERTIES
        and n not in REFUSED_SETTINGS
        and n not in REQUIRED_VALUES
        and n != "default.topic.config"
        and not n.endswith(("serializer", "deserializer"))
    )
)


@PROPERTY
@given(st.dictionaries(_FREE, _VALUES, max_size=8))
def test_settings_the_bridge_does_not_own_pass_through_as_text(conf: dict[str, Any]) -> None:
    parts = split_kafka_config(conf)
    assert set(parts.kafka) == set(conf)
    for name, value in conf.items():
        expected = ("true" if value else "false") if isinstance(value, bool) else str(value)
        assert parts.kafka[name] == expected


def test_serializer_hooks_in_the_config_conflict_with_other_arguments() -> None:
    def one(obj: Any, ctx: SerializationContext) -> bytes:
        return b"1"

    def two(obj: Any, ctx: SerializationContext) -> bytes:
        return b"2"

    parts = split_kafka_config({"value.serializer": one})
    assert pick_hook(parts, "value.serializer", None) is one
    assert pick_hook(parts, "value.serializer", one) is one
    with pytest.raises(KafkaConfigError, match="value_serializer="):
        pick_hook(parts, "value.serializer", two)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "None"),
        (b"SASL", "bytes"),
        (["a", "b"], "list"),
        ({"a": 1}, "dict"),
        (object(), "object"),
        (lambda: None, "callable"),
    ],
)
def test_a_value_librdkafka_cannot_take_is_refused_by_name(value: object, shown: str) -> None:
    with pytest.raises(KafkaConfigError, match=shown) as raised:
        split_kafka_config({"sasl.username": value})
    assert raised.value.setting == "sasl.username"


def test_a_logger_is_refused_for_the_bridges_own() -> None:
    with pytest.raises(KafkaConfigError, match=r"bridge\.kafka\.rdkafka") as raised:
        split_kafka_config({"logger": logging.getLogger("app")})
    assert raised.value.setting == "logger"


def test_callbacks_numbers_and_bools_reach_librdkafka_as_it_takes_them() -> None:
    def on_error(err: object) -> None:
        return None

    parts = split_kafka_config(
        {
            "error_cb": on_error,
            "retry.backoff.ms": 150,
            "socket.nagle.disable": True,
            "batch.size": 1.5,
        }
    )
    assert parts.kafka == {
        "error_cb": on_error,
        "retry.backoff.ms": "150",
        "socket.nagle.disable": "true",
        "batch.size": "1.5",
    }


def test_default_topic_config_entries_are_read_as_top_level_settings() -> None:
    parts = split_kafka_config(
        {"default.topic.config": {"compression.codec": "lz4", "acks": "all"}}
    )
    assert parts.kafka == {"compression.codec": "lz4"}
    with pytest.raises(KafkaConfigError) as raised:
        split_kafka_config({"default.topic.config": {"acks": 0}})
    assert raised.value.setting == "acks"
    with pytest.raises(KafkaConfigError) as raised:
        split_kafka_config({"default.topic.config": {"auto.offset.reset": "error"}})
    assert raised.value.setting == "auto.offset.reset"
    with pytest.raises(KafkaConfigError, match="dict of topic settings"):
        split_kafka_config({"default.topic.config": "acks=0"})


@pytest.mark.parametrize(
    ("settings", "reset", "expected"),
    [
        (
            PushConsumerConfig(consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
            "latest",
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        ),
        (
            PushConsumerConfig(consume_from_where=ConsumeFromWhere.CONSUME_FROM_TIMESTAMP),
            "earliest",
            ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
        ),
        (PushConsumerConfig(), "earliest", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
        (None, "earliest", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET),
    ],
)
def test_auto_offset_reset_gives_way_to_settings_that_name_where_to_start(
    settings: PushConsumerConfig | None, reset: str, expected: ConsumeFromWhere
) -> None:
    consumer = PushConsumer(
        "g",
        bootstrap_servers="127.0.0.1:1",
        settings=settings,
        kafka_config={"auto.offset.reset": reset},
    )
    assert consumer.settings.consume_from_where == expected
    keyword = PushConsumer(
        "g",
        bootstrap_servers="127.0.0.1:1",
        settings=settings,
        kafka_config={"auto.offset.reset": reset},
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
    )
    assert keyword.settings.consume_from_where == ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
