"""Kafka client security settings in the two dialects the project meets: librdkafka's (the
Python clients, ``BRIDGE_KAFKA_*``) and the Java client's (Kafka's tools, a
``--command-config`` properties file, Spark's ``kafka.``-prefixed source options).

Pure functions, no I/O except :func:`read_properties_file`:

* :func:`read_properties_file` parses a Java ``.properties`` file;
* :func:`to_librdkafka` turns a properties file's settings (librdkafka names or the Java names
  people put in such files) into librdkafka settings;
* :func:`to_java` turns librdkafka settings into the Java client's (for Spark, each key then
  gets the ``kafka.`` prefix: :func:`spark_kafka_options`);
* :func:`kafka_env_properties` reads the ``BRIDGE_KAFKA_*`` variables as ``ClientConfig.from_env``
  does, for the processes that cannot import the bridge (the Spark jobs).

A setting that cannot be mapped raises :class:`ClientPropertyError` naming the property (and
what to use instead); no message ever holds a setting's value, since many are secrets. The two
text formats it reads live apart, each beside its own rules: Java's ``.properties`` in
:mod:`topics.java_properties`, the ``sasl.jaas.config`` value in :mod:`topics.jaas` (their
functions are importable from here too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from topics.errors import ClientPropertyError
from topics.jaas import jaas_login, parse_jaas_login
from topics.java_properties import (
    Properties,
    format_properties,
    parse_properties,
    read_properties_file,
)

__all__ = [
    "COMMON_PROPERTIES",
    "ENV_COMMAND_CONFIG",
    "ENV_KAFKA_PREFIX",
    "LIBRDKAFKA_SECURITY",
    "NOT_CLIENT_ENV",
    "PLAIN_LOGIN_MODULE",
    "SCRAM_LOGIN_MODULE",
    "SCRAM_MECHANISMS",
    "ClientPropertyError",
    "Properties",
    "client_settings",
    "format_properties",
    "is_secret",
    "jaas_login",
    "kafka_env_properties",
    "masked",
    "parse_jaas_login",
    "parse_properties",
    "read_properties_file",
    "spark_kafka_options",
    "to_java",
    "to_librdkafka",
]
"""With what :mod:`topics.java_properties` and :mod:`topics.jaas` define, importable from
here as before."""

ENV_KAFKA_PREFIX: Final = "BRIDGE_KAFKA_"
"""``BRIDGE_KAFKA_<PROPERTY>`` sets ``ClientConfig.kafka``: any librdkafka property, upper case
with ``_`` for ``.`` (``BRIDGE_KAFKA_SECURITY_PROTOCOL=SASL_SSL``), except the protected ones
(refused with an ``InvalidArgumentError`` that says why and what to use instead) and
``BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS`` (a coordinator setting). Producers skip consumer-only
properties such as ``session.timeout.ms``, and consumers producer-only ones; a property
librdkafka refuses is an ``InvalidArgumentError`` naming it."""
ENV_COMMAND_CONFIG: Final = "BRIDGE_COMMAND_CONFIG"
"""The environment variable naming a client properties file (the ``--command-config``)."""
NOT_CLIENT_ENV: Final = frozenset({"BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS"})
"""``BRIDGE_KAFKA_`` variables that are coordinator settings, not client properties."""

SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_LOGIN_MODULE: Final = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN_MODULE: Final = "org.apache.kafka.common.security.plain.PlainLoginModule"
_LOGIN_MODULES: Final = {SCRAM_LOGIN_MODULE: SCRAM_MECHANISMS, PLAIN_LOGIN_MODULE: ("PLAIN",)}

# Same name and meaning in librdkafka and in the Java client.
COMMON_PROPERTIES: Final = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.kerberos.service.name",
        "client.id",
        "metadata.max.age.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "socket.connection.setup.timeout.ms",
        "connections.max.idle.ms",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "fetch.min.bytes",
        "fetch.max.bytes",
    }
)
"""Client properties with the same name and value in both dialects."""

# librdkafka-only security names a properties file may use as they are.
LIBRDKAFKA_SECURITY: Final = frozenset(
    {
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.ca.pem",
        "ssl.certificate.location",
        "ssl.certificate.pem",
        "ssl.key.location",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
    }
)
"""librdkafka security properties :func:`to_librdkafka` accepts as they are."""

_PROPERTY_NAME: Final = re.compile(r"(?=.{1,64}$)[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+")
"""What a client property's name looks like (lower case, dotted, at most 64 characters); any
other unknown key is not printed: it may be a line of a pasted PEM key (base64 has no dots) or
the tail of a value broken over lines."""

_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def is_secret(name: str) -> bool:
    """True for a property (either dialect) whose value is a secret: passwords, private keys,
    JAAS configs (they hold passwords), OAUTHBEARER configs, client secrets."""
    lowered = name.lower()
    return (
        "password" in lowered
        or "secret" in lowered
        or "jaas" in lowered
        or lowered.endswith(("ssl.key.pem", "ssl.keystore.key", "sasl.oauthbearer.config"))
    )


def masked(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with every secret value (:func:`is_secret`) replaced by ``***``."""
    return {k: "***" if is_secret(k) else v for k, v in settings.items()}


