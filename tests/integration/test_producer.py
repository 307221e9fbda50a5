"""The plain producer against a real broker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from bridge import ClientConfig, Message, Producer, SendResult, SendStatus, read_messages
from bridge.client.records import plain_record
from bridge.client.sender import RecordSender
from bridge.errors import (
    IllegalStateError,
    InvalidMessageError,
    InvalidTopicNameError,
    MessageTooLargeError,
    SendError,
    SendTimeoutError,
)
from bridge.runtime.local_kafka import free_port
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def raw_consume(bootstrap: str, topic: str, count: int, timeout_s: float = 20) -> list[Any]:
    """Read with a plain confluent-kafka consumer, as any Kafka user would."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < count and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                out.append(record)
    finally:
        consumer.close()
    return out


def test_send_sync_round_trip_readable_by_a_raw_kafka_consumer(
    client_config: ClientConfig, topic: str
) -> None:
    msg = Message(
        topic, b"payload", keys="order-1 order-2", tags="TagA", properties={"region": "eu"}
    )
    with Producer("pg", config=client_config) as producer:
        result = producer.send_sync(msg)
    assert result.status is SendStatus.SEND_OK
    assert result.topic == topic
    assert result.offset == 0

    (record,) = raw_consume(client_config.bootstrap_servers, topic, 1)
    assert record.value() == b"payload"
    assert record.key() == b"order-1 order-2"
    headers = dict(record.headers())
    assert headers["UNIQ_KEY"] == result.msg_id.encode()
    assert headers["TAGS"] == b"TagA"
    assert headers["KEYS"] == b"order-1 order-2"
    assert headers["region"] == b"eu"
    assert (record.partition(), record.offset()) == (result.queue_id, result.offset)

    (received,) = read_messages(client_config, [topic], max_messages=1)
    assert received.msg_id == result.msg_id
    assert received.tags == "TagA"
    assert received.keys == ["order-1", "order-2"]
    assert received.user_properties == {"region": "eu"}
    assert abs(received.born_timestamp_ms - time.time() * 1000) < 60_000


def test_read_messages_reads_what_a_topic_holds_whatever_its_idle_timeout(
    client_config: ClientConfig, topic: str
) -> None:
    """The idle clock starts once the reader has read its partitions to their end: joining
    the group is not idleness (a 1 s timeout read nothing on a busy machine)."""
    with Producer("pg", config=client_config) as producer:
        for i in range(3):
            producer.send_sync(Message(topic, f"m{i}".encode()))

    got = [m.body for m in read_messages(client_config, [topic], timeout_ms=1)]

    assert sorted(got) == [b"m0", b"m1", b"m2"]


def test_send_async_and_oneway_deliver_every_message_once(
    client_config: ClientConfig, topic: str
) -> None:
    results: list[Any] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def ok(result: Any) -> None:
        with lock:
            results.append(result)

    with Producer("pg", config=client_config) as producer:
        sent_ids = [
            producer.send_async(Message(topic, f"m{i}"), ok, errors.append) for i in range(500)
        ]
        oneway_ids = [producer.send_oneway(Message(topic, f"o{i}")) for i in range(100)]
        assert producer.flush() == 0
    wait_until(lambda: len(results) == 500)
    assert not errors
    assert sorted(r.msg_id for r in results) == sorted(sent_ids)
    assert len(set(sent_ids + oneway_ids)) == 600
    received = list(read_messages(client_config, [topic], max_messages=600))
    assert sorted(m.msg_id for m in received) == sorted(sent_ids + oneway_ids)


def test_a_few_async_sends_get_their_results_without_flush(
    client_config: ClientConfig, topic: str
) -> None:
    # Fewer sends than the sending thread serves reports for: the delivery thread must.
    results: list[SendResult] = []
    with Producer("pg", config=client_config) as producer:
        ids = [producer.send_async(Message(topic, f"m{i}"), results.append) for i in range(3)]
        wait_until(lambda: len(results) == 3, timeout_s=10)
    assert sorted(r.msg_id for r in results) == sorted(ids)
    assert sorted(r.offset for r in results) == [0, 1, 2]
    assert {(r.status, r.topic, r.queue_id) for r in results} == {(SendStatus.SEND_OK, topic, 0)}


