"""A real N-node Apache Kafka cluster on loopback, each node a broker and a controller.

Every node is a :class:`~bridge.runtime.local_kafka.LocalKafka` in its own directory
(``<data_dir>/node-<id>``), all formatted with one cluster id and sharing a static voter set.
``cluster.json`` in the data directory remembers the cluster id and every node's ports, so a
node stopped or killed comes back on the same data and ports, and so does the whole cluster.

Cluster-wide defaults make every topic nobody configured otherwise (the bridge asks for
replication factor -1, the broker default) replicated ``replication_factor`` times with
``min.insync.replicas`` of ``min_insync_replicas``, and so are the internal topics (consumer
offsets, transaction state, share-group state). A broker that stops heartbeating is fenced
after :data:`BROKER_SESSION_TIMEOUT_MS`, which is when a killed leader's partitions move.

``with LocalKafkaCluster(LocalClusterConfig(data_dir)) as cluster: cluster.kill(2)``.

The configuration, ``cluster.json`` and each node's settings are in
:mod:`bridge.runtime.cluster_config` (its names stay importable from here).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import (
    BrokerStartError,
    BrokerUnreachableError,
    ClusterUnhealthyError,
    IllegalStateError,
    InvalidArgumentError,
)
from bridge.lifecycle import Startable
from bridge.runtime.cluster_config import (
    BROKER_HEARTBEAT_INTERVAL_MS,
    BROKER_SESSION_TIMEOUT_MS,
    LocalClusterConfig,
    cluster_state,
    node_configs,
)
from bridge.runtime.local_kafka import LocalKafka
from bridge.runtime.node_config import JVM_OPTIONS
from bridge.runtime.node_probes import probe_admin, wait_for_coordinators

__all__ = [
    "BROKER_HEARTBEAT_INTERVAL_MS",
    "BROKER_SESSION_TIMEOUT_MS",
    "JVM_OPTIONS",
    "ClusterUnhealthyError",
    "LocalClusterConfig",
    "LocalKafkaCluster",
]

logger = logging.getLogger(__name__)


class LocalKafkaCluster(Startable):
    """Start, stop, kill, pause and restart the nodes of a local KRaft cluster.

    Drive the nodes from one thread at a time; the metadata queries (:meth:`leader_of`,
    :meth:`isr_of`, :meth:`wait_healthy`, ...) may run on any thread meanwhile.
    """

    def __init__(self, config: LocalClusterConfig) -> None:
        self.config = config
        self._nodes: dict[int, LocalKafka] = {}
        self._admin: AdminClient | None = None
        self._admin_for = ""
        self._admin_lock = threading.Lock()

    # --- layout and state ---------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.config.data_dir

    @property
    def node_ids(self) -> tuple[int, ...]:
        """Every node id, ascending."""
        return tuple(range(1, self.config.nodes + 1))

    def _ensure_nodes(self) -> dict[int, LocalKafka]:
        if not self._nodes:
            configs = node_configs(self.config, cluster_state(self.config))
            self._nodes = {node_id: LocalKafka(config) for node_id, config in configs.items()}
        return self._nodes

    def node(self, node_id: int) -> LocalKafka:
        """The node with id ``node_id``; :class:`InvalidArgumentError` for an unknown id."""
        nodes = self._ensure_nodes()
        if node_id not in nodes:
            raise InvalidArgumentError(f"no node {node_id}; the nodes are {list(nodes)}")
        return nodes[node_id]

    def _iter_nodes(self) -> Iterator[LocalKafka]:
        return iter(self._ensure_nodes().values())

    @property
    def cluster_id(self) -> str:
        """The cluster id every node's storage is formatted with."""
        return self.node(1).cluster_id

    @property
    def bootstrap_servers(self) -> str:
        """Every node's direct client address, comma-separated."""
        return ",".join(node.bootstrap_servers for node in self._iter_nodes())

    @property
    def mtls_bootstrap_servers(self) -> str | None:
        """Every node's mTLS (SSL) address of a secured cluster, comma-separated; else None."""
        if not self.config.secured:
            return None
        return ",".join(str(node.mtls_bootstrap_servers) for node in self._iter_nodes())

    def client_settings(self, user: str, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for ``user`` on a secured cluster (see
        :meth:`LocalKafka.client_settings`): with a password for :attr:`bootstrap_servers`,
        without for :attr:`mtls_bootstrap_servers`."""
        return self.node(1).client_settings(user, password)

    @property
    def proxied_bootstrap_servers(self) -> str:
        """Every node's PROXIED address (the proxy's ports), comma-separated. A client that
        bootstraps here is sent through the proxy for every broker."""
        self._require_proxied()
        return ",".join(f"127.0.0.1:{node.proxied_advertised_port}" for node in self._iter_nodes())

    def proxy_routes(self) -> list[tuple[int, int]]:
        """``(listen_port, target_port)`` per node, for the fault proxy: it listens on each
        PROXIED advertised port and forwards to the port that listener binds."""
        self._require_proxied()
        routes = []
        for node in self._iter_nodes():
            listen, target = node.proxied_advertised_port, node.proxied_port
            assert listen is not None and target is not None
            routes.append((listen, target))
        return routes

    def _require_proxied(self) -> None:
        if not self.config.proxied:
            raise IllegalStateError(
                "this cluster has no PROXIED listener: use LocalClusterConfig(proxied=True)"
            )

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start every node that is not running and wait until all are registered, the group
        and transaction coordinators serve every partition of their internal topics and no
        partition is under-replicated (at most ``start_timeout_ms``). Raises
        :class:`BrokerStartError` (or :class:`ClusterUnhealthyError`) naming the node that
        failed; then every node this call launched is killed."""
        started = time.monotonic()
        launched = []
        try:
            for node in self._iter_nodes():
                if not node.is_running:
                    node.launch()
                    launched.append(node)
            for node in launched:
                try:
                    node.wait_ready()
                except BrokerStartError as exc:
                    raise BrokerStartError(f"node {node.node_id}: {exc}") from exc
            deadline = started + self.config.start_timeout_ms / 1000
            self.wait_healthy(max(deadline - time.monotonic(), 1.0))
            # Groups and transactions are served (their internal topics created and loaded)
            # before this returns, and those topics are fully replicated too.
            offsets, transactions = self.node(1).coordinator_partitions()
            wait_for_coordinators(
                self._probe_servers(list(self._iter_nodes())),
                offsets,
                transactions,
                deadline,
                settings=self.node(1).probe_settings(),
            )
            self.wait_healthy(max(deadline - time.monotonic(), 1.0))
            self.node(1).sync_scram_users()
        except BaseException:
            for node in launched:
                node.kill()
            raise
        logger.info(
            "local Kafka cluster of %d nodes ready at %s in %.1f s (data in %s)",
            self.config.nodes,
            self.bootstrap_servers,
            time.monotonic() - started,
            self.data_dir,
        )

    def stop(self) -> None:
        """Stop every node cleanly, all at once (one at a time, the last ones would wait for
        a controller quorum that is gone). Idempotent."""
        nodes = list(self._iter_nodes())
        for node in nodes:
            node.begin_stop()
        for node in nodes:
            node.wait_stopped()
        self._admin = None

    def kill(self, node_id: int) -> None:
        """Kill node ``node_id`` with SIGKILL (no clean shutdown)."""
        self.node(node_id).kill()

    def stop_node(self, node_id: int) -> None:
        """Stop node ``node_id`` cleanly (its leaderships move first)."""
        self.node(node_id).stop()

    def start_node(self, node_id: int) -> None:
        """Start node ``node_id`` again on the same data and ports and wait until it answers
        (not until it is back in every ISR: :meth:`wait_healthy` waits for that)."""
        node = self.node(node_id)
        if node.is_running:
            return
        node.launch()
        try:
            # Not for the coordinators: with other nodes down, some partitions of the internal
            # topics may rightly have no leader.
            node.wait_ready()
        except BaseException:
            node.kill()
            raise

    def restart_node(self, node_id: int) -> None:
        """Stop node ``node_id`` cleanly and start it again."""
        self.stop_node(node_id)
        self.start_node(node_id)

    def pause(self, node_id: int) -> None:
        """Freeze node ``node_id`` (SIGSTOP) until :meth:`resume`."""
        self.node(node_id).pause()

    def resume(self, node_id: int) -> None:
        """Let a paused node run again (SIGCONT)."""
        self.node(node_id).resume()

    def running_node_ids(self) -> tuple[int, ...]:
        """Ids of the nodes whose process is alive and not paused."""
        return tuple(n.node_id for n in self._iter_nodes() if n.is_running and not n.is_paused)

    # --- metadata -------------------------------------------------------------------------
    def _metadata(self, timeout_s: float = 5.0) -> Any:
        """Cluster metadata from a node that runs and is not paused.
        :class:`BrokerUnreachableError` if none answers within ``timeout_s``."""
        usable = [n for n in self._iter_nodes() if n.is_running and not n.is_paused]
        if not usable:
            raise BrokerUnreachableError("no node of the local cluster is running")
        servers = self._probe_servers(usable)
        with self._admin_lock:
            admin = self._admin
            if admin is None or self._admin_for != servers:
                # A new client when the usable nodes change, so requests start at a live one.
                settings = {
                    "socket.connection.setup.timeout.ms": 2000,
                    **usable[0].probe_settings(),
                }
                admin = self._admin = probe_admin(servers, settings)
                self._admin_for = servers
        try:
            return admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            with self._admin_lock:
                if self._admin is admin:
                    self._admin = None
            raise BrokerUnreachableError(
                f"no node of the local cluster ({servers}) answered within {timeout_s} s: {exc}"
            ) from exc

    @staticmethod
    def _probe_servers(nodes: list[LocalKafka]) -> str:
        """Where this runtime's own checks connect (the mTLS ports of a secured cluster)."""
        return ",".join(node.probe_bootstrap_servers for node in nodes)

    def registered_node_ids(self) -> tuple[int, ...]:
        """Ids of the brokers the metadata shows (registered and not fenced), ascending."""
        return tuple(sorted(self._metadata().brokers))

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The node id leading ``topic``/``partition`` as the metadata shows it now; None if
        it has no leader or the partition is not known (yet)."""
        found = self._metadata().topics.get(topic)
        if found is None or found.error is not None or partition not in found.partitions:
            return None
        leader = int(found.partitions[partition].leader)
        return leader if leader >= 0 else None

    def isr_of(self, topic: str, partition: int) -> tuple[int, ...]:
        """The in-sync replicas of ``topic``/``partition`` (empty if it is not known)."""
        found = self._metadata().topics.get(topic)
        if found is None or found.error is not None or partition not in found.partitions:
            return ()
        return tuple(sorted(int(r) for r in found.partitions[partition].isrs))

    def controller_leader(self) -> int | None:
        """The active controller's node id, read from the nodes' ``quorum-state`` files (the
        newest election a live node took part in); None while there is none, or while the
        one they name is not running or paused."""
        best: tuple[int, int] | None = None
        for node in self._iter_nodes():
            if not node.is_running:
                continue
            path = node.data_dir / "kraft" / "__cluster_metadata-0" / "quorum-state"
            try:
                quorum = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            epoch, leader = int(quorum.get("leaderEpoch", -1)), int(quorum.get("leaderId", -1))
            if leader >= 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        if best is None or best[1] not in self.running_node_ids():
            return None
        return best[1]

    def health_problems(self) -> ClusterUnhealthyError | None:
        """What keeps the cluster from being healthy now (as the error
        :meth:`wait_healthy` would raise), or None if every node is registered and every
        partition has a leader and a full ISR."""
        try:
            metadata = self._metadata(timeout_s=2.0)
        except BrokerUnreachableError as exc:
            return ClusterUnhealthyError(str(exc), missing_nodes=self.node_ids)
        missing = tuple(n for n in self.node_ids if n not in metadata.brokers)
        under: list[tuple[str, int]] = []
        leaderless: list[tuple[str, int]] = []
        details: list[str] = []
        for name, topic in sorted(metadata.topics.items()):
            for pid, part in sorted(topic.partitions.items()):
                if part.leader < 0:
                    leaderless.append((name, pid))
                    details.append(f"{name}-{pid} has no leader")
                elif len(part.isrs) < len(part.replicas):
                    under.append((name, pid))
                    details.append(
                        f"{name}-{pid} isr {sorted(part.isrs)} of {sorted(part.replicas)}"
                    )
        if not (missing or under or leaderless):
            return None
        parts = []
        if missing:
            parts.append(f"nodes not registered: {list(missing)}")
        if details:
            shown = "; ".join(details[:10])
            more = f" and {len(details) - 10} more" if len(details) > 10 else ""
            parts.append(f"partitions: {shown}{more}")
        return ClusterUnhealthyError(
            "; ".join(parts),
            missing_nodes=missing,
            under_replicated=tuple(under),
            leaderless=tuple(leaderless),
        )

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        """Wait until every node is registered and no partition is leaderless or
        under-replicated; raise :class:`ClusterUnhealthyError` naming what is still missing
        after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            problem = self.health_problems()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise ClusterUnhealthyError(
                    f"the local cluster was not healthy within {timeout_s:.1f} s: {problem}",
                    missing_nodes=problem.missing_nodes,
                    under_replicated=problem.under_replicated,
                    leaderless=problem.leaderless,
                )
            time.sleep(0.1)

    def rolling_restart(self, timeout_s: float = 60.0) -> None:
        """Stop and start each node in turn, waiting for a healthy cluster before the next
        (each wait at most ``timeout_s``)."""
        for node_id in self.node_ids:
            self.restart_node(node_id)
            self.wait_healthy(timeout_s)
