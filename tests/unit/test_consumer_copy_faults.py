"""A failed message whose retry or DLQ copy cannot be built: a message the codec cannot encode
is quarantined (the copy would fail the same way again); a fault of the code (a ``TypeError``,
say) blames no message: it is logged with its traceback and the message is consumed again."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bridge import ClientConfig, ConsumeStatus, MessageExt
from bridge.codec import PreparedRecord
from bridge.consumer import PushConsumer
from bridge.consumer import retry_policy as retry_policy_module
from bridge.consumer.process_queue import ProcessQueue
from bridge.consumer.retry_policy import RetryPolicy
from bridge.consumer.send_back import send_back_record
from topics.catalog import SystemTopic


class _Sender:
    """Stands in for the producer of copies: keeps each copy."""

    def __init__(self) -> None:
        self.sent: list[PreparedRecord] = []

    def send_record_async(self, record: PreparedRecord, *_: Any, **__: Any) -> None:
        self.sent.append(record)

    def send_records_sync(self, records: list[PreparedRecord]) -> list[object]:
        self.sent += records
        return [None] * len(records)


class _Record:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"x"

    def headers(self) -> list[Any]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def _setup(
    fault: type[Exception], monkeypatch: pytest.MonkeyPatch
) -> tuple[PushConsumer, RetryPolicy, ProcessQueue, list[MessageExt], _Sender]:
    sender = _Sender()
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    consumer._context.producer = sender  # type: ignore[assignment]
    policy = consumer._new_consumption().policy
    pq = ProcessQueue("t", 0)
    msgs = [MessageExt("t", b"x", msg_id=f"m{i}", queue_id=0, queue_offset=i) for i in range(3)]
    pq.put(msgs, records=[_Record(i) for i in range(3)])
    build = send_back_record

    def broken(msg: MessageExt, *args: Any, **kwargs: Any) -> Any:
        if msg.msg_id == "m1":
            raise fault("cannot build this copy")
        return build(msg, *args, **kwargs)

    monkeypatch.setattr(retry_policy_module, "send_back_record", broken)
    return consumer, policy, pq, msgs, sender


def _quarantined(sender: _Sender) -> list[str]:
    quarantine = ClientConfig().catalog().topic(SystemTopic.QUARANTINE)
    return [r.msg_id for r in sender.sent if r.kafka_topic == quarantine]


def test_a_message_whose_copy_cannot_be_encoded_is_quarantined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer, policy, pq, msgs, sender = _setup(ValueError, monkeypatch)
    policy.fail(pq, msgs, [0, 0, 0])
    assert _quarantined(sender) == ["t-0-1"]
    assert consumer.stats().retried_locally == 0


@pytest.mark.parametrize("fault", [TypeError, AttributeError, ZeroDivisionError])
def test_a_fault_of_the_code_building_a_retry_copy_quarantines_nothing(
    fault: type[Exception], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    consumer, policy, pq, msgs, sender = _setup(fault, monkeypatch)
    with caplog.at_level(logging.ERROR, logger=retry_policy_module.__name__):
        policy.fail(pq, msgs, [0, 0, 0])
    assert _quarantined(sender) == []
    assert [r.msg_id for r in sender.sent] == ["m0", "m2"]
    assert consumer.stats().retried_locally == 1
    assert pq.holds(1)
    assert any(r.exc_info and "fault of the code" in r.message for r in caplog.records)


def test_a_fault_of_the_code_building_a_dlq_copy_keeps_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, policy, pq, msgs, sender = _setup(TypeError, monkeypatch)
    sent, kept = policy.dead_letter(pq, msgs)
    assert ([m.msg_id for m in sent], [m.msg_id for m in kept]) == (["m0", "m2"], ["m1"])
    assert _quarantined(sender) == []
