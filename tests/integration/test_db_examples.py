"""examples/orders_inventory.py runs on SQLite with nothing but a broker and a coordinator, and
on PostgreSQL when its URLs say so: every good order once in each database, the failing one
nowhere, and the replayed copy takes no stock."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from bridge import read_messages
from bridge.config import ClientConfig
from bridge.coordinator import Coordinator, CoordinatorConfig
from tests.conftest import REPO_ROOT
from tests.db_fixtures import new_postgres_database
from tests.integration.test_examples import run_example

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_orders_inventory_example(
    client_config: ClientConfig, backend: str, request: pytest.FixtureRequest
) -> None:
    env = {}
    if backend == "postgresql":
        server = request.getfixturevalue("postgres_server")
        env = {
            "ORDERS_DATABASE_URL": new_postgres_database(server),
            "INVENTORY_DATABASE_URL": new_postgres_database(server),
        }
    config = CoordinatorConfig(client=client_config, coordinator_id="example-db")
    with Coordinator(config):
        out = run_example(
            "orders_inventory", client_config.bootstrap_servers, client_config.namespace, env
        )
    assert "order-3 unobtainium x1: ROLLBACK" in out
    assert out.count(": COMMIT") == 4
    assert "orders db:    order-1, order-2, order-4, order-5" in out
    # tea 10 - 2 - 3 (order-1 once, though delivered twice), café 5 - 1, 茶碗 2 - 1
    assert 'inventory db: {"café": 4, "tea": 5, "茶碗": 1}' in out


def _first_python_block(page: str) -> str:
    text = (REPO_ROOT / page).read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_transactions_page_database_example_runs_as_written(
    client_config: ClientConfig, tmp_path: Path
) -> None:
    code = _first_python_block("docs/transactions.md")
    assert len([line for line in code.splitlines() if line.strip()]) <= 16
    assert code.count('"127.0.0.1:9092"') == 1
    topic = f"orders-{uuid.uuid4().hex[:8]}"  # the session's broker is shared
    code = code.replace('"127.0.0.1:9092"', repr(client_config.bootstrap_servers))
    code = code.replace('Message("orders"', f"Message({topic!r}")
    # As written, the producer is in the default namespace (rmq): so is this coordinator.
    client_config = ClientConfig(bootstrap_servers=client_config.bootstrap_servers)
    config = CoordinatorConfig(client=client_config, coordinator_id="readme-db")
    with Coordinator(config):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.strip() == "TransactionStatus.COMMIT"
        (received,) = read_messages(client_config, [topic], max_messages=1, timeout_ms=60_000)
    assert received.keys == ["order-1"]
    engine = create_engine(f"sqlite:///{tmp_path / 'orders.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, item FROM orders").all() == [("order-1", "tea")]
    engine.dispose()


def test_readme_transactional_example_runs_as_written(
    client_config: ClientConfig, tmp_path: Path
) -> None:
    """The README's example, which the getting-started page repeats word for word, run as a
    user runs it: the broker address from KAFKA_BOOTSTRAP_SERVERS, a coordinator running."""
    code = _first_python_block("README.md")
    assert code == _first_python_block("docs/getting-started.md")
    topic = f"orders-{uuid.uuid4().hex[:8]}"  # the session's broker is shared
    code = code.replace('Message("orders"', f"Message({topic!r}")
    client_config = ClientConfig(bootstrap_servers=client_config.bootstrap_servers)
    config = CoordinatorConfig(client=client_config, coordinator_id="readme-quick")
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": client_config.bootstrap_servers}
    with Coordinator(config):
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
            timeout=180, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        stored, decided = done.stdout.strip().splitlines()
        assert stored == "storing order order-1"
        assert decided.startswith("TransactionStatus.COMMIT ")
        (received,) = read_messages(client_config, [topic], max_messages=1, timeout_ms=60_000)
    assert received.keys == ["order-1"]
    assert received.msg_id == decided.split()[1]
