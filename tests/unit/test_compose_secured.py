"""docker-compose.secured.yml, the opt-in secured override: no Docker engine runs here, so
its structure is checked against the code (the settings parse, the ACL commands run, no
plaintext listener, no password in the file)."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bridge.cli import cli
from bridge.config import ClientConfig
from bridge.coordinator import CoordinatorConfig
from spark_jobs.common import kafka_security_options
from tests.conftest import REPO_ROOT
from topics.client_security import parse_jaas_login

PASSWORDS = {
    "BRIDGE_COORDINATOR_PASSWORD": "coordinator-pw-1",
    "BRIDGE_SPARK_PASSWORD": "spark-pw-12",
    "BRIDGE_OPERATOR_PASSWORD": "operator-pw-1",
    "BRIDGE_UI_PASSWORD": "ui-pw-1234",
}
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Z_]+)(?::(?P<op>[?-])(?P<arg>[^}]*))?\}")


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((REPO_ROOT / name).read_text())
    return loaded


def merge(base: Any, override: Any, key: str = "") -> Any:
    """Compose's merge of an override file: mappings merge, ``ports`` and ``volumes`` append,
    anything else is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if key in ("ports", "volumes") and isinstance(base, list):
        return base + [v for v in override if v not in base]
    return override


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's variable substitution (``${X:?msg}`` refuses an unset or empty X)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        if env.get(name):
            return env[name]
        if op == "?":
            raise LookupError(f"{name}: {arg}")
        return arg if op == "-" else ""

    return _VARIABLE.sub(one, value).replace("$$", "$")


def stack() -> dict[str, Any]:
    merged: dict[str, Any] = merge(load("docker-compose.yml"), load("docker-compose.secured.yml"))
    return merged


def env_of(service: str, env: dict[str, str] | None = None) -> dict[str, str]:
    raw = stack()["services"][service]["environment"]
    return {k: interpolate(str(v), PASSWORDS if env is None else env) for k, v in raw.items()}


def test_the_override_names_only_services_volumes_and_anchors_of_its_own() -> None:
    secured = load("docker-compose.secured.yml")
    assert set(secured) <= {"services", "volumes", "x-secured-client"}
    # Every service of the base file that talks to Kafka is secured by the override.
    base = load("docker-compose.yml")["services"]
    talking = {name for name, service in base.items() if "kafka:9092" in yaml.safe_dump(service)}
    assert {"kafka", "coordinator", "ingest", "kafka-ui"} <= talking | {"kafka"}
    assert talking | {"kafka"} <= set(secured["services"])


def test_kafka_has_no_plaintext_listener_and_enforces_acls() -> None:
    env = env_of("kafka")
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = [item.split("://")[0] for item in env["KAFKA_LISTENERS"].split(",")]
    assert set(listeners) == set(protocols)
    assert "PLAINTEXT" not in protocols.values()
    assert protocols["HOST"] == "SASL_SSL"  # the one listener the host reaches
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_SSL_CLIENT_AUTH"] == "required"
    # The healthcheck talks TLS too (the base file's PLAINTEXT one would never pass).
    health = " ".join(stack()["services"]["kafka"]["healthcheck"]["test"])
    assert "--command-config" in health and ":9095" in health


def test_published_ports_still_bind_localhost_only() -> None:
    for name, service in stack()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_no_password_is_written_in_the_file_and_each_is_required() -> None:
    text = (REPO_ROOT / "docker-compose.secured.yml").read_text()
    for line in text.splitlines():
        if "PASSWORD:" in line and not line.lstrip().startswith("#"):
            assert "${" in line and ":?" in line, line
    incomplete = dict(PASSWORDS)
    del incomplete["BRIDGE_SPARK_PASSWORD"]
    with pytest.raises(LookupError, match="BRIDGE_SPARK_PASSWORD"):
        env_of("ingest", incomplete)


def test_the_coordinator_connects_as_its_own_principal_over_sasl_ssl() -> None:
    env = env_of("coordinator")
    config = CoordinatorConfig.from_env(env)
    kafka = config.client.kafka
    assert config.client.bootstrap_servers == "kafka:9092"
    assert kafka["security.protocol"] == "SASL_SSL"
    assert (kafka["sasl.username"], kafka["sasl.password"]) == ("coordinator", "coordinator-pw-1")
    assert kafka["ssl.ca.location"] == "/certs/ca.pem"
    assert "coordinator-pw-1" not in repr(config)
    assert "certs:/certs:ro" in stack()["services"]["coordinator"]["volumes"]


def test_the_ingest_job_maps_the_same_settings_to_spark_options() -> None:
    options = kafka_security_options(environ=env_of("ingest"))
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == "/certs/ca.pem"
    _, login = parse_jaas_login(options["kafka.sasl.jaas.config"])
    assert login == {"username": "spark", "password": "spark-pw-12"}


def test_the_ui_is_read_only_and_logs_in_as_ui() -> None:
    env = env_of("kafka-ui")
    assert env["KAFKA_CLUSTERS_0_READONLY"] == "true"
    _, login = parse_jaas_login(env["KAFKA_CLUSTERS_0_PROPERTIES_SASL_JAAS_CONFIG"])
    assert login == {"username": "ui", "password": "ui-pw-1234"}
    assert env["KAFKA_CLUSTERS_0_PROPERTIES_SECURITY_PROTOCOL"] == "SASL_SSL"


def test_the_setup_grants_each_service_the_acls_of_its_role() -> None:
    service = stack()["services"]["security-setup"]
    script = interpolate(service["command"][0], PASSWORDS)
    env = env_of("security-setup")
    commands = [
        shlex.split(c.replace("\\\n", " "))
        for c in re.findall(r"^bridge acls apply(?:.*\\\n)*.*$", script, re.M)
    ]
    assert len(commands) == 2
    principals = set()
    for command in commands:
        args = [a.replace("$BRIDGE_ACL_TOPIC", env["BRIDGE_ACL_TOPIC"]) for a in command[3:]]
        assert "--command-config" in args
        # The same options print the table (apply would create these rows).
        printable = [a for a in args if not a.startswith(("-b", "kafka:", "--command-config"))]
        printable = [a for a in printable if not a.endswith(".properties")]
        out = CliRunner().invoke(cli, ["--namespace", "rmq", "acls", "print", *printable])
        assert out.exit_code == 0, out.output
        principals |= {line.split()[0] for line in out.output.splitlines()[:-1]}
    assert principals == {"User:coordinator", "User:spark", "User:operator", "User:ui"}
    # Every SCRAM user the services log in as is made.
    for user in ("coordinator", "spark", "operator", "ui"):
        assert f"BRIDGE_{user.upper()}_PASSWORD" in env
    assert ClientConfig.from_env(env).namespace == "rmq"
