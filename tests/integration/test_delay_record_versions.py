"""Both SCHEDULE and timer record formats on one broker: the Avro envelopes the previous version
wrote and the header-format records written now, on the same partitions, are each delivered
once, and a message delivers the same Kafka record (key, value, headers in their order, born
time, partition) whichever format it waited in. An envelope that fails its delivery backs off
in the header format and is delivered once its target is fixed. Header-format records that
cannot be delivered (malformed routing, unreadable headers) are quarantined with the reason and
hold nothing back; a topic outside ``allowed_topics`` (G12) quarantines either format.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import NewPartitions

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.codec import (
    BORN_TIMESTAMP_HEADER,
    decode_envelope,
    delayed_headers,
    encode_envelope,
    is_header_format,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.delay.routing import SEND_ID_HEADER, delayed_record
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.kafka.quarantine import read_quarantine, replay_quarantined
from bridge.message import DELAY_PROPERTIES, MessageConst, PropertyValue
from tests.conftest import wait_until
from tests.integration.test_delay_isolation import (
    isolation_config,
    produce_with_raw_headers,
    warm_up,
)
from topics.catalog import SystemTopic, TopicSpec

pytestmark = pytest.mark.broker

Record = tuple[str, int, bytes | None, bytes | None, list[tuple[str, str | bytes | None]]]
"""(topic, partition, key, value, headers) of a SCHEDULE or timer record."""


def coordinator_config(client: ClientConfig, name: str, **settings: Any) -> CoordinatorConfig:
    return CoordinatorConfig(
        client=client,
        coordinator_id=name,
        transaction_partitions=1,
        session_timeout_ms=6000,
        **settings,
    )


@pytest.fixture()
def config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return isolation_config(kafka_bootstrap, namespace)


def envelope_record(
    config: ClientConfig, msg: Message, msg_id: str, born_ms: int, partition: int
) -> Record:
    """The record the previous version's producer wrote for the delayed ``msg``: its
    ``delayed_record`` with the message as a ``MessageEnvelope`` value."""
    policy = config.delay_policy
    catalog = config.catalog(1)
    props: dict[str, PropertyValue] = msg.wire_properties()
    raw_level = props.get(MessageConst.DELAY_TIME_LEVEL)
    level = int(raw_level) if raw_level else 0
    props.update(
        {
            MessageConst.REAL_TOPIC: msg.topic,
            MessageConst.REAL_QUEUE_ID: str(partition),
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: msg_id,
        }
    )
    for name in DELAY_PROPERTIES:
        props.pop(name, None)
    send_id = (SEND_ID_HEADER, uuid.uuid4().hex.encode())
    if level > 0:
        props[MessageConst.DELAY_TIME_LEVEL] = str(level)
        value = encode_envelope(msg_id, msg.body, props, born_ms, "10.1.2.3")
        topic = catalog.topic(SystemTopic.SCHEDULE)
        return topic, level - 1, msg_id.encode(), value, [send_id]
    deliver_ms = born_ms + int(msg.get_property(MessageConst.TIMER_DELAY_MS) or "0")
    props[MessageConst.TIMER_DELIVER_MS] = str(deliver_ms)
    value = encode_envelope(msg_id, msg.body, props, born_ms, "10.1.2.3")
    tier = policy.route(deliver_ms, born_ms)
    assert tier is not None
    headers = [(MessageConst.TIMER_DELIVER_MS, str(deliver_ms).encode()), send_id]
    return catalog.topic(SystemTopic.TIMER), tier, msg_id.encode(), value, list(headers)


def header_record(
    config: ClientConfig, msg: Message, msg_id: str, born_ms: int, partition: int
) -> Record:
    """The record this version's producer writes for the delayed ``msg``."""
    record = delayed_record(msg, msg_id, born_ms, "10.1.2.3", partition=partition, config=config)
    assert record is not None
    return record.kafka_topic, record.partition, record.key, record.value, list(record.headers)


def write_all(config: ClientConfig, records: list[Record]) -> None:
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    for topic, partition, key, value, headers in records:
        raw.produce(topic, value, key, partition=partition, headers=list(headers))
    assert raw.flush(10) == 0


def raw_records(config: ClientConfig, topic: str, partitions: int, count: int) -> list[Any]:
    """Every record of ``topic`` once ``count`` arrived (and a moment more for extras)."""
    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"versions-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            record = consumer.poll(0.2)
            if record is not None and record.error() is None:
                got.append(record)
                continue
            if len(got) >= count:
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return got


