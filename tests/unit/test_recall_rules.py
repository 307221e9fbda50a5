"""Recall's pure rules: the recall handle's codec (every handle reads back; anything else is
refused with an error naming the problem), the one rule both sides apply, and the marker and
handle the producer builds."""

from __future__ import annotations

import base64
import time
from typing import Any, cast

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME
from hypothesis import given
from hypothesis import strategies as st

from bridge.client.recall import Recaller, recall_handle
from bridge.config import ClientConfig
from bridge.coordinator.delay.recall_watch import RECALL_KEPT_MS, RecallWatch
from bridge.delay.recall import (
    RECALL_MARGIN_MS,
    TICK_KEY,
    RecallHandle,
    decode_handle,
    encode_handle,
    marker_headers,
    marker_key,
    read_marker,
    recall_applies,
    tick_headers,
)
from bridge.delay.routing import delayed_record
from bridge.errors import InvalidArgumentError, SendTimeoutError
from bridge.message import Message, now_ms
from topics.catalog import SystemTopic, TopicCatalog

names = st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=200)
handles = st.builds(
    RecallHandle,
    namespace=names,
    topic=names,
    message_id=names,
    due_ms=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
)


@given(handles)
def test_every_handle_reads_back_as_it_was_and_is_url_safe(handle: RecallHandle) -> None:
    text = encode_handle(handle)
    assert decode_handle(text) == handle
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@given(handles, st.integers(min_value=1, max_value=40))
def test_a_truncated_handle_is_refused_naming_what_is_missing(
    handle: RecallHandle, cut: int
) -> None:
    raw = base64.urlsafe_b64decode(encode_handle(handle) + "==")
    short = raw[: max(len(raw) - cut, 1)]
    text = base64.urlsafe_b64encode(short).decode().rstrip("=")
    with pytest.raises(InvalidArgumentError, match=r"truncated|empty"):
        decode_handle(text)


@given(handles, st.binary(min_size=1, max_size=8))
def test_bytes_after_the_time_are_refused(handle: RecallHandle, extra: bytes) -> None:
    raw = base64.urlsafe_b64decode(encode_handle(handle) + "==") + extra
    with pytest.raises(InvalidArgumentError, match="bytes after its time"):
        decode_handle(base64.urlsafe_b64encode(raw).decode())


@pytest.mark.parametrize(
    ("handle", "problem"),
    [
        (None, "must be a string, got NoneType"),
        (b"AQ", "must be a string, got bytes"),
        ("", "empty"),
        ("not base64!", "not URL-safe base64"),
        (base64.urlsafe_b64encode(b"\x02abc").decode(), "layout version 2"),
        (base64.urlsafe_b64encode(b"\x01\x00\x02\xff\xfe").decode(), "namespace is not UTF-8"),
    ],
)
def test_what_is_not_a_handle_is_refused_naming_the_problem(handle: object, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        decode_handle(handle)


@given(st.integers(-(1 << 50), 1 << 50), st.integers(-(1 << 50), 1 << 50))
def test_a_marker_applies_exactly_when_stored_more_than_the_margin_before_the_time(
    append_ms: int, due_ms: int
) -> None:
    assert recall_applies(append_ms, due_ms) == (due_ms - append_ms > RECALL_MARGIN_MS)


def test_the_rule_at_its_edge() -> None:
    due = 1_000_000
    assert recall_applies(due - RECALL_MARGIN_MS - 1, due)
    assert not recall_applies(due - RECALL_MARGIN_MS, due)
    assert not recall_applies(due, due)


@given(handles)
def test_a_marker_reads_back_as_its_message_id_and_time(handle: RecallHandle) -> None:
    headers = marker_headers(handle)
    assert read_marker(handle.message_id.encode(), headers) == (
        handle.message_id,
        handle.due_ms,
    )


@given(handles)
def test_each_marker_has_a_key_of_its_own_that_reads_back_as_its_message_id(
    handle: RecallHandle,
) -> None:
    # The recall topic is compacted: a marker sharing its key with a later record (a second
    # recall of the message, stored too late) would be dropped.
    first, second = marker_key(handle.message_id), marker_key(handle.message_id)
    assert first != second
    assert TICK_KEY not in (first, second)
    for key in (first, second):
        assert read_marker(key, marker_headers(handle)) == (handle.message_id, handle.due_ms)


def test_the_recall_topic_compacts_its_ticks_and_still_deletes() -> None:
    spec = TopicCatalog(namespace="ns").spec(SystemTopic.RECALL)
    assert set(spec.configs["cleanup.policy"].split(",")) == {"compact", "delete"}
    assert int(spec.configs["segment.ms"]) <= 3_600_000
    assert spec.config_mismatches(spec.configs) == []
    # A topic of an earlier build (delete only) is correct, only slower to read at a start.
    assert spec.config_mismatches({**spec.configs, "cleanup.policy": "delete"}) == []
    # Compaction alone would keep every marker (each of its own key) for ever.
    (found,) = spec.config_mismatches({**spec.configs, "cleanup.policy": "compact"})
    assert (found.setting, found.fix) == ("cleanup.policy", "compact,delete")
    # Every other system topic still refuses compaction.
    timer = TopicCatalog(namespace="ns").spec(SystemTopic.TIMER)
    assert [
        m.setting
        for m in timer.config_mismatches({**timer.configs, "cleanup.policy": "compact,delete"})
    ] == ["cleanup.policy"]


def test_ticks_and_foreign_records_are_no_markers() -> None:
    assert read_marker(None, tick_headers()) is None
    assert read_marker(TICK_KEY, tick_headers()) is None
    assert read_marker(b"id", tick_headers()) is None
    assert read_marker(b"id", None) is None
    assert read_marker(b"id", [("BRIDGE_RECALL", b"marker")]) is None  # no time
    assert (
        read_marker(b"id", [("BRIDGE_RECALL", b"marker"), ("BRIDGE_RECALL_DUE_MS", b"x")]) is None
    )
    assert read_marker(b"\xff", marker_headers(RecallHandle("n", "t", "id", 5))) is None


@pytest.mark.parametrize("record_format", ["headers", "envelope"])
def test_a_timer_send_has_a_handle_naming_its_message_and_time(record_format: str) -> None:
    config = ClientConfig(namespace="ns1", delay_record_format=record_format)
    msg = Message("orders", b"body")
    msg.set_deliver_time_ms(2_000_000_000_000)
    record = delayed_record(msg, "MSGID", 1_999_999_000_000, "host", partition=-1, config=config)
    assert record is not None
    handle = recall_handle(record, "orders", "ns1")
    assert handle is not None
    assert decode_handle(handle) == RecallHandle("ns1", "orders", "MSGID", 2_000_000_000_000)


def test_delay_levels_and_other_namespaces_have_no_handle() -> None:
    config = ClientConfig(namespace="ns1")
    level = delayed_record(
        Message("orders", b"b", delay_time_level=2), "ID", 1, "h", partition=-1, config=config
    )
    assert level is not None
    assert recall_handle(level, "orders", "ns1") is None
    msg = Message("orders", b"body")
    msg.set_deliver_time_ms(2_000_000_000_000)
    timer = delayed_record(msg, "ID", 1_999_999_000_000, "h", partition=-1, config=config)
    assert timer is not None
    assert recall_handle(timer, "orders", "ns2") is None


class _Record:
    """A record of the recall topic as confluent-kafka hands it over."""

    def __init__(self, offset: int, stamped_ms: int, key: bytes | None, headers: list[Any]) -> None:
        self._offset, self._stamped, self._key, self._headers = offset, stamped_ms, key, headers

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_LOG_APPEND_TIME, self._stamped)

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[Any]:
        return self._headers


