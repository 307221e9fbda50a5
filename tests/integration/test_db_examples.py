"""examples/orders_inventory.py runs on SQLite with nothing but a broker and a coordinator, and
on PostgreSQL when its URLs say so: every good order once in each database, the failing one
nowhere, and the replayed copy takes no stock."""

from __future__ import annotations

import pytest

from bridge.config import ClientConfig
from bridge.coordinator import Coordinator, CoordinatorConfig
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
