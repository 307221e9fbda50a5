"""``bridge broker``: the local Kafka broker, or a cluster of them, in the foreground; with
``--secured``, SASL_SSL (SCRAM-SHA-512) and mTLS listeners and an authorizer that allows only
what an ACL allows (see docs/security.md).

Secured users' passwords never go on the command line: ``--scram-users-file`` (a properties
file, ``name=password`` per line) or ``BRIDGE_SCRAM_USERS`` (``name=password,...``). Each
client gets a properties file (Java client names, for ``--command-config`` and Kafka's tools)
in ``<data dir>/clients/``, mode 0600: the command prints where they are, never a password.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import click

from bridge.cli.common import DEFAULT_LOCAL_PORT, console, stop_on_signals
from bridge.errors import InvalidArgumentError
from bridge.runtime.certs import TlsFiles
from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from bridge.runtime.jars import cache_dir
from bridge.runtime.local_kafka import BROKER_PRINCIPAL, LocalKafka, LocalKafkaConfig
from topics.client_security import (
    SCRAM_LOGIN_MODULE,
    format_properties,
    jaas_login,
    parse_properties,
)

ENV_SCRAM_USERS = "BRIDGE_SCRAM_USERS"
"""SCRAM users of ``bridge broker --secured``: ``name=password[,name=password...]``."""


def local_broker(data_dir: Path | None, port: int) -> LocalKafka:
    """The single-node local broker (``bridge up`` and ``bridge broker``)."""
    return LocalKafka(LocalKafkaConfig(data_dir=data_dir or cache_dir() / "broker", port=port))


def scram_users(users_file: Path | None, environ: Mapping[str, str]) -> dict[str, str]:
    """SCRAM users (name -> password) from ``users_file`` (properties: ``name=password``) and
    ``BRIDGE_SCRAM_USERS`` (``name=password,...``); the file wins for a name in both. Errors
    name the entry, never a password."""
    users: dict[str, str] = {}
    for i, entry in enumerate(filter(None, environ.get(ENV_SCRAM_USERS, "").split(",")), 1):
        name, sep, password = entry.strip().partition("=")
        if not sep or not name or not password:
            raise InvalidArgumentError(
                f"{ENV_SCRAM_USERS} entry {i} must be name=password (entries separated by ',')"
            )
        users[name] = password
    if users_file is not None:
        try:
            text = users_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read the SCRAM users file {users_file}") from exc
        for name, password in parse_properties(text).items():
            if not password:
                raise InvalidArgumentError(f"user {name!r} in {users_file} has no password")
            users[name] = password
    return users


def write_client_files(
    directory: Path, tls: TlsFiles, users: Mapping[str, str], tls_clients: tuple[str, ...]
) -> dict[str, Path]:
    """A client properties file (Java client names; ``--command-config`` and Kafka's tools
    read it) for each SCRAM user (SASL_SSL) and each certificate (SSL), in ``directory``
    (mode 0700; files 0600: they hold passwords). Returns name -> file."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca_pem)}
    files: dict[str, dict[str, str]] = {}
    for name, password in users.items():
        files[f"{name}.properties"] = {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": jaas_login(SCRAM_LOGIN_MODULE, name, password),
            **trust,
        }
    for name in tls_clients:
        files[f"{name}-mtls.properties"] = {
            "security.protocol": "SSL",
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(tls.keystore(name)),
            "ssl.keystore.password": tls.password,
            **trust,
        }
    out: dict[str, Path] = {}
    for file_name, props in files.items():
        path = directory / file_name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(format_properties(props))
        path.chmod(0o600)
        out[file_name.removesuffix(".properties")] = path
    return out