def _messages(topic: str) -> Iterator[tuple[str, Message, int]]:
    """(name, delayed message, REAL_QID) of every kind worth comparing."""
    for delayed in ("level", "timer"):
        kinds: tuple[tuple[str, Callable[[], Message], int], ...] = (
            ("plain", lambda: Message(topic, b"plain"), -1),
            ("empty", lambda: Message(topic, b""), 2),
            ("binary", lambda: Message(topic, b"\xff\xfe\x00body"), -1),
            ("keys", lambda: Message(topic, b"k", keys=["k1", "k2"], tags="TagA"), -1),
            ("props", _with_properties(topic), 1),
            ("sharding", _with_sharding(topic), -1),
        )
        for name, build, queue_id in kinds:
            msg = build()
            if delayed == "level":
                msg.set_delay_time_level(1)
            else:
                msg.set_delay_time_ms(1200)
            yield f"{name}-{delayed}", msg, queue_id


def _with_properties(topic: str) -> Callable[[], Message]:
    def build() -> Message:
        msg = Message(topic, b"props")
        msg.put_user_property("bin", b"\xff\x00\xfe")
        msg.put_user_property("utf8-bytes", "é".encode())
        msg.put_user_property("text", "naïve")
        msg.put_user_property("empty", "")
        msg.put_user_property(SEND_ID_HEADER, "a user's value")
        return msg

    return build


def _with_sharding(topic: str) -> Callable[[], Message]:
    def build() -> Message:
        msg = Message(topic, b"sharded", keys="ignored")
        msg.put_system_property(MessageConst.SHARDING_KEY, b"\xfe\xffshard")
        return msg

    return build


def test_envelope_and_header_records_deliver_the_same_records_once(
    config: ClientConfig, topic: str
) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 3)])
    born = time.time_ns() // 1_000_000
    records: list[Record] = []
    expected: dict[str, int] = {}
    for name, msg, queue_id in _messages(topic):
        # The same message (same id, born time) in both formats, one after the other on the
        # same SCHEDULE partition or timer tier.
        for build in (envelope_record, header_record):
            records.append(build(config, msg, f"{name}-id", born, queue_id))
        expected[f"{name}-id"] = 2
    assert {r[:2] for r in records[0::2]} == {r[:2] for r in records[1::2]}
    with Coordinator(coordinator_config(config, "versions")):
        warm_up(config, f"{topic}-warm")
        write_all(config, records)
        got = raw_records(config, topic, 3, len(records))
    by_id: dict[str, list[Any]] = {}
    for record in got:
        by_id.setdefault(dict(record.headers())["UNIQ_KEY"].decode(), []).append(record)
    assert {k: len(v) for k, v in by_id.items()} == expected, "each format delivered once"
    for msg_id, (first, second) in by_id.items():
        assert first.topic() == second.topic() == topic
        assert first.partition() == second.partition(), msg_id
        assert first.key() == second.key(), msg_id
        assert first.value() == second.value(), msg_id
        assert first.headers() == second.headers(), msg_id  # names, bytes and order
        # Stamped when delivered, the born time in the first header (a topic's retention
        # counts from the delivery, and the consumers read the born time from the header).
        assert first.timestamp()[1] > born and second.timestamp()[1] > born, msg_id
        names = [n for n, _ in first.headers()]
        assert first.headers()[0] == (BORN_TIMESTAMP_HEADER, str(born).encode()), msg_id
        assert BORN_TIMESTAMP_HEADER not in names[1:]
        assert MessageConst.REAL_TOPIC not in names
    props = dict(by_id["props-level-id"][1].headers())
    assert props["bin"] == b"\xff\x00\xfe" and props[SEND_ID_HEADER] == b"a user's value"
    assert by_id["empty-timer-id"][1].value() == b""
    assert by_id["empty-timer-id"][1].partition() == 2
    assert by_id["sharding-level-id"][1].key() == b"\xfe\xffshard"
    assert by_id["keys-timer-id"][1].key() == b"k1 k2"


