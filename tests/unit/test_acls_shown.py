"""Waiting until the broker shows newly created ACLs (``bridge.kafka.acls.await_acls_shown``):
the loop alone, over an admin that answers as a broker applying them late would."""

from __future__ import annotations

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

from bridge.errors import KafkaClientError
from bridge.kafka.acls import await_acls_shown


def _binding(topic: str, permission: AclPermissionType) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:app", "*",
        AclOperation.WRITE, permission,
    )  # fmt: skip


class _LateBroker:
    """Shows ``bindings`` from its ``shows_from``-th answer on (never if 0)."""

    def __init__(self, bindings: list[AclBinding], shows_from: int) -> None:
        self.bindings, self.shows_from, self.asked = bindings, shows_from, 0

    def describe_acls(self, _filter: Any, request_timeout: float) -> Future[list[AclBinding]]:
        self.asked += 1
        answer: Future[list[AclBinding]] = Future()
        shown = 0 < self.shows_from <= self.asked
        answer.set_result(
            [_binding("other", AclPermissionType.ALLOW), *self.bindings][: None if shown else 1]
        )
        return answer


WANTED = [_binding("orders", AclPermissionType.ALLOW), _binding("audit", AclPermissionType.DENY)]


def test_it_returns_once_the_broker_shows_every_acl() -> None:
    broker = _LateBroker(WANTED, shows_from=3)
    await_acls_shown(broker, WANTED, 5_000)
    assert broker.asked == 3


def test_acls_never_shown_raise_a_typed_error_naming_one() -> None:
    broker = _LateBroker(WANTED, shows_from=0)
    with pytest.raises(KafkaClientError, match=r"2 ACLs created but not shown .* within 200 ms"):
        await_acls_shown(broker, WANTED, 200)
    assert broker.asked > 1
