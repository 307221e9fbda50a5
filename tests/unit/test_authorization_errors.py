"""Kafka's authorization refusals become typed errors that say what permission is missing,
and stay what callers already catch (a refused send is still a SendError)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from bridge.errors import (
    AuthorizationError,
    KafkaClientError,
    SendAuthorizationError,
    SendError,
    TopicProvisioningError,
)
from bridge.kafka.clients import translate_error


@pytest.mark.parametrize(
    ("code", "lacks"),
    [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "on the topic"),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "READ on the consumer group"),
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "WRITE on the transactional id"),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "cluster permission"),
    ],
)
def test_an_authorization_refusal_is_typed_and_names_what_is_missing(code: int, lacks: str) -> None:
    sent = translate_error(KafkaError(code), "send of m1 to orders")
    assert isinstance(sent, SendAuthorizationError)
    assert isinstance(sent, SendError) and isinstance(sent, AuthorizationError)
    assert "send of m1 to orders" in str(sent) and "the principal lacks" in str(sent)
    assert lacks in str(sent)
    other = translate_error(KafkaError(code), "listing groups", default=KafkaClientError)
    assert type(other) is AuthorizationError
    # A caller's own error type is kept (still named in the text).
    kept = translate_error(KafkaError(code), "creating orders", default=TopicProvisioningError)
    assert type(kept) is TopicProvisioningError and lacks in str(kept)


def test_other_refusals_are_unchanged() -> None:
    error = translate_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "send of m1 to orders")
    assert type(error) is SendError
    assert not isinstance(error, AuthorizationError)
