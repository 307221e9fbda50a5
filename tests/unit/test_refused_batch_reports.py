"""Delivery reports of records the broker refused with their request batch as too large."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from bridge.client.send_results import Report, SendResult, report_async
from bridge.codec import PreparedRecord
from bridge.errors import IllegalStateError, SendError


class _Kmsg:
    """What a delivery report's message carries (no headers, no timestamp on failure)."""

    def __init__(self, partition: int, offset: int = -1) -> None:
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return "kt"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"


HEADERS = [("UNIQ_KEY", b"id-1")]


def _report(resend: Any, outcomes: list[Any]) -> Any:
    def report(err: KafkaError | None, kmsg: Any) -> None:
        report_async(
            resend, HEADERS, 1234, "id-1", "t", "kt", None, outcomes.append, outcomes.append,
            0.0, err, kmsg,
        )  # fmt: skip

    return report


def test_a_refused_record_is_sent_again_with_its_headers_and_reported_once() -> None:
    sent: list[tuple[PreparedRecord, Report]] = []
    outcomes: list[Any] = []
    _report(lambda record, again: sent.append((record, again)), outcomes)(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Kmsg(2)
    )
    assert outcomes == []  # the send alone decides
    [(record, again)] = sent
    assert record == PreparedRecord("kt", b"k", b"v", HEADERS, "id-1", 1234, 2)
    again(None, _Kmsg(2, offset=7))
    assert outcomes == [SendResult(outcomes[0].status, "id-1", 7, "t", 2)]


def test_a_record_refused_alone_fails_with_its_refusal() -> None:
    sent: list[tuple[PreparedRecord, Report]] = []
    outcomes: list[Any] = []
    _report(lambda record, again: sent.append((record, again)), outcomes)(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Kmsg(0)
    )
    sent[0][1](KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Kmsg(0))
    assert len(sent) == 1  # sent again once, not again and again
    [error] = outcomes
    assert isinstance(error, SendError)
    assert "MSG_SIZE_TOO_LARGE" in str(error)


def test_a_refused_record_that_cannot_be_sent_again_fails_once_saying_why() -> None:
    def shut_down(record: PreparedRecord, again: Report) -> None:
        raise IllegalStateError("producer pg is shut down")

    outcomes: list[Any] = []
    _report(shut_down, outcomes)(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Kmsg(0))
    [error] = outcomes
    assert isinstance(error, SendError)
    assert "MSG_SIZE_TOO_LARGE" in str(error)
    assert "shut down" in str(error)


def test_other_failures_are_not_sent_again() -> None:
    outcomes: list[Any] = []
    _report(lambda record, again: outcomes.append("resent"), outcomes)(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), _Kmsg(0)
    )
    [error] = outcomes
    assert isinstance(error, SendError)
