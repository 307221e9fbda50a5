"""Every example in examples/ runs against the session broker and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bridge.config import ClientConfig
from bridge.coordinator import Coordinator, CoordinatorConfig
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.broker


def run_example(
    module: str, bootstrap: str, namespace: str = "rmq", extra_env: dict[str, str] | None = None
) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{module}"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "BRIDGE_NAMESPACE": namespace,
            **(extra_env or {}),
        },
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def run_with_fast_checks(module: str, client: ClientConfig, coordinator_id: str) -> str:
    """Run a transactional example beside a coordinator that checks undecided transactions
    back 1.5 s after they were sent, then every second."""
    config = CoordinatorConfig(
        client=client, coordinator_id=coordinator_id, transaction_partitions=2,
        transaction_timeout_ms=1500, check_interval_ms=1000,
    )  # fmt: skip
    with Coordinator(config):
        return run_example(module, client.bootstrap_servers, client.namespace)


def test_simple_producer_example(kafka_bootstrap: str) -> None:
    out = run_example("simple_producer", kafka_bootstrap)
    assert "SEND_OK" in out
    received = [line for line in out.splitlines() if line.startswith("received ")]
    assert [line.split("tags=")[1].split()[0] for line in received] == ["TagA", "TagB", "TagC"]
    assert "properties={'region': 'eu'}" in received[0]


def test_transaction_producer_example_receives_only_the_committed(
    client_config: ClientConfig,
) -> None:
    out = run_with_fast_checks("transaction_producer", client_config, "example")
    assert out.count(" UNKNOWN") == 10
    received = [line for line in out.splitlines() if line.startswith("received ")]
    assert sorted(line.split("body=")[1] for line in received) == [
        "'Hello RocketMQ 1'", "'Hello RocketMQ 4'", "'Hello RocketMQ 7'",
    ]  # fmt: skip


def test_delay_and_timer_examples(client_config: ClientConfig) -> None:
    config = CoordinatorConfig(client=client_config, coordinator_id="example-delay")
    with Coordinator(config):
        levels = run_example(
            "delay_level_producer", client_config.bootstrap_servers, client_config.namespace
        )
        timers = run_example(
            "timer_producer", client_config.bootstrap_servers, client_config.namespace
        )
    received = [line for line in levels.splitlines() if line.startswith("received ")]
    assert [line.split("'")[1] for line in received] == ["level 1", "level 2", "level 3"]
    assert "refused  timer delay of" in timers
    got = [line.split("'")[1] for line in timers.splitlines() if line.startswith("received ")]
    # "recalled", due between the last two, never arrives.
    assert got == ["already due", "in 2 s", "at now + 3 s"]
    assert "recalled " in timers


def test_push_consumer_example_retries_dead_letters_and_replays(
    kafka_bootstrap: str, namespace: str
) -> None:
    levels = "1s 1s 1s 1s"
    client = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, message_delay_level=levels
    )
    with Coordinator(CoordinatorConfig(client=client, coordinator_id="example-consumer")):
        out = run_example(
            "push_consumer", kafka_bootstrap, namespace, {"BRIDGE_MESSAGE_DELAY_LEVEL": levels}
        )
    lines = out.splitlines()
    assert sum("order-2" in line and "-> fail" in line for line in lines) == 1, out
    assert any("order-2" in line and "reconsume_times=1) -> ok" in line for line in lines), out
    assert sum("order-4" in line and "-> fail" in line for line in lines) == 2, out
    assert "not for us" not in out
    assert any(line.startswith("DLQ of") and "1 message(s)" in line for line in lines), out
    assert "replayed 1 dead letter(s)" in out


def test_fifo_consumer_example_keeps_each_orders_events_in_order(
    kafka_bootstrap: str, namespace: str
) -> None:
    out = run_example("fifo_consumer", kafka_bootstrap, namespace)
    lines = out.splitlines()
    for order in ("order-0", "order-1", "order-2"):
        assert f"{order}: created, paid, shipped" in lines, out
    events = [line.split()[1:3] for line in lines if line.split()[1:2] == ["order-1"]]
    assert events == [["order-1", e] for e in ("created", "paid", "paid", "shipped")], out
    assert sum("-> fail" in line for line in lines) == 1, out


def test_async_service_example_ships_only_the_stored_orders(client_config: ClientConfig) -> None:
    out = run_with_fast_checks("async_service", client_config, "example-aio")
    lines = out.splitlines()
    assert "posted   order-1: COMMIT" in lines, out
    assert "posted   order-2: ROLLBACK" in lines, out
    assert "posted   order-3: UNKNOWN" in lines, out
    assert "check    order-3: stored" in lines, out
    assert sorted(line.split()[1] for line in lines if line.startswith("shipped ")) == [
        "order-1", "order-3",
    ]  # fmt: skip
    assert "received order-2" not in lines, "a rolled-back order was delivered"


def test_v5_producer_example_reaches_its_push_consumer(
    kafka_bootstrap: str, namespace: str
) -> None:
    out = run_example("v5_producer", kafka_bootstrap, namespace)
    lines = out.splitlines()
    received = sorted(line for line in lines if line.startswith("received "))
    assert [line.split("'")[1] for line in received] == [
        "order created", "order paid", "order shipped",
    ], out  # fmt: skip
    created = next(line for line in received if "order created" in line)
    assert "tag=TagA keys=['order-1'] properties={'region': 'eu'}" in created, out
    assert "group=order-1" in next(line for line in received if "shipped" in line), out
    assert all("attempt=1" in line for line in received), out
    assert any(line.startswith("async    ") for line in lines), out


def test_v5_transaction_example_delivers_the_committed_and_the_checked(
    client_config: ClientConfig,
) -> None:
    out = run_with_fast_checks("v5_transaction_producer", client_config, "example-v5")
    lines = out.splitlines()
    assert "check    order-3: COMMIT" in lines, out
    # Orders 1 and 2 are decided at once; a check of either that came first (a loaded
    # machine) was answered as the application decided, or not known yet.
    for order, decided in (("order-1", "COMMIT"), ("order-2", "ROLLBACK")):
        answers = {line.split(": ")[1] for line in lines if line.startswith(f"check    {order}:")}
        assert answers <= {decided, "TRANSACTION_RESOLUTION_UNSPECIFIED"}, out
    received = sorted(line.split("'")[1] for line in lines if line.startswith("received "))
    assert received == ["order-1 created", "order-3 created"], out


def test_v5_simple_consumer_example_redelivers_the_unacked(
    kafka_bootstrap: str, namespace: str
) -> None:
    out = run_example("v5_simple_consumer", kafka_bootstrap, namespace)
    lines = [line for line in out.splitlines() if line.startswith("received ")]
    assert "received job-2 attempt=1: not acked" in lines, out
    assert "received job-2 attempt=2: acked" in lines, out
    assert sorted(line for line in lines if line.endswith(": acked")) == [
        "received job-1 attempt=1: acked",
        "received job-2 attempt=2: acked",
        "received job-3 attempt=1: acked",
    ], out
