"""Waiting until the broker shows newly created ACLs (``bridge.kafka.acls.await_acls_shown``):
the loop alone, over an admin that answers as a broker applying them late, refusing to show
them, or not answering would."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bridge.kafka.acls import await_acls_shown


def _binding(topic: str, permission: AclPermissionType, principal: str = "User:app") -> AclBinding:
    # As confluent-kafka builds a described binding: from the codes, a new object.
    return AclBinding(
        ResourceType.TOPIC.value, topic, ResourcePatternType.LITERAL.value, principal, "*",
        AclOperation.WRITE.value, permission.value,
    )  # fmt: skip


GRANTS = [
    ("orders", AclPermissionType.ALLOW, "User:app"),
    ("audit", AclPermissionType.DENY, "User:app"),
    ("orders", AclPermissionType.ALLOW, "User:ops"),
]
WANTED = [_binding(*grant) for grant in GRANTS]


class _Broker:
    """Answers ``describe_acls``: each principal's ACLs of :data:`WANTED` from its
    ``shows_from``-th round of questions on (never if 0), another ACL always; an empty list
    (``refuses``: how a broker refusing DESCRIBE answers); or never (``silent``)."""

    def __init__(self, shows_from: int = 0, *, refuses: bool = False, silent: bool = False):
        self.shows_from, self.refuses, self.silent = shows_from, refuses, silent
        self.asked: list[str] = []

    def describe_acls(self, acl_filter: Any, request_timeout: float) -> Future[list[AclBinding]]:
        self.asked.append(acl_filter.principal)
        answer: Future[list[AclBinding]] = Future()
        if self.silent:
            return answer
        rounds = self.asked.count(acl_filter.principal)
        shown = 0 < self.shows_from <= rounds
        mine = [_binding(*grant) for grant in GRANTS]
        other = _binding("other", AclPermissionType.ALLOW, acl_filter.principal)
        answer.set_result(
            [] if self.refuses
            else [other, *(b for b in mine if shown and b.principal == acl_filter.principal)]
        )  # fmt: skip
        return answer


def test_it_returns_once_the_broker_shows_every_acl_asking_per_principal() -> None:
    broker = _Broker(shows_from=3)
    assert await_acls_shown(broker, WANTED, 5_000) is True
    assert broker.asked == ["User:app", "User:ops"] * 3


@pytest.mark.parametrize(
    "broker",
    [_Broker(), _Broker(refuses=True), _Broker(silent=True)],
    ids=["late", "refuses", "silent"],
)
def test_acls_not_shown_in_time_are_a_warning_naming_one_not_an_error(
    broker: _Broker, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bridge.kafka.acls"):
        assert await_acls_shown(broker, WANTED, 200) is False
    assert "ACLs created, but the broker did not show them within 200 ms, such as" in caplog.text
    assert "AclBinding(" in caplog.text
