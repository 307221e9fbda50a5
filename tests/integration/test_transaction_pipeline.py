"""What the transaction pipeline costs per message: Kafka transactions of the coordinator and
the sends of the transactional producer, against a real broker."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.transaction.service import TransactionService
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


class _Undecided(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.UNKNOWN


def _undecided(service: TransactionService) -> int:
    return sum(len(state.pending) for state in service._partitions.values())


def test_half_messages_alone_commit_no_kafka_transaction(
    client_config: ClientConfig, topic: str
) -> None:
    """A half message read while nothing is decided leaves every checkpoint where it was (the
    oldest undecided message holds it): the coordinator commits no Kafka transaction for it,
    so a decision read next does not wait behind one. The decision then commits once."""
    config = CoordinatorConfig(
        client=client_config,
        coordinator_id=f"c-{uuid.uuid4().hex[:8]}",
        transaction_partitions=2,
        transaction_timeout_ms=120_000,
        session_timeout_ms=6000,
    )
    with (
        Coordinator(config) as coordinator,
        TransactionMQProducer("tx_quiet", _Undecided(), config=client_config) as producer,
    ):
        (service,) = [s for s in coordinator.services if isinstance(s, TransactionService)]
        first = producer.send_message_in_transaction(Message(topic, "first"))
        # The first batch after the assignment commits the checkpoints it starts from.
        wait_until(lambda: _undecided(service) == 1 and service.committed_transactions >= 1)
        before = service.committed_transactions
        for i in range(10):
            producer.send_message_in_transaction(Message(topic, f"undecided-{i}"))
        wait_until(lambda: _undecided(service) == 11)
        producer._end(
            first.transaction_id, first.queue_id, TransactionStatus.COMMIT, from_check=False
        )
        (seen,) = list(read_messages(client_config, [topic], max_messages=1, timeout_ms=30_000))
        assert seen.body == b"first"
        # The loop is sequential: once the decision's commit is counted, every batch before it
        # is done.
        wait_until(lambda: service.committed_transactions >= before + 1)
        assert service.committed_transactions == before + 1


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


def test_the_decision_is_sent_at_once_whatever_the_linger(
    client_config: ClientConfig, topic: str
) -> None:
    """A transactional send waits for its half message anyway: ``linger_ms`` (set high for
    batching plain sends) delays neither the half message nor the decision after it, so a
    commit reaches its real topic without waiting for the next send."""
    config = client_config.replace(linger_ms=10_000, send_msg_timeout_ms=30_000)
    coordinator_config = CoordinatorConfig(
        client=client_config,
        coordinator_id=f"c-{uuid.uuid4().hex[:8]}",
        transaction_partitions=2,
        session_timeout_ms=6000,
    )
    with (
        Coordinator(coordinator_config),
        TransactionMQProducer("tx_lingering", _Commit(), config=config) as producer,
    ):
        producer.send_message_in_transaction(Message(topic, "warm-up"))
        assert list(read_messages(client_config, [topic], max_messages=1, timeout_ms=30_000))
        started = time.monotonic()
        producer.send_message_in_transaction(Message(topic, "at once"))
        seen = list(read_messages(client_config, [topic], max_messages=2, timeout_ms=30_000))
        elapsed_s = time.monotonic() - started
    assert [m.body for m in seen] == [b"warm-up", b"at once"]
    # The linger is 10 s; visible well before, however busy the machine.
    assert elapsed_s < 5.0