def test_an_envelope_that_fails_backs_off_in_the_header_format_and_is_delivered_once(
    config: ClientConfig, topic: str
) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    born = time.time_ns() // 1_000_000
    msg = Message(topic, b"\xffwaits", keys="k")
    msg.put_user_property("bin", b"\x00\xff")
    msg.set_delay_time_level(1)
    old = envelope_record(config, msg, "BACKOFF-ID", born, 1)  # partition 1 does not exist yet
    timer = config.catalog(1).topic(SystemTopic.TIMER)
    # Enough attempts that the copy is seen before the message is quarantined.
    with Coordinator(coordinator_config(config, "backoff", delivery_attempts=20)):
        warm_up(config, f"{topic}-warm")
        write_all(config, [old])

        def backoff_copy() -> list[Any]:
            tiers = config.delay_policy.tier_count
            return [
                r
                for r in raw_records(config, timer, tiers, 0)
                # This message's copy only: under load the warm-up timer's own delivery can be
                # set aside too, and its copy must not be taken for this one.
                if r.key() == b"BACKOFF-ID"
                and any(n == "DELIVERY_ATTEMPTS" for n, _ in r.headers() or [])
            ]

        (copy, *_) = wait_until(backoff_copy, timeout_s=30)
        names = [n for n, _ in copy.headers()]
        assert names[0] == BORN_TIMESTAMP_HEADER and SEND_ID_HEADER not in names
        assert copy.value() == b"\xffwaits"  # the body, not an envelope
        admin = new_admin(config)  # kept: the future fails once its handle is gone
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(10)
        # The broker learns of the new partition a little after the controller answered: a
        # reader that asked before then is given partition 0 alone, for the whole read (under
        # a loaded suite, the delivered copy was then never read).
        wait_until(lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == 2)
        (delivered,) = read_messages(config, [topic], max_messages=1, timeout_ms=30_000)
        again = list(read_messages(config, [topic], timeout_ms=3000))
    assert (delivered.body, delivered.msg_id, delivered.queue_id) == (b"\xffwaits", "BACKOFF-ID", 1)
    assert delivered.born_timestamp_ms == born
    assert delivered.properties["bin"] == b"\x00\xff"
    assert delivered.keys == ["k"]
    assert not {"DELIVERY_ATTEMPTS", "DELIVERY_ERROR", BORN_TIMESTAMP_HEADER} & set(
        delivered.properties
    )
    assert len(again) == 1


def _malformed(config: ClientConfig, topic: str, born: int) -> dict[str, tuple[Record, str]]:
    """Header-format SCHEDULE records (level 1) that cannot be delivered, by name: (record,
    what the quarantine reason must say)."""
    schedule = config.catalog(1).topic(SystemTopic.SCHEDULE)

    def record(name: str, **changes: bytes | None) -> Record:
        props = {
            MessageConst.REAL_TOPIC: topic,
            MessageConst.REAL_QUEUE_ID: "-1",
            MessageConst.DELAY_TIME_LEVEL: "1",
        }
        headers: list[tuple[str, str | bytes | None]] = []
        for key, value in delayed_headers([], f"BAD-{name}", "h", props, born):
            if key in changes:
                if changes[key] is not None:
                    headers.append((key, changes[key]))
            else:
                headers.append((key, value))
        return schedule, 0, name.encode(), f"bad-{name}".encode(), headers

    return {
        "qid": (record("qid", REAL_QID=b"seven"), "REAL_QID is not a partition number"),
        "topic": (record("topic", REAL_TOPIC=b"no/such topic"), "invalid name"),
        "uniq": (record("uniq", UNIQ_KEY=None), "no UNIQ_KEY"),
        "uniq-empty": (record("uniq-empty", UNIQ_KEY=b""), "UNIQ_KEY header is empty"),
        "utf8": (record("utf8", REAL_TOPIC=b"\xff\xfe"), "REAL_TOPIC is not UTF-8"),
        "born": (record("born", BRIDGE_BORN_MS=b"yesterday"), "BRIDGE_BORN_MS is not a time"),
    }