def test_explicit_partition_is_honoured(client_config: ClientConfig, topic: str) -> None:
    from bridge.kafka.admin import TopicAdmin
    from topics.catalog import TopicSpec

    TopicAdmin(client_config).ensure_topics([TopicSpec(topic, 3)])
    with Producer("pg", config=client_config) as producer:
        results = [producer.send_sync(Message(topic, b"x"), partition=p) for p in (2, 0, 2)]
    assert [r.queue_id for r in results] == [2, 0, 2]
    assert [r.offset for r in results] == [0, 0, 1]


def test_bad_input_raises_typed_errors_before_sending(
    client_config: ClientConfig, topic: str
) -> None:
    with Producer("pg", config=client_config.replace(max_message_bytes=1000)) as producer:
        with pytest.raises(InvalidTopicNameError, match="found"):
            producer.send_sync(Message("bad topic!", b"x"))
        with pytest.raises(
            MessageTooLargeError, match="1001 bytes, more than max_message_bytes=1000"
        ):
            producer.send_sync(Message(topic, b"x" * 1001))
        with pytest.raises(InvalidMessageError, match="body length is zero"):
            producer.send_async(Message(topic, b""))
        with pytest.raises(InvalidMessageError, match="expected a Message"):
            producer.send_oneway("not a message")  # type: ignore[arg-type]
    # Nothing of the above reached the topic.
    assert list(read_messages(client_config, [topic], timeout_ms=1500)) == []


def test_sending_requires_a_started_producer(client_config: ClientConfig, topic: str) -> None:
    producer = Producer("pg", config=client_config)
    with pytest.raises(IllegalStateError, match="call start"):
        producer.send_sync(Message(topic, b"x"))
    producer.start()
    producer.shutdown()
    producer.shutdown()  # idempotent
    with pytest.raises(IllegalStateError):
        producer.send_sync(Message(topic, b"x"))


def test_unreachable_broker_fails_within_the_send_timeout(topic: str) -> None:
    config = ClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", send_msg_timeout_ms=1500)
    failures: list[Exception] = []
    with Producer("pg", config=config) as producer:
        started = time.monotonic()
        with pytest.raises(SendTimeoutError):
            producer.send_sync(Message(topic, b"x"))
        assert time.monotonic() - started < 1.5 + 2.0
        producer.send_async(Message(topic, b"y"), on_exception=failures.append)
        wait_until(lambda: failures, timeout_s=10)
    assert isinstance(failures[0], SendError)


def test_records_written_by_other_kafka_clients_decode(
    client_config: ClientConfig, topic: str
) -> None:
    from confluent_kafka import Producer as RawProducer

    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    raw.produce(topic, b"foreign", b"k", headers=[("bin", b"\xff\xfe"), ("null", None)])
    raw.flush(10)
    (msg,) = read_messages(client_config, [topic], max_messages=1)
    assert msg.body == b"foreign"
    assert msg.msg_id == f"{topic}-0-0"
    assert msg.get_property("bin") == b"\xff\xfe"  # not UTF-8: kept as bytes
    assert msg.get_property("null") == ""


def test_a_raw_consumer_positions_match_send_results(
    client_config: ClientConfig, topic: str
) -> None:
    with Producer("pg", config=client_config) as producer:
        last = [producer.send_sync(Message(topic, f"{i}")) for i in range(5)][-1]
    consumer = Consumer({"bootstrap.servers": client_config.bootstrap_servers, "group.id": "x"})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, last.queue_id), timeout=10)
    consumer.close()
    assert (low, high) == (0, last.offset + 1)


