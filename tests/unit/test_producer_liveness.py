"""When the check-back takes a producer group to have no live producer (transaction.liveness).

Kafka's answers are scripted (the rule is about what is made of them); the integration tests
of the check-back (test_transaction_isolation.py, test_check_storm.py) ask a real broker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial

import pytest
from confluent_kafka import KafkaError, KafkaException

from bridge.config import ClientConfig
from bridge.transaction.liveness import ProducerLiveness
from tests.conftest import wait_until

Answer = int | Exception


class Kafka:
    """Answers the questions asked of it, one at a time, from a script."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.asked: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, check_group: str) -> int:
        with self._lock:
            self.asked.append(check_group)
            answer = self.script.pop(0) if self.script else RuntimeError("not in the script")
        if isinstance(answer, BaseException):
            raise answer
        return answer


@pytest.fixture()
def kafka() -> Kafka:
    return Kafka()


def liveness(kafka: Kafka, absent_ms: int = 2000) -> ProducerLiveness:
    # fresh_ms=0: each look takes the answer in and asks again, so questions go a step apart.
    return ProducerLiveness(
        ClientConfig(namespace="live"), absent_ms=absent_ms, fresh_ms=0, count_members=kafka
    )


def answers(live: ProducerLiveness, kafka: Kafka, script: list[Answer]) -> Iterator[bool | None]:
    """What ``live`` says after each answer of ``script``, asked 1000 ms apart."""
    kafka.script = list(script)
    now = 0
    live.live("orders", now)  # the first question
    for i in range(len(script)):
        wait_until(partial(_answered, live, kafka, i + 1), timeout_s=5)
        now += 1000
        yield live.live("orders", now)


def _answered(live: ProducerLiveness, kafka: Kafka, questions: int) -> bool:
    """``questions`` were asked and the last one was answered."""
    asking = live._asking.get("orders")
    return len(kafka.asked) >= questions and (asking is None or asking[0].done())


def test_a_group_is_not_known_before_its_first_answer(kafka: Kafka) -> None:
    kafka.script = [1]
    assert liveness(kafka).live("orders", 0) is None
    wait_until(lambda: kafka.asked, timeout_s=5)
    assert kafka.asked == ["live.transaction-check.orders"]


def test_members_make_the_group_live(kafka: Kafka) -> None:
    assert list(answers(liveness(kafka), kafka, [2, 1])) == [True, True]


def test_a_group_missing_from_one_answer_is_not_known_to_have_none(kafka: Kafka) -> None:
    # A group coordinator moving leaves the group out of every broker's answer for a while.
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, [1, 0, 0, 1]))
    assert said == [True, None, None, True]


def test_a_group_missing_from_every_answer_over_absent_ms_has_no_live_producer(
    kafka: Kafka,
) -> None:
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, [0, 0, 0, 0, 3, 0]))
    # Asked at 0, 1000 and 2000 ms: missing over 2000 ms from the third on; back when it has
    # members; a single miss after that is not known again.
    assert said == [None, None, False, False, True, None]


def test_an_unanswered_question_neither_starts_nor_ends_an_absence(kafka: Kafka) -> None:
    timeout: Exception = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, [0, timeout, 0, timeout]))
    assert said == [None, None, False, None]


def test_a_question_that_fails_to_start_is_not_known(kafka: Kafka) -> None:
    def refused(check_group: str) -> int:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "admin client refused"))

    live = ProducerLiveness(
        ClientConfig(namespace="live"), absent_ms=0, fresh_ms=0, count_members=refused
    )
    assert live.live("orders", 0) is None
    wait_until(live._asking["orders"][0].done, timeout_s=5)
    assert live.live("orders", 1) is None
