"""``ClientConfig.delay_record_format``: with ``"envelope"`` producers, send-backs and the
coordinator's back-off copies write SCHEDULE and timer records exactly as the release before
the header format did (a coordinator of that release reads them during a rolling upgrade).
Also: a header-format record with a null value or a null, empty or repeated ``UNIQ_KEY``.
"""

from __future__ import annotations

import pytest

from bridge import ClientConfig, Message
from bridge.codec import (
    BORN_TIMESTAMP_HEADER,
    PreparedRecord,
    decode_envelope,
    delayed_headers,
    delayed_message,
    delivery_record,
    header_delivery_record,
    is_header_format,
)
from bridge.config import TrustLimits
from bridge.consumer.model import RetryRoute
from bridge.consumer.send_back import send_back_record
from bridge.coordinator.delay.fetch import Held
from bridge.coordinator.delay.held import DelaySettings
from bridge.coordinator.delay.isolation import Isolation
from bridge.delay.routing import SEND_ID_HEADER, TIMER_ROUTING_HEADER, delayed_record
from bridge.errors import InvalidArgumentError, MalformedRecordError
from bridge.kafka.service import ServiceConfig
from bridge.kafka.transactional import DELIVERY_ATTEMPTS, DELIVERY_ERROR, REMOVED_ON_DELIVERY
from bridge.message import MessageConst, MessageExt
from topics.catalog import SystemTopic

BORN = 1_700_000_000_000
HEADERS = ClientConfig(namespace="ns", timer_max_delay_ms=86_400_000)
ENVELOPE = HEADERS.replace(delay_record_format="envelope")

# What the release before the header format (4e2e25d^, bridge/delay/routing.py) wrote as the
# value for the two messages below, byte for byte.
OLD_LEVEL_VALUE = bytes.fromhex(
    "c301f722f35bc1101f021049442d4c4556454c0c626f647900ff0e0a636f6c6f7208626c7565084b4559530a"
    "6b31206b3208544147530274145245414c5f544f5049430c6f7264657273105245414c5f514944023210554e"
    "49515f4b45591049442d4c4556454c0a44454c415902330080a0abfef9621031302e302e302e31"
)
OLD_TIMER_VALUE = bytes.fromhex(
    "c301f722f35bc1101f021049442d54494d45521474696d657220626f64790c0a636f6c6f7206726564084b45"
    "5953046b33145245414c5f544f5049430c6f7264657273105245414c5f514944042d3110554e49515f4b4559"
    "1049442d54494d45522054494d45525f44454c495645525f4d531a313730303030303030353030300080a0ab"
    "fef9621031302e302e302e31"
)


def _level_message() -> Message:
    msg = Message("orders", b"body\x00\xff", keys="k1 k2", tags="t")
    msg.put_user_property("color", "blue")
    msg.set_delay_time_level(3)
    return msg


def _timer_message() -> Message:
    msg = Message("orders", b"timer body", keys="k3")
    msg.put_user_property("color", "red")
    msg.put_system_property(MessageConst.TIMER_DELAY_MS, "5000")
    return msg


# --- the setting ------------------------------------------------------------------------------


def test_the_default_is_the_header_format() -> None:
    assert ClientConfig().delay_record_format == "headers"


