"""The push consumer's pure rules: retry routing, tag filters, the offset it commits, copies."""

from __future__ import annotations

import random
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from bridge import ClientConfig, MessageConst, MessageExt
from bridge.codec import decode_headers, delayed_message
from bridge.consumer import PushConsumer, PushConsumerConfig, TagFilter
from bridge.consumer.concurrent import ConcurrentConsumption
from bridge.consumer.model import (
    ACK_INDEX_ALL,
    DEFAULT_MAX_RECONSUME_TIMES,
    ORDERLY_UNLIMITED_RECONSUME,
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    MessageQueue,
    checked_ack_index,
    checked_delay_level,
    checked_suspend_millis,
    effective_max_reconsume_times,
    retry_route,
)
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.quarantine import refused_for_good as _refused_for_good
from bridge.consumer.send_back import ReplayTarget, replay_record, send_back_record
from bridge.consumer.tuning import fetch_tuning, group_tuning
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    MessageTooLargeError,
    SendError,
    SendTimeoutError,
)
from bridge.lifecycle import ServiceState
from topics.naming import dlq_topic, retry_topic, system_topic


def test_first_failure_waits_at_level_three_and_each_next_one_level_more() -> None:
    assert retry_route(0, 16) == (False, 3, 1)
    assert retry_route(1, 16) == (False, 4, 2)
    assert retry_route(15, 16) == (False, 18, 16)


def test_the_seventeenth_failure_goes_to_the_dlq() -> None:
    assert retry_route(16, 16).to_dlq
    assert retry_route(16, 16).reconsume_times == 17


def test_a_listener_level_overrides_and_a_negative_one_means_dlq() -> None:
    assert retry_route(5, 16, 2) == (False, 2, 6)
    assert retry_route(0, 16, -1).to_dlq


def test_minus_one_means_rocketmqs_default_budget() -> None:
    assert effective_max_reconsume_times(-1, orderly=False) == DEFAULT_MAX_RECONSUME_TIMES == 16
    assert effective_max_reconsume_times(-1, orderly=True) == ORDERLY_UNLIMITED_RECONSUME
    assert effective_max_reconsume_times(3, orderly=True) == 3


@pytest.mark.parametrize(
    ("expression", "tag", "expected"),
    [
        ("*", None, True),
        ("", "X", True),
        ("   ", "X", True),  # RocketMQ's parser keeps no tag: it would pass nothing
        (" * ", "X", True),  # RocketMQ's: the literal tag "*"
        (" * ", None, True),
        ("TagA", "TagA", True),
        ("TagA", "TagB", False),
        ("TagA || TagB", "TagB", True),
        ("TagA||TagB", "TagC", False),
        ("TagA || TagB", None, False),
    ],
)
def test_tag_expressions(expression: str, tag: str | None, expected: bool) -> None:
    assert TagFilter(expression).matches(tag) is expected


@pytest.mark.parametrize("expression", ["||", "Tag A", "TagA || *", "a | b"])
def test_malformed_expressions_are_refused(expression: str) -> None:
    with pytest.raises(InvalidArgumentError, match="expression"):
        TagFilter(expression)


def _msg(offset: int) -> MessageExt:
    return MessageExt("t", b"x", msg_id=f"id{offset}", queue_id=0, queue_offset=offset)


def test_commit_offset_is_the_smallest_held_whatever_order_work_finishes_in() -> None:
    pq = ProcessQueue("t", 0)
    assert pq.commit_offset() is None
    pq.put(_msg(o) for o in range(10, 20))
    order = list(range(10, 20))
    random.Random(7).shuffle(order)
    done: set[int] = set()
    for offset in order:
        pq.remove([offset])
        done.add(offset)
        expected = min(set(range(10, 20)) - done, default=20)
        assert pq.commit_offset() == expected


def test_skipped_offsets_advance_the_commit_only_past_done_work() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(3)])
    pq.skip(4)
    assert pq.commit_offset() == 3
    pq.remove([3])
    assert pq.commit_offset() == 5


def test_a_dropped_queue_starts_no_work_and_drains_running_work() -> None:
    pq = ProcessQueue("t", 0)
    assert pq.begin()
    assert not pq.drop_and_drain(0.01)
    assert not pq.begin()
    pq.end()
    assert pq.drop_and_drain(0.01)