def _marker(offset: int, stamped_ms: int, message_id: str, due_ms: int) -> _Record:
    handle = RecallHandle("ns", "t", message_id, due_ms)
    return _Record(offset, stamped_ms, message_id.encode(), marker_headers(handle))


def test_the_watch_keeps_the_markers_that_apply_and_moves_its_horizon_with_every_record() -> None:
    watch = RecallWatch(ClientConfig(namespace="ns"), "ns.rmq_sys_timer_recall", "test")
    due = 10_000_000
    watch._take(_marker(0, due - RECALL_MARGIN_MS - 1, "early", due))
    watch._take(_marker(1, due - RECALL_MARGIN_MS, "edge", due))
    watch._take(_marker(2, due + 5, "after", due))
    watch._take(_Record(3, due + 7, None, tick_headers()))
    assert watch.applies("early", due)
    assert not watch.applies("early", due + 1)  # another time: a back-off copy, or forged
    assert not watch.applies("edge", due)
    assert not watch.applies("after", due)
    assert watch.horizon_ms == due + 7
    watch.forget("early", due)
    assert not watch.applies("early", due)


def test_the_watch_forgets_a_marker_a_week_after_its_time_not_before() -> None:
    watch = RecallWatch(ClientConfig(namespace="ns"), "ns.rmq_sys_timer_recall", "test")
    due = 10_000_000
    watch._take(_marker(0, due - 60_000, "m", due))
    watch.expire(due + RECALL_KEPT_MS)
    assert watch.applies("m", due)  # hours behind its timers, a coordinator still knows it
    watch.expire(due + RECALL_KEPT_MS + 1)
    assert not watch.applies("m", due)


class _SilentPump:
    """A producer's delivery pump whose broker does not answer until told to."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def refuse_waiting_in_a_callback(self, what: str) -> None:
        pass

    def produce(self, record: Any, partition: int, report: Any) -> None:
        self.reports.append(report)

    def flush(self, timeout_s: float) -> int:
        time.sleep(min(timeout_s, 0.01))
        return len(self.reports)


class _Stored:
    """The broker's acknowledgement of a record it stored at ``stamped_ms``."""

    def __init__(self, stamped_ms: int) -> None:
        self._stamped = stamped_ms

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_LOG_APPEND_TIME, self._stamped)


def test_a_recall_made_again_after_a_timeout_answers_as_the_marker_that_was_stored() -> None:
    # The first write timed out but was stored in time: a recall made again once the time is
    # near must not raise RecallTooLateError ("delivered"), since the message is kept back.
    config = ClientConfig(namespace="ns", send_msg_timeout_ms=200)
    pump = _SilentPump()
    recaller = Recaller(config, cast(Any, pump))
    recaller._topic_ready = True  # no broker here: the topic is taken as there
    born = now_ms()
    due = born + RECALL_MARGIN_MS + 2000
    handle = encode_handle(RecallHandle("ns", "orders", "MSGID", due))
    with pytest.raises(SendTimeoutError):
        recaller.recall("orders", handle)
    (report,) = pump.reports
    report(None, _Stored(born + 10))  # the acknowledgement comes after all
    while now_ms() < due - RECALL_MARGIN_MS:
        time.sleep(0.05)
    assert recaller.recall("orders", handle) == "MSGID"
    assert len(pump.reports) == 1  # answered from the first write, nothing written again
