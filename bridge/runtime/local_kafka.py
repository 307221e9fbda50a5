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
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from bridge.errors import BrokerStartError, IllegalStateError, InvalidArgumentError
from bridge.lifecycle import Startable
from bridge.runtime.certs import TlsFiles, check_identity_name, ensure_certificates
from bridge.runtime.jars import JAVA_HINT, KAFKA_VERSION, ensure_jars, require_tool

logger = logging.getLogger(__name__)
# librdkafka complains loudly while the broker is still starting; keep that apart.
_probe_logger = logging.getLogger("bridge.kafka.rdkafka.probe")

_LOG4J2 = """\
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


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


_PORT_FIELDS = ("port", "controller_port", "proxied_port", "proxied_advertised_port", "ssl_port")

BROKER_PRINCIPAL = "bridge-local-broker"
"""The secured broker's own identity: its certificate's common name and its principal
(``User:bridge-local-broker``), a super user. No client identity may take this name."""
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_MECHANISM = "SCRAM-SHA-512"
# SCRAM passwords go into `kafka-storage format --add-scram 'SCRAM-SHA-512=[name=N,password=P]'`,
# whose parser splits on these: printable ASCII without them keeps every password intact.
_SCRAM_PASSWORD = re.compile(r"[!#-+\--<>-Z\\^-~]{8,128}")


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
    jvm_options: tuple[str, ...] = ()
    """Extra JVM options (after the heap settings)."""
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
        for name in _PORT_FIELDS:
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
        for name in (*self.scram_users, *self.tls_clients, *self.super_users):
            check_identity_name(name)
            if name == BROKER_PRINCIPAL:
                raise InvalidArgumentError(
                    f"{name!r} is the broker's own identity (a super user): use another name"
                )
        for name, password in self.scram_users.items():
            # The message never holds the password, only what is wrong with it.
            if not isinstance(password, str) or not _SCRAM_PASSWORD.fullmatch(password):
                raise InvalidArgumentError(
                    f"the SCRAM password of user {name!r} must be 8-128 printable ASCII "
                    f"characters without spaces, '\"', ',', '=', '[' or ']'"
                )

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


class LocalKafka(Startable):
    """Start, stop, kill, pause and restart one local node process.

    ``with LocalKafka(LocalKafkaConfig(data_dir)) as kafka: kafka.bootstrap_servers``.
    """

    def __init__(self, config: LocalKafkaConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: dict[str, Any] = {}
        self._launched_at = 0.0
        self._paused = False
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
        return TlsFiles(self.config.tls_dir or self.data_dir / "tls")

    def client_settings(self, user: str, password: str | None = None) -> dict[str, str]:
        """librdkafka settings (without ``bootstrap.servers``) for ``user`` on a secured
        broker: with a ``password``, SASL_SSL with SCRAM-SHA-512 (connect to
        :attr:`bootstrap_servers`); without, SSL with ``user``'s certificate (one of
        :attr:`LocalKafkaConfig.tls_clients`, or the broker's own identity; connect to
        :attr:`mtls_bootstrap_servers`). Each key maps to ``BRIDGE_KAFKA_<KEY>`` with ``.``
        as ``_``, upper case."""
        tls = self.tls
        settings = {"ssl.ca.location": str(tls.ca_pem)}
        if password is not None:
            return {
                **settings,
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": SCRAM_MECHANISM,
                "sasl.username": user,
                "sasl.password": password,
            }
        if user != BROKER_PRINCIPAL and user not in self.config.tls_clients:
            raise InvalidArgumentError(
                f"no certificate for {user!r}: the broker's tls_clients are "
                f"{list(self.config.tls_clients)}"
            )
        return {
            **settings,
            "security.protocol": "SSL",
            "ssl.keystore.location": str(tls.keystore(user)),
            "ssl.keystore.password": tls.password,
        }

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
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """True while the broker process is alive (paused or not)."""
        return self.pid is not None

    @property
    def is_paused(self) -> bool:
        """True while the process is alive and frozen by :meth:`pause`."""
        return self._paused and self.is_running

    def _load_state(self) -> dict[str, Any]:
        if not self._state:
            config = self.config
            state: dict[str, Any] = {}
            if self._state_file.is_file():
                state = json.loads(self._state_file.read_text())
            fresh = not state
            configured = {
                "port": config.port,
                "controller_port": config.voters.get(config.node_id, config.controller_port),
                "proxied_port": config.proxied_port,
                "proxied_advertised_port": config.proxied_advertised_port,
                "ssl_port": config.ssl_port,
            }
            for name in _PORT_FIELDS:
                if name.startswith("proxied") and not config.proxied:
                    continue
                if name == "ssl_port" and not config.secured:
                    continue
                # An explicitly configured port wins over the remembered one.
                if configured[name]:
                    state[name] = configured[name]
                elif name not in state:
                    state[name] = free_port()
            if config.cluster_id is not None:
                state["cluster_id"] = config.cluster_id
            elif "cluster_id" not in state:
                state["cluster_id"] = new_cluster_id()
            self._state = state
            if fresh:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._save_state()
        return self._state

    def _save_state(self) -> None:
        self._state_file.write_text(json.dumps(self._state, indent=2) + "\n")

    def _server_properties(self, state: Mapping[str, Any]) -> str:
        return "".join(f"{k}={v}\n" for k, v in self._server_property_map(state).items())

    def _server_property_map(self, state: Mapping[str, Any]) -> dict[str, str]:
        port, cport = state["port"], state["controller_port"]
        node_id = self.config.node_id
        voters = dict(self.config.voters) or {node_id: cport}
        listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}"
        advertised = f"PLAINTEXT://127.0.0.1:{port}"
        protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
        if self.config.proxied:
            listeners += f",PROXIED://127.0.0.1:{state['proxied_port']}"
            advertised += f",PROXIED://127.0.0.1:{state['proxied_advertised_port']}"
            protocols += ",PROXIED:PLAINTEXT"
        inter_broker = "PLAINTEXT"
        if self.config.secured:
            sport = state["ssl_port"]
            listeners = f"SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{sport}"
            listeners += f",CONTROLLER://127.0.0.1:{cport}"
            advertised = f"SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{sport}"
            protocols = "CONTROLLER:SSL,SASL_SSL:SASL_SSL,SSL:SSL"
            inter_broker = "SSL"
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
            "log.dirs": str(self.data_dir / "kraft"),
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
        if self.config.secured:
            props.update(self._security_properties())
        props.update(self.config.properties)
        return props

    def _security_properties(self) -> dict[str, str]:
        """A secured node's TLS, SASL and authorizer settings (the store password in them is
        also in ``tls/secrets.json``; both stay in the data directory)."""
        tls = self.tls
        password = tls.password
        supers = [BROKER_PRINCIPAL, *self.config.super_users]
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

    def _internal_partitions(self) -> tuple[int, int]:
        """The partition counts of ``__consumer_offsets`` and ``__transaction_state`` this node
        is configured with (Kafka's default, 50, where nothing sets them)."""
        props = self._server_property_map(self._load_state())
        return (
            int(props.get("offsets.topic.num.partitions", "50")),
            int(props.get("transaction.state.log.num.partitions", "50")),
        )

    def _formatted_cluster_id(self) -> str | None:
        """The cluster id in the formatted storage's ``meta.properties``, or None."""
        meta = self.data_dir / "kraft" / "meta.properties"
        if not meta.is_file():
            return None
        for line in meta.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        return None

    # --- lifecycle ------------------------------------------------------------------------
    def _java_base(self, java: str, libs: Path) -> list[str]:
        logs = self.data_dir / "logs"
        return [
            java,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={logs}",
            "-cp",
            f"{libs}/*",
        ]

    def _stop_stale(self, state: dict[str, Any]) -> None:
        """Stop a broker left running on this data directory by a process that died."""
        pid = state.get("pid")
        if not pid:
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            return
        if b"kafka.Kafka" in cmdline and str(self.data_dir).encode() in cmdline:
            logger.warning("stopping a stale broker (pid %s) left on %s", pid, self.data_dir)
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)  # a paused one would never see the SIGTERM
            deadline = time.monotonic() + self.config.stop_timeout_ms / 1000
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)

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
        self._stop_stale(state)
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
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        for name in ("port", "controller_port", "proxied_port", "ssl_port"):
            if name in state and port_in_use(state[name]):
                raise BrokerStartError(
                    f"cannot start the local broker: 127.0.0.1:{state[name]} ({name}) is in use"
                )
        base = self._java_base(java, libs)
        formatted = self._formatted_cluster_id()
        if formatted is not None and formatted != state["cluster_id"]:
            raise BrokerStartError(
                f"the storage in {self.data_dir / 'kraft'} belongs to cluster {formatted}, "
                f"not {state['cluster_id']}: use another data directory or remove this one"
            )
        self._formatted_now = formatted is None
        if formatted is None:
            # SCRAM credentials go into the metadata log as the storage is formatted.
            scram = [
                arg
                for name, password in sorted(self.config.scram_users.items())
                for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
            ]
            fmt = subprocess.run(
                [*base, "kafka.tools.StorageTool", "format", f"--cluster-id={state['cluster_id']}",
                 "-c", str(props_file), *scram],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            if fmt.returncode != 0:
                raise BrokerStartError(
                    f"formatting broker storage failed (exit {fmt.returncode}): "
                    f"{self._redact((fmt.stdout + fmt.stderr).strip()[-2000:])}"
                )
        stdout = (self.data_dir / "logs" / "stdout.log").open("ab")
        cmd = [*base[:1], f"-Xmx{self.config.heap_mb}m", f"-Xms{min(self.config.heap_mb, 256)}m",
               *self.config.jvm_options, *base[1:], "kafka.Kafka", str(props_file)]  # fmt: skip
        self._launched_at = time.monotonic()
        # Own session: Ctrl-C in a terminal reaches us, and we stop the broker in order.
        proc = subprocess.Popen(
            cmd, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._proc = proc
        self._paused = False
        stdout.close()
        state["pid"] = proc.pid
        self._save_state()

    def _redact(self, text: str) -> str:
        """``text`` with every configured SCRAM password replaced by ``***``."""
        for password in self.config.scram_users.values():
            text = text.replace(password, "***")
        return text

    def sync_scram_users(self) -> None:
        """Create or update every SCRAM user of a secured broker whose storage was formatted
        before (a new start formats them in). Raises :class:`BrokerStartError` naming the
        user the broker refused (never the password)."""
        if not self.config.secured or not self.config.scram_users or self._formatted_now:
            return
        admin_config: dict[str, Any] = {
            "bootstrap.servers": self.probe_bootstrap_servers,
            "logger": _probe_logger,
            **self._probe_settings(),
        }
        admin = AdminClient(admin_config)
        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                name,
                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                password.encode(),
            )
            for name, password in sorted(self.config.scram_users.items())
        ]
        for name, future in admin.alter_user_scram_credentials(upserts).items():
            try:
                future.result()
            except KafkaException as exc:
                raise BrokerStartError(
                    f"the broker refused SCRAM credentials for user {name!r}: "
                    f"{self._redact(str(exc))}"
                ) from None

    @property
    def probe_bootstrap_servers(self) -> str:
        """Where this runtime's own checks connect: the mTLS listener (as the broker's own
        identity) on a secured broker, else :attr:`bootstrap_servers`."""
        return self.mtls_bootstrap_servers or self.bootstrap_servers

    def wait_ready(self) -> None:
        """Wait until the process :meth:`launch` started answers metadata requests, at most
        ``start_timeout_ms`` after the launch. Raises :class:`BrokerStartError` with the
        log's tail if it exits or does not answer in time (the process is left as it is)."""
        proc = self._proc
        if proc is None:
            raise BrokerStartError(f"the broker on {self.data_dir} was not launched")
        deadline = self._launched_at + self.config.start_timeout_ms / 1000
        admin_config: dict[str, Any] = {
            "bootstrap.servers": self.probe_bootstrap_servers,
            "logger": _probe_logger,
            **self._probe_settings(),
        }
        admin = AdminClient(admin_config)
        while True:
            code = proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the local broker exited with code {code} while starting; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                metadata = admin.list_topics(timeout=1.0)
                if metadata.brokers:
                    break
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the local broker did not answer within {self.config.start_timeout_ms} ms; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        logger.info(
            "local Kafka %s node %d ready at %s in %.1f s (data in %s)",
            KAFKA_VERSION, self.node_id, self.bootstrap_servers,
            time.monotonic() - self._launched_at, self.data_dir,
        )  # fmt: skip

    def wait_coordinators(self) -> None:
        """Wait until a consumer group and a transactional producer can be served whatever
        their name (see :func:`wait_for_coordinators`), at most ``start_timeout_ms`` after the
        launch. Raises :class:`BrokerStartError` naming what did not answer, with the log's
        tail."""
        started = time.monotonic()
        deadline = self._launched_at + self.config.start_timeout_ms / 1000
        offsets, transactions = self._internal_partitions()
        try:
            wait_for_coordinators(
                self.probe_bootstrap_servers, offsets, transactions, deadline,
                settings=self._probe_settings(),
            )  # fmt: skip
        except BrokerStartError as exc:
            raise BrokerStartError(f"{exc}; log tail:\n{self.log_tail()}") from exc
        logger.info(
            "local Kafka node %d: group and transaction coordinators ready in %.1f s",
            self.node_id, time.monotonic() - started,
        )  # fmt: skip

    def _probe_settings(self) -> dict[str, Any]:
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
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        if self._paused:
            proc.send_signal(signal.SIGCONT)
            self._paused = False

    def wait_stopped(self) -> None:
        """Wait up to ``stop_timeout_ms`` for the process to exit, then kill it."""
        proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(self.config.stop_timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            logger.warning("local broker did not stop in time; killing it")
            proc.kill()
            proc.wait()
        self._proc = None
        self._paused = False
        logger.info("local Kafka at %s stopped", self.bootstrap_servers)

    def stop(self) -> None:
        """Stop cleanly (SIGTERM), killing the process if it takes too long."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            self._paused = False
            return
        self.begin_stop()
        self.wait_stopped()

    def kill(self) -> None:
        """Kill the broker with SIGKILL (no clean shutdown)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None
        self._paused = False

    def pause(self) -> None:
        """Freeze the process (SIGSTOP), like a node in a long GC pause: it keeps its sockets
        and answers nothing until :meth:`resume`. Returns once the kernel shows it stopped."""
        pid = self.pid
        if pid is None:
            raise IllegalStateError(f"cannot pause the broker on {self.data_dir}: not running")
        os.kill(pid, signal.SIGSTOP)
        self._paused = True
        deadline = time.monotonic() + 5.0
        while _process_state(pid) not in ("T", None) and time.monotonic() < deadline:
            time.sleep(0.01)

    def resume(self) -> None:
        """Let a paused process run again (SIGCONT)."""
        pid = self.pid
        if pid is None:
            raise IllegalStateError(f"cannot resume the broker on {self.data_dir}: not running")
        os.kill(pid, signal.SIGCONT)
        self._paused = False

    def restart(self) -> None:
        """Stop cleanly and start again on the same data and ports."""
        self.stop()
        self.start()


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text`` (over its UTF-16 code units), a signed 32-bit
    int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition Kafka's coordinators place a group id or transactional id
    in: ``Utils.abs(key.hashCode()) % partitions`` (``Utils.abs(MIN_VALUE)`` is 0)."""
    hashed = java_string_hash(key)
    return (0 if hashed == -(2**31) else abs(hashed)) % partitions


def probe_keys(prefix: str, partitions: int) -> dict[int, str]:
    """One key per partition: ``<prefix>-<n>`` for the smallest ``n`` landing in it."""
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < partitions:
        key = f"{prefix}-{n}"
        keys.setdefault(coordinator_partition(key, partitions), key)
        n += 1
    return keys


# Errors a coordinator answers while it is not (yet) serving a partition.
_COORDINATOR_ERRORS = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)

GROUP_PROBE_PREFIX = "bridge-local-ready"
"""Group ids and transactional ids of the readiness probes start with this."""


def wait_for_coordinators(
    bootstrap_servers: str,
    offsets_partitions: int,
    transaction_partitions: int,
    deadline: float,
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Wait until every partition of ``__consumer_offsets`` and ``__transaction_state`` is
    served, so the first consumer group join and the first ``init_transactions`` find a
    coordinator at once (on a fresh broker the first ``JoinGroup`` otherwise gets "Not
    coordinator" and librdkafka backs off about 3 s). For every partition, one group id that
    Kafka places there is described (which finds its coordinator and
    creates ``__consumer_offsets`` if needed; no group is created), and one transactional
    producer whose id lands there initialises (creating ``__transaction_state``). Polls until
    ``deadline`` (``time.monotonic()``); raises :class:`BrokerStartError` naming the
    partitions that did not answer and the last error."""
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": _probe_logger,
        **(settings or {}),
    }
    admin = AdminClient(dict(base))
    waiting = probe_keys(GROUP_PROBE_PREFIX, offsets_partitions)
    last_error = ""
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerStartError(
                f"the group coordinator did not serve __consumer_offsets partitions "
                f"{sorted(waiting)} in time (last error: {last_error or 'none'})"
            )
        # Describing a group that does not exist creates nothing; it answers (state DEAD)
        # once the partition holding it is loaded. (Asking for its committed offsets instead
        # made confluent-kafka 2.16 crash with SIGSEGV on a fresh broker.)
        futures = admin.describe_consumer_groups(
            list(waiting.values()), request_timeout=max(0.5, min(5.0, remaining))
        )
        for partition, group in list(waiting.items()):
            try:
                futures[group].result()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() not in _COORDINATOR_ERRORS:
                    raise BrokerStartError(
                        f"the group coordinator refused a probe of __consumer_offsets "
                        f"partition {partition}: {error}"
                    ) from exc
                last_error = str(error)
                continue
            del waiting[partition]
        if waiting:
            time.sleep(0.1)
    transactional = probe_keys(GROUP_PROBE_PREFIX, transaction_partitions)
    # One producer per partition, all at once: each init is mostly waiting.
    with ThreadPoolExecutor(max_workers=min(len(transactional), 16)) as pool:
        results = list(
            pool.map(
                lambda item: _init_transactions_probe(base, item[0], item[1], deadline),
                sorted(transactional.items()),
            )
        )
    failed = [result for result in results if result is not None]
    if failed:
        raise BrokerStartError("; ".join(failed))


def _init_transactions_probe(
    base: Mapping[str, Any], partition: int, transactional_id: str, deadline: float
) -> str | None:
    """Initialise a transactional producer with ``transactional_id`` (in ``__transaction_state``
    partition ``partition``) until it succeeds or ``deadline``; None, or what went wrong."""
    producer = Producer({**base, "transactional.id": transactional_id})
    last_error = ""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (
                    f"the transaction coordinator did not serve __transaction_state partition "
                    f"{partition} in time (last error: {last_error or 'none'})"
                )
            try:
                producer.init_transactions(max(0.5, remaining))
                return None
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and not (
                    error.code() in _COORDINATOR_ERRORS or error.retriable()
                ):
                    return (
                        f"the transaction coordinator refused a probe of __transaction_state "
                        f"partition {partition}: {error}"
                    )
                last_error = str(error)
                time.sleep(0.1)
    finally:
        producer.flush(0)


def _process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``T``: stopped), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    return stat.rsplit(")", 1)[1].split()[0]
