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
from bridge.coordinator.transaction.liveness import ProducerLiveness
from tests.conftest import wait_until

Answer = int | None | Exception
"""A member count (0: its coordinator describes the group Empty or Dead), None (no broker lists
the group), or what the question raises."""
LEFT_OUT = None


class Kafka:
    """Answers the questions asked of it, one at a time, from a script."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.asked: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, check_group: str) -> int | None:
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


def test_a_group_described_with_no_member_has_no_live_producer_at_once(kafka: Kafka) -> None:
    assert list(answers(liveness(kafka), kafka, [0, 1, 0])) == [False, True, False]


def test_a_group_left_out_of_one_answer_is_not_known_to_have_none(kafka: Kafka) -> None:
    # A group coordinator moving leaves the group out of every broker's answer for a while.
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, [1, LEFT_OUT, LEFT_OUT, 1]))
    assert said == [True, None, None, True]


def test_a_group_left_out_of_every_answer_over_absent_ms_has_no_live_producer(
    kafka: Kafka,
) -> None:
    script: list[Answer] = [LEFT_OUT, LEFT_OUT, LEFT_OUT, LEFT_OUT, 3, LEFT_OUT]
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, script))
    # Asked at 0, 1000 and 2000 ms: left out over 2000 ms from the third on; back when it has
    # members; a single miss after that is not known again.
    assert said == [None, None, False, False, True, None]


def test_an_unanswered_question_starts_the_absence_over(kafka: Kafka) -> None:
    timeout: Exception = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    script: list[Answer] = [LEFT_OUT, timeout, LEFT_OUT, LEFT_OUT, LEFT_OUT]
    said = list(answers(liveness(kafka, absent_ms=2000), kafka, script))
    assert said == [None, None, None, None, False]


def test_answers_too_far_apart_are_not_one_absence(kafka: Kafka) -> None:
    # Two misses with a long silence between (no check due meanwhile) are two moments of a
    # coordinator moving, not one absence: request_timeout_ms 10 s + fresh_ms 0.
    live = liveness(kafka, absent_ms=2000)
    kafka.script = [LEFT_OUT, LEFT_OUT, LEFT_OUT]
    assert live.live("orders", 0) is None
    wait_until(partial(_answered, live, kafka, 1), timeout_s=5)
    assert live.live("orders", 20_000) is None  # the first answer (asked at 0); asks again
    wait_until(partial(_answered, live, kafka, 2), timeout_s=5)
    assert live.live("orders", 21_000) is None  # asked at 20 s: the absence starts there
    wait_until(partial(_answered, live, kafka, 3), timeout_s=5)
    assert live.live("orders", 22_000) is None  # asked at 21 s: 1 s of absence
    assert len(kafka.asked) == 3 + 1


def test_groups_not_looked_at_are_forgotten(kafka: Kafka) -> None:
    live = liveness(kafka, absent_ms=2000)
    kafka.script = [0, 1, 1]  # the second answer is forgotten with the rest
    live.live("orders", 0)
    wait_until(partial(_answered, live, kafka, 1), timeout_s=5)
    assert live.live("orders", 1000) is False
    wait_until(partial(_answered, live, kafka, 2), timeout_s=5)
    live.forget_older(5000)
    assert live.live("orders", 6000) is None  # asked again from scratch
    wait_until(partial(_answered, live, kafka, 3), timeout_s=5)
    assert live.live("orders", 7000) is True


def test_a_question_that_fails_to_start_is_not_known(kafka: Kafka) -> None:
    def refused(check_group: str) -> int:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "admin client refused"))

    live = ProducerLiveness(
        ClientConfig(namespace="live"), absent_ms=0, fresh_ms=0, count_members=refused
    )
    assert live.live("orders", 0) is None
    wait_until(live._asking["orders"][0].done, timeout_s=5)
    assert live.live("orders", 1) is None
