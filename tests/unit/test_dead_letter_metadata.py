"""Dead-letter metadata on retry and DLQ copies: how the listener failed a message, where the
group first read it, and what a replay to the origin topic drops (docs/tracing.md)."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.codec import decode_headers, delayed_message
from bridge.config import ClientConfig
from bridge.consumer.consumption import Failure, leading_successes, record_failure
from bridge.consumer.model import ConsumeStatus, retry_route
from bridge.consumer.send_back import ReplayTarget, replay_record, send_back_record
from bridge.message import (
    DEAD_LETTER_PROPERTIES,
    FAILURE_MESSAGE_MAX_BYTES,
    MessageConst,
    MessageExt,
    truncate_utf8,
)


class OrderRejectedError(Exception):
    pass


def _received(offset: int = 7) -> MessageExt:
    return MessageExt(
        "orders",
        b"payload",
        msg_id="ABC",
        queue_id=2,
        queue_offset=offset,
        born_timestamp_ms=1_700_000_000_000,
        kafka_topic="orders",
        properties={"UNIQ_KEY": "ABC", "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    )


def test_a_long_exception_message_is_cut_to_one_kib_of_utf8() -> None:
    text = "é" * 2000  # 4000 bytes
    cut = truncate_utf8(text)
    assert cut.endswith("...")
    assert len(cut.encode()) <= FAILURE_MESSAGE_MAX_BYTES
    assert truncate_utf8("short") == "short"
    assert truncate_utf8("a\udc80b") == "a?b"


def _cut_whole(text: str, max_bytes: int) -> str:
    """The rule, from the text's whole UTF-8 encoding."""
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= max_bytes:
        return encoded.decode("utf-8")
    return encoded[: max(max_bytes - 3, 0)].decode("utf-8", "ignore") + "..."


@settings(max_examples=500, derandomize=True, database=None, deadline=None)
@given(
    text=st.text(
        alphabet=st.one_of(st.characters(), st.sampled_from(["a", "é", "€", "😀", "\udc80"])),
        max_size=40,
    ),
    max_bytes=st.integers(-2, 60),
)
def test_a_cut_is_the_longest_prefix_that_fits_whatever_the_text(text: str, max_bytes: int) -> None:
    cut = truncate_utf8(text, max_bytes)
    assert cut == _cut_whole(text, max_bytes)
    if len(text.encode("utf-8", "replace")) <= max_bytes:
        assert cut == text.encode("utf-8", "replace").decode("utf-8")
    else:
        assert cut.endswith("...") and len(cut.encode()) <= max(max_bytes, 3)


class _WholeText(str):
    """A text that must never be encoded whole (slices of it are plain ``str``)."""

    __slots__ = ()

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        raise AssertionError(f"the whole {len(self)}-character text was encoded")


