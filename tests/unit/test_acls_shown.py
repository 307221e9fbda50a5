"""Waiting until the brokers show newly created ACLs (``bridge.kafka.acls.await_acls_shown``):
the loop alone, over an admin that answers as brokers applying them late, refusing to show
them, answering slowly or failing a request would."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bridge.kafka.acls import await_acls_shown


def _binding(topic: str, permission: AclPermissionType, principal: str) -> AclBinding:
    # As confluent-kafka builds a described binding: from the codes, a new object.
    return AclBinding(
        ResourceType.TOPIC.value, topic, ResourcePatternType.LITERAL.value, principal, "*",
        AclOperation.WRITE.value, permission.value,
    )  # fmt: skip


GRANTS = [
    ("orders", AclPermissionType.ALLOW, "User:app"),
    ("audit", AclPermissionType.DENY, "User:app"),
    ("orders", AclPermissionType.ALLOW, "User:ops"),
    ("orders", AclPermissionType.ALLOW, "User:spark"),
]
WANTED = [_binding(*grant) for grant in GRANTS]


class _Broker:
    """Answers ``describe_acls`` for one principal: its ACLs of :data:`GRANTS` from its
    ``shows_from``-th round on (never if 0) beside another one; an empty list (``refuses``:
    how a broker refusing DESCRIBE answers); after ``slow_s`` (from another thread); or with
    ``error`` for the first ``failing`` rounds."""

    def __init__(
        self,
        shows_from: int = 0,
        *,
        refuses: bool = False,
        slow_s: float = 0.0,
        error: KafkaError | None = None,
        failing: int = 0,
    ) -> None:
        self.shows_from, self.refuses, self.slow_s = shows_from, refuses, slow_s
        self.error, self.failing = error, failing
        self.asked: list[str] = []

    def describe_acls(self, acl_filter: Any, request_timeout: float) -> Future[list[AclBinding]]:
        principal = acl_filter.principal
        self.asked.append(principal)
        rounds = self.asked.count(principal)
        answer: Future[list[AclBinding]] = Future()
        if self.error is not None and rounds <= self.failing:
            answer.set_exception(KafkaException(self.error))
            return answer
        shown = 0 < self.shows_from <= rounds and not self.refuses
        acls = [] if self.refuses else [_binding("other", AclPermissionType.ALLOW, principal)]
        acls += [_binding(*g) for g in GRANTS if shown and g[2] == principal]
        if self.slow_s:
            threading.Timer(self.slow_s, answer.set_result, [acls]).start()
        else:
            answer.set_result(acls)
        return answer


def test_it_returns_once_the_brokers_show_every_acl_asking_each_principal_each_round() -> None:
    broker = _Broker(shows_from=3)
    assert await_acls_shown(broker, WANTED, 5_000) is True
    assert broker.asked == ["User:app", "User:ops", "User:spark"] * 3


def test_a_request_that_timed_out_is_asked_again() -> None:
    broker = _Broker(shows_from=1, error=KafkaError(KafkaError._TIMED_OUT), failing=2)
    assert await_acls_shown(broker, WANTED, 5_000) is True
    assert len(broker.asked) == 9


@pytest.mark.parametrize(
    "broker", [_Broker(), _Broker(refuses=True)], ids=["never applies them", "refuses DESCRIBE"]
)
def test_acls_not_shown_in_time_are_a_warning_naming_one_not_an_error(
    broker: _Broker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.kafka.acls"):
        assert await_acls_shown(broker, WANTED, 300) is False
    assert "ACLs created, but the brokers did not show them within 300 ms, such as" in caplog.text
    assert "AclBinding(" in caplog.text
    assert len(broker.asked) > 3, "asked again until the time was up"


def test_brokers_answering_slowly_hold_it_about_its_timeout_not_once_per_principal() -> None:
    broker = _Broker(slow_s=0.25)
    started = time.monotonic()
    assert await_acls_shown(broker, WANTED, 300) is False
    assert time.monotonic() - started < 0.45


def test_an_error_not_worth_retrying_ends_the_wait_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED)
    broker = _Broker(shows_from=1, error=refused, failing=1)
    with caplog.at_level(logging.WARNING, logger="bridge.kafka.acls"):
        assert await_acls_shown(broker, WANTED, 5_000) is False
    assert "cannot be read back" in caplog.text
    assert len(broker.asked) == 3, "not asked again"