def test_send_record_async_raises_only_for_a_record_it_did_not_take(
    client_config: ClientConfig, topic: str
) -> None:
    # Reports are served on the sending thread every few sends: a callback that raises there
    # must not make a send that was taken look refused (its caller would count the record as
    # not sent while its report still comes).
    reports: list[object] = []

    def raising(err: object, _msg: object) -> None:
        reports.append(err)
        if len(reports) == 1:  # once: flush() and close() below serve the rest
            raise RuntimeError("a callback that fails")

    sent = 0
    with RecordSender(client_config, "send_record_raising_cb") as sender:
        deadline = time.monotonic() + 30
        while not reports and time.monotonic() < deadline:
            record = plain_record(Message(topic, b"x"), topic, f"id-{sent}", 0, b"h")
            sender.send_record_async(record, -1, raising)
            sent += 1
        assert reports, "no report served on the sending thread"
        sender.flush(10_000)
    assert len(reports) == sent
    assert all(err is None for err in reports)


def test_a_callback_raising_system_exit_does_not_stop_the_reports_of_later_sends(
    client_config: ClientConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # The first report is served by the producer's own thread (nothing else sends meanwhile):
    # its callback's SystemExit, which the report handler does not catch as an Exception,
    # ended that thread, and no later send_async callback ran until the next send.
    topic = f"sysexit-{uuid.uuid4().hex[:8]}"
    called = threading.Event()
    done: list[str] = []

    def exits(result: SendResult) -> None:
        called.set()
        raise SystemExit(3)

    with Producer("sysexit_pg", config=client_config) as producer:
        producer.send_sync(Message(topic, b"warm"))  # the topic exists, the connection is up
        producer.send_async(Message(topic, b"first"), on_success=exits)
        assert called.wait(20)
        for body in ("a", "b", "c"):
            producer.send_async(Message(topic, body), on_success=lambda r: done.append(r.msg_id))
        wait_until(lambda: len(done) == 3, timeout_s=10)
    assert "a delivery report callback raised" in caplog.text


_CHAINED_SENDS = """
import sys
from bridge import ClientConfig, Message, Producer
from bridge.errors import IllegalStateError
bootstrap, topic = sys.argv[1:3]
producer = Producer("chained_pg", config=ClientConfig(bootstrap_servers=bootstrap))
producer.start()
chained, refused = [], []
def on_success(result):
    if len(chained) < 300:
        chained.append(producer.send_async(Message(topic, b"chained"), on_success))
    if not refused:
        try:
            producer.send_sync(Message(topic, b"never"))
        except IllegalStateError as exc:
            refused.append(str(exc))
for i in range(200):
    producer.send_async(Message(topic, b"%04d" % i), on_success)
for _ in range(30):
    if len(chained) == 300:
        break
    producer.flush(10_000)
print(producer.flush(10_000), len(chained), refused[0] if refused else "not refused")
producer.shutdown()
"""


def test_a_callback_that_sends_again_does_not_abort_the_process(
    client_config: ClientConfig,
) -> None:
    # Sends served delivery reports every few sends: from inside a report callback that meant
    # polling the client again from one of its own callbacks, which confluent-kafka answers
    # by aborting the process (a failed C assertion). A process of its own, for that.
    topic = f"chained-{uuid.uuid4().hex[:8]}"
    script = [sys.executable, "-c", _CHAINED_SENDS, client_config.bootstrap_servers, topic]
    ended = subprocess.run(script, capture_output=True, text=True, timeout=120, check=False)
    assert ended.returncode == 0, ended.stderr[-2000:]
    remaining, chained, refused = ended.stdout.split(" ", 2)
    assert (remaining, chained) == ("0", "300")
    assert "send_sync in one of its own delivery callbacks" in refused, refused
    stored = raw_consume(client_config.bootstrap_servers, topic, 500)
    assert len(stored) == 500
