"""What a push consumer's intake counts as a record's own fault: a record it cannot decode is
held to be quarantined and the rest of the poll goes on; a fault of the code (a ``TypeError``,
say) quarantines nothing: every partition of the poll is sought back to its first record of it
(nothing is skipped) and the exception is raised, for the poll loop to log."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import TopicPartition

from bridge import ConsumeStatus
from bridge.codec import undecoded_message
from bridge.consumer import PushConsumer
from bridge.consumer import intake as intake_module
from bridge.consumer.intake import Intake
from bridge.consumer.process_queue import ProcessQueue

RETRY = "rmq.RETRY.g"


class _Record:
    def __init__(self, topic: str, partition: int, offset: int, headers: list[Any]) -> None:
        self._t, self._p, self._o, self._h = topic, partition, offset, headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def value(self) -> bytes:
        return b"body"

    def key(self) -> None:
        return None

    def headers(self) -> list[Any]:
        return list(self._h)


class _Kafka:
    """The consumer, as far as the intake uses it: the seeks it was asked for."""

    def __init__(self) -> None:
        self.seeks: list[tuple[str, int, int]] = []

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def _intake() -> tuple[Intake, _Kafka]:
    consumer = PushConsumer("g")
    consumer.subscribe("t", lambda m: ConsumeStatus.CONSUME_SUCCESS)
    queues = {
        ("t", 0): ProcessQueue("t", 0),
        ("t", 1): ProcessQueue("t", 1),
        (RETRY, 0): ProcessQueue(RETRY, 0),
    }
    kafka = _Kafka()
    return Intake(consumer._context, queues, kafka, {"t": "t"}, RETRY), kafka


def _poll() -> list[_Record]:
    return [_Record("t", 0, 5, []), _Record("t", 1, 9, []), _Record("t", 0, 6, [])]


def test_a_malformed_retry_record_is_held_to_be_quarantined_and_the_rest_go_on() -> None:
    intake, kafka = _intake()
    batches = intake.sort([_Record(RETRY, 0, 3, []), *_poll()])
    assert [r.offset() for r, _ in batches[(RETRY, 0)].poison] == [3]
    assert "RETRY_TOPIC" in str(batches[(RETRY, 0)].poison[0][1])
    assert [m.queue_offset for m in batches[("t", 0)].work] == [5, 6]
    assert [m.queue_offset for m in batches[("t", 1)].work] == [9]
    assert kafka.seeks == []


def test_a_fault_of_the_code_quarantines_nothing_and_the_poll_is_read_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    intake, kafka = _intake()
    decode = undecoded_message

    def broken(record: Any, *args: Any, **kwargs: Any) -> Any:
        if record.offset() == 9:
            raise TypeError("a fault of the code")
        return decode(record, *args, **kwargs)

    monkeypatch.setattr(intake_module, "undecoded_message", broken)
    with pytest.raises(TypeError, match="a fault of the code"):
        intake.sort(_poll())
    assert sorted(kafka.seeks) == [("t", 0, 5), ("t", 1, 9)]
