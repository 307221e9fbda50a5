"""``Producer.send_async`` without a broker (an address nobody listens on): the ids of the
records it hands to librdkafka, and the trace context it writes into a message (the records
themselves are the record builder's: ``test_record_builder.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bridge import ClientConfig, Message, Producer
from bridge.message import MessageConst

NOWHERE = "127.0.0.1:1"


class HandedOver:
    """Stands in for a producer's confluent-kafka client: keeps what ``produce`` is given
    and hands nothing on."""

    def __init__(self, kafka: Any) -> None:
        self.kafka = kafka
        self.records: list[dict[str, Any]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **kwargs: Any) -> None:
        self.records.append({"topic": topic, "value": value, "key": key, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kafka, name)


@pytest.fixture(scope="module")
def producer() -> Iterator[Producer]:
    config = ClientConfig(
        bootstrap_servers=NOWHERE, namespace="ns", max_message_bytes=1000, send_msg_timeout_ms=1000
    )
    with Producer("pg", config=config) as started:
        kafka = started._sender.pump.kafka
        started._sender.pump.kafka = HandedOver(kafka)
        yield started
        started._sender.pump.kafka = kafka
        kafka.purge()


def handed_over(producer: Producer) -> list[dict[str, Any]]:
    log = producer._sender.pump.kafka
    assert isinstance(log, HandedOver)
    return log.records


def test_send_async_ids_are_unique_and_name_the_record(producer: Producer) -> None:
    ids = [producer.send_async(Message("orders", b"x", tags="T")) for _ in range(1000)]
    assert len(set(ids)) == 1000
    headers = [dict(r["headers"]) for r in handed_over(producer)[-1000:]]
    assert [h[MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX].decode() for h in headers] == ids


def test_send_async_writes_the_current_trace_context_without_a_tracer_provider(
    producer: Producer,
) -> None:
    # A valid current span (one a framework took from an incoming request, say) without a
    # tracer provider: its context goes into the message, as prepare writes it.
    trace = pytest.importorskip("opentelemetry.trace")
    context = trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    producer.send_async(Message("orders", b"mapped"))  # the topic is mapped: no slow path
    msg = Message("orders", b"traced", tags="T")
    with trace.use_span(trace.NonRecordingSpan(context)):
        producer.send_async(msg)
    expected = msg.get_property(MessageConst.TRACE_PARENT)
    assert isinstance(expected, str)
    assert "1234" in expected
    headers = dict(handed_over(producer)[-1]["headers"])
    assert headers[MessageConst.TRACE_PARENT] == expected.encode()
    plain = Message("orders", b"plain")
    producer.send_async(plain)  # no current span: nothing written
    assert MessageConst.TRACE_PARENT not in dict(handed_over(producer)[-1]["headers"])
