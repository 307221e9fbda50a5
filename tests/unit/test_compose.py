"""docker-compose.yml: no Docker engine runs here, so check its structure against the code."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from bridge.config import ENV_BOOTSTRAP_SERVERS, ENV_PREFIX, ClientConfig
from bridge.coordinator import CoordinatorConfig
from bridge.runtime.jars import KAFKA_VERSION
from tests.conftest import REPO_ROOT


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    return loaded


def test_images_are_pinned_and_kafka_matches_the_local_broker() -> None:
    services = compose()["services"]
    for name, service in services.items():
        image = service.get("image", "")
        assert image and ":" in image and not image.endswith(":latest"), name
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_coordinator_env_uses_names_the_code_reads() -> None:
    env = compose()["services"]["coordinator"]["environment"]
    known = {ENV_BOOTSTRAP_SERVERS} | {
        ENV_PREFIX + f.name.upper()
        for cls in (ClientConfig, CoordinatorConfig)
        for f in dataclasses.fields(cls)
        if f.name not in ("kafka", "client", "bootstrap_servers")
    }
    assert set(env) <= known, set(env) - known
    config = CoordinatorConfig.from_env({k: str(v) for k, v in env.items()})
    assert config.client.bootstrap_servers == "kafka:9092"


def test_kafka_is_configured_for_transactions_on_one_node() -> None:
    env = compose()["services"]["kafka"]["environment"]
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert "healthcheck" in compose()["services"]["kafka"]
    depends = compose()["services"]["coordinator"]["depends_on"]["kafka"]
    assert depends["condition"] == "service_healthy"
