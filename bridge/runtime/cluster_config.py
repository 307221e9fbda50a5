"""Where and how a local N-node Kafka cluster runs (:class:`LocalClusterConfig`), the
cluster-wide broker settings every node gets, ``cluster.json`` (the cluster id and every
node's ports) and each node's :class:`~bridge.runtime.node_config.LocalKafkaConfig`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.errors import InvalidArgumentError
from bridge.runtime.node_config import (
    JVM_OPTIONS,
    LocalKafkaConfig,
    free_port,
    new_cluster_id,
    valid_cluster_id,
)

BROKER_HEARTBEAT_INTERVAL_MS = 500
"""How often a broker heartbeats to the active controller, ms (Kafka's default: 2000)."""
BROKER_SESSION_TIMEOUT_MS = 4_000
"""How long the controller waits for a heartbeat before it fences a broker and moves its
leaderships, ms (Kafka's default: 9000). Short enough for a test to see a killed leader
replaced within seconds; long enough that a busy 2-core machine does not fence live brokers."""

_MAX_NODES = 9


@dataclass(frozen=True, slots=True)
class LocalClusterConfig:
    """Where and how the local cluster runs."""

    data_dir: Path
    nodes: int = 3
    """How many nodes (each a broker and a controller voter), 1..9; ids are 1..nodes."""
    heap_mb: int = 512
    """JVM heap per node, MiB."""
    replication_factor: int = 3
    """``default.replication.factor`` and the internal topics' replication factor."""
    min_insync_replicas: int = 2
    """``min.insync.replicas`` (broker default and the internal topics')."""
    proxied: bool = False
    """Give every node a PROXIED listener whose advertised port a fault proxy is to bind
    (:meth:`LocalKafkaCluster.proxy_routes`)."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Extra ``server.properties`` entries for every node (they win over the defaults)."""
    base_port: int = 0
    """Client ports ``base_port``, ``base_port + 1``, ...; 0: free ports (remembered)."""
    start_timeout_ms: int = 120_000
    """How long :meth:`LocalKafkaCluster.start` may take, ms."""
    stop_timeout_ms: int = 30_000
    """How long a node's clean stop may take before it is killed, ms."""
    jvm_options: tuple[str, ...] = JVM_OPTIONS
    """Every node's extra JVM options."""
    secured: bool = False
    """Run every node secured (see :attr:`LocalKafkaConfig.secured`): SASL_SSL on the client
    ports, mTLS on a second port per node (also between the nodes and to the controllers),
    ``StandardAuthorizer``. One set of certificates in ``<data_dir>/tls`` serves every node."""
    scram_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    """With :attr:`secured`: SCRAM-SHA-512 users, name -> password (never printed)."""
    tls_clients: tuple[str, ...] = ()
    """With :attr:`secured`: names of the client certificates to make."""
    super_users: tuple[str, ...] = ()
    """With :attr:`secured`: user names that are super users besides the brokers."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        object.__setattr__(self, "jvm_options", tuple(self.jvm_options))
        if not 1 <= self.nodes <= _MAX_NODES:
            raise InvalidArgumentError(f"nodes must be 1..{_MAX_NODES}, got {self.nodes}")
        if self.heap_mb < 128:
            raise InvalidArgumentError(f"heap_mb must be at least 128, got {self.heap_mb}")
        if not 1 <= self.replication_factor <= self.nodes:
            raise InvalidArgumentError(
                f"replication_factor must be 1..nodes ({self.nodes}), got {self.replication_factor}"
            )
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise InvalidArgumentError(
                f"min_insync_replicas must be 1..replication_factor "
                f"({self.replication_factor}), got {self.min_insync_replicas}"
            )
        if self.base_port and not 1 <= self.base_port <= 65535 - self.nodes:
            raise InvalidArgumentError(
                f"base_port must leave room for {self.nodes} ports below 65536, "
                f"got {self.base_port}"
            )
        if self.start_timeout_ms <= 0 or self.stop_timeout_ms <= 0:
            raise InvalidArgumentError("start_timeout_ms and stop_timeout_ms must be positive")
        object.__setattr__(self, "scram_users", MappingProxyType(dict(self.scram_users)))
        object.__setattr__(self, "tls_clients", tuple(self.tls_clients))
        object.__setattr__(self, "super_users", tuple(self.super_users))
        # The nodes' own checks of the security settings, before anything starts.
        LocalKafkaConfig(data_dir=self.data_dir, proxied=self.proxied, **self.security_fields())

    def security_fields(self) -> dict[str, Any]:
        """The :class:`LocalKafkaConfig` security fields every node gets (empty unless
        :attr:`secured`)."""
        if not (self.secured or self.scram_users or self.tls_clients or self.super_users):
            return {}
        return {
            "secured": self.secured,
            "scram_users": self.scram_users,
            "tls_clients": self.tls_clients,
            "super_users": self.super_users,
        }

    def server_properties(self) -> dict[str, str]:
        """The ``server.properties`` entries every node gets on top of a single node's."""
        rf, isr = str(self.replication_factor), str(self.min_insync_replicas)
        props = {
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            # Only an in-sync replica may lead: an acknowledged record is never dropped.
            "unclean.leader.election.enable": "false",
            # A dead broker is fenced (its leaderships move) this soon; a clean stop moves
            # them first anyway (controlled shutdown).
            "broker.heartbeat.interval.ms": str(BROKER_HEARTBEAT_INTERVAL_MS),
            "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS),
            # Three JVMs share a small machine: fewer request and background threads.
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "4",
        }
        props.update(self.properties)
        return props


def cluster_state(config: LocalClusterConfig) -> dict[str, Any]:
    """What ``cluster.json`` in ``config.data_dir`` holds: the cluster id and every node's
    ports, picked (free ports, a new cluster id) and written on first use. Raises
    :class:`InvalidArgumentError` if the file describes another cluster."""
    state_file = config.data_dir / "cluster.json"
    state: dict[str, Any] = {}
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        if len(state.get("nodes", {})) != config.nodes:
            raise InvalidArgumentError(
                f"{config.data_dir} holds a cluster of {len(state.get('nodes', {}))} nodes, "
                f"not {config.nodes}: the voter set is fixed; use another data directory"
            )
        if not valid_cluster_id(str(state.get("cluster_id", ""))):
            raise InvalidArgumentError(f"{state_file} has no valid cluster_id")
    else:
        state = {"cluster_id": new_cluster_id(), "nodes": {}}
    taken: set[int] = {port for node in state["nodes"].values() for port in node.values() if port}

    def pick() -> int:
        while True:
            port = free_port()
            if port not in taken:
                taken.add(port)
                return port

    changed = not state_file.is_file()
    for node_id in range(1, config.nodes + 1):
        node = state["nodes"].setdefault(str(node_id), {})
        wanted = ["port", "controller_port"]
        if config.proxied:
            wanted += ["proxied_port", "proxied_advertised_port"]
        if config.secured:
            wanted += ["ssl_port"]
        for name in wanted:
            if not node.get(name):
                if name == "port" and config.base_port:
                    node[name] = config.base_port + node_id - 1
                else:
                    node[name] = pick()
                changed = True
        if config.base_port and node["port"] != config.base_port + node_id - 1:
            raise InvalidArgumentError(
                f"{state_file} has node {node_id} on port {node['port']}, not "
                f"{config.base_port + node_id - 1} (base_port {config.base_port})"
            )
    if changed:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(state, indent=2) + "\n")
    return state