@pytest.mark.parametrize("bad", ["avro", "", "Envelope", "headers "])
def test_a_bad_format_raises_a_typed_error_naming_the_setting_and_the_values(bad: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        ClientConfig(delay_record_format=bad)
    text = str(caught.value)
    assert "delay_record_format" in text
    assert "BRIDGE_DELAY_RECORD_FORMAT" in text
    assert "'headers'" in text and "'envelope'" in text


def test_the_environment_sets_it() -> None:
    assert ClientConfig.from_env({"BRIDGE_DELAY_RECORD_FORMAT": "envelope"}) == ClientConfig(
        delay_record_format="envelope"
    )
    with pytest.raises(InvalidArgumentError, match="delay_record_format"):
        ClientConfig.from_env({"BRIDGE_DELAY_RECORD_FORMAT": "v1"})


# --- producers and send-backs ------------------------------------------------------------------


def test_envelope_writes_the_delay_level_record_of_the_previous_release() -> None:
    record = delayed_record(
        _level_message(), "ID-LEVEL", BORN, "10.0.0.1", partition=2, config=ENVELOPE
    )
    assert record is not None
    assert record.kafka_topic == "ns.SCHEDULE_TOPIC_XXXX"
    assert record.partition == 2  # level 3
    assert record.key == b"ID-LEVEL"
    assert record.value == OLD_LEVEL_VALUE
    assert [name for name, _ in record.headers] == [SEND_ID_HEADER]
    assert not is_header_format(record.headers)
    # The previous release's delivery reads it, and it delivers what the header format does.
    headers = delayed_record(
        _level_message(), "ID-LEVEL", BORN, "10.0.0.1", partition=2, config=HEADERS
    )
    assert headers is not None and is_header_format(headers.headers)
    old = delivery_record(record.value, "ns", REMOVED_ON_DELIVERY)
    new = header_delivery_record(headers.headers, headers.value, "ns", REMOVED_ON_DELIVERY)
    real_headers = [h for h in new.headers if h[0] != SEND_ID_HEADER]
    assert (old.kafka_topic, old.partition, old.key, old.value, old.msg_id) == (
        new.kafka_topic,
        new.partition,
        new.key,
        new.value,
        new.msg_id,
    )
    assert old.headers == real_headers


def test_envelope_writes_the_timer_record_of_the_previous_release() -> None:
    record = delayed_record(
        _timer_message(), "ID-TIMER", BORN, "10.0.0.1", partition=-1, config=ENVELOPE
    )
    assert record is not None
    assert record.kafka_topic == "ns.rmq_sys_wheel_timer"
    assert record.value == OLD_TIMER_VALUE
    assert [name for name, _ in record.headers] == [TIMER_ROUTING_HEADER, SEND_ID_HEADER]
    assert record.headers[0][1] == b"1700000005000"
    assert not is_header_format(record.headers)
    msg = decode_envelope(record.value)
    assert (msg.topic, msg.body, msg.msg_id) == ("orders", b"timer body", "ID-TIMER")
    assert msg.get_property(MessageConst.TIMER_DELIVER_MS) == "1700000005000"


def test_a_send_back_honours_the_consumers_setting() -> None:
    received = MessageExt("orders", b"failed", msg_id="M1", born_timestamp_ms=BORN)
    route = RetryRoute(reconsume_times=1, delay_level=3, to_dlq=False)
    old = send_back_record(received, "g", route, 16, config=ENVELOPE, born_host=b"h")
    new = send_back_record(received, "g", route, 16, config=HEADERS, born_host=b"h")
    assert not is_header_format(old.headers) and is_header_format(new.headers)
    assert old.value is not None
    back = decode_envelope(old.value)
    assert (back.body, back.msg_id) == (b"failed", "M1")
    assert back.get_property(MessageConst.REAL_TOPIC) == "%RETRY%g"


# --- the coordinator's back-off copies ---------------------------------------------------------


class _Record:
    def __init__(self, value: bytes | None, key: bytes) -> None:
        self._value, self._key = value, key

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes:
        return self._key


def _isolation(client: ClientConfig) -> Isolation:
    config = ServiceConfig(client=client, catalog=client.catalog(), coordinator_id="c")
    timer = config.catalog.topic(SystemTopic.TIMER)
    settings = DelaySettings(
        "timer", "timer", timer, timer, "g", config, client.delay_policy, TrustLimits().topics
    )
    return Isolation(settings, process=_no_process, producer=lambda: None)


def _no_process(held: Held, now: int) -> tuple[PreparedRecord, bool]:
    raise AssertionError("only back-off copies are made here")


@pytest.mark.parametrize("written", ["headers", "envelope"])
def test_an_envelope_coordinator_backs_off_in_the_envelope_of_the_previous_release(
    written: str,
) -> None:
    writer = HEADERS.replace(delay_record_format=written)
    record = delayed_record(
        _level_message(), "ID-LEVEL", BORN, "10.0.0.1", partition=2, config=writer
    )
    assert record is not None
    held = Held(_Record(record.value, record.key or b""), 2, 7, list(record.headers), None)
    now = BORN + 10_000
    copy = _isolation(ENVELOPE)._aside(held, "orders: too large", now)
    # What the previous release's _aside wrote: an envelope, TIMER_DELIVER_MS its one header.
    assert [name for name, _ in copy.headers] == [TIMER_ROUTING_HEADER]
    deliver_ms = int(copy.headers[0][1] or b"")
    assert deliver_ms == now + 1000  # the first back-off: delivery_backoff_ms
    assert copy.value is not None
    msg = decode_envelope(copy.value)
    assert (msg.topic, msg.body, msg.msg_id, msg.born_timestamp_ms, msg.born_host) == (
        "orders",
        b"body\x00\xff",
        "ID-LEVEL",
        BORN,
        "10.0.0.1",
    )
    assert msg.get_property(DELIVERY_ATTEMPTS) == "1"
    assert msg.get_property(DELIVERY_ERROR) == "orders: too large"
    assert msg.get_property(MessageConst.TIMER_DELIVER_MS) == str(deliver_ms)
    assert msg.get_property(MessageConst.DELAY_TIME_LEVEL) is None
    assert msg.get_property("color") == "blue"
    # The previous release delivers it as the same real-topic record as the original.
    original = delayed_message(record.headers, record.value)
    real = delivery_record(copy.value, "ns", REMOVED_ON_DELIVERY)
    assert (real.kafka_topic, real.partition, real.key, real.value) == (
        "orders",
        2,
        original.kafka_key(),
        b"body\x00\xff",
    )


def test_a_header_coordinator_still_backs_off_in_the_header_format() -> None:
    record = delayed_record(
        _level_message(), "ID-LEVEL", BORN, "10.0.0.1", partition=2, config=HEADERS
    )
    assert record is not None
    held = Held(_Record(record.value, record.key or b""), 2, 7, list(record.headers), None)
    copy = _isolation(HEADERS)._aside(held, "orders: too large", BORN + 10_000)
    assert is_header_format(copy.headers)
    assert copy.value == b"body\x00\xff"


# --- header-format records: null value, UNIQ_KEY edge cases ------------------------------------


def _header_record(
    uniq: list[bytes | None] | None = None,
) -> list[tuple[str, bytes | None]]:
    headers = delayed_headers(
        [],
        "ID1",
        "h",
        {MessageConst.REAL_TOPIC: "orders", MessageConst.REAL_QUEUE_ID: "0", "k": "v"},
        BORN,
    )
    if uniq is None:
        return headers
    at = next(
        i for i, (n, _) in enumerate(headers) if n == MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
    )
    headers[at] = (MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, uniq[0])
    headers += [(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX, v) for v in uniq[1:]]
    return headers


def test_a_null_value_is_delivered_as_an_empty_body_never_a_tombstone() -> None:
    real = header_delivery_record(_header_record(), None, "ns", REMOVED_ON_DELIVERY)
    assert real.value == b""
    assert delayed_message(_header_record(), None).body == b""


@pytest.mark.parametrize("uniq", [None, b""])
def test_a_null_or_empty_uniq_key_is_malformed(uniq: bytes | None) -> None:
    headers = _header_record([uniq])
    assert headers[0][0] == BORN_TIMESTAMP_HEADER
    with pytest.raises(MalformedRecordError, match="UNIQ_KEY"):
        header_delivery_record(headers, b"b", "ns", REMOVED_ON_DELIVERY)
    with pytest.raises(MalformedRecordError, match="UNIQ_KEY"):
        delayed_message(headers, b"b")


def test_of_a_repeated_uniq_key_the_last_counts_as_consumers_read_it() -> None:
    headers = _header_record([b"FIRST", b"LAST"])
    real = header_delivery_record(headers, b"b", "ns", REMOVED_ON_DELIVERY)
    assert real.msg_id == "LAST"
    assert delayed_message(headers, b"b").msg_id == "LAST"
    # A consumer of the real topic reads the last one too.
    assert dict(real.headers)[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == b"LAST"
    # An empty last one is no id, whatever came before.
    with pytest.raises(MalformedRecordError, match="UNIQ_KEY"):
        header_delivery_record(_header_record([b"FIRST", b""]), b"b", "ns", REMOVED_ON_DELIVERY)
