"""Timer records with delivery times no producer sends, written straight onto the timer topic
(as another client, an older release or a producer with a larger ``timer_max_delay_ms``
could): one due further ahead than the maximum is quarantined with the reason instead of
hopping from tier to tier until its time (year 9999: a write every last-tier wait, for
ever), and can be replayed; past and negative times are delivered at once; a time that is
no integer is quarantined. The producer refuses such timers at send time."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import Producer as RawProducer

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.codec import delayed_headers, encode_envelope
from bridge.coordinator import Coordinator
from bridge.errors import InvalidDelayError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.quarantine import QuarantinedRecord, read_quarantine, replay_quarantined
from bridge.message import MessageConst
from tests.conftest import wait_until
from tests.integration.test_delays import LEVELS, coordinator_config
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker

_MAX_DELAY_MS = 1000
"""A small maximum (4 tiers of 100 to 800 ms), so a record beyond it that hops would hop
about once a second."""
_YEAR_9999_MS = 253_402_300_799_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _raw_timer(
    producer: RawProducer,
    config: ClientConfig,
    real_topic: str,
    deliver: str,
    *,
    envelope: bool = False,
) -> bytes:
    """Write a timer record due at ``deliver`` (the header's text as given) for
    ``real_topic`` onto tier 0 of the timer topic with a plain Kafka producer, in the header
    format or as an envelope with a ``TIMER_DELIVER_MS`` header (as releases before wrote);
    return its key (the message id)."""
    msg_id = uuid.uuid4().hex
    props = {
        MessageConst.REAL_TOPIC: real_topic,
        MessageConst.REAL_QUEUE_ID: "0",
        MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: msg_id,
        MessageConst.TIMER_DELIVER_MS: deliver,
    }
    topic = config.catalog(1).topic(SystemTopic.TIMER)
    body = f"raw {deliver[:40]}".encode()
    if envelope:
        value = encode_envelope(msg_id, body, props, _now_ms(), "raw")
        headers: list[tuple[str, str | bytes | None]] = [
            (MessageConst.TIMER_DELIVER_MS, deliver.encode())
        ]
    else:
        value = body
        headers = [*delayed_headers([], msg_id, "raw", props, _now_ms())]
    producer.produce(topic, value, msg_id.encode(), partition=0, headers=headers)
    return msg_id.encode()


def _timer_topic_copies(config: ClientConfig, keys: set[bytes]) -> Counter[bytes]:
    """How many committed records with each of ``keys`` the timer topic holds (the raw write
    and every hop)."""
    topic = config.catalog(1).topic(SystemTopic.TIMER)
    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"copies-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.subscribe([topic])
    counts: Counter[bytes] = Counter()
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is None:
                continue
            partition, key = record.partition(), record.key()
            assert partition is not None
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                continue
            at_end.discard(partition)
            if key is not None and key in keys:
                counts[key] += 1
    finally:
        consumer.close()
    assert len(at_end) == partitions, "the timer topic was not read to its end"
    return counts


def test_timers_due_beyond_the_maximum_are_parked_not_hopped_for_ever(
    kafka_bootstrap: str, namespace: str, unique: Callable[[str], str]
) -> None:
    config = ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        message_delay_level=LEVELS,
        timer_precision_ms=100,
        timer_max_delay_ms=_MAX_DELAY_MS,
    )
    real = unique("real")
    TopicAdmin(config).ensure_topics(
        [TopicSpec(real, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    # The producer refuses what is beyond the maximum, with a typed error, writing nothing.
    with Producer("pg", config=config) as producer:
        far = Message(real, b"refused")
        far.set_deliver_time_ms(_YEAR_9999_MS)
        with pytest.raises(InvalidDelayError, match="beyond timer_max_delay_ms=1000"):
            producer.send_sync(far)
        late = Message(real, b"refused")
        late.set_delay_time_ms(_MAX_DELAY_MS + 1)
        with pytest.raises(InvalidDelayError, match="beyond timer_max_delay_ms=1000"):
            producer.send_sync(late)
    with Coordinator(coordinator_config(config, "reach")):
        raw = RawProducer({"bootstrap.servers": kafka_bootstrap})
        now = _now_ms()
        beyond = {
            _raw_timer(raw, config, real, str(_YEAR_9999_MS)): "year 9999",
            _raw_timer(raw, config, real, str(2**63 - 1)): "int64 max",
            _raw_timer(raw, config, real, str(10**40)): "beyond int64",
            _raw_timer(raw, config, real, str(now + _MAX_DELAY_MS + 3_600_000)): "max + 1 h",
            _raw_timer(raw, config, real, str(_YEAR_9999_MS), envelope=True): "envelope",
        }
        malformed = {
            _raw_timer(raw, config, real, "soon"): "soon",
            _raw_timer(raw, config, real, "1.5e12"): "1.5e12",
        }
        at_once = {
            _raw_timer(raw, config, real, "-5"): "negative",
            _raw_timer(raw, config, real, str(now - 60_000)): "past",
        }
        # Beyond the maximum but within the minute of margin the coordinator's own back-off
        # copies (and clock differences) need: it hops to its time and is delivered then.
        near_ms = now + 4000
        near = _raw_timer(raw, config, real, str(near_ms))
        assert raw.flush(10) == 0
        with Producer("pg", config=config) as producer:
            good = Message(real, b"good")
            good.set_delay_time_ms(800)
            producer.send_sync(good)

        expected = len(at_once) + 2  # and the near one and the good one
        got = {m.msg_id: m for m in read_messages(config, [real], max_messages=expected)}
        assert {k.decode() for k in (*at_once, near)} <= got.keys(), sorted(
            m.body for m in got.values()
        )
        arrived = got[near.decode()].store_timestamp_ms
        assert arrived is not None and arrived >= near_ms, "delivered early"
        assert all(MessageConst.TIMER_DELIVER_MS not in m.properties for m in got.values())

        parked = beyond | malformed

        def quarantined() -> dict[bytes, QuarantinedRecord]:
            found = {k.key: k for k in read_quarantine(config, timeout_ms=1000) if k.key in parked}
            return found if found.keys() == parked.keys() else {}

        kept = wait_until(quarantined, timeout_s=30)
        for key, name in beyond.items():
            assert "beyond timer_max_delay_ms=1000" in kept[key].reason, (name, kept[key])
        for key, name in malformed.items():
            assert "is not a time" in kept[key].reason, (name, kept[key])
        # Parked at the first tier exit: the raw write is the only copy on the timer topic,
        # and none is added while the coordinator runs on: a timer of the maximum, sent
        # now, hops through the tiers and is delivered after more than the last tier's wait
        # (800 ms), within which a record still hopping would have hopped again.
        with Producer("pg", config=config) as producer:
            marker = Message(real, b"marker")
            marker.set_delay_time_ms(_MAX_DELAY_MS)
            marker_id = producer.send_sync(marker).msg_id
        wait_until(lambda: any(m.msg_id == marker_id for m in read_messages(config, [real])))
        copies = _timer_topic_copies(config, set(beyond))
        assert copies == dict.fromkeys(beyond, 1), {beyond[k]: n for k, n in copies.items()}

    # Kept with its reason, never lost: an operator delivers it (at once, as the reason says).
    replay = kept[next(k for k, n in beyond.items() if n == "year 9999")]
    assert replay.key is not None
    replay_quarantined(config, replay.offset)
    again = Counter(m.msg_id for m in read_messages(config, [real], timeout_ms=3000))
    assert again == dict.fromkeys({*got, marker_id, replay.key.decode()}, 1)