def test_malformed_header_records_are_quarantined_with_the_reason_and_hold_nothing_back(
    config: ClientConfig, topic: str
) -> None:
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    born = time.time_ns() // 1_000_000
    bad = _malformed(config, topic, born)
    good: list[Record] = []
    for i in range(len(bad) + 1):
        msg = Message(topic, f"good{i}".encode())
        msg.set_delay_time_level(1)
        good.append(header_record(config, msg, f"GOOD-{i}", born, -1))
    interleaved: list[Record] = []
    for i, (record, _) in enumerate(bad.values()):
        interleaved += [good[i], record]
    interleaved.append(good[-1])
    schedule = config.catalog(1).topic(SystemTopic.SCHEDULE)
    with Coordinator(coordinator_config(config, "malformed")):
        warm_up(config, f"{topic}-warm")
        write_all(config, interleaved)
        # Headers that cannot be read (a name that is not UTF-8) on a header-format record:
        # no envelope in its value either, so it is quarantined, not lost.
        unreadable = [(b"\xff\xfe", b"x")]
        unreadable += [(k.encode(), v if isinstance(v, bytes) else b"") for k, v in good[0][4][1:]]
        produce_with_raw_headers(
            config.bootstrap_servers, schedule, 0, b"unreadable", b"bad-unreadable", unreadable
        )
        after = Message(topic, b"after")
        after.set_delay_time_level(1)
        write_all(config, [header_record(config, after, "GOOD-after", born, -1)])
        bodies = sorted(
            m.body.decode()
            for m in read_messages(config, [topic], max_messages=len(good) + 1, timeout_ms=20_000)
        )
        kept = wait_until(
            lambda: (
                (
                    found := {
                        k.key.decode(): k
                        for k in read_quarantine(config, timeout_ms=1000)
                        if k.key is not None and k.source_topic == schedule
                    }
                ).keys()
                >= {*bad, "unreadable"}
                and found
            ),
            timeout_s=30,
        )
        again = list(read_messages(config, [topic], timeout_ms=2000))
    assert bodies == sorted([f"good{i}" for i in range(len(good))] + ["after"])
    assert len(again) == len(bodies), "nothing delivered twice, nothing malformed delivered"
    for name, (_, reason) in bad.items():
        assert reason in kept[name].reason, (name, kept[name].reason)
        assert kept[name].value == f"bad-{name}".encode()
    assert "could not be read" in kept["unreadable"].reason
    assert kept["unreadable"].value == b"bad-unreadable"


def test_a_topic_outside_allowed_topics_quarantines_either_format_and_both_replay(
    config: ClientConfig, topic: str, unique: Callable[[str], str]
) -> None:
    allowed = unique("allowed")
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1), TopicSpec(allowed, 1)])
    born = time.time_ns() // 1_000_000
    records = []
    for fmt, build in (("envelope", envelope_record), ("headers", header_record)):
        for target in (topic, allowed):
            msg = Message(target, f"{fmt}-{target == allowed}".encode())
            msg.set_delay_time_level(1)
            records.append(build(config, msg, f"{fmt}-{target}", born, -1))
    narrow = coordinator_config(config, "g12", allowed_topics=f"{allowed}*")
    with Coordinator(narrow):
        warm_up(config, f"{allowed}-warm")
        write_all(config, records)
        inside = sorted(
            m.body for m in read_messages(config, [allowed], max_messages=2, timeout_ms=20_000)
        )
        kept = wait_until(
            lambda: len(found := list(read_quarantine(config, timeout_ms=1000))) >= 2 and found,
            timeout_s=30,
        )
        assert list(read_messages(config, [topic], timeout_ms=1000)) == []
    assert inside == [b"envelope-True", b"headers-True"]
    for copy in kept:
        assert "allowed_topics" in copy.reason and topic in copy.reason, copy.reason
        replay_quarantined(config, copy.offset)
    delivered = list(read_messages(config, [topic], max_messages=2, timeout_ms=10_000))
    assert sorted(m.body for m in delivered) == [b"envelope-False", b"headers-False"]
    assert {m.msg_id for m in delivered} == {f"envelope-{topic}", f"headers-{topic}"}
    assert {m.born_timestamp_ms for m in delivered} == {born}


