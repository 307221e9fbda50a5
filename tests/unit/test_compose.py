"""docker-compose.yml: no Docker engine runs here, so check its structure against the code."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from bridge.config import ENV_BOOTSTRAP_SERVERS, ENV_PREFIX, ClientConfig
from bridge.coordinator import CoordinatorConfig
from bridge.observability import ENV_METRICS_HOST, ENV_METRICS_PORT
from bridge.observability.server import parse_port
from bridge.runtime.jars import KAFKA_VERSION
from spark_jobs import ingest
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


DEBIAN_RELEASES = ("bookworm", "trixie")
"""Debian releases a base image may name (a tag such as ``3.11-slim-bookworm``)."""
JAVA_RUNTIMES = {"bookworm": "openjdk-17-jre-headless"}
"""The Java runtime package the ingest image installs, per Debian release that has it
(``apt-cache policy openjdk-17-jre-headless`` on Debian 12 shows it; Debian 13 has none)."""


def base_images() -> list[str]:
    """The image of each ``FROM`` in the Dockerfile that is not an earlier stage."""
    stages: set[str] = set()
    images = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["FROM"]:
            if parts[1] not in stages:
                images.append(parts[1])
            if len(parts) >= 4 and parts[2].upper() == "AS":
                stages.add(parts[3])
    return images


def release_of(image: str) -> str | None:
    """The Debian release an image's tag names, or None (a digest pins it anyway)."""
    tag = image.split("@", maxsplit=1)[0].rpartition(":")[2]
    return next((r for r in DEBIAN_RELEASES if tag.endswith(r)), None)


def test_dockerfile_bases_are_pinned_and_the_ingest_java_exists_in_their_release() -> None:
    """A floating tag (python:3.11-slim) moves to a new Debian release without a change here,
    and the ingest image's Java runtime may not exist there."""
    images = base_images()
    assert images, "no FROM in the Dockerfile"
    for image in images:
        assert "@sha256:" in image or release_of(image), f"{image} floats: name a release"
    java = [
        word
        for word in (REPO_ROOT / "Dockerfile").read_text().split()
        if word.startswith("openjdk-")
    ]
    for image in images:
        release = release_of(image)
        if release is not None and java:
            assert set(java) == {JAVA_RUNTIMES.get(release)}, (image, java)


@pytest.mark.parametrize("image", ["python:3.11-slim", "python:3.11", "python:latest"])
def test_a_floating_base_is_told_apart(image: str) -> None:
    assert release_of(image) is None


def test_coordinator_env_uses_names_the_code_reads() -> None:
    env = compose()["services"]["coordinator"]["environment"]
    known = {ENV_BOOTSTRAP_SERVERS, ENV_METRICS_PORT, ENV_METRICS_HOST} | {
        ENV_PREFIX + f.name.upper()
        for cls in (ClientConfig, CoordinatorConfig)
        for f in dataclasses.fields(cls)
        if f.name not in ("kafka", "client", "bootstrap_servers")
    }
    assert set(env) <= known, set(env) - known
    metrics_env = (ENV_METRICS_PORT, ENV_METRICS_HOST)
    config = CoordinatorConfig.from_env({k: str(v) for k, v in env.items() if k not in metrics_env})
    assert config.client.bootstrap_servers == "kafka:9092"


def test_kafka_is_configured_for_transactions_on_one_node() -> None:
    env = compose()["services"]["kafka"]["environment"]
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert "healthcheck" in compose()["services"]["kafka"]
    depends = compose()["services"]["coordinator"]["depends_on"]["kafka"]
    assert depends["condition"] == "service_healthy"


def test_every_service_has_a_health_check_and_waits_for_what_it_needs() -> None:
    services = compose()["services"]
    assert set(services) >= {"kafka", "coordinator", "ingest", "kafka-ui", "prometheus", "grafana"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
    assert services["ingest"]["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert services["kafka-ui"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert services["coordinator"]["healthcheck"]["test"] == ["CMD", "bridge", "health"]


def test_built_services_name_stages_of_the_dockerfile() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    stages = {line.split()[-1] for line in dockerfile.splitlines() if line.startswith("FROM ")}
    for name in ("coordinator", "ingest"):
        assert compose()["services"][name]["build"]["target"] in stages


def test_ingest_command_and_env_parse_with_the_jobs_own_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = compose()["services"]["ingest"]
    for key in ("KAFKA_BOOTSTRAP_SERVERS", "BRIDGE_NAMESPACE", "BRIDGE_SPARK_JARS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in service["environment"].items():
        monkeypatch.setenv(key, str(value))
    args = ingest.parser().parse_args(service["command"])
    config = ingest.config_from_args(args)
    assert (config.bootstrap_servers, config.namespace, args.jars) == (
        "kafka:9092", "rmq", "packages",
    )  # fmt: skip
    assert config.trigger == "continuous"
    assert config.output.startswith("/data/") and config.checkpoint.startswith("/data/")
    known = {"KAFKA_BOOTSTRAP_SERVERS", "BRIDGE_NAMESPACE", "BRIDGE_SPARK_JARS"}
    assert set(service["environment"]) <= known


def test_the_web_ui_points_at_the_broker() -> None:
    env = compose()["services"]["kafka-ui"]["environment"]
    assert env["KAFKA_CLUSTERS_0_BOOTSTRAPSERVERS"] == "kafka:9092"


def test_published_ports_bind_localhost_and_the_ui_cannot_write() -> None:
    services = compose()["services"]
    published = [
        (name, port) for name, service in services.items() for port in service.get("ports", [])
    ]
    assert published
    for name, port in published:
        # "127.0.0.1:HOST:CONTAINER": without the address Docker publishes on every interface.
        assert str(port).startswith("127.0.0.1:"), (name, port)
    assert services["kafka-ui"]["environment"]["KAFKA_CLUSTERS_0_READONLY"] == "true"


def test_prometheus_scrapes_the_coordinators_metrics_port() -> None:
    services = compose()["services"]
    env = services["coordinator"]["environment"]
    port = parse_port(str(env[ENV_METRICS_PORT]))
    # Reachable from the other containers, published on the host's loopback only.
    assert env[ENV_METRICS_HOST] == "0.0.0.0"
    assert f"127.0.0.1:{port}:{port}" in services["coordinator"]["ports"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    scrape = yaml.safe_load((REPO_ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    targets = jobs["bridge-coordinator"]["static_configs"][0]["targets"]
    assert targets == [f"coordinator:{port}"]
    assert jobs["bridge-coordinator"]["metrics_path"] == "/metrics"


def test_grafana_has_no_anonymous_access_and_provisions_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    provisioning = REPO_ROOT / mounts["/etc/grafana/provisioning"]
    dashboards = REPO_ROOT / mounts["/var/lib/grafana/dashboards"]
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "bridge.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (dashboards / "bridge-dashboard.json").is_file()
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/bridge-dashboard.json"


def test_the_console_is_read_only_and_runs_from_the_coordinator_image() -> None:
    services = compose()["services"]
    console = services["console"]
    assert console["image"] == services["coordinator"]["image"]
    assert console["command"][0] == "console" and "--write" not in console["command"]
    assert console["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert '".[console]"' in (REPO_ROOT / "Dockerfile").read_text()