def test_orderly_take_and_put_back_keep_order() -> None:
    pq = ProcessQueue("t", 0)
    pq.put([_msg(o) for o in range(5)], pending=True)
    first = pq.take(2)
    pq.put_back(first)
    assert [m.queue_offset for m in pq.take(10)] == [0, 1, 2, 3, 4]


def _received() -> MessageExt:
    return MessageExt(
        "orders",
        b"payload",
        msg_id="ABC",
        born_timestamp_ms=1_700_000_000_000,
        born_host="10.0.0.1",
        keys="k1 k2",
        tags="TagA",
        properties={
            "KEYS": "k1 k2",
            "TAGS": "TagA",
            "UNIQ_KEY": "ABC",
            "region": "eu",
            "DELAY": "2",
        },
    )


def test_a_send_back_keeps_body_keys_tags_properties_and_id() -> None:
    config = ClientConfig(namespace="ns")
    record = send_back_record(
        _received(), "g1", retry_route(0, 16), 16, config=config, born_host=b"h"
    )
    assert record.kafka_topic == system_topic("SCHEDULE_TOPIC_XXXX", "ns")
    assert record.partition == 2  # level 3
    copy = delayed_message(record.headers, record.value)
    assert copy.msg_id == record.msg_id == "ABC"
    assert copy.body == b"payload"
    assert copy.keys == ["k1", "k2"]
    assert copy.tags == "TagA"
    props = copy.properties
    assert props["region"] == "eu"
    assert props[MessageConst.REAL_TOPIC] == "%RETRY%g1"
    assert props[MessageConst.RETRY_TOPIC] == "orders"
    assert props[MessageConst.RECONSUME_TIME] == "1"
    assert props[MessageConst.ORIGIN_MESSAGE_ID] == "ABC"
    assert props[MessageConst.MAX_RECONSUME_TIMES] == "16"
    assert props[MessageConst.DELAY_TIME_LEVEL] == "3"
    assert copy.born_timestamp_ms == 1_700_000_000_000


def test_a_dead_letter_is_a_plain_record_of_the_dlq_topic() -> None:
    msg = _received()
    msg.put_system_property(MessageConst.RETRY_TOPIC, "orders")
    msg.put_system_property(MessageConst.RECONSUME_TIME, "16")
    msg.put_system_property(MessageConst.ORIGIN_MESSAGE_ID, "FIRST")
    config = ClientConfig(namespace="ns")
    record = send_back_record(msg, "g1", retry_route(16, 16), 16, config=config, born_host=b"h")
    assert record.kafka_topic == dlq_topic("g1", "ns")
    headers = decode_headers(record.headers)
    assert headers[MessageConst.RECONSUME_TIME] == "17"
    assert headers[MessageConst.ORIGIN_MESSAGE_ID] == "FIRST"
    assert headers[MessageConst.RETRY_TOPIC] == "orders"
    assert MessageConst.DELAY_TIME_LEVEL not in headers
    assert [name for name, _ in record.headers].count(MessageConst.KEYS) == 1


def test_replay_to_origin_drops_the_retry_properties_and_to_retry_resets_failures() -> None:
    msg = _received()
    msg.put_system_property(MessageConst.RETRY_TOPIC, "orders")
    msg.put_system_property(MessageConst.RECONSUME_TIME, "17")
    origin = replay_record(msg, "g1", ReplayTarget.ORIGIN, namespace="ns")
    assert origin.kafka_topic == "orders"
    assert origin.msg_id == "ABC"
    assert MessageConst.RETRY_TOPIC not in decode_headers(origin.headers)
    retry = replay_record(msg, "g1", ReplayTarget.RETRY, namespace="ns")
    assert retry.kafka_topic == retry_topic("g1", "ns")
    headers = decode_headers(retry.headers)
    assert headers[MessageConst.RETRY_TOPIC] == "orders"
    assert MessageConst.RECONSUME_TIME not in headers


