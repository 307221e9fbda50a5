"""Trace context and dead-letter metadata against a real broker (docs/tracing.md).

A W3C ``traceparent`` sent with a transactional message reaches the consumer of the real
topic and, after the listener failed it, of the retry topic; the DLQ copy carries it with the
failure's metadata. A delay level and a timer keep it too. The OpenTelemetry spans are checked
in a child process (the tracer provider is process-wide and set once), with the SDK's
in-memory exporter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.consumer import ConsumeFromWhere, ConsumeStatus, PushConsumer
from bridge.consumer.admin import read_dead_letters
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.admin import TopicAdmin
from bridge.message import FAILURE_MESSAGE_MAX_BYTES, MessageConst
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import TopicSpec
from topics.naming import retry_topic

# One worker runs the module: its coordinator (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_tracing")]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


@pytest.fixture(scope="module")
def fast_config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level="1s 1s 1s 1s 1s",
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture(scope="module")
def coordinator(fast_config: ClientConfig) -> Iterator[Coordinator]:
    config = CoordinatorConfig(
        client=fast_config,
        coordinator_id=f"tracing-{uuid.uuid4().hex[:6]}",
        transaction_partitions=1,
        session_timeout_ms=6000,
    )
    with Coordinator(config) as running:
        yield running


class Commit(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


class PaymentDeclinedError(Exception):
    pass


@dataclass
class Failing:
    """Fails every delivery: raises for bodies starting with ``raise``, else returns
    RECONSUME_LATER; records what each delivery carried."""

    seen: list[MessageExt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        with self.lock:
            self.seen.append(msg)
        if msg.body.startswith(b"raise"):
            raise PaymentDeclinedError("card 4242 declined: " + "x" * 3000)
        return ConsumeStatus.RECONSUME_LATER

    def of(self, body: bytes) -> list[MessageExt]:
        with self.lock:
            return [m for m in self.seen if m.body == body]


def start_consumer(config: ClientConfig, group: str, topic: str, listener: Any) -> PushConsumer:
    consumer = PushConsumer(
        group,
        config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        max_reconsume_times=1,
        persist_consumer_offset_interval_ms=200,
        send_back_retry_delay_ms=300,
    )
    consumer.subscribe(topic, listener)
    consumer.start()
    return consumer


def test_a_trace_id_reaches_the_real_and_retry_topics_and_the_dlq_with_the_failure(
    fast_config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    topic = unique("t")
    group = unique("g")
    TopicAdmin(fast_config).ensure_topics([TopicSpec(topic, 1)])
    listener = Failing()
    consumer = start_consumer(fast_config, group, topic, listener)
    try:
        with TransactionMQProducer(unique("pg"), Commit(), config=fast_config) as producer:
            for text in ("raise-1", "later-1"):
                producer.send_message_in_transaction(
                    Message(
                        topic,
                        text,
                        keys=text,
                        properties={"traceparent": TRACEPARENT, "tracestate": TRACESTATE},
                    ),
                    None,
                )
        wait_until(lambda: consumer.stats().dead_lettered == 2, timeout_s=90)
    finally:
        consumer.shutdown()

    for raw in (b"raise-1", b"later-1"):
        first, second = listener.of(raw)
        assert first.kafka_topic == topic, "the real topic's consumer"
        assert second.kafka_topic == retry_topic(group, fast_config.namespace)
        for delivery in (first, second):
            assert delivery.get_property(MessageConst.TRACE_PARENT) == TRACEPARENT
            assert delivery.get_property(MessageConst.TRACE_STATE) == TRACESTATE
        assert second.get_property(MessageConst.CONSUMER_GROUP) == group
        assert second.get_property(MessageConst.ORIGIN_QUEUE_OFFSET) == str(first.queue_offset)

    letters = {m.body: m for m in read_dead_letters(fast_config, group)}
    assert set(letters) == {b"raise-1", b"later-1"}
    for raw, letter in letters.items():
        first = listener.of(raw)[0]
        props = letter.properties
        assert props[MessageConst.TRACE_PARENT] == TRACEPARENT
        assert props[MessageConst.TRACE_STATE] == TRACESTATE
        assert props[MessageConst.CONSUMER_GROUP] == group
        assert props[MessageConst.ORIGIN_KAFKA_TOPIC] == topic
        assert props[MessageConst.ORIGIN_QUEUE_ID] == "0"
        assert props[MessageConst.ORIGIN_QUEUE_OFFSET] == str(first.queue_offset)
        assert props[MessageConst.ORIGIN_TIMESTAMP] == str(
            first.store_timestamp_ms or first.born_timestamp_ms
        )
        assert letter.user_properties == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    raised = letters[b"raise-1"].properties
    assert raised[MessageConst.CONSUME_FAILURE] == "EXCEPTION"
    assert raised[MessageConst.CONSUME_EXCEPTION_CLASS] == f"{__name__}.PaymentDeclinedError"
    message = raised[MessageConst.CONSUME_EXCEPTION_MESSAGE]
    assert isinstance(message, str) and message.startswith("card 4242 declined: xxx")
    assert message.endswith("...") and len(message.encode()) <= FAILURE_MESSAGE_MAX_BYTES
    later = letters[b"later-1"].properties
    assert later[MessageConst.CONSUME_FAILURE] == "RECONSUME_LATER"
    assert MessageConst.CONSUME_EXCEPTION_CLASS not in later
    assert MessageConst.CONSUME_EXCEPTION_MESSAGE not in later

    # The operator's view shows the same.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge.cli",
            "--namespace",
            fast_config.namespace,
            "dlq",
            "list",
            "-b",
            fast_config.bootstrap_servers,
            "--group",
            group,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["message"]["body"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert rows["raise-1"]["failure"]["CONSUME_EXCEPTION_CLASS"].endswith("PaymentDeclinedError")
    assert rows["raise-1"]["failure"]["ORIGIN_KAFKA_TOPIC"] == topic
    assert rows["later-1"]["failure"]["CONSUME_FAILURE"] == "RECONSUME_LATER"
    assert rows["later-1"]["failure"]["traceparent"] == TRACEPARENT


def test_a_trace_id_survives_a_delay_level_and_a_timer(
    fast_config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    topic = unique("t")
    TopicAdmin(fast_config).ensure_topics([TopicSpec(topic, 1)])
    props = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    level = Message(topic, "level", properties=props, delay_time_level=2)
    timer = Message(topic, "timer", properties=props)
    timer.set_delay_time_ms(1500)
    with Producer(unique("pg"), config=fast_config) as producer:
        producer.send_sync(level)
        producer.send_sync(timer)
    got = {
        m.body: m for m in read_messages(fast_config, [topic], max_messages=2, timeout_ms=60_000)
    }
    assert set(got) == {b"level", b"timer"}
    for msg in got.values():
        assert msg.get_property(MessageConst.TRACE_PARENT) == TRACEPARENT
        assert msg.get_property(MessageConst.TRACE_STATE) == TRACESTATE


_SPANS_SCRIPT = """
import json, sys, threading, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bridge import ClientConfig, Message, Producer, TransactionMQProducer, TransactionStatus
from bridge import TransactionListener
from bridge.consumer import ConsumeFromWhere, ConsumeStatus, PushConsumer

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

