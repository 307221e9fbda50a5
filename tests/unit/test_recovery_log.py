"""A HALF partition whose recovery fails for want of a leader (a topic created a moment ago, as
on a first start) is tried again quietly; one that keeps failing, or fails otherwise, is
warned of."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bridge.config import ClientConfig, TrustLimits
from bridge.coordinator.transaction.ledger import HalfLedger, HalfSettings
from bridge.coordinator.transaction.recovery import Recovery
from bridge.coordinator.transaction.state import CheckPolicy
from bridge.errors import KafkaClientError
from bridge.kafka.service import ServiceConfig

HALF = "ns.RMQ_SYS_TRANS_HALF_TOPIC"
OP = "ns.RMQ_SYS_TRANS_OP_HALF_TOPIC"


def _recovery(failures: list[BaseException | None]) -> Recovery:
    """A Recovery of HALF partition 0 whose attempts end as ``failures`` says, in order
    (None: recovered)."""
    consumer: Any = SimpleNamespace(assignment=lambda: [TopicPartition(HALF, 0)])
    client = ClientConfig(bootstrap_servers="127.0.0.1:1")
    config = ServiceConfig(client=client, catalog=client.catalog(), coordinator_id="c1")
    settings = HalfSettings("transaction-c1", config, CheckPolicy(), TrustLimits(), HALF, OP)
    recovery = Recovery(HalfLedger(), settings, consumer=lambda: consumer)

    def attempt(*_: object) -> None:
        failure = failures.pop(0)
        if failure is not None:
            raise failure

    recovery._recover_partition = attempt  # type: ignore[method-assign,assignment]
    return recovery


def _levels(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.levelno for r in caplog.records if "recovering HALF partition 0" in r.message]


def test_no_leader_yet_is_tried_again_quietly_then_warned_of_and_a_success_resets_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    no_leader = KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    timed_out = KafkaClientError("timed out", KafkaError(KafkaError._TIMED_OUT))
    recovery = _recovery([no_leader, timed_out, no_leader, None, no_leader])
    caplog.set_level(logging.INFO, logger="bridge.coordinator.transaction.recovery")
    for _ in range(5):
        recovery.recover([0])
    info, warning = logging.INFO, logging.WARNING
    assert _levels(caplog) == [info, info, warning, info]


@pytest.mark.parametrize(
    "failure",
    [
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
        KafkaClientError("no error code"),
    ],
    ids=["not-authorized", "no-kafka-error"],
)
def test_any_other_failure_is_warned_of_at_once(
    caplog: pytest.LogCaptureFixture, failure: BaseException
) -> None:
    recovery = _recovery([failure])
    caplog.set_level(logging.INFO, logger="bridge.coordinator.transaction.recovery")
    recovery.recover([0])
    assert _levels(caplog) == [logging.WARNING]
