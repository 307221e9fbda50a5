"""Client security settings between librdkafka's names and the Java client's: properties
files, ``--command-config``, Spark's ``kafka.`` options, and errors that never hold a value."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from bridge.cli.common import bootstrap_option, client_config
from spark_jobs.common import kafka_options, kafka_security_options
from spark_jobs.ingest import IngestConfig, config_from_args, parser
from topics.client_security import (
    PLAIN_LOGIN_MODULE,
    SCRAM_LOGIN_MODULE,
    ClientPropertyError,
    format_properties,
    jaas_login,
    kafka_env_properties,
    masked,
    parse_jaas_login,
    parse_properties,
    to_java,
    to_librdkafka,
)

SECRET = 'pa"ss\\word-1234'
SECRET_IN_FILE = SECRET.replace("\\", "\\\\")


def test_properties_files_follow_javas_syntax() -> None:
    text = (
        "# a comment\n! another\n\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism:SCRAM-SHA-512\n"
        "client.id bridge\\\n"
        "    -cli\n"
        "ssl.truststore.location=C:\\\\certs\\\\ca.pem\n"
        "key\\=with\\:seps=v\\u0041\n"
        "client.id=last-wins\n"
    )
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "client.id": "last-wins",
        "ssl.truststore.location": "C:\\certs\\ca.pem",
        "key=with:seps": "vA",
    }


def test_a_jaas_scram_login_becomes_sasl_username_and_password() -> None:
    props = {
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, "alice", SECRET),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/tls/ca.pem",
    }
    assert to_librdkafka(props) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
    }
    module, options = parse_jaas_login(props["sasl.jaas.config"])
    assert (module, options) == (SCRAM_LOGIN_MODULE, {"username": "alice", "password": SECRET})


def test_a_bare_word_jaas_and_a_plain_login() -> None:
    jaas = f"{PLAIN_LOGIN_MODULE} required username=bob password=s3cret-bare;"
    out = to_librdkafka({"sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas})
    assert out["sasl.username"] == "bob" and out["sasl.password"] == "s3cret-bare"


def test_a_pkcs12_keystore_and_librdkafka_names_pass() -> None:
    props = {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": "/tls/carol.p12",
        "ssl.keystore.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
        "ssl.endpoint.identification.algorithm": "",
    }
    assert to_librdkafka(props) == {
        "security.protocol": "SSL",
        "ssl.keystore.location": "/tls/carol.p12",
        "ssl.keystore.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
    }
    # The type is read from the file name when not given; a PEM key store is cert and key.
    pem = to_librdkafka({"ssl.keystore.location": "/tls/me.pem", "ssl.key.password": SECRET})
    assert pem == {
        "ssl.certificate.location": "/tls/me.pem",
        "ssl.key.location": "/tls/me.pem",
        "ssl.key.password": SECRET,
    }


@pytest.mark.parametrize(
    ("props", "named"),
    [
        ({"ssl.truststore.location": "/t.jks", "ssl.truststore.password": SECRET},
         "ssl.truststore.type"),
        ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
          "ssl.truststore.password": SECRET}, "ssl.truststore.password"),
        ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/k",
          "ssl.keystore.password": SECRET}, "ssl.keystore.type"),
        ({"ssl.keystore.location": "/keystore", "ssl.keystore.password": SECRET},
         "ssl.keystore.type"),
        ({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config":
          "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
          f'clientSecret="{SECRET}";'}, "sasl.jaas.config"),
        ({"sasl.mechanism": "GSSAPI",
          "sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, "a", SECRET)}, "sasl.mechanism"),
        ({"sasl.mechanism": "PLAIN",
          "sasl.jaas.config": f'{PLAIN_LOGIN_MODULE} required username="a" password="{SECRET}'},
         "sasl.jaas.config"),
        ({"sasl.mechanism": "PLAIN", "sasl.jaas.config":
          f'{PLAIN_LOGIN_MODULE} required username="a" password="{SECRET}" extra="{SECRET}";'},
         "sasl.jaas.config"),
        ({"ssl.protocol": SECRET}, "ssl.protocol"),
        ({"bootstrap.servers": "h:1"}, "bootstrap.servers"),
        ({"security.protocol": f"x{SECRET}"}, "security.protocol"),
    ],
)  # fmt: skip
def test_unsupported_properties_are_named_and_their_values_never_shown(
    props: dict[str, str], named: str
) -> None:
    with pytest.raises(ClientPropertyError) as refused:
        to_librdkafka(props, source="/etc/client.properties")
    assert refused.value.property == named
    assert repr(named) in str(refused.value)
    assert "/etc/client.properties" in str(refused.value)
    for value in props.values():
        if len(value) > 5 and value not in ("PKCS12", "/ca.pem"):
            assert value not in str(refused.value)
    assert SECRET not in str(refused.value)


def test_librdkafka_settings_become_spark_kafka_options() -> None:
    scram = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
    }
    java = to_java(scram)
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, "alice", SECRET),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/tls/ca.pem",
    }
    # The JAAS value quotes and escapes the password: parsing it gives it back.
    assert parse_jaas_login(java["sasl.jaas.config"])[1]["password"] == SECRET
    # And back again: the round trip is the identity.
    assert to_librdkafka(java) == scram
    mtls = {
        "security.protocol": "SSL",
        "ssl.keystore.location": "/tls/carol.p12",
        "ssl.keystore.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
    }
    assert to_java(mtls) == {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": "/tls/carol.p12",
        "ssl.keystore.password": SECRET,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/tls/ca.pem",
    }
    assert to_java({"ssl.certificate.location": "/a.pem", "ssl.key.location": "/a.pem"}) == {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": "/a.pem",
    }


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"statistics.interval.ms": "1000"}, "statistics.interval.ms"),
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "a", "sasl.password": SECRET},
         "sasl.mechanism"),
        ({"sasl.password": SECRET}, "sasl.password"),
        ({"ssl.certificate.location": "/a.pem", "ssl.key.location": "/b.key"},
         "ssl.certificate.location"),
    ],
)  # fmt: skip
def test_what_the_java_client_cannot_take_is_named(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ClientPropertyError) as refused:
        to_java(settings)
    assert refused.value.property == named
    assert SECRET not in str(refused.value)


def test_spark_jobs_read_the_environment_and_a_command_config(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        f"sasl.jaas.config={jaas_login(SCRAM_LOGIN_MODULE, 'bob', 'b0b-secret-pw')}\n"
        "ssl.truststore.type=PEM\nssl.truststore.location=/tls/ca.pem\n"
    )
    env = {
        "BRIDGE_KAFKA_CLIENT_ID": "ingest",
        "BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS": "60000",  # a coordinator setting: skipped
        "BRIDGE_COMMAND_CONFIG": str(props),
    }
    assert kafka_env_properties(env) == {"client.id": "ingest"}
    options = kafka_security_options(environ=env)
    assert options == {
        "kafka.client.id": "ingest",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, "bob", "b0b-secret-pw"),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/tls/ca.pem",
    }
    source = kafka_options("h:1", topics=["t"], security=options)
    assert source["kafka.bootstrap.servers"] == "h:1"
    assert source["kafka.isolation.level"] == "read_committed"
    assert source["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    args = parser().parse_args(
        ["--output", "o", "--checkpoint", "c", "--command-config", str(props)]
    )
    config = config_from_args(args)
    assert config.security is not None
    assert config.security["kafka.security.protocol"] == "SASL_SSL"
    assert "b0b-secret-pw" not in repr(config)
    assert "b0b-secret-pw" not in repr(IngestConfig("h:1", "o", "c", security=options))
    assert masked(options)["kafka.sasl.jaas.config"] == "***"


def _run_client_config(args: list[str], env: dict[str, str]) -> object:
    seen: dict[str, object] = {}

    @click.command()
    @bootstrap_option("Kafka.")
    @click.pass_context
    def show(ctx: click.Context, bootstrap_servers: str | None) -> None:
        ctx.ensure_object(dict)
        seen["config"] = client_config(ctx, bootstrap_servers)

    show.main(args, standalone_mode=False, obj={"namespace": None}, prog_name="x")
    return seen["config"]


def test_command_config_is_merged_into_the_client_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "security.protocol=SSL\nssl.keystore.type=PKCS12\n"
        "ssl.keystore.location=/tls/carol.p12\n"
        # A backslash is an escape in a properties file.
        f"ssl.keystore.password={SECRET_IN_FILE}\n"
        "ssl.truststore.type=PEM\nssl.truststore.location=/tls/ca.pem\n"
    )
    monkeypatch.delenv("BRIDGE_COMMAND_CONFIG", raising=False)
    monkeypatch.setenv("BRIDGE_KAFKA_CLIENT_ID", "from-env")
    monkeypatch.setenv("BRIDGE_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    config = _run_client_config(["-b", "h:9", "--command-config", str(props)], {})
    assert getattr(config, "bootstrap_servers") == "h:9"  # noqa: B009
    kafka = dict(getattr(config, "kafka"))  # noqa: B009
    assert kafka == {
        "client.id": "from-env",
        "security.protocol": "SSL",  # the file wins over BRIDGE_KAFKA_*
        "ssl.keystore.location": "/tls/carol.p12",
        "ssl.keystore.password": SECRET,
        "ssl.ca.location": "/tls/ca.pem",
    }
    assert SECRET not in repr(config)
    # The environment variable names the file too.
    monkeypatch.setenv("BRIDGE_COMMAND_CONFIG", str(props))
    config = _run_client_config(["-b", "h:9"], {})
    assert dict(getattr(config, "kafka"))["security.protocol"] == "SSL"  # noqa: B009


def test_a_bad_command_config_is_a_typed_error_without_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(f"ssl.truststore.location=/t.jks\nssl.truststore.password={SECRET}\n")
    monkeypatch.delenv("BRIDGE_COMMAND_CONFIG", raising=False)
    with pytest.raises(ClientPropertyError) as refused:
        _run_client_config(["--command-config", str(props)], {})
    assert refused.value.property == "ssl.truststore.type"
    assert str(props) in str(refused.value)
    assert SECRET not in str(refused.value)


def test_formatted_properties_read_back_the_same() -> None:
    props = {
        "sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, "alice", SECRET),
        "odd key=:#": " leading space\ttab\nnewline \\ back",
        "!bang": "#hash",
    }
    assert parse_properties(format_properties(props)) == props