# --- Java -> librdkafka ----------------------------------------------------------------------


def _store_type(props: Mapping[str, str], kind: str) -> str:
    """The type of the ``kind`` (keystore or truststore) store: ``ssl.<kind>.type``, else
    guessed from the file name's extension."""
    given = props.get(f"ssl.{kind}.type")
    if given:
        return given.strip().upper()
    location = props.get(f"ssl.{kind}.location", "")
    suffix = Path(location).suffix.lower()
    if suffix in (".p12", ".pfx"):
        return "PKCS12"
    if suffix in (".pem", ".crt", ".cer"):
        return "PEM"
    if suffix == ".jks":
        return "JKS"
    raise ClientPropertyError(
        f"ssl.{kind}.type", f"not given, and the {kind} file's name does not say (PKCS12 or PEM)"
    )


def _java_truststore(props: Mapping[str, str], out: dict[str, str]) -> None:
    names = {"ssl.truststore.location", "ssl.truststore.certificates"} & props.keys()
    if not names and "ssl.truststore.type" not in props:
        if "ssl.truststore.password" in props:
            raise ClientPropertyError("ssl.truststore.password", "given without a trust store")
        return
    kind = _store_type(props, "truststore") if names else "PEM"
    if kind != "PEM":
        raise ClientPropertyError(
            "ssl.truststore.type",
            f"{kind} trust stores cannot be read by the Python clients (librdkafka); give the "
            "certificate authority as PEM: ssl.truststore.type=PEM with ssl.truststore.location "
            "(or ssl.ca.location)",
        )
    if "ssl.truststore.password" in props:
        raise ClientPropertyError(
            "ssl.truststore.password", "a PEM trust store has no password: leave it out"
        )
    if "ssl.truststore.location" in props:
        out["ssl.ca.location"] = props["ssl.truststore.location"]
    if "ssl.truststore.certificates" in props:
        out["ssl.ca.pem"] = props["ssl.truststore.certificates"]


