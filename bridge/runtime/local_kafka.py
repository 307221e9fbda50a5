"""A real single-node Apache Kafka broker (KRaft, broker + controller) on loopback.

The broker's jars come from Maven Central through :mod:`bridge.runtime.jars`. Everything the
broker writes lives in one data directory: ``server.properties``, ``broker.json`` (ports,
cluster id, pid), ``kraft/`` (the log dirs) and ``logs/server.log``. Starting again on the
same directory keeps every topic and record, on the same ports.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from bridge.errors import BrokerStartError, InvalidArgumentError
from bridge.lifecycle import Startable
from bridge.runtime.jars import JAVA_HINT, ensure_jars, require_tool

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


def _new_cluster_id() -> str:
    # Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, unpadded; like Kafka's
    # Uuid.randomUuid(), never one starting with "-" (command lines would take it for a flag).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True, slots=True)
class LocalKafkaConfig:
    """Where and how the local broker runs. A port of 0 picks a free one (then remembered)."""

    data_dir: Path
    port: int = 0
    controller_port: int = 0
    heap_mb: int = 512
    """JVM heap, MiB."""
    start_timeout_ms: int = 90_000
    """How long to wait for the broker to answer after starting it, ms."""
    stop_timeout_ms: int = 30_000
    """How long a clean stop may take before the process is killed, ms."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Extra ``server.properties`` entries."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))
        for name in ("port", "controller_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgumentError(f"{name} must be 0..65535, got {value}")
        if self.heap_mb < 128:
            raise InvalidArgumentError(f"heap_mb must be at least 128, got {self.heap_mb}")
        if self.start_timeout_ms <= 0 or self.stop_timeout_ms <= 0:
            raise InvalidArgumentError("start_timeout_ms and stop_timeout_ms must be positive")


class LocalKafka(Startable):
    """Start, stop, kill and restart one local broker process.

    ``with LocalKafka(LocalKafkaConfig(data_dir)) as kafka: kafka.bootstrap_servers``.
    """

    def __init__(self, config: LocalKafkaConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: dict[str, Any] = {}

    # --- paths and state ----------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """The broker's data directory."""
        return self.config.data_dir

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
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """True while the broker process is alive."""
        return self.pid is not None

    def _load_state(self) -> dict[str, Any]:
        if not self._state:
            if self._state_file.is_file():
                self._state = json.loads(self._state_file.read_text())
                # An explicitly configured port wins over the remembered one.
                for name in ("port", "controller_port"):
                    if getattr(self.config, name):
                        self._state[name] = getattr(self.config, name)
            else:
                self._state = {
                    "port": self.config.port or free_port(),
                    "controller_port": self.config.controller_port or free_port(),
                    "cluster_id": _new_cluster_id(),
                }
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._save_state()
        return self._state

    def _save_state(self) -> None:
        self._state_file.write_text(json.dumps(self._state, indent=2) + "\n")

    def _server_properties(self, state: Mapping[str, Any]) -> str:
        port, cport = state["port"], state["controller_port"]
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
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
        props.update(self.config.properties)
        return "".join(f"{k}={v}\n" for k, v in props.items())

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
            deadline = time.monotonic() + self.config.stop_timeout_ms / 1000
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)

    def start(self) -> None:
        """Fetch the jars if needed, format storage on first start, start the broker and wait
        until it answers. Raises :class:`BrokerStartError` with the log's tail on failure."""
        if self.is_running:
            return
        java = require_tool("java", JAVA_HINT)
        libs = ensure_jars("kafka")
        state = self._load_state()
        self._stop_stale(state)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        props_file = self.data_dir / "server.properties"
        props_file.write_text(self._server_properties(state))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        for name in ("port", "controller_port"):
            if port_in_use(state[name]):
                raise BrokerStartError(
                    f"cannot start the local broker: 127.0.0.1:{state[name]} ({name}) is in use"
                )
        base = self._java_base(java, libs)
        if not (self.data_dir / "kraft" / "meta.properties").is_file():
            fmt = subprocess.run(
                [*base, "kafka.tools.StorageTool", "format", f"--cluster-id={state['cluster_id']}",
                 "-c", str(props_file)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            if fmt.returncode != 0:
                raise BrokerStartError(
                    f"formatting broker storage failed (exit {fmt.returncode}): "
                    f"{(fmt.stdout + fmt.stderr).strip()[-2000:]}"
                )
        stdout = (self.data_dir / "logs" / "stdout.log").open("ab")
        cmd = [*base[:1], f"-Xmx{self.config.heap_mb}m", f"-Xms{min(self.config.heap_mb, 256)}m",
               *base[1:], "kafka.Kafka", str(props_file)]  # fmt: skip
        started = time.monotonic()
        # Own session: Ctrl-C in a terminal reaches us, and we stop the broker in order.
        proc = subprocess.Popen(
            cmd, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._proc = proc
        stdout.close()
        state["pid"] = proc.pid
        self._save_state()
        try:
            self._wait_ready(proc, started)
        except BaseException:
            self.kill()
            raise
        logger.info(
            "local Kafka %s ready at %s in %.1f s (data in %s)",
            libs.parent.name, self.bootstrap_servers, time.monotonic() - started, self.data_dir,
        )  # fmt: skip

    def _wait_ready(self, proc: subprocess.Popen[bytes], started: float) -> None:
        deadline = started + self.config.start_timeout_ms / 1000
        admin_config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": _probe_logger,
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
                    return
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the local broker did not answer within {self.config.start_timeout_ms} ms; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and stdout."""
        out = []
        for path in (self.log_file, self.data_dir / "logs" / "stdout.log"):
            if path.is_file():
                out.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(out[-lines:])

    def stop(self) -> None:
        """Stop cleanly (SIGTERM), killing the process if it takes too long."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.config.stop_timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            logger.warning("local broker did not stop in time; killing it")
            proc.kill()
            proc.wait()
        self._proc = None
        logger.info("local Kafka at %s stopped", self.bootstrap_servers)

    def kill(self) -> None:
        """Kill the broker with SIGKILL (no clean shutdown)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Stop cleanly and start again on the same data and ports."""
        self.stop()
        self.start()
