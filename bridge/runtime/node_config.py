"""Where and how one local Kafka node runs (:class:`LocalKafkaConfig`, checked as it is
made), the free ports and cluster ids a node picks for what is not configured, and the
``server.properties`` it runs with (:func:`server_property_map`)."""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.errors import InvalidArgumentError
from bridge.runtime.certs import TlsFiles
from bridge.runtime.node_security import (
    check_identities,
    secured_listeners,
    security_properties,
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    """True if something listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def new_cluster_id() -> str:
    """A new random cluster id."""
    # Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, unpadded; like Kafka's
    # Uuid.randomUuid(), never one starting with "-" (command lines would take it for a flag).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def valid_cluster_id(cluster_id: str) -> bool:
    """True if ``cluster_id`` is a Kafka ``Uuid`` string (16 bytes, URL-safe base64, unpadded)."""
    if len(cluster_id) != 22 or cluster_id.startswith("-"):
        return False
    try:
        return len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    except ValueError:
        return False


PORT_FIELDS = ("port", "controller_port", "proxied_port", "proxied_advertised_port", "ssl_port")
"""The port fields of :class:`LocalKafkaConfig`, as named in ``broker.json``."""


JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
"""The local broker's JVM options, a single node's and every cluster node's. The JVMs share a few
cores with the clients: the serial collector has no concurrent GC threads and the C1 compiler
alone no C2 compile threads. Measured on a shared 2-core machine: a single node starts on 6-7 s
of CPU (11-13 s with the JVM's defaults, G1 and C1+C2) and spends 2.2-2.6 s of CPU on 1,000,000
idempotent sends (6.3-7.4 s with the defaults), sending them faster; three nodes cold-start in
7-9 s (16-17 s with the defaults), and spend 8 s of CPU on 300,000 acks=all sends to a topic
with replication factor 3 (16-17 s with C2 as well), at the same throughput."""


@dataclass(frozen=True, slots=True)
class LocalKafkaConfig:
    """Where and how the local node runs. A port of 0 picks a free one (then remembered)."""

    data_dir: Path
    port: int = 0
    """The client (PLAINTEXT) port, also used between brokers."""
    controller_port: int = 0
    """The CONTROLLER listener's port; with :attr:`voters` it is ``voters[node_id]``."""
    heap_mb: int = 512
    """JVM heap, MiB."""
    start_timeout_ms: int = 90_000
    """How long to wait for the broker to answer after starting it, ms."""
    stop_timeout_ms: int = 30_000
    """How long a clean stop may take before the process is killed, ms."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Extra ``server.properties`` entries (they win over the generated ones)."""
    node_id: int = 1
    """This node's ``node.id``."""
    voters: Mapping[int, int] = field(default_factory=dict)
    """The static controller quorum: node id -> CONTROLLER port on 127.0.0.1, this node
    included. Empty: this node is the only voter."""
    cluster_id: str | None = None
    """The cluster id storage is formatted with (every node of a cluster shares one).
    None: a new one, remembered in ``broker.json``."""
    proxied: bool = False
    """Add the PROXIED client listener: it binds :attr:`proxied_port` and advertises
    :attr:`proxied_advertised_port` (where a fault proxy is to listen)."""
    proxied_port: int = 0
    """The port the PROXIED listener binds (0: a free one, remembered)."""
    proxied_advertised_port: int = 0
    """The port the PROXIED listener advertises (0: a free one, remembered)."""
    jvm_options: tuple[str, ...] = JVM_OPTIONS
    """JVM options (after the heap settings)."""
    secured: bool = False
    """Run secured: the client listener on :attr:`port` is SASL_SSL (SCRAM-SHA-512, the users
    of :attr:`scram_users`), a second one on :attr:`ssl_port` is SSL with client certificates
    required (mTLS: the :attr:`tls_clients`' certificates, and the broker's own, which also
    carries inter-broker and controller traffic), and ``StandardAuthorizer`` allows only what
    an ACL allows (``allow.everyone.if.no.acl.found=false``) except to the super users. There
    is no PLAINTEXT listener. Certificates are made at the first start (JDK ``keytool``) in
    :attr:`tls_dir`."""
    ssl_port: int = 0
    """With :attr:`secured`: the mTLS (SSL) listener's port (0: a free one, remembered)."""
    scram_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    """With :attr:`secured`: SCRAM-SHA-512 users, name -> password (8-128 printable ASCII
    characters, none of ``" , = [ ]`` or space), created when the storage is formatted (and
    created or updated at each later start). Principal ``User:<name>``. Never printed."""
    tls_clients: tuple[str, ...] = ()
    """With :attr:`secured`: names of the client certificates to make (``CN=<name>``, principal
    ``User:<name>``), one PKCS#12 keystore each (:meth:`LocalKafka.client_settings`)."""
    super_users: tuple[str, ...] = ()
    """With :attr:`secured`: user names (SCRAM or certificate) that are super users, besides
    the broker's own identity."""
    tls_dir: Path | None = None
    """With :attr:`secured`: where the certificates are (None: ``<data_dir>/tls``); the nodes
    of a cluster share one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        object.__setattr__(self, "voters", MappingProxyType(dict(self.voters)))
        object.__setattr__(self, "jvm_options", tuple(self.jvm_options))
        for name in PORT_FIELDS:
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgumentError(f"{name} must be 0..65535, got {value}")
        if self.heap_mb < 128:
            raise InvalidArgumentError(f"heap_mb must be at least 128, got {self.heap_mb}")
        if self.start_timeout_ms <= 0 or self.stop_timeout_ms <= 0:
            raise InvalidArgumentError("start_timeout_ms and stop_timeout_ms must be positive")
        if not 0 <= self.node_id <= 2**31 - 1:
            raise InvalidArgumentError(f"node_id must be 0..2147483647, got {self.node_id}")
        self._check_voters()
        if self.cluster_id is not None and not valid_cluster_id(self.cluster_id):
            raise InvalidArgumentError(
                f"cluster_id must be a Kafka Uuid (22 URL-safe base64 characters, not starting "
                f"with '-'), got {self.cluster_id!r}"
            )
        if not self.proxied and (self.proxied_port or self.proxied_advertised_port):
            raise InvalidArgumentError("proxied_port and proxied_advertised_port need proxied=True")
        object.__setattr__(self, "scram_users", MappingProxyType(dict(self.scram_users)))
        object.__setattr__(self, "tls_clients", tuple(self.tls_clients))
        object.__setattr__(self, "super_users", tuple(self.super_users))
        if self.tls_dir is not None:
            object.__setattr__(self, "tls_dir", Path(self.tls_dir))
        self._check_security()

    def _check_security(self) -> None:
        if not self.secured:
            if (
                self.ssl_port
                or self.scram_users
                or self.tls_clients
                or self.super_users
                or self.tls_dir is not None
            ):
                raise InvalidArgumentError(
                    "ssl_port, scram_users, tls_clients, super_users and tls_dir need secured=True"
                )
            return
        if self.proxied:
            raise InvalidArgumentError("a secured broker has no PROXIED listener")
        check_identities(self.scram_users, (*self.tls_clients, *self.super_users))

    def _check_voters(self) -> None:
        if not self.voters:
            return
        if self.node_id not in self.voters:
            raise InvalidArgumentError(
                f"voters {dict(self.voters)} must include this node's id {self.node_id}"
            )
        for voter, vport in self.voters.items():
            if voter < 0 or not 1 <= vport <= 65535:
                raise InvalidArgumentError(
                    f"voters must map node ids >= 0 to ports 1..65535, got {voter}: {vport}"
                )
        own = self.voters[self.node_id]
        if self.controller_port and self.controller_port != own:
            raise InvalidArgumentError(
                f"controller_port {self.controller_port} differs from this node's voter port "
                f"{own}: give one of them"
            )


def node_state(config: LocalKafkaConfig, remembered: Mapping[str, Any]) -> dict[str, Any]:
    """What ``broker.json`` holds for the node ``config`` describes: the ``remembered``
    entries, with every port and the cluster id ``config`` sets winning, and a free port or a
    new cluster id for what neither has."""
    state = dict(remembered)
    configured = {
        "port": config.port,
        "controller_port": config.voters.get(config.node_id, config.controller_port),
        "proxied_port": config.proxied_port,
        "proxied_advertised_port": config.proxied_advertised_port,
        "ssl_port": config.ssl_port,
    }
    wanted = [
        name
        for name in PORT_FIELDS
        if not (name.startswith("proxied") and not config.proxied)
        and not (name == "ssl_port" and not config.secured)
    ]
    for name in wanted:
        # An explicitly configured port wins over the remembered one.
        if configured[name]:
            state[name] = configured[name]
    taken = {state[name] for name in wanted if state.get(name)}
    for name in wanted:
        if not state.get(name):
            # Each listener its own port: the kernel may hand out a port just released again.
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            state[name] = port
    if config.cluster_id is not None:
        state["cluster_id"] = config.cluster_id
    elif "cluster_id" not in state:
        state["cluster_id"] = new_cluster_id()
    return state


def tls_files(config: LocalKafkaConfig) -> TlsFiles:
    """Where the certificates of the node ``config`` describes are (or will be made)."""
    return TlsFiles(config.tls_dir or config.data_dir / "tls")


def server_property_map(config: LocalKafkaConfig, state: Mapping[str, Any]) -> dict[str, str]:
    """The ``server.properties`` entries of the node ``config`` describes, on the ports of
    ``state`` (``broker.json``), in file order."""
    port, cport = state["port"], state["controller_port"]
    node_id = config.node_id
    voters = dict(config.voters) or {node_id: cport}
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}"
    advertised = f"PLAINTEXT://127.0.0.1:{port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    if config.proxied:
        listeners += f",PROXIED://127.0.0.1:{state['proxied_port']}"
        advertised += f",PROXIED://127.0.0.1:{state['proxied_advertised_port']}"
        protocols += ",PROXIED:PLAINTEXT"
    inter_broker = "PLAINTEXT"
    if config.secured:
        listeners, advertised, protocols, inter_broker = secured_listeners(
            port, state["ssl_port"], cport
        )
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(
            f"{voter}@127.0.0.1:{vport}" for voter, vport in sorted(voters.items())
        ),
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": protocols,
        "inter.broker.listener.name": inter_broker,
        "log.dirs": str(config.data_dir / "kraft"),
        # A single node: without these the transaction coordinator never comes up.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
    }
    if config.secured:
        props.update(security_properties(tls_files(config), config.super_users))
    props.update(config.properties)
    return props


def render_properties(props: Mapping[str, str]) -> str:
    """``props`` as a ``.properties`` file, one ``key=value`` line each."""
    return "".join(f"{k}={v}\n" for k, v in props.items())


def internal_partitions(props: Mapping[str, str]) -> tuple[int, int]:
    """The partition counts of ``__consumer_offsets`` and ``__transaction_state`` that
    ``props`` configure (Kafka's default, 50, where nothing sets them)."""
    return (
        int(props.get("offsets.topic.num.partitions", "50")),
        int(props.get("transaction.state.log.num.partitions", "50")),
    )
