"""Recall of timer messages (RocketMQ 5.3's ``recall_message``) against a real broker: a
message recalled in time is never delivered, a recall too late says so and the message
arrives exactly once, recalls racing the time come out one way or the other for each message
(never both, never neither), and a coordinator killed between the recall and the time does not
deliver it after its restart."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from bridge import ClientConfig, Message, Producer, SendResult, read_messages
from bridge.aio import Producer as AsyncProducer
from bridge.client.recall import Recaller
from bridge.coordinator import Coordinator
from bridge.coordinator.delay.recall_watch import RecallWatch
from bridge.coordinator.delay.service import TimerService
from bridge.delay.recall import (
    RECALL_MARGIN_MS,
    decode_handle,
    encode_handle,
    read_marker,
    recall_applies,
)
from bridge.errors import BridgeError, InvalidArgumentError, RecallTooLateError
from bridge.kafka.admin import TopicAdmin
from bridge.message import now_ms
from bridge.v5 import Message as V5Message
from bridge.v5 import Producer as V5Producer
from tests.conftest import wait_until
from tests.integration.test_delays import coordinator_config, coordinator_process, stamped_topic
from topics.catalog import SystemTopic

pytestmark = pytest.mark.broker


@pytest.fixture()
def recall_config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=namespace,
        timer_precision_ms=100,
        timer_max_delay_ms=86_400_000,
    )


def _timer(topic: str, body: str, due_ms: int) -> Message:
    msg = Message(topic, body)
    msg.set_deliver_time_ms(due_ms)
    return msg


def _bodies(config: ClientConfig, topic: str) -> Counter[str]:
    """Every body in ``topic`` (read committed), counted."""
    return Counter(
        m.body.decode()
        for m in read_messages(config, [topic], max_messages=10_000, timeout_ms=3000)
    )


def _warm_up(config: ClientConfig, topic: str) -> None:
    """A timer delivered: the timer service owns its partitions."""
    with Producer("warmup", config=config) as producer:
        warm = Message(f"{topic}-warmup", b"w")
        warm.set_delay_time_ms(300)
        producer.send_sync(warm)
    assert list(read_messages(config, [f"{topic}-warmup"], max_messages=1, timeout_ms=60_000))


@pytest.fixture()
def coordinator(recall_config: ClientConfig, topic: str) -> Iterator[Coordinator]:
    stamped_topic(recall_config, topic)
    with Coordinator(coordinator_config(recall_config, "recall")) as running:
        _warm_up(recall_config, topic)
        yield running


def _clock_at(at_ms: int) -> Callable[[], bool]:
    """True once the clock reached ``at_ms`` (epoch ms)."""
    return lambda: now_ms() >= at_ms


def _timer_service(coordinator: Coordinator) -> TimerService:
    (service,) = [s for s in coordinator.services if isinstance(s, TimerService)]
    return service


def test_a_message_recalled_before_its_time_is_never_delivered(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    due = now_ms() + 3000
    with Producer("pg", config=recall_config) as producer:
        recalled = producer.send_sync(_timer(topic, "recalled", due))
        kept = producer.send_sync(_timer(topic, "kept", due + 1000))
        plain = producer.send_sync(Message(topic, "plain"))
        assert recalled.recall_handle is not None and kept.recall_handle is not None
        assert plain.recall_handle is None  # only timers have one
        assert decode_handle(recalled.recall_handle).due_ms == due
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.msg_id
        # Again while the time is far: the same answer (a second marker, which applies too).
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.msg_id
        # The handle of another topic, and what is no handle, are refused naming why.
        with pytest.raises(InvalidArgumentError, match="of topic"):
            producer.recall_message(f"{topic}-other", kept.recall_handle)
        with pytest.raises(InvalidArgumentError, match="not a recall handle"):
            producer.recall_message(topic, "@@@")
    # "kept" is due a second after "recalled": once it is there, "recalled" was decided.
    wait_until(lambda: _bodies(recall_config, topic)["kept"] == 1, timeout_s=30)
    assert _bodies(recall_config, topic) == Counter({"plain": 1, "kept": 1})
    assert _timer_service(coordinator).recalled == 1


def test_a_recall_made_again_near_the_time_answers_as_the_first_one_that_applied(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    # RecallTooLateError says the message is delivered: a second recall of a handle whose
    # first recall applied must not say so when the message is in fact kept back.
    due = now_ms() + 3000
    with Producer("pg", config=recall_config) as producer:
        recalled = producer.send_sync(_timer(topic, "recalled", due))
        kept = producer.send_sync(_timer(topic, "kept", due + 1000))
        assert recalled.recall_handle is not None and kept.recall_handle is not None
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.msg_id
        wait_until(_clock_at(due - RECALL_MARGIN_MS + 50), timeout_s=10)
        assert producer.recall_message(topic, recalled.recall_handle) == recalled.msg_id
    wait_until(lambda: _bodies(recall_config, topic)["kept"] == 1, timeout_s=30)
    assert _bodies(recall_config, topic) == Counter({"kept": 1})


def test_a_recall_after_the_delivery_is_too_late_and_the_message_arrived_once(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    with Producer("pg", config=recall_config) as producer:
        sent = producer.send_sync(_timer(topic, "late", now_ms() + 1500))
        assert sent.recall_handle is not None
        wait_until(lambda: _bodies(recall_config, topic)["late"] == 1, timeout_s=30)
        with pytest.raises(RecallTooLateError) as late:
            producer.recall_message(topic, sent.recall_handle)
    assert late.value.message_id == sent.msg_id
    assert not late.value.retriable
    assert _bodies(recall_config, topic) == Counter({"late": 1})


def test_a_marker_stored_inside_the_margin_does_not_keep_the_message_back(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    """The coordinator's side of the rule: a marker the broker stored less than the margin
    before the time (written here past the producer's own check) is ignored, and the message
    is delivered exactly once."""
    due = now_ms() + 2500
    with Producer("pg", config=recall_config) as producer:
        sent = producer.send_sync(_timer(topic, "inside", due))
        assert sent.recall_handle is not None
        wait_until(lambda: now_ms() >= due - RECALL_MARGIN_MS // 2, timeout_s=10, interval_s=0.01)
        recaller: Recaller = producer._recaller
        recaller._ensure_topic()
        append_ms = recaller._write(decode_handle(sent.recall_handle), now_ms())
    assert not recall_applies(append_ms, due)
    wait_until(lambda: _bodies(recall_config, topic)["inside"] == 1, timeout_s=30)
    assert _bodies(recall_config, topic) == Counter({"inside": 1})
    assert _timer_service(coordinator).recalled == 0


def test_recalls_racing_the_time_each_come_out_one_way_exactly(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    """Recalls made around each message's time less the margin (where the producer's check
    and the broker's stamp meet), and markers written past the producer's check around the
    time itself (where the coordinator takes the message, with its window, ticks and
    transactions): a message whose marker applies by the rule is never delivered, every
    other is delivered exactly once."""
    count = 80
    start = now_ms() + 4000
    due = {f"m{i}": start + i * 40 for i in range(count)}
    handles: dict[str, str] = {}
    with Producer("pg", config=recall_config) as producer:
        for name, due_ms in due.items():
            handle = producer.send_sync(_timer(topic, name, due_ms)).recall_handle
            assert handle is not None
            handles[name] = handle
        recaller: Recaller = producer._recaller
        recaller._ensure_topic()
        recalled: set[str] = set()
        late: set[str] = set()
        raw_late = 0
        rng = random.Random(32)
        plan = sorted(
            (due_ms - RECALL_MARGIN_MS + rng.randint(-150, 60), name, True)
            if i % 2 == 0
            else (due_ms + rng.randint(-RECALL_MARGIN_MS - 300, 200), name, False)
            for i, (name, due_ms) in enumerate(due.items())
        )
        for at, name, by_producer in plan:
            wait_until(_clock_at(at), timeout_s=30, interval_s=0.002)
            if by_producer:
                try:
                    producer.recall_message(topic, handles[name])
                    recalled.add(name)
                except RecallTooLateError:
                    late.add(name)
                continue
            append_ms = recaller._write(decode_handle(handles[name]), now_ms())
            if recall_applies(append_ms, due[name]):
                recalled.add(name)
            else:
                late.add(name)
                raw_late += 1
        sentinel_due = max(due.values()) + 1000
        producer.send_sync(_timer(topic, "sentinel", sentinel_due))
    assert len(recalled) + len(late) == count
    assert recalled and late and raw_late, (len(recalled), len(late), raw_late)
    wait_until(lambda: _bodies(recall_config, topic)["sentinel"] == 1, timeout_s=60)
    got = _bodies(recall_config, topic)
    assert {name for name in got if name != "sentinel"} == late
    assert all(got[name] == 1 for name in late)
    assert _timer_service(coordinator).recalled == len(recalled)


def test_a_recall_survives_a_coordinator_killed_between_the_recall_and_the_time(
    recall_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(recall_config).ensure_system_topics(coordinator_config(recall_config).catalog)
    stamped_topic(recall_config, topic)
    first = coordinator_process(recall_config, "recall-killed")
    second = None
    try:
        _warm_up(recall_config, topic)
        due = now_ms() + 6000
        with Producer("pg", config=recall_config) as producer:
            recalled = producer.send_sync(_timer(topic, "recalled", due))
            kept = producer.send_sync(_timer(topic, "kept", due + 1000))
            assert recalled.recall_handle is not None and kept.recall_handle is not None
            producer.recall_message(topic, recalled.recall_handle)
        # Killed with "recalled" in its tiers or in its final window, not yet due.
        wait_until(lambda: now_ms() >= due - 2000, timeout_s=10, interval_s=0.01)
        assert now_ms() < due - RECALL_MARGIN_MS
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = coordinator_process(recall_config, "recall-killed")
        wait_until(lambda: _bodies(recall_config, topic)["kept"] == 1, timeout_s=60)
        assert _bodies(recall_config, topic) == Counter({"kept": 1})
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_the_v5_and_asyncio_producers_recall_too(
    recall_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    due = now_ms() + 8000
    v5 = V5Producer(recall_config, (topic,))
    v5.startup()
    try:
        msg = V5Message()
        msg.topic, msg.body, msg.delivery_timestamp = topic, b"v5", due / 1000
        receipt = v5.send(msg)
        assert receipt.recall_handle is not None
        assert v5.recall_message(topic, receipt.recall_handle) == receipt.message_id
        msg2 = V5Message()
        msg2.topic, msg2.body, msg2.delivery_timestamp = topic, b"v5-async", due / 1000
        receipt2 = v5.send_async(msg2).result(30)
        assert receipt2.recall_handle is not None
        future = v5.recall_message_async(topic, receipt2.recall_handle)
        assert future.result(30) == receipt2.message_id
    finally:
        v5.shutdown()

    async def aio() -> str:
        async with AsyncProducer("pg-aio", config=recall_config) as producer:
            result = await producer.send(_timer(topic, "aio", due))
            assert result.recall_handle is not None
            return await producer.recall_message(topic, result.recall_handle)

    assert asyncio.run(aio())
    with Producer("pg", config=recall_config) as producer:
        # The batch and async sends of the threaded producer carry a handle too.
        (batch,) = producer.send_batch([_timer(topic, "batch", due)])
        assert isinstance(batch, SendResult) and batch.recall_handle is not None
        producer.recall_message(topic, batch.recall_handle)
        sent: list[SendResult] = []
        producer.send_async(_timer(topic, "async", due), on_success=sent.append)
        assert producer.flush(10_000) == 0
        (async_result,) = wait_until(lambda: sent)
        assert async_result.recall_handle is not None
        producer.recall_message(topic, async_result.recall_handle)
        producer.send_sync(_timer(topic, "kept", due + 1000))
        # A handle is refused by a producer of another namespace.
        own = decode_handle(receipt.recall_handle)
        foreign = encode_handle(dataclasses.replace(own, namespace="other"))
        with pytest.raises(InvalidArgumentError, match="namespace"):
            producer.recall_message(topic, foreign)
    wait_until(lambda: _bodies(recall_config, topic)["kept"] == 1, timeout_s=30)
    assert _bodies(recall_config, topic) == Counter({"kept": 1})
    assert _timer_service(coordinator).recalled == 5


def _recall_topic_records(config: ClientConfig, topic: str) -> tuple[int, list[tuple[str, int]]]:
    """(ticks, markers as (message id, due ms)) of the recall topic ``topic``, read now."""
    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"count-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    ticks, markers = 0, []
    try:
        while True:
            record = consumer.poll(5)
            assert record is not None, "no end of the recall partition in 5 s"
            if record.error() is not None:
                break
            headers: Any = record.headers()  # a list of (name, value): no producer sent a dict
            marker = read_marker(record.key(), headers)
            if marker is None:
                ticks += 1
            else:
                markers.append(marker)
    finally:
        consumer.close()
    return ticks, markers


def test_the_recall_topic_keeps_every_marker_and_only_the_last_ticks(
    recall_config: ClientConfig, topic: str
) -> None:
    # A restarted coordinator reads the whole recall topic before its first delivery: the
    # ticks (about one a second per coordinator process while timers come due) must not pile
    # up for the topic's retention (timer_max_delay_ms + 7 days) while no marker may go.
    spec = recall_config.catalog().spec(SystemTopic.RECALL)
    TopicAdmin(recall_config).ensure_topics([spec])
    admin = AdminClient({"bootstrap.servers": recall_config.bootstrap_servers})
    # Segments that roll within a second (the topic's own roll hourly), so that the log
    # cleaner reaches the ticks during the test.
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        spec.kafka_name,
        incremental_configs=[
            ConfigEntry("segment.ms", "500", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    due = now_ms() + 3_600_000
    with (
        Producer("pg", config=recall_config) as producer,
        Producer("pg2", config=recall_config) as other,
    ):
        sent = [producer.send_sync(_timer(topic, f"m{i}", due + i)) for i in range(3)]
        handles = [s.recall_handle for s in sent]
        assert all(h is not None for h in handles)
        watch = RecallWatch(recall_config, spec.kafka_name, "test")
        watch.start()
        try:
            for round_ in range(6):
                for handle in handles:
                    assert handle is not None
                    if round_ < 2:
                        # Two markers of each message, both applying (from two producers: one
                        # producer answers a second recall from memory).
                        (producer, other)[round_].recall_message(topic, handle)
                for _ in range(50):
                    watch.advance()
                wait_until(_clock_at(now_ms() + 600), timeout_s=5)
        finally:
            watch.stop()
    expected = sorted((s.msg_id, due + i) for i, s in enumerate(sent))

    def compacted() -> bool:
        ticks, markers = _recall_topic_records(recall_config, spec.kafka_name)
        return ticks < 100 and sorted(set(markers)) == expected and len(markers) == 6

    wait_until(compacted, timeout_s=120)
    # A coordinator started now reads every marker and applies it.
    fresh = RecallWatch(recall_config, spec.kafka_name, "fresh")
    fresh.start()
    try:
        fresh.ensure(now_ms() - RECALL_MARGIN_MS)
        assert all(fresh.applies(msg_id, d) for msg_id, d in expected)
    finally:
        fresh.stop()


def test_an_idle_recall_watch_fetches_from_the_broker_a_few_times_a_second_at_most(
    recall_config: ClientConfig, topic: str
) -> None:
    # librdkafka fetches the reader's partition whether or not it is read; each fetch waits up
    # to RECALL_FETCH_WAIT_MS (500) at the broker for records. Fetches that did not wait
    # (10 ms) sent the broker about 85 requests a second from every idle coordinator.
    fetches: list[tuple[float, int]] = []
    """(librdkafka's monotonic clock, s; the reader's fetch requests so far)."""

    def stats(text: str) -> None:
        report = json.loads(text)
        if report["type"] == "consumer":
            sent = sum(b["req"].get("Fetch", 0) for b in report["brokers"].values())
            fetches.append((report["ts"] / 1e6, sent))

    config = dataclasses.replace(
        recall_config, kafka={"statistics.interval.ms": "100", "stats_cb": stats}
    )
    spec = config.catalog().spec(SystemTopic.RECALL)
    TopicAdmin(config).ensure_topics([spec])
    watch = RecallWatch(config, spec.kafka_name, "test")
    watch.start()
    try:
        watch.advance()
        idle_from = time.monotonic()
        time.sleep(IDLE_S)  # the idle time is what is measured: no condition to poll for
        idle_to = time.monotonic()
        watch.advance()  # serves the statistics reported meanwhile
        before = max((n for ts, n in fetches if ts <= idle_from), default=0)
        after = max(n for ts, n in fetches if ts <= idle_to)
        # One a wait (4 in 2 s) and a few more at the window's edges (reports come every
        # 100 ms): 5 a second at most.
        assert after - before <= 5 * IDLE_S, f"{after - before} fetches in {IDLE_S} s idle"
        # And it still reads what comes while it is idle: a marker written then applies.
        with Producer("pg", config=config) as producer:
            due = now_ms() + 3_600_000
            sent = producer.send_sync(_timer(topic, "recalled", due))
            producer.recall_message(topic, sent.recall_handle or "")
        watch.ensure(now_ms())
        assert watch.applies(sent.msg_id, due)
    finally:
        watch.stop()


IDLE_S = 2.0
"""How long the watch is left idle in the test above, s."""


def test_a_recall_topic_created_again_is_read_from_its_beginning(
    recall_config: ClientConfig, topic: str
) -> None:
    # An operator deletes the recall topic (to fix a setting) and a producer's first recall
    # creates it again: its offsets start again at 0, below what a running coordinator read.
    spec = recall_config.catalog().spec(SystemTopic.RECALL)
    TopicAdmin(recall_config).ensure_topics([spec])
    watch = RecallWatch(recall_config, spec.kafka_name, "test")
    watch.start()
    try:
        for _ in range(30):
            watch.advance()
        admin = AdminClient({"bootstrap.servers": recall_config.bootstrap_servers})
        for future in admin.delete_topics([spec.kafka_name]).values():
            future.result(30)
        wait_until(lambda: spec.kafka_name not in admin.list_topics(timeout=10).topics)
        due = now_ms() + 3_600_000
        with Producer("pg", config=recall_config) as producer:
            sent = producer.send_sync(_timer(topic, "recalled", due))
            assert sent.recall_handle is not None

            def recalled() -> bool:
                try:
                    return producer.recall_message(topic, sent.recall_handle or "") == sent.msg_id
                except BridgeError:  # the topic is still being deleted
                    return False

            wait_until(recalled, timeout_s=60)

        def caught_up() -> bool:
            try:
                watch.ensure(now_ms())
            except KafkaException:  # the watch's clients learn of the new topic
                return False
            return True

        wait_until(caught_up, timeout_s=60)
        assert watch.applies(sent.msg_id, due)
    finally:
        watch.stop()