def _print_secured(kafka: LocalKafka | LocalKafkaCluster, tls: TlsFiles, clients: Path) -> None:
    console.print(f"SASL_SSL (SCRAM-SHA-512) {kafka.bootstrap_servers}")
    console.print(f"SSL (mTLS)               {kafka.mtls_bootstrap_servers}")
    console.print(f"CA certificate (PEM)     {tls.ca_pem}")
    console.print(f"trust store (PKCS12)     {tls.truststore}")
    console.print(f"key stores (PKCS12)      {tls.directory}/<name>.p12")
    console.print(f"store password in        {tls.directory}/secrets.json")
    console.print(f"client properties        {clients}/ (use with --command-config)")
    console.print(
        f"the broker's identity User:{BROKER_PRINCIPAL} (a super user) connects over mTLS "
        f"with {clients}/{BROKER_PRINCIPAL}-mtls.properties; grant ACLs with `bridge acls apply`"
    )


@click.command()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="Data directory [default: broker/, with --nodes N cluster-N/, --secured adds "
    "-secured, in the cache directory: BRIDGE_CACHE_DIR or .cache/].",
)
@click.option(
    "--port",
    type=int,
    default=DEFAULT_LOCAL_PORT,
    show_default=True,
    help="Client port (0: any free); with --nodes N, nodes use PORT..PORT+N-1.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Nodes, each a broker and a KRaft controller; with more than one the defaults (for "
    "internal topics too) are replication factor min(3, N), min.insync.replicas min(2, N-1).",
)
@click.option(
    "--secured",
    is_flag=True,
    help="SASL_SSL (SCRAM-SHA-512) on the client port, mTLS on another, ACLs enforced.",
)
@click.option(
    "--scram-users-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help=f"With --secured: SCRAM users, name=password per line [also env {ENV_SCRAM_USERS}: "
    "name=password,...].",
)
@click.option(
    "--tls-client",
    "tls_clients",
    multiple=True,
    help="With --secured: make a client certificate CN=NAME (principal User:NAME); repeatable.",
)
@click.option(
    "--super-user",
    "super_users",
    multiple=True,
    help="With --secured: a user (SCRAM or certificate) allowed everything; repeatable.",
)
def broker(  # noqa: PLR0917 - click passes every option as a parameter
    data_dir: Path | None,
    port: int,
    nodes: int,
    secured: bool,
    scram_users_file: Path | None,
    tls_clients: tuple[str, ...],
    super_users: tuple[str, ...],
) -> None:
    """Run only the local Kafka broker (or a cluster of them) in the foreground: print its
    bootstrap servers, run until Ctrl-C.

    With --secured, the SCRAM users come from --scram-users-file or BRIDGE_SCRAM_USERS, never
    from the command line; the command prints where the CA and the key stores are and writes
    a client properties file per user in <data dir>/clients/."""
    users = scram_users(scram_users_file, os.environ) if secured else {}
    if not secured and (scram_users_file or tls_clients or super_users):
        raise click.UsageError("--scram-users-file, --tls-client and --super-user need --secured")
    suffix = "-secured" if secured else ""
    security = {
        "secured": secured,
        "scram_users": users,
        "tls_clients": tls_clients,
        "super_users": super_users,
    }
    kafka: LocalKafka | LocalKafkaCluster
    if nodes == 1:
        directory = data_dir or cache_dir() / f"broker{suffix}"
        kafka = LocalKafka(LocalKafkaConfig(data_dir=directory, port=port, **security))  # type: ignore[arg-type]
    else:
        replication = min(3, nodes)
        kafka = LocalKafkaCluster(
            LocalClusterConfig(
                data_dir=data_dir or cache_dir() / f"cluster-{nodes}{suffix}",
                nodes=nodes,
                replication_factor=replication,
                min_insync_replicas=min(2, replication - 1),
                base_port=port,
                **security,  # type: ignore[arg-type]
            )
        )
        console.print(f"starting a local Kafka cluster of {nodes} nodes...")
    with stop_on_signals() as stop:
        kafka.start()
        try:
            console.print(
                f"Kafka {kafka.bootstrap_servers} (data in {kafka.data_dir}); Ctrl-C stops"
            )
            if secured:
                tls = kafka.tls if isinstance(kafka, LocalKafka) else kafka.node(1).tls
                clients = kafka.data_dir / "clients"
                write_client_files(clients, tls, users, (BROKER_PRINCIPAL, *tls_clients))
                _print_secured(kafka, tls, clients)
            stop.wait()
        finally:
            kafka.stop()