def _java_keystore(props: Mapping[str, str], out: dict[str, str]) -> None:
    names = {"ssl.keystore.location", "ssl.keystore.key", "ssl.keystore.certificate.chain"}
    if not names & props.keys():
        if "ssl.keystore.type" in props:
            return
        if "ssl.keystore.password" in props:
            raise ClientPropertyError("ssl.keystore.password", "given without a key store")
        return
    if "ssl.keystore.location" not in props:  # PEM given inline
        if {"ssl.keystore.key", "ssl.keystore.certificate.chain"} - props.keys():
            raise ClientPropertyError(
                "ssl.keystore.key", "needs ssl.keystore.certificate.chain with it (both PEM)"
            )
        out["ssl.key.pem"] = props["ssl.keystore.key"]
        out["ssl.certificate.pem"] = props["ssl.keystore.certificate.chain"]
        return
    kind = _store_type(props, "keystore")
    location = props["ssl.keystore.location"]
    if kind == "PKCS12":
        out["ssl.keystore.location"] = location
        if "ssl.keystore.password" in props:
            out["ssl.keystore.password"] = props["ssl.keystore.password"]
    elif kind == "PEM":
        if "ssl.keystore.password" in props:
            raise ClientPropertyError(
                "ssl.keystore.password",
                "a PEM key store has no store password (the key's is ssl.key.password)",
            )
        out["ssl.certificate.location"] = location
        out["ssl.key.location"] = location
    else:
        raise ClientPropertyError(
            "ssl.keystore.type",
            f"{kind} key stores cannot be read by the Python clients (librdkafka); convert it "
            "to PKCS12 (keytool -importkeystore -deststoretype PKCS12) or PEM",
        )


# Read by _java_sasl, _java_truststore and _java_keystore (the key store's two names mean the
# same in both dialects, with the store's type deciding what librdkafka gets).
_JAVA_ONLY: Final = frozenset(
    {
        "ssl.keystore.location",
        "ssl.keystore.password",
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.truststore.password",
        "ssl.truststore.certificates",
        "ssl.keystore.type",
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
    }
)


def _java_sasl(props: Mapping[str, str], out: dict[str, str]) -> None:
    if "sasl.jaas.config" not in props:
        return
    module, options = parse_jaas_login(props["sasl.jaas.config"])
    mechanisms = _LOGIN_MODULES.get(module)
    if mechanisms is None:
        raise ClientPropertyError(
            "sasl.jaas.config",
            f"login module {module!r} is not supported; supported: "
            f"{', '.join(sorted(_LOGIN_MODULES))} (username and password)",
        )
    for option in options:
        if option not in ("username", "password"):
            raise ClientPropertyError(
                "sasl.jaas.config",
                f"option {option!r} of {module.rsplit('.', 1)[-1]} is not supported",
            )
    if {"username", "password"} - options.keys():
        raise ClientPropertyError("sasl.jaas.config", "needs both username and password")
    mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "").upper()
    if mechanism not in mechanisms:
        raise ClientPropertyError(
            "sasl.mechanism",
            f"{module.rsplit('.', 1)[-1]} needs sasl.mechanism {' or '.join(mechanisms)}",
        )
    if {"sasl.username", "sasl.password"} & props.keys():
        raise ClientPropertyError(
            "sasl.jaas.config", "give either it or sasl.username and sasl.password, not both"
        )
    out["sasl.username"] = options["username"]
    out["sasl.password"] = options["password"]


def to_librdkafka(props: Mapping[str, str], source: str = "") -> dict[str, str]:
    """librdkafka settings from a client properties file's ``props``: librdkafka's names (the
    :data:`COMMON_PROPERTIES` and :data:`LIBRDKAFKA_SECURITY`) kept, the Java client's
    (``sasl.jaas.config`` with a SCRAM or PLAIN login, ``ssl.truststore.*`` of type PEM,
    ``ssl.keystore.*`` of type PKCS12 or PEM) translated. Anything else, or a setting
    librdkafka cannot honour, is a :class:`ClientPropertyError` naming it (``source``, e.g.
    the file, is named too)."""
    try:
        return _to_librdkafka(props, source)
    except ClientPropertyError as exc:
        if not source or exc.shown:  # a shown place already names the source
            raise
        raise ClientPropertyError(exc.property, exc.reason, source) from None


_JAVA_BLANKS: Final = "".join(chr(c) for c in range(0x21))
"""What Java's String.trim strips (every character up to and including the space)."""


