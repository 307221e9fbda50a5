"""A broker restart while transactions and delayed messages are in flight loses nothing and
duplicates nothing (G2, G3, G5). Runs on a broker of its own, so the restart disturbs no other
test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    Producer,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig

# Serial: a restart of a broker beside the other workers' load is what librdkafka's clients in
# a worker have aborted on (SIGABRT in init_transactions while the broker came back).
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.serial]


class CommitOnCheck(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.COMMIT if arg else TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return TransactionStatus.COMMIT


@pytest.fixture()
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    broker = LocalKafka(LocalKafkaConfig(data_dir=tmp_path / "kafka"))
    broker.start()
    yield broker
    broker.stop()


def test_broker_restart_mid_flight(own_broker: LocalKafka, namespace: str) -> None:
    config = ClientConfig(
        bootstrap_servers=own_broker.bootstrap_servers,
        namespace=namespace,
        message_delay_level="1s 2s 8s",
        timer_precision_ms=100,
        send_msg_timeout_ms=30_000,
    )
    coordinator_config = CoordinatorConfig(
        client=config, coordinator_id="restart", transaction_partitions=2,
        transaction_timeout_ms=2000, check_interval_ms=2000, session_timeout_ms=6000,
    )  # fmt: skip
    topic = "restart-orders"
    expected = set()
    with Coordinator(coordinator_config):
        with Producer("pg", config=config) as producer:
            for i in range(50):
                producer.send_sync(Message(topic, f"level-{i}", delay_time_level=3))  # 8 s
                timer = Message(topic, f"timer-{i}")
                timer.set_delay_time_ms(8000)
                producer.send_sync(timer)
                expected |= {f"level-{i}", f"timer-{i}"}
        with TransactionMQProducer("tx_restart", CommitOnCheck(), config=config) as tx:
            for i in range(50):
                # Half of them are decided only by a check after the restart.
                tx.send_message_in_transaction(Message(topic, f"tx-{i}"), i % 2 == 0)
                expected.add(f"tx-{i}")
            own_broker.restart()
            received = [
                m.body.decode()
                for m in read_messages(
                    config, [topic], max_messages=len(expected), timeout_ms=90_000
                )
            ]
            received += [m.body.decode() for m in read_messages(config, [topic], timeout_ms=5000)][
                len(received) :
            ]
    assert sorted(received) == sorted(expected)