def test_settings_are_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="consume_thread_count"):
        PushConsumerConfig(consume_thread_count=0)
    with pytest.raises(InvalidArgumentError, match="max_reconsume_times"):
        PushConsumerConfig(max_reconsume_times=-2)
    with pytest.raises(InvalidArgumentError, match="unknown push consumer setting"):
        PushConsumer("g", consume_threads=3)


def test_subscribe_refuses_bad_input() -> None:
    consumer = PushConsumer("g")
    with pytest.raises(InvalidArgumentError, match="listener is required"):
        consumer.subscribe("t", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Kafka topic names"):
        consumer.subscribe("bad topic", lambda m: None)
    with pytest.raises(InvalidArgumentError, match="own retry topic"):
        consumer.subscribe("%RETRY%g", lambda m: None)
    with pytest.raises(IllegalStateError, match="subscribe"):
        consumer.start()


def test_settings_replaced_before_start_are_the_ones_every_part_reads() -> None:
    consumer = PushConsumer("g")
    consumer.settings = consumer.settings.replace(message_model=MessageModel.BROADCASTING)
    consumer.config = ClientConfig(bootstrap_servers="elsewhere:9092", namespace="other")
    context = consumer._context
    assert context.broadcasting and consumer.message_model is MessageModel.BROADCASTING
    assert context.config.bootstrap_servers == "elsewhere:9092"
    assert context.catalog.namespace == "other"


def test_settings_cannot_be_replaced_once_started_and_an_orderly_listener_stays_orderly() -> None:
    consumer = PushConsumer("g")
    consumer.subscribe("t", _Orderly())
    assert consumer.orderly
    with pytest.raises(IllegalStateError, match="MessageListenerOrderly"):
        consumer.orderly = False
    consumer._lifecycle.transition(ServiceState.RUNNING)
    with pytest.raises(IllegalStateError, match="before start"):
        consumer.settings = PushConsumerConfig()
    with pytest.raises(IllegalStateError, match="before start"):
        consumer.config = ClientConfig()


class _Orderly(MessageListenerOrderly):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


def test_fetch_wait_is_shortened_unless_the_user_set_it() -> None:
    assert fetch_tuning(PushConsumer("g").config) == {"fetch_wait_max_ms": 100}
    mine = ClientConfig(kafka={"fetch.wait.max.ms": "500"})
    assert fetch_tuning(PushConsumer("g", config=mine).config) == {}


def _group_tuning(consumer: PushConsumer) -> tuple[dict[str, Any], float]:
    """The consumer's Kafka options for its group and its revoke wait (s)."""
    tuning = group_tuning(
        consumer.group, consumer.config, consumer.settings, orderly=consumer.orderly
    )
    return tuning.options, tuning.revoke_wait_s


def test_orderly_consumers_stay_in_the_group_while_a_revoke_waits_consume_timeout() -> None:
    orderly = PushConsumer("g", orderly=True)
    assert _group_tuning(orderly)[0] == {"max_poll_interval_ms": 15 * 60_000 + 30_000}
    assert _group_tuning(orderly)[1] == 15 * 60
    short = PushConsumer("g", orderly=True, consume_timeout=0.05)
    assert _group_tuning(short)[0] == {"max_poll_interval_ms": 300_000}, "never below 5 min"
    assert _group_tuning(short)[1] == pytest.approx(3.0)
    mine = ClientConfig(kafka={"max.poll.interval.ms": "60000"})
    given = PushConsumer("g", orderly=True, config=mine)
    assert _group_tuning(given)[0] == {}, "the user's setting stands"
    assert _group_tuning(given)[1] == 30.0, "the wait ends 30 s before the group expels us"
    assert _group_tuning(PushConsumer("g"))[0] == {}, "concurrent consumers do not wait"


def test_shutdown_timeout_must_be_a_non_negative_number_of_ms() -> None:
    with pytest.raises(InvalidArgumentError, match="timeout_ms"):
        PushConsumer("g").shutdown(timeout_ms=-1)


@pytest.mark.parametrize(
    ("value", "count", "expected"),
    [
        (ACK_INDEX_ALL, 4, 3),
        (1, 4, 1),
        (9, 4, 3),
        (-1, 4, -1),
        (-7, 4, -1),
        (0, 1, 0),
        (2.0, 4, None),
        (True, 4, None),
        (False, 4, None),
        (None, 4, None),
        ("1", 4, None),
    ],
)
def test_an_ack_index_is_clamped_to_the_batch_and_one_that_is_no_int_is_refused(
    value: object, count: int, expected: int | None
) -> None:
    assert checked_ack_index(value, count) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(0, 0), (5, 5), (-1, -1), (2.5, None), (True, None), (None, None)]
)
def test_a_delay_level_or_suspension_that_is_no_int_is_refused(
    value: object, expected: int | None
) -> None:
    assert checked_delay_level(value) == expected
    assert checked_suspend_millis(value) == expected


