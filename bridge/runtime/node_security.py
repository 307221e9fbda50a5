"""The opt-in secured mode of a local Kafka node: its listeners, TLS and SASL settings, the
authorizer and its super users, SCRAM users, and the client settings that reach it.

A secured node has no PLAINTEXT listener: clients with a SCRAM-SHA-512 password use SASL_SSL on
the client port; clients with a certificate (and the nodes among themselves, and to the
controllers) use SSL with client certificates required (mTLS) on a second port.
``StandardAuthorizer`` allows only what an ACL allows, except to the super users. The
certificates come from :mod:`bridge.runtime.certs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from bridge.errors import BrokerStartError, InvalidArgumentError
from bridge.runtime.certs import TlsFiles, check_identity_name

BROKER_PRINCIPAL = "bridge-local-broker"
"""The secured broker's own identity: its certificate's common name and its principal
(``User:bridge-local-broker``), a super user. No client identity may take this name."""
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_MECHANISM = "SCRAM-SHA-512"
# SCRAM passwords go into `kafka-storage format --add-scram 'SCRAM-SHA-512=[name=N,password=P]'`,
# whose parser splits on these: printable ASCII without them keeps every password intact.
_SCRAM_PASSWORD = re.compile(r"[!#-+\--<>-Z\\^-~]{8,128}")


def check_identities(scram_users: Mapping[str, str], names: Iterable[str]) -> None:
    """Refuse (:class:`InvalidArgumentError`) an identity name that cannot be a principal or is
    the broker's own, and a SCRAM password the storage tool would split; ``names`` are the
    other identities (certificates, super users). No message holds a password."""
    for name in (*scram_users, *names):
        check_identity_name(name)
        if name == BROKER_PRINCIPAL:
            raise InvalidArgumentError(
                f"{name!r} is the broker's own identity (a super user): use another name"
            )
    for name, password in scram_users.items():
        # The message never holds the password, only what is wrong with it.
        if not isinstance(password, str) or not _SCRAM_PASSWORD.fullmatch(password):
            raise InvalidArgumentError(
                f"the SCRAM password of user {name!r} must be 8-128 printable ASCII "
                f"characters without spaces, '\"', ',', '=', '[' or ']'"
            )


def secured_listeners(port: int, ssl_port: int, controller_port: int) -> tuple[str, str, str, str]:
    """``listeners``, ``advertised.listeners``, ``listener.security.protocol.map`` and
    ``inter.broker.listener.name`` of a secured node: SASL_SSL on ``port``, SSL (mTLS) on
    ``ssl_port``, the CONTROLLER listener over SSL on ``controller_port``."""
    listeners = f"SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{ssl_port}"
    listeners += f",CONTROLLER://127.0.0.1:{controller_port}"
    advertised = f"SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{ssl_port}"
    protocols = "CONTROLLER:SSL,SASL_SSL:SASL_SSL,SSL:SSL"
    return listeners, advertised, protocols, "SSL"


def security_properties(tls: TlsFiles, super_users: Iterable[str]) -> dict[str, str]:
    """A secured node's TLS, SASL and authorizer settings (the store password in them is
    also in ``tls/secrets.json``; both stay in the data directory). The broker's own identity
    is the first super user, then ``super_users``."""
    password = tls.password
    supers = [BROKER_PRINCIPAL, *super_users]
    return {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(tls.keystore(BROKER_PRINCIPAL)),
        "ssl.keystore.password": password,
        "ssl.key.password": password,
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(tls.truststore),
        "ssl.truststore.password": password,
        # mTLS on the SSL and CONTROLLER listeners; SASL_SSL authenticates by SCRAM.
        "ssl.client.auth": "required",
        "listener.name.sasl_ssl.ssl.client.auth": "none",
        # A certificate's principal is its common name: CN=alice is User:alice.
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": ";".join(f"User:{name}" for name in dict.fromkeys(supers)),
    }


def client_settings(
    tls: TlsFiles, tls_clients: Iterable[str], user: str, password: str | None = None
) -> dict[str, str]:
    """librdkafka settings (without ``bootstrap.servers``) for ``user``: with a ``password``,
    SASL_SSL with SCRAM-SHA-512; without, SSL with ``user``'s certificate (one of
    ``tls_clients``, or the broker's own identity; else :class:`InvalidArgumentError`)."""
    settings = {"ssl.ca.location": str(tls.ca_pem)}
    if password is not None:
        return {
            **settings,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
        }
    clients = list(tls_clients)
    if user != BROKER_PRINCIPAL and user not in clients:
        raise InvalidArgumentError(
            f"no certificate for {user!r}: the broker's tls_clients are {clients}"
        )
    return {
        **settings,
        "security.protocol": "SSL",
        "ssl.keystore.location": str(tls.keystore(user)),
        "ssl.keystore.password": tls.password,
    }


def scram_format_args(scram_users: Mapping[str, str]) -> list[str]:
    """The storage tool's ``--add-scram`` arguments that create ``scram_users`` (name ->
    password) as the storage is formatted (the credentials go into the metadata log)."""
    return [
        arg
        for name, password in sorted(scram_users.items())
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
    ]


def redact(text: str, scram_users: Mapping[str, str]) -> str:
    """``text`` with every password of ``scram_users`` replaced by ``***``."""
    for password in scram_users.values():
        text = text.replace(password, "***")
    return text


def upsert_scram_users(admin: AdminClient, scram_users: Mapping[str, str]) -> None:
    """Create or update every user of ``scram_users`` (name -> password) through ``admin``.
    Raises :class:`BrokerStartError` naming the user the broker refused (never the
    password)."""
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            name,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
            password.encode(),
        )
        for name, password in sorted(scram_users.items())
    ]
    for name, future in admin.alter_user_scram_credentials(upserts).items():
        try:
            future.result()
        except KafkaException as exc:
            raise BrokerStartError(
                f"the broker refused SCRAM credentials for user {name!r}: "
                f"{redact(str(exc), scram_users)}"
            ) from None