def _unknown(name: str, props: Mapping[str, str], source: str) -> ClientPropertyError:
    reason = (
        "unknown or not supported here; supported: security.protocol, sasl.mechanism, "
        "sasl.jaas.config (SCRAM or PLAIN), ssl.truststore.* (PEM), ssl.keystore.* "
        "(PKCS12 or PEM), ssl.key.password, librdkafka's sasl.*/ssl.* names and "
        "client tuning shared by both clients"
    )
    if _PROPERTY_NAME.fullmatch(name):
        return ClientPropertyError(name, reason)
    # Not a property's name: likely a line of a pasted PEM key or the tail of a value broken
    # over lines (a secret); name where it is, never what it holds.
    lines = getattr(props, "lines", {})
    where = f"line {lines[name]}" if name in lines else "a line"
    in_file = f" of {source}" if source else " of the client properties"
    return ClientPropertyError(
        "",
        "not a property name (a value broken over lines? continue a line with '\\'); its "
        "text is not shown",
        shown=f"{where}{in_file}",
    )


def _to_librdkafka(props: Mapping[str, str], source: str = "") -> dict[str, str]:
    # Java trims the values of its settings (ConfigDef); a secret's value is kept as written
    # (a JAAS quoted value keeps its blanks; librdkafka's sasl.password is not Java's).
    original = props
    props = {k: v if is_secret(k) else v.strip(_JAVA_BLANKS) for k, v in props.items()}
    out: dict[str, str] = {}
    for name, value in props.items():
        if name == "bootstrap.servers":
            raise ClientPropertyError(
                name, "give the brokers with -b/--bootstrap-servers or KAFKA_BOOTSTRAP_SERVERS"
            )
        if name in _JAVA_ONLY:
            continue
        if name not in COMMON_PROPERTIES and name not in LIBRDKAFKA_SECURITY:
            raise _unknown(name, original, source)
        if name == "security.protocol":
            protocol = value.strip().upper()
            if protocol not in _PROTOCOLS:
                raise ClientPropertyError(name, f"must be one of {', '.join(_PROTOCOLS)}")
            out[name] = protocol
        elif name == "ssl.endpoint.identification.algorithm":
            algorithm = value.strip().lower()
            out[name] = "none" if algorithm in ("", "none") else algorithm
        else:
            out[name] = value
    _java_sasl(props, out)
    _java_truststore(props, out)
    _java_keystore(props, out)
    return out


# --- librdkafka -> Java ----------------------------------------------------------------------


def to_java(settings: Mapping[str, str]) -> dict[str, str]:
    """The Java client's settings for librdkafka ``settings``: ``sasl.username``/``password``
    become a ``sasl.jaas.config`` (SCRAM or PLAIN login module by ``sasl.mechanism``),
    ``ssl.ca.location``/``ssl.ca.pem`` a PEM trust store, ``ssl.keystore.*`` a PKCS12 key
    store, ``ssl.certificate.*`` with ``ssl.key.*`` a PEM key store. A setting with no Java
    counterpart is a :class:`ClientPropertyError` naming it."""
    out: dict[str, str] = {}
    mechanism = (settings.get("sasl.mechanism") or settings.get("sasl.mechanisms") or "").upper()
    for name, value in settings.items():
        if name in COMMON_PROPERTIES:
            out[name] = (
                value.strip().upper() if name in ("security.protocol", "sasl.mechanism") else value
            )
        elif name == "sasl.mechanisms":
            out["sasl.mechanism"] = value.strip().upper()
        elif name == "ssl.endpoint.identification.algorithm":
            out[name] = "" if value.strip().lower() == "none" else value.strip().lower()
        elif name not in LIBRDKAFKA_SECURITY:
            raise ClientPropertyError(
                name, "has no counterpart in the Java client (Spark's Kafka source)"
            )
    _java_login(settings, mechanism, out)
    if "ssl.ca.location" in settings or "ssl.ca.pem" in settings:
        out["ssl.truststore.type"] = "PEM"
        if "ssl.ca.location" in settings:
            out["ssl.truststore.location"] = settings["ssl.ca.location"]
        if "ssl.ca.pem" in settings:
            out["ssl.truststore.certificates"] = settings["ssl.ca.pem"]
    _java_client_key(settings, out)
    return out


