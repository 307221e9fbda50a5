"""``bridge broker --secured``: users without passwords on the command line, and the client
properties files it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bridge.cli import cli
from bridge.cli.broker import scram_users, write_client_files
from bridge.errors import InvalidArgumentError
from bridge.runtime.certs import TlsFiles
from topics.client_security import read_properties_file, to_librdkafka

PASSWORD = "s3cret-Pa55word"


def test_users_come_from_a_file_and_the_environment(tmp_path: Path) -> None:
    users_file = tmp_path / "users.properties"
    users_file.write_text(f"# users\nalice={PASSWORD}\nbob = other-password\n")
    env = {"BRIDGE_SCRAM_USERS": f"carol={PASSWORD}x,alice=overridden-by-file"}
    assert scram_users(users_file, env) == {
        "carol": PASSWORD + "x",
        "alice": PASSWORD,
        "bob": "other-password",
    }
    with pytest.raises(InvalidArgumentError) as refused:
        scram_users(None, {"BRIDGE_SCRAM_USERS": f"alice={PASSWORD},{PASSWORD}"})
    assert "entry 2" in str(refused.value)
    assert PASSWORD not in str(refused.value)


def test_client_files_are_private_and_read_back_as_client_settings(tmp_path: Path) -> None:
    tls = TlsFiles(tmp_path / "tls")
    tls.directory.mkdir()
    (tls.directory / "secrets.json").write_text(json.dumps({"store_password": "store-pw-123"}))
    files = write_client_files(tmp_path / "clients", tls, {"alice": PASSWORD}, ("carol",))
    assert set(files) == {"alice", "carol-mtls"}
    assert (tmp_path / "clients").stat().st_mode & 0o777 == 0o700
    for path in files.values():
        assert path.stat().st_mode & 0o777 == 0o600
    assert to_librdkafka(read_properties_file(files["alice"])) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(tls.ca_pem),
    }
    assert to_librdkafka(read_properties_file(files["carol-mtls"])) == {
        "security.protocol": "SSL",
        "ssl.keystore.location": str(tls.keystore("carol")),
        "ssl.keystore.password": "store-pw-123",
        "ssl.ca.location": str(tls.ca_pem),
    }


def test_security_options_need_secured() -> None:
    out = CliRunner().invoke(cli, ["broker", "--tls-client", "carol"])
    assert out.exit_code == 2
    assert "need --secured" in out.output
