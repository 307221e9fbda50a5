"""A real Apache Kafka node (KRaft, broker + controller in one process) on loopback.

By default the node is a cluster of its own (node id 1, the only voter). Given a node id, a
static voter set and a shared cluster id it is one of N such nodes
(:mod:`bridge.runtime.cluster` builds those). An optional second client listener, PROXIED,
binds one port and advertises another, where a fault proxy listens and forwards to the bound
one: a client that bootstraps through the proxy is sent back through it for every broker, while
inter-broker and controller traffic stays direct.

The jars come from Maven Central through :mod:`bridge.runtime.jars`. Everything the node writes
lives in one data directory: ``server.properties``, ``broker.json`` (node id, ports, cluster
id, pid), ``kraft/`` (the log dirs) and ``logs/server.log``. Starting again on the same
directory keeps every topic and record, on the same ports.

:class:`LocalKafka` drives the node; its parts live apart: the configuration, ports and
``server.properties`` in :mod:`bridge.runtime.node_config`, the secured mode (listeners, TLS,
SCRAM, authorizer, client settings) in :mod:`bridge.runtime.node_security`, the readiness
probes in :mod:`bridge.runtime.node_probes` and the JVM process in
:mod:`bridge.runtime.node_process`. The names other code imports stay importable from here.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge.errors import BrokerStartError, IllegalStateError
from bridge.lifecycle import Startable
from bridge.runtime.certs import TlsFiles, ensure_certificates
from bridge.runtime.jars import JAVA_HINT, KAFKA_VERSION, ensure_jars, require_tool
from bridge.runtime.node_config import (
    LocalKafkaConfig,
    free_port,
    internal_partitions,
    new_cluster_id,
    node_state,
    port_in_use,
    render_properties,
    server_property_map,
    tls_files,
    valid_cluster_id,
)
from bridge.runtime.node_probes import (
    GROUP_PROBE_PREFIX,
    coordinator_partition,
    java_string_hash,
    probe_admin,
    probe_keys,
    wait_for_coordinators,
    wait_for_metadata,
)
from bridge.runtime.node_process import (
    LOG4J2,
    NodeProcess,
    broker_command,
    format_storage,
    formatted_cluster_id,
    java_base,
    stop_stale,
)
from bridge.runtime.node_security import (
    BROKER_PRINCIPAL,
    SCRAM_MECHANISM,
    STANDARD_AUTHORIZER,
    client_settings,
    redact,
    scram_format_args,
    upsert_scram_users,
)

__all__ = [
    "BROKER_PRINCIPAL",
    "GROUP_PROBE_PREFIX",
    "SCRAM_MECHANISM",
    "STANDARD_AUTHORIZER",
    "LocalKafka",
    "LocalKafkaConfig",
    "coordinator_partition",
    "free_port",
    "java_string_hash",
    "new_cluster_id",
    "port_in_use",
    "probe_keys",
    "valid_cluster_id",
    "wait_for_coordinators",
]

logger = logging.getLogger(__name__)


class LocalKafka(Startable):
    """Start, stop, kill, pause and restart one local node process.

    ``with LocalKafka(LocalKafkaConfig(data_dir)) as kafka: kafka.bootstrap_servers``.
    """

    def __init__(self, config: LocalKafkaConfig) -> None:
        self.config = config
        self._process = NodeProcess()
        self._state: dict[str, Any] = {}
        self._formatted_now = False

    # --- paths and state ----------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """The broker's data directory."""
        return self.config.data_dir

    @property
    def node_id(self) -> int:
        """This node's ``node.id``."""
        return self.config.node_id

    @property
    def log_file(self) -> Path:
        """The broker's own log."""
        return self.data_dir / "logs" / "server.log"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def port(self) -> int:
        """The client (PLAINTEXT) port."""
        return int(self._load_state()["port"])

    @property
    def controller_port(self) -> int:
        """The CONTROLLER listener's port."""
        return int(self._load_state()["controller_port"])

    @property
    def proxied_port(self) -> int | None:
        """The port the PROXIED listener binds, or None without one."""
        return int(self._load_state()["proxied_port"]) if self.config.proxied else None

    @property
    def proxied_advertised_port(self) -> int | None:
        """The port the PROXIED listener advertises (the proxy's), or None without one."""
        state = self._load_state()
        return int(state["proxied_advertised_port"]) if self.config.proxied else None

    @property
    def ssl_port(self) -> int | None:
        """The mTLS (SSL) listener's port of a secured broker, else None."""
        return int(self._load_state()["ssl_port"]) if self.config.secured else None

    @property
    def mtls_bootstrap_servers(self) -> str | None:
        """``127.0.0.1:<ssl_port>`` of a secured broker (clients with a certificate), else
        None."""
        return f"127.0.0.1:{self.ssl_port}" if self.config.secured else None

    @property
    def tls(self) -> TlsFiles:
        """Where a secured broker's certificates are (made at its first start)."""
        if not self.config.secured:
            raise IllegalStateError(f"the broker on {self.data_dir} is not secured")
        return tls_files(self.config)

    def client_settings(self, user: str, password: str | None = None) -> dict[str, str]:
        """librdkafka settings (without ``bootstrap.servers``) for ``user`` on a secured
        broker: with a ``password``, SASL_SSL with SCRAM-SHA-512 (connect to
        :attr:`bootstrap_servers`); without, SSL with ``user``'s certificate (one of
        :attr:`LocalKafkaConfig.tls_clients`, or the broker's own identity; connect to
        :attr:`mtls_bootstrap_servers`). Each key maps to ``BRIDGE_KAFKA_<KEY>`` with ``.``
        as ``_``, upper case."""
        return client_settings(self.tls, self.config.tls_clients, user, password)

    @property
    def cluster_id(self) -> str:
        """The cluster id this node's storage is (or will be) formatted with."""
        return str(self._load_state()["cluster_id"])

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process id while it runs."""
        return self._process.pid

    @property
    def is_running(self) -> bool:
        """True while the broker process is alive (paused or not)."""
        return self.pid is not None

    @property
    def is_paused(self) -> bool:
        """True while the process is alive and frozen by :meth:`pause`."""
        return self._process.is_paused

    def _load_state(self) -> dict[str, Any]:
        if not self._state:
            remembered: dict[str, Any] = {}
            if self._state_file.is_file():
                remembered = json.loads(self._state_file.read_text())
            self._state = node_state(self.config, remembered)
            if not remembered:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._save_state()
        return self._state

    def _save_state(self) -> None:
        self._state_file.write_text(json.dumps(self._state, indent=2) + "\n")

    def _server_properties(self, state: Mapping[str, Any]) -> str:
        return render_properties(server_property_map(self.config, state))

    def coordinator_partitions(self) -> tuple[int, int]:
        """The partition counts of ``__consumer_offsets`` and ``__transaction_state`` this node
        is configured with (Kafka's default, 50, where nothing sets them)."""
        return internal_partitions(server_property_map(self.config, self._load_state()))

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Fetch the jars if needed, format storage on first start, start the broker and wait
        until it answers metadata requests and its group and transaction coordinators serve
        every partition of ``__consumer_offsets`` and ``__transaction_state`` (creating those
        topics on a fresh broker), all within ``start_timeout_ms``. Raises
        :class:`BrokerStartError` with the log's tail on failure."""
        if self.is_running:
            return
        self.launch()
        try:
            self.wait_ready()
            self.wait_coordinators()
            self.sync_scram_users()
        except BaseException:
            self.kill()
            raise

    def launch(self) -> None:
        """Like :meth:`start` without waiting for the broker to answer (a node of a cluster
        cannot answer before a majority of the voters runs); :meth:`wait_ready` waits."""
        if self.is_running:
            return
        java = require_tool("java", JAVA_HINT)
        libs = ensure_jars("kafka")
        state = self._load_state()
        stop_stale(state.get("pid"), self.data_dir, self.config.stop_timeout_ms)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.config.secured:
            ensure_certificates(
                self.tls.directory, (BROKER_PRINCIPAL, *self.config.tls_clients), java
            )
        props_file = self.data_dir / "server.properties"
        if self.config.secured:  # it holds the stores' password
            props_file.touch(mode=0o600)
            props_file.chmod(0o600)
        props_file.write_text(self._server_properties(state))
        (self.data_dir / "log4j2.properties").write_text(LOG4J2)
        for name in ("port", "controller_port", "proxied_port", "ssl_port"):
            if name in state and port_in_use(state[name]):
                raise BrokerStartError(
                    f"cannot start the local broker: 127.0.0.1:{state[name]} ({name}) is in use"
                )
        base = java_base(java, libs, self.data_dir)
        formatted = formatted_cluster_id(self.data_dir)
        if formatted is not None and formatted != state["cluster_id"]:
            raise BrokerStartError(
                f"the storage in {self.data_dir / 'kraft'} belongs to cluster {formatted}, "
                f"not {state['cluster_id']}: use another data directory or remove this one"
            )
        self._formatted_now = formatted is None
        if formatted is None:
            # SCRAM credentials go into the metadata log as the storage is formatted.
            scram = scram_format_args(self.config.scram_users)
            format_storage(base, state["cluster_id"], props_file, scram, self._redact)
        cmd = broker_command(base, self.config.heap_mb, self.config.jvm_options, props_file)
        state["pid"] = self._process.launch(cmd, self.data_dir / "logs" / "stdout.log")
        self._save_state()

    def _redact(self, text: str) -> str:
        """``text`` with every configured SCRAM password replaced by ``***``."""
        return redact(text, self.config.scram_users)

    def sync_scram_users(self) -> None:
        """Create or update every SCRAM user of a secured broker whose storage was formatted
        before (a new start formats them in). Raises :class:`BrokerStartError` naming the
        user the broker refused (never the password)."""
        if not self.config.secured or not self.config.scram_users or self._formatted_now:
            return
        admin = probe_admin(self.probe_bootstrap_servers, self.probe_settings())
        upsert_scram_users(admin, self.config.scram_users)

    @property
    def probe_bootstrap_servers(self) -> str:
        """Where this runtime's own checks connect: the mTLS listener (as the broker's own
        identity) on a secured broker, else :attr:`bootstrap_servers`."""
        return self.mtls_bootstrap_servers or self.bootstrap_servers

    def wait_ready(self) -> None:
        """Wait until the process :meth:`launch` started answers metadata requests, at most
        ``start_timeout_ms`` after the launch. Raises :class:`BrokerStartError` with the
        log's tail if it exits or does not answer in time (the process is left as it is)."""
        process = self._process
        if not process.launched:
            raise BrokerStartError(f"the broker on {self.data_dir} was not launched")
        deadline = process.launched_at + self.config.start_timeout_ms / 1000
        admin = probe_admin(self.probe_bootstrap_servers, self.probe_settings())
        wait_for_metadata(
            admin, process.poll, deadline, self.config.start_timeout_ms, self.log_tail
        )
        logger.info(
            "local Kafka %s node %d ready at %s in %.1f s (data in %s)",
            KAFKA_VERSION,
            self.node_id,
            self.bootstrap_servers,
            time.monotonic() - process.launched_at,
            self.data_dir,
        )

    def wait_coordinators(self) -> None:
        """Wait until a consumer group and a transactional producer can be served whatever
        their name (see :func:`wait_for_coordinators`), at most ``start_timeout_ms`` after the
        launch. Raises :class:`BrokerStartError` naming what did not answer, with the log's
        tail."""
        started = time.monotonic()
        deadline = self._process.launched_at + self.config.start_timeout_ms / 1000
        offsets, transactions = self.coordinator_partitions()
        try:
            wait_for_coordinators(
                self.probe_bootstrap_servers,
                offsets,
                transactions,
                deadline,
                settings=self.probe_settings(),
            )
        except BrokerStartError as exc:
            raise BrokerStartError(f"{exc}; log tail:\n{self.log_tail()}") from exc
        logger.info(
            "local Kafka node %d: group and transaction coordinators ready in %.1f s",
            self.node_id,
            time.monotonic() - started,
        )

    def probe_settings(self) -> dict[str, Any]:
        """librdkafka settings the readiness probes add to ``bootstrap.servers``: the broker's
        own certificate on a secured broker."""
        return self.client_settings(BROKER_PRINCIPAL) if self.config.secured else {}

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and stdout."""
        out = []
        for path in (self.log_file, self.data_dir / "logs" / "stdout.log"):
            if path.is_file():
                out.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(out[-lines:])

    def begin_stop(self) -> None:
        """Ask the process to stop cleanly (SIGTERM; SIGCONT too if paused) without waiting
        (:meth:`wait_stopped` waits). Stopping every node of a cluster at once this way
        keeps a controller quorum while each broker hands over its leaderships."""
        self._process.begin_stop()

    def wait_stopped(self) -> None:
        """Wait up to ``stop_timeout_ms`` for the process to exit, then kill it."""
        if self._process.wait_stopped(self.config.stop_timeout_ms / 1000):
            logger.info("local Kafka at %s stopped", self.bootstrap_servers)

    def stop(self) -> None:
        """Stop cleanly (SIGTERM), killing the process if it takes too long."""
        if self._process.pid is None:
            self._process.forget()
            return
        self.begin_stop()
        self.wait_stopped()

    def kill(self) -> None:
        """Kill the broker with SIGKILL (no clean shutdown)."""
        self._process.kill()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP), like a node in a long GC pause: it keeps its sockets
        and answers nothing until :meth:`resume`. Returns once the kernel shows it stopped."""
        if not self._process.pause():
            raise IllegalStateError(f"cannot pause the broker on {self.data_dir}: not running")

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT)."""
        if not self._process.resume():
            raise IllegalStateError(f"cannot resume the broker on {self.data_dir}: not running")

    def restart(self) -> None:
        """Stop cleanly and start again on the same data and ports."""
        self.stop()
        self.start()