def test_a_producer_writing_envelopes_for_old_coordinators_delivers_the_same_records_once(
    config: ClientConfig, topic: str
) -> None:
    """``delay_record_format="envelope"`` (a rolling upgrade): the producer writes the
    previous release's envelope records, and each delay-level and timer message is delivered
    once as the same real-topic record the header format delivers."""
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 2)])
    old_format = config.replace(delay_record_format="envelope")
    catalog = config.catalog(1)

    def messages(fmt: str) -> list[Message]:
        level = Message(topic, b"\xfflevel", keys=["k1", "k2"], tags="TagA")
        level.put_user_property("bin", b"\x00\xff")
        level.put_user_property("fmt", fmt)
        level.set_delay_time_level(1)
        timer = Message(topic, b"timer\x00", keys="k3")
        timer.put_user_property("fmt", fmt)
        timer.set_delay_time_ms(1200)
        return [level, timer]

    sent: dict[str, str] = {}
    with Coordinator(coordinator_config(config, "envelope-producer")):
        warm_up(config, f"{topic}-warm")
        for fmt, client in (("headers", config), ("envelope", old_format)):
            with Producer(f"p-{fmt}", config=client) as producer:
                for kind, msg in zip(("level", "timer"), messages(fmt), strict=True):
                    sent[producer.send_sync(msg, partition=1).msg_id] = f"{kind}-{fmt}"
        got = raw_records(config, topic, 2, len(sent))
        waiting = [
            r
            for system in (SystemTopic.SCHEDULE, SystemTopic.TIMER)
            for r in raw_records(
                config,
                catalog.topic(system),
                config.delay_policy.tier_count if system is SystemTopic.TIMER else 2,
                0,
            )
            if r.key() is not None and r.key().decode() in sent
        ]
    # What the envelope producer wrote is what the previous release wrote and reads.
    written = {sent[r.key().decode()]: r for r in waiting if SEND_ID_HEADER in dict(r.headers())}
    for kind in ("level", "timer"):
        old, new = written[f"{kind}-envelope"], written[f"{kind}-headers"]
        assert not is_header_format(old.headers()) and is_header_format(new.headers())
        assert decode_envelope(old.value()).body == new.value()
    assert [n for n, _ in written["timer-envelope"].headers()] == [
        MessageConst.TIMER_DELIVER_MS,
        SEND_ID_HEADER,
    ]
    assert [n for n, _ in written["level-envelope"].headers()] == [SEND_ID_HEADER]
    # Each delivered once, as the same record but for its id and born time.
    by_name: dict[str, list[Any]] = {}
    for record in got:
        by_name.setdefault(sent[dict(record.headers())["UNIQ_KEY"].decode()], []).append(record)
    assert {k: len(v) for k, v in by_name.items()} == dict.fromkeys(sent.values(), 1)

    def same(record: Any) -> tuple[Any, ...]:
        headers = [
            (n, v)
            for n, v in record.headers()
            if n not in ("UNIQ_KEY", "fmt", BORN_TIMESTAMP_HEADER)
        ]
        return record.partition(), record.key(), record.value(), headers

    for kind in ("level", "timer"):
        (old,), (new,) = by_name[f"{kind}-envelope"], by_name[f"{kind}-headers"]
        assert same(old) == same(new), kind
        assert dict(old.headers())["fmt"] == b"envelope"
    assert by_name["level-envelope"][0].value() == b"\xfflevel"
    assert by_name["timer-envelope"][0].partition() == 1
    assert dict(by_name["level-envelope"][0].headers())["bin"] == b"\x00\xff"


def test_a_coordinator_writing_envelopes_backs_off_in_the_envelope_and_delivers_once(
    config: ClientConfig, topic: str
) -> None:
    """With ``delay_record_format="envelope"`` the coordinator's back-off copy of a
    header-format record is the previous release's (an envelope, ``TIMER_DELIVER_MS`` its one
    header), which a coordinator of that release reads; it is delivered once."""
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 1)])
    born = time.time_ns() // 1_000_000
    msg = Message(topic, b"\xffwaits", keys="k")
    msg.set_delay_time_level(1)
    new = header_record(config, msg, "ENVELOPE-BACKOFF-ID", born, 1)  # no partition 1 yet
    timer = config.catalog(1).topic(SystemTopic.TIMER)
    old_format = config.replace(delay_record_format="envelope")
    with Coordinator(coordinator_config(old_format, "backoff-env", delivery_attempts=20)):
        warm_up(config, f"{topic}-warm")
        write_all(config, [new])

        def backoff_copy() -> list[Any]:
            tiers = config.delay_policy.tier_count
            return [
                r for r in raw_records(config, timer, tiers, 0) if r.key() == b"ENVELOPE-BACKOFF-ID"
            ]

        (copy, *_) = wait_until(backoff_copy, timeout_s=30)
        assert [n for n, _ in copy.headers()] == [MessageConst.TIMER_DELIVER_MS]
        waiting = decode_envelope(copy.value())
        assert waiting.body == b"\xffwaits" and waiting.get_property("DELIVERY_ATTEMPTS") == "1"
        admin = new_admin(config)  # kept: the future fails once its handle is gone
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(10)
        # The broker learns of the new partition a little after the controller answered: a
        # reader that asked before then is given partition 0 alone, for the whole read (under
        # a loaded suite, the delivered copy was then never read).
        wait_until(lambda: len(admin.list_topics(topic, timeout=5).topics[topic].partitions) == 2)
        (delivered,) = read_messages(config, [topic], max_messages=1, timeout_ms=30_000)
        again = list(read_messages(config, [topic], timeout_ms=3000))
    assert (delivered.body, delivered.msg_id, delivered.queue_id) == (
        b"\xffwaits",
        "ENVELOPE-BACKOFF-ID",
        1,
    )
    assert delivered.born_timestamp_ms == born
    assert not {"DELIVERY_ATTEMPTS", "DELIVERY_ERROR"} & set(delivered.properties)
    assert len(again) == 1
