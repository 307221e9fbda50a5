"""The push consumer's send-backs against a real broker: the topics their copies go to are
checked when the consumer starts, not by the listener threads of its first failures."""

from __future__ import annotations

import threading

import pytest

from bridge import ClientConfig, ConsumeStatus, Message, MessageExt, Producer
from bridge.consumer import ConsumeFromWhere, PushConsumer
from bridge.kafka.admin import TopicAdmin
from tests.conftest import wait_until
from topics.catalog import SystemTopic

pytestmark = pytest.mark.broker


def test_a_concurrent_consumer_checks_the_schedule_topic_before_its_first_send_back(
    client_config: ClientConfig, topic: str
) -> None:
    catalog = client_config.catalog()
    schedule = catalog.topic(SystemTopic.SCHEDULE)
    admin = TopicAdmin(client_config)
    assert schedule not in admin.list_topics()  # a namespace of its own: nothing sent yet
    with Producer("send_back_start_p", config=client_config) as producer:
        for i in range(5):
            producer.send_sync(Message(topic, f"m{i}".encode()))
    failed: list[str] = []
    go = threading.Event()

    def listener(msg: MessageExt) -> ConsumeStatus:
        go.wait(30)  # no failure before the topics were looked at
        if not msg.reconsume_times:
            failed.append(msg.msg_id)
            return ConsumeStatus.RECONSUME_LATER
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(
        "send_back_start",
        config=client_config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic, listener)
    consumer.start()
    try:
        # Before any message failed: the copies' topic is there, with its partition count,
        # so no listener thread stops its work to check it at its first failure.
        topics = admin.list_topics()
        assert topics.get(schedule) == catalog.spec(SystemTopic.SCHEDULE).partitions
        assert not failed
        go.set()
        wait_until(lambda: consumer.stats().sent_back == 5, timeout_s=60)
        stats = consumer.stats()
        assert (stats.failed, stats.retried_locally, stats.quarantined) == (5, 0, 0)
    finally:
        consumer.shutdown()


def test_concurrent_first_sends_to_the_system_topics_run_one_check(
    client_config: ClientConfig, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = TopicAdmin.ensure_topics

    def counted(self: TopicAdmin, *args: object, **kwargs: object) -> object:
        calls.append(threading.get_ident())
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(TopicAdmin, "ensure_topics", counted)
    start = threading.Barrier(8)
    errors: list[BaseException] = []
    with Producer("send_back_first_sends", config=client_config) as producer:

        def send() -> None:
            try:
                start.wait(30)
                msg = Message(topic, b"later")
                msg.set_delay_time_level(1)
                producer.send_sync(msg)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    # One check: SCHEDULE and TIMER, then HALF and OP, by the one thread that ran it.
    assert len(calls) == 2
    assert len(set(calls)) == 1
