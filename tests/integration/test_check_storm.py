"""A storm of checks: thousands of undecided transactions of one live producer checked at once
(what a database outage of a few minutes leaves behind). No transaction is parked unless its
producer was asked ``transaction_check_max`` times."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import Counter
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
from bridge.cli.admin.transactions import read_parked
from bridge.kafka.admin import TopicAdmin
from tests.conftest import REPO_ROOT, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

STORM = 20_000
SENDERS = 8
CHECK_MAX = 3
SETTINGS = {
    "transaction_timeout_ms": 3000,
    "check_interval_ms": 3000,
    "transaction_check_max": CHECK_MAX,
}


class _Answers(TransactionListener):
    """UNKNOWN when sent (the database is away); every check answers ``answer`` at once."""

    def __init__(self, answer: TransactionStatus) -> None:
        self.answer = answer
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return TransactionStatus.UNKNOWN

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        with self._lock:
            self.calls[msg.msg_id] += 1
        return self.answer


def _coordinator(config: ClientConfig) -> subprocess.Popen[bytes]:
    """A coordinator process, as deployed (its own interpreter: the storm's senders and check
    threads do not slow it down)."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_COORDINATOR_ID": "storm",
        **{f"BRIDGE_{k.upper()}": str(v) for k, v in SETTINGS.items()},
    }
    env.pop("BRIDGE_COORDINATOR_PROCESSES", None)
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO_ROOT,
    )  # fmt: skip


def _send(producer: TransactionMQProducer, topic: str) -> list[str]:
    """:data:`STORM` transactions left undecided, from :data:`SENDERS` threads; their ids."""
    ids: list[str] = []

    def work(slot: int) -> None:
        for i in range(slot, STORM, SENDERS):
            ids.append(producer.send_message_in_transaction(Message(topic, f"s{i}")).msg_id)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids


@pytest.mark.parametrize(
    "answer", [TransactionStatus.COMMIT, TransactionStatus.UNKNOWN], ids=["commit", "unknown"]
)
def test_a_check_storm_parks_nothing_its_live_producer_was_not_asked(
    client_config: ClientConfig,
    topic: str,
    answer: TransactionStatus,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A line a check answered: 60,000 of them would only slow the storm down.
    caplog.set_level(logging.WARNING, logger="bridge.transaction.producer")
    TopicAdmin(client_config).ensure_system_topics(client_config.catalog())
    coordinator = _coordinator(client_config)
    listener = _Answers(answer)
    try:
        with TransactionMQProducer("storm", listener, config=client_config) as producer:
            ids = _send(producer, topic)
            if answer is TransactionStatus.COMMIT:
                committed = read_messages(
                    client_config, [topic], max_messages=STORM, timeout_ms=60_000
                )
                assert len({m.msg_id for m in committed}) == STORM
                parked = read_parked(client_config)
            else:
                parked = wait_until(
                    lambda: (found := read_parked(client_config)) and len(found) >= STORM and found,
                    timeout_s=120,
                    interval_s=2,
                )
    finally:
        coordinator.terminate()
        coordinator.wait(30)
    parked_ids = {m.msg_id for m in parked}
    if answer is TransactionStatus.COMMIT:
        assert not parked_ids, f"{len(parked_ids)} parked, their producer would have committed"
        assert set(listener.calls) == set(ids)
        return
    assert parked_ids == set(ids)
    never = STORM - len(listener.calls)
    calls = Counter(listener.calls.values())
    assert calls == {CHECK_MAX: STORM}, f"checks a transaction: {dict(calls)}, never: {never}"