def node_configs(
    config: LocalClusterConfig, state: Mapping[str, Any]
) -> dict[int, LocalKafkaConfig]:
    """Every node's configuration (node id -> config), on the ports and with the cluster id
    of ``state`` (:func:`cluster_state`), in ``<data_dir>/node-<id>``."""
    voters = {int(k): int(v["controller_port"]) for k, v in state["nodes"].items()}
    properties = config.server_properties()
    configs = {}
    for node_id in range(1, config.nodes + 1):
        ports = state["nodes"][str(node_id)]
        security = config.security_fields()
        if config.secured:
            security["ssl_port"] = int(ports["ssl_port"])
            security["tls_dir"] = config.data_dir / "tls"
        configs[node_id] = LocalKafkaConfig(
            data_dir=config.data_dir / f"node-{node_id}",
            port=int(ports["port"]),
            heap_mb=config.heap_mb,
            start_timeout_ms=config.start_timeout_ms,
            stop_timeout_ms=config.stop_timeout_ms,
            properties=properties,
            node_id=node_id,
            voters=voters,
            cluster_id=str(state["cluster_id"]),
            proxied=config.proxied,
            proxied_port=int(ports.get("proxied_port", 0)) if config.proxied else 0,
            proxied_advertised_port=(
                int(ports.get("proxied_advertised_port", 0)) if config.proxied else 0
            ),
            jvm_options=config.jvm_options,
            **security,
        )
    return configs