def _java_login(settings: Mapping[str, str], mechanism: str, out: dict[str, str]) -> None:
    given = {"sasl.username", "sasl.password"} & settings.keys()
    if not given:
        return
    if len(given) == 1:
        raise ClientPropertyError(sorted(given)[0], "needs sasl.username and sasl.password both")
    if mechanism in SCRAM_MECHANISMS:
        module = SCRAM_LOGIN_MODULE
    elif mechanism == "PLAIN":
        module = PLAIN_LOGIN_MODULE
    else:
        raise ClientPropertyError(
            "sasl.mechanism",
            "a username and password map to the Java client only with SCRAM-SHA-256, "
            "SCRAM-SHA-512 or PLAIN",
        )
    out["sasl.jaas.config"] = jaas_login(
        module, settings["sasl.username"], settings["sasl.password"]
    )


def _java_client_key(settings: Mapping[str, str], out: dict[str, str]) -> None:
    if "ssl.keystore.location" in settings:
        if {"ssl.certificate.location", "ssl.certificate.pem"} & settings.keys():
            raise ClientPropertyError(
                "ssl.keystore.location", "give either a key store or a certificate, not both"
            )
        out["ssl.keystore.type"] = "PKCS12"
        out["ssl.keystore.location"] = settings["ssl.keystore.location"]
        if "ssl.keystore.password" in settings:
            out["ssl.keystore.password"] = settings["ssl.keystore.password"]
    elif "ssl.keystore.password" in settings:
        raise ClientPropertyError("ssl.keystore.password", "given without ssl.keystore.location")
    cert_file, key_file = settings.get("ssl.certificate.location"), settings.get("ssl.key.location")
    if cert_file or key_file:
        if cert_file != key_file:
            raise ClientPropertyError(
                "ssl.certificate.location" if cert_file else "ssl.key.location",
                "the Java client reads a PEM certificate and its key from one file: give "
                "ssl.certificate.location and ssl.key.location the same file, or a PKCS12 "
                "ssl.keystore.location",
            )
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.location"] = str(cert_file)
    cert_pem, key_pem = settings.get("ssl.certificate.pem"), settings.get("ssl.key.pem")
    if cert_pem or key_pem:
        if not (cert_pem and key_pem):
            raise ClientPropertyError(
                "ssl.certificate.pem" if cert_pem else "ssl.key.pem",
                "needs ssl.certificate.pem and ssl.key.pem both",
            )
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = cert_pem
        out["ssl.keystore.key"] = key_pem
    if "ssl.key.password" in settings:
        out["ssl.key.password"] = settings["ssl.key.password"]


def spark_kafka_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Spark Kafka source options (``kafka.``-prefixed Java client names) for librdkafka
    ``settings`` (:func:`to_java`)."""
    return {f"kafka.{name}": value for name, value in to_java(settings).items()}


# --- environment -----------------------------------------------------------------------------


def kafka_env_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties set by ``BRIDGE_KAFKA_<PROPERTY>`` variables (dots written as
    underscores), as ``ClientConfig.from_env`` reads them."""
    return {
        key[len(ENV_KAFKA_PREFIX) :].lower().replace("_", "."): value
        for key, value in environ.items()
        if key.startswith(ENV_KAFKA_PREFIX) and key not in NOT_CLIENT_ENV
    }


def client_settings(
    environ: Mapping[str, str], command_config: str | Path | None = None
) -> dict[str, str]:
    """The librdkafka client settings an entry point runs with: ``BRIDGE_KAFKA_*`` from
    ``environ``, then the properties file ``command_config`` (else the one
    ``BRIDGE_COMMAND_CONFIG`` names, if any), whose settings win."""
    settings = kafka_env_properties(environ)
    path = command_config or environ.get(ENV_COMMAND_CONFIG) or None
    if path:
        settings.update(to_librdkafka(read_properties_file(path), source=str(path)))
    return settings
