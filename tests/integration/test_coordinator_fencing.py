"""Two coordinators started with the same ``coordinator_id``: the older one is fenced by the
newer, stops with an error naming the id, and does not fence the newer one back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator import Coordinator
from bridge.lifecycle import ServiceState
from tests.integration.test_delay_isolation import isolation_config, warm_up
from tests.integration.test_delays import coordinator_config

pytestmark = pytest.mark.broker


@pytest.fixture()
def config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return isolation_config(kafka_bootstrap, namespace)


def test_a_coordinator_fenced_by_another_with_its_id_stops_and_says_why(
    config: ClientConfig, topic: str
) -> None:
    older = Coordinator(coordinator_config(config, "twin"))
    older.start()
    try:
        warm_up(config, f"{topic}-warm")
        with Coordinator(coordinator_config(config, "twin")) as newer:
            assert older.wait(30), "the fenced coordinator kept running"
            failure = getattr(older, "failure", None)
            assert failure is not None and "'twin'" in str(failure), failure
            assert older.state is ServiceState.SHUTDOWN_ALREADY
            assert all(s.state is ServiceState.SHUTDOWN_ALREADY for s in older.services)
            with pytest.raises(type(failure)):
                older.run_until(threading.Event())
            # The newer one keeps its services and delivers, exactly once.
            with Producer("pg", config=config) as producer:
                for i in range(3):
                    producer.send_sync(Message(topic, f"m{i}", delay_time_level=1))
                    timer = Message(topic, f"t{i}")
                    timer.set_delay_time_ms(500)
                    producer.send_sync(timer)
            bodies = sorted(m.body for m in read_messages(config, [topic], timeout_ms=8000))
            assert newer.failure is None and not newer.wait(0)
            assert all(s.state is ServiceState.RUNNING for s in newer.services)
    finally:
        older.stop()
    assert bodies == sorted(f"{k}{i}".encode() for k in "mt" for i in range(3))


def test_bridge_coordinator_exits_non_zero_when_another_takes_its_id(
    config: ClientConfig, topic: str
) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_MESSAGE_DELAY_LEVEL": config.message_delay_level,
        "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
        "BRIDGE_TIMER_MAX_DELAY_MS": str(config.timer_max_delay_ms),
        "BRIDGE_TRANSACTION_PARTITIONS": "1",
        "BRIDGE_SESSION_TIMEOUT_MS": "6000",
        "BRIDGE_COORDINATOR_ID": "cli-twin",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "coordinator"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        warm_up(config, f"{topic}-warm")  # the command's services own their partitions
        with Coordinator(coordinator_config(config, "cli-twin")):
            _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("Error: "), err
    assert "'cli-twin'" in err, err