bootstrap, namespace, topic, group = sys.argv[1:5]
config = ClientConfig(bootstrap_servers=bootstrap, namespace=namespace,
                      message_delay_level="1s 1s 1s 1s 1s")

class Commit(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return TransactionStatus.COMMIT
    def check_local_transaction(self, msg):
        return TransactionStatus.COMMIT

seen = []
lock = threading.Lock()
def listener(msg):
    with lock:
        seen.append((msg.body.decode(), msg.kafka_topic, msg.get_property("traceparent")))
        n = sum(1 for body, _, _ in seen if body == msg.body.decode())
    return ConsumeStatus.CONSUME_SUCCESS if n > 1 else ConsumeStatus.RECONSUME_LATER

consumer = PushConsumer(group, config=config,
                        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
consumer.subscribe(topic, listener)
consumer.start()
tracer = trace.get_tracer("test")
with tracer.start_as_current_span("checkout"):
    with Producer("pg-plain", config=config) as producer:
        producer.send_sync(Message(topic, "plain"))
    with TransactionMQProducer("pg-tx", Commit(), config=config) as producer:
        producer.send_message_in_transaction(Message(topic, "tx"), None)
deadline = time.monotonic() + 90
while time.monotonic() < deadline:
    with lock:
        if len(seen) >= 4:
            break
    time.sleep(0.05)
consumer.shutdown()

def ident(context):
    return None if context is None else format(context.span_id, "016x")

spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": ident(s.context),
        "parent_id": ident(s.parent),
        "status": s.status.status_code.name,
        "group": s.attributes.get("messaging.consumer.group.name"),
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps({"spans": spans, "seen": seen}))
"""


def test_opentelemetry_spans_follow_the_message(
    fast_config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    topic = unique("t")
    group = unique("g")
    TopicAdmin(fast_config).ensure_topics([TopicSpec(topic, 1)])
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _SPANS_SCRIPT,
            fast_config.bootstrap_servers,
            fast_config.namespace,
            topic,
            group,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    spans, seen = out["spans"], out["seen"]
    [checkout] = [s for s in spans if s["name"] == "checkout"]
    [send] = [s for s in spans if s["name"] == f"{topic} send"]
    assert send["kind"] == "PRODUCER"
    assert send["parent_id"] == checkout["span_id"], "the send span is a child of the caller's"
    assert {s["trace_id"] for s in spans} == {checkout["trace_id"]}, "one trace throughout"
    # traceparent without its flags (sampled; the SDK may add W3C's random-trace-id flag).
    carried = {(body, kafka_topic): tp.rsplit("-", 1)[0] for body, kafka_topic, tp in seen}
    retry = retry_topic(group, fast_config.namespace)
    # The plain send carries its send span's context; the transactional one (no send span of
    # its own) the caller's; both on the real topic and on the retry topic.
    for kafka_topic in (topic, retry):
        assert carried[("plain", kafka_topic)] == f"00-{checkout['trace_id']}-{send['span_id']}"
        assert carried[("tx", kafka_topic)] == f"00-{checkout['trace_id']}-{checkout['span_id']}"
    process = [s for s in spans if s["name"] == f"{topic} process"]
    assert len(process) == 4, process
    assert {s["kind"] for s in process} == {"CONSUMER"}
    assert {s["group"] for s in process} == {group}
    assert sorted(s["parent_id"] for s in process) == sorted(
        [send["span_id"]] * 2 + [checkout["span_id"]] * 2
    ), "each delivery's span is a child of the context the message carried"
    assert sorted(s["status"] for s in process) == ["ERROR", "ERROR", "UNSET", "UNSET"]