def test_only_the_head_of_a_huge_exception_message_is_encoded() -> None:
    huge = _WholeText("€" * 10_000_000 + "end")
    cut = truncate_utf8(huge)
    assert cut == "€" * ((FAILURE_MESSAGE_MAX_BYTES - 3) // 3) + "..."
    assert truncate_utf8(_WholeText("short")) == "short"
    assert truncate_utf8(_WholeText("")) == ""


def test_the_exception_a_listener_raised_travels_in_the_retry_and_dlq_copies() -> None:
    msg = _received()

    def listener(m: MessageExt) -> ConsumeStatus:
        raise OrderRejectedError("x" * 5000)

    assert leading_successes(listener, [msg], "g1") == 0
    config = ClientConfig(namespace="ns")
    waiting = send_back_record(msg, "g1", retry_route(0, 16), 16, config=config, born_host=b"h")
    retry = delayed_message(waiting.headers, waiting.value).properties
    assert retry[MessageConst.CONSUME_FAILURE] == Failure.EXCEPTION
    assert retry[MessageConst.CONSUME_EXCEPTION_CLASS] == f"{__name__}.OrderRejectedError"
    message = retry[MessageConst.CONSUME_EXCEPTION_MESSAGE]
    assert isinstance(message, str) and message.startswith("xxx") and message.endswith("...")
    assert len(message.encode()) <= FAILURE_MESSAGE_MAX_BYTES
    assert retry[MessageConst.CONSUMER_GROUP] == "g1"
    assert retry[MessageConst.ORIGIN_KAFKA_TOPIC] == "orders"
    assert retry[MessageConst.ORIGIN_QUEUE_ID] == "2"
    assert retry[MessageConst.ORIGIN_QUEUE_OFFSET] == "7"
    assert retry[MessageConst.ORIGIN_TIMESTAMP] == "1700000000000"
    assert retry[MessageConst.TRACE_PARENT] == msg.properties["traceparent"]

    # Read back from the retry topic (another place) and failed without raising: the origin
    # stays the first record's, the exception gives way to the status.
    again = MessageExt(
        "%RETRY%g1",
        b"payload",
        msg_id="ABC",
        queue_id=0,
        queue_offset=99,
        kafka_topic="ns.RETRY.g1",
        properties=dict(retry),
    )
    record_failure([again], ConsumeStatus.RECONSUME_LATER.name)
    dead = decode_headers(
        send_back_record(
            again, "g1", retry_route(16, 16), 16, config=config, born_host=b"h"
        ).headers
    )
    assert dead[MessageConst.CONSUME_FAILURE] == "RECONSUME_LATER"
    assert MessageConst.CONSUME_EXCEPTION_CLASS not in dead
    assert MessageConst.CONSUME_EXCEPTION_MESSAGE not in dead
    assert dead[MessageConst.ORIGIN_KAFKA_TOPIC] == "orders"
    assert dead[MessageConst.ORIGIN_QUEUE_OFFSET] == "7"
    assert dead[MessageConst.TRACE_PARENT] == msg.properties["traceparent"]

    letter = MessageExt("%DLQ%g1", b"payload", msg_id="ABC", properties=dict(dead))
    origin = decode_headers(
        replay_record(letter, "g1", ReplayTarget.ORIGIN, namespace="ns").headers
    )
    assert not set(DEAD_LETTER_PROPERTIES) & set(origin), "a replay to origin starts afresh"
    assert origin[MessageConst.TRACE_PARENT] == msg.properties["traceparent"]
    retry_again = decode_headers(
        replay_record(letter, "g1", ReplayTarget.RETRY, namespace="ns").headers
    )
    assert retry_again[MessageConst.ORIGIN_QUEUE_OFFSET] == "7"


def test_a_listener_returning_none_and_the_messages_after_it_note_the_failure() -> None:
    msgs = [_received(i) for i in range(3)]
    results = iter([ConsumeStatus.CONSUME_SUCCESS, None])
    assert leading_successes(lambda m: next(results), msgs) == 1
    assert MessageConst.CONSUME_FAILURE not in msgs[0].properties
    assert [m.get_property(MessageConst.CONSUME_FAILURE) for m in msgs[1:]] == ["NONE", "NONE"]


def test_without_opentelemetry_nothing_of_it_is_imported_and_the_context_still_travels() -> None:
    script = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from bridge.consumer.consumption import leading_successes
from bridge.message import Message, MessageExt
from bridge.tracing import inject_trace_context, tracing_available
m = Message("t", b"x", properties={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})
inject_trace_context(m)
plain = Message("t", b"x")
inject_trace_context(plain)
assert leading_successes(lambda msg: None, [MessageExt("t", b"x", msg_id="i")]) == 0
assert not tracing_available()
assert not [k for k, v in sys.modules.items() if k.startswith("opentelemetry.") and v]
print(m.properties["traceparent"], sorted(plain.properties))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["00-" + "a" * 32 + "-" + "b" * 16 + "-01", "[]"]