class _HalfAck(MessageListenerConcurrently):
    def __init__(self, ack: object, delay: object = 0) -> None:
        self.ack, self.delay = ack, delay
        self.seen: list[bytes] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeStatus:
        self.seen += [m.body for m in msgs]
        context.ack_index = self.ack  # type: ignore[assignment]
        context.delay_level_when_next_consume = self.delay  # type: ignore[assignment]
        return ConsumeStatus.CONSUME_SUCCESS


def _batch(n: int) -> list[MessageExt]:
    return [MessageExt("t", f"m{i}".encode(), msg_id=f"id{i}", queue_offset=i) for i in range(n)]


@pytest.mark.parametrize(("ack", "expected"), [(1.0, -1), (True, -1), (None, -1), (1, 1), (99, 3)])
def test_what_the_listener_acknowledges_is_checked_before_it_is_trusted(
    ack: object, expected: int, caplog: pytest.LogCaptureFixture
) -> None:
    consumption = PushConsumer("g")._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    msgs = _batch(4)
    context = ConsumeConcurrentlyContext(MessageQueue("t", 0))
    # The listener call answers how many leading messages are done: the ack index plus one.
    assert consumption._call_listener(_HalfAck(ack), msgs, context) - 1 == expected
    if expected == -1:
        assert f"ack_index={ack!r}" in caplog.text
    context.delay_level_when_next_consume = 2.5  # type: ignore[assignment]
    assert consumption._delay_level(context, msgs) == 0
    assert "delay_level_when_next_consume=2.5" in caplog.text


def test_an_unexpected_failure_in_one_request_hands_it_back_and_runs_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = PushConsumer("g", message_model=MessageModel.BROADCASTING)
    listener = _HalfAck(ACK_INDEX_ALL)
    consumer.subscribe("t", listener)
    pq = ProcessQueue("t", 0)
    msgs = _batch(6)
    pq.put(msgs)
    settle = pq.settle
    broke: list[int] = []

    def breaks_once(call: object, batch: list[MessageExt]) -> set[int]:
        if not broke:
            broke.append(batch[0].queue_offset)
            raise RuntimeError("bookkeeping broke")
        return settle(call, batch)

    monkeypatch.setattr(pq, "settle", breaks_once)
    consumption = consumer._new_consumption()
    assert isinstance(consumption, ConcurrentConsumption)
    consumption._consume_requests(pq, [msgs[0:2], msgs[2:4], msgs[4:6]])
    assert listener.seen == [m.body for m in msgs], "the task's other requests ran"
    assert pq.held == 2 and pq.commit_offset() == 0
    assert pq.overdue(1e12, 0.0) == [], "nothing is left in a listener call"
    assert consumer.stats().retried_locally == 2
    assert len(consumer._context.scheduler) == 1, "the broken request is consumed again later"
    assert pq.running == 0


def test_copy_failures_that_will_never_succeed_are_told_from_transient_ones() -> None:
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    assert _refused_for_good(too_large)
    assert _refused_for_good(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert _refused_for_good(KafkaException(too_large))
    assert _refused_for_good(SendError("send of x: too large", too_large))
    assert _refused_for_good(MessageTooLargeError(2 << 20, 1 << 20))
    assert not _refused_for_good(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert not _refused_for_good(SendTimeoutError("no acknowledgement"))
    assert not _refused_for_good(KafkaError(KafkaError._TRANSPORT))
    assert not _refused_for_good(RuntimeError("the client broke"))
    assert not _refused_for_good(IllegalStateError("not started"))
