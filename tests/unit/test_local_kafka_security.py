"""The secured local broker's settings: what is refused (without echoing a password), what
``server.properties`` gets, and that the default broker's settings stay as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.runtime.local_kafka import (
    BROKER_PRINCIPAL,
    STANDARD_AUTHORIZER,
    LocalKafka,
    LocalKafkaConfig,
)

SECRET = "s3cret-Passw0rd!"


def properties(broker: LocalKafka) -> dict[str, str]:
    text = broker._server_properties(broker._load_state())
    return dict(line.split("=", 1) for line in text.splitlines())


def test_the_default_broker_has_no_security_settings(tmp_path: Path) -> None:
    props = properties(LocalKafka(LocalKafkaConfig(data_dir=tmp_path, port=9000)))
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:9000,CONTROLLER://")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert not [k for k in props if k.startswith(("ssl.", "sasl.", "authorizer", "super."))]


def test_a_secured_broker_has_sasl_ssl_mtls_and_the_standard_authorizer(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "secrets.json").write_text('{"store_password": "pw"}')
    config = LocalKafkaConfig(
        data_dir=tmp_path, port=9000, ssl_port=9001, controller_port=9002, secured=True,
        scram_users={"alice": SECRET}, tls_clients=("carol",), super_users=("ops",),
    )  # fmt: skip
    props = properties(LocalKafka(config))
    assert props["listeners"] == (
        "SASL_SSL://127.0.0.1:9000,SSL://127.0.0.1:9001,CONTROLLER://127.0.0.1:9002"
    )
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["inter.broker.listener.name"] == "SSL"
    assert props["ssl.client.auth"] == "required"
    assert props["listener.name.sasl_ssl.ssl.client.auth"] == "none"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["authorizer.class.name"] == STANDARD_AUTHORIZER
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == f"User:{BROKER_PRINCIPAL};User:ops"
    assert SECRET not in "\n".join(props.values())  # SCRAM passwords go to format only


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ssl_port": 9001},
        {"scram_users": {"alice": SECRET}},
        {"tls_clients": ("carol",)},
        {"super_users": ("ops",)},
        {"tls_dir": "/tmp/x"},
    ],
)
def test_security_fields_need_secured(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="need secured=True"):
        LocalKafkaConfig(data_dir=tmp_path, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scram_users": {BROKER_PRINCIPAL: SECRET}}, "broker's own identity"),
        ({"tls_clients": (BROKER_PRINCIPAL,)}, "broker's own identity"),
        ({"tls_clients": ("has space",)}, "identity name"),
        ({"scram_users": {"a/b": SECRET}}, "identity name"),
        ({"proxied": True}, "no PROXIED listener"),
    ],
)
def test_bad_secured_configs_are_typed_errors(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        LocalKafkaConfig(data_dir=tmp_path, secured=True, **kwargs)


@pytest.mark.parametrize("password", ["short", "with space 123", "a,b=c[d]e", 'quo"ted-pw'])
def test_a_bad_scram_password_is_refused_without_echoing_it(tmp_path: Path, password: str) -> None:
    with pytest.raises(InvalidArgumentError, match="SCRAM password of user 'alice'") as refused:
        LocalKafkaConfig(data_dir=tmp_path, secured=True, scram_users={"alice": password})
    assert password not in str(refused.value)


def test_the_config_repr_hides_scram_passwords(tmp_path: Path) -> None:
    config = LocalKafkaConfig(data_dir=tmp_path, secured=True, scram_users={"alice": SECRET})
    assert SECRET not in repr(config)
    assert SECRET not in str(config)


def test_client_settings_need_a_secured_broker_and_a_known_certificate(tmp_path: Path) -> None:
    with pytest.raises(IllegalStateError, match="not secured"):
        LocalKafka(LocalKafkaConfig(data_dir=tmp_path)).client_settings("alice", SECRET)
    secured = LocalKafka(LocalKafkaConfig(data_dir=tmp_path, secured=True, tls_clients=("c",)))
    scram = secured.client_settings("alice", SECRET)
    assert scram["security.protocol"] == "SASL_SSL"
    assert scram["sasl.mechanism"] == "SCRAM-SHA-512"
    with pytest.raises(InvalidArgumentError, match="no certificate for 'dave'"):
        secured.client_settings("dave")


def test_each_listener_gets_its_own_port_when_the_kernel_hands_one_out_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """free_port() releases its port at once, so two calls can return the same one (a CI run
    once formatted a secured broker with two listeners on one port)."""
    from bridge.runtime import node_config

    handed = iter([41000, 41000, 41000, 41001, 41001, 41002])
    monkeypatch.setattr(node_config, "free_port", lambda: next(handed))
    config = LocalKafkaConfig(data_dir=tmp_path, secured=True, scram_users={"a": "a-long-password"})
    state = node_config.node_state(config, {})
    ports = [state["port"], state["controller_port"], state["ssl_port"]]
    assert sorted(ports) == [41000, 41001, 41002]
