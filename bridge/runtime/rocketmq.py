"""A real Apache RocketMQ 5 (name server + broker) on loopback, for side-by-side runs.

The project compares itself with the system whose semantics it keeps: the differential suite
(``tests/differential/``) and ``python -m bench rocketmq`` run the same workloads against this
and against the bridge. The jars (name server, broker and the remoting client) come from Maven
Central through :mod:`bridge.runtime.jars` (set ``rocketmq``), like the local Kafka broker's.

Everything the two processes write lives in one data directory: ``namesrv.properties``,
``broker.conf``, ``rocketmq.json`` (ports, pids), ``store/`` (commit log, consume queues, timer
log and wheel, checkpoints) and ``logs/`` (their stdout, and RocketMQ's own log files under
``logs/rocketmqlogs``). The remoting protocol of the 4.x-style client talks to the name server
and broker directly. With ``proxy=True`` the broker runs inside RocketMQ 5's gRPC proxy in *local
mode* (``ProxyStartup -pm local -bc broker.conf``, jars of the set ``rocketmq-proxy``): one JVM
serves both the broker's remoting port, as before, and the proxy's gRPC port
(:attr:`LocalRocketMQ.proxy_addr`), the endpoint of RocketMQ 5's clients (``SimpleConsumer``,
FIFO consumer groups). Its ``rmq-proxy.json`` is in the data directory too.

The broker runs with the timer wheel on (``timerWheelEnable``) and transactional messages
(always on in RocketMQ); the settings both sides must share to be compared are fields of
:class:`LocalRocketMQConfig`, written under RocketMQ's own names: ``messageDelayLevel``,
``transactionTimeOut``, ``transactionCheckInterval``, ``transactionCheckMax``,
``transactionOpBatchInterval``, ``timerPrecisionMs`` and ``timerMaxDelaySec``. Heaps are small
(256 MiB for the name server, 512 MiB for the broker by default) so both fit beside Kafka on
two cores.

The module stays a little above 500 lines: one launcher for both ways of running the broker
(beside the name server, or inside the proxy), whose configuration files, port choices and
start-up checks share one data directory and the retries of a start that lost a port race.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bridge.delay.model import DEFAULT_MESSAGE_DELAY_LEVEL, TIMER_PRECISIONS_MS, parse_delay_levels
from bridge.errors import BrokerStartError, InvalidArgumentError
from bridge.lifecycle import Startable
from bridge.runtime.jars import JAVA_HINT, ensure_jars, require_tool
from bridge.runtime.node_config import free_port, port_in_use

logger = logging.getLogger(__name__)

NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
PROXY_MAIN = "org.apache.rocketmq.proxy.ProxyStartup"
_PROXY_READY = b"rocketmq-proxy startup successfully"
_START_TRIES = 3
_NAMESRV_READY = b"The Name Server boot success"
_BROKER_READY = b"boot success"
BROKER_NAME = "broker-a"
"""The broker's ``brokerName`` (one master, ``brokerId=0``)."""
CLUSTER_NAME = "DefaultCluster"


@dataclass(frozen=True, slots=True)
class LocalRocketMQConfig:
    """Where and how the local name server and broker run.

    A port of 0 picks a free one (then remembered in the data directory). The broker also
    listens on ``broker_port - 2`` (its "VIP" channel) and ``broker_port + 1`` (HA), as
    RocketMQ does; a picked port has both free.
    """

    data_dir: Path
    namesrv_port: int = 0
    broker_port: int = 0
    namesrv_heap_mb: int = 256
    """Name server JVM heap, MiB."""
    broker_heap_mb: int = 512
    """Broker JVM heap, MiB."""
    broker_direct_memory_mb: int = 512
    """Broker ``-XX:MaxDirectMemorySize`` (Netty buffers), MiB."""
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    """RocketMQ's ``messageDelayLevel`` (the format of ``ClientConfig.message_delay_level``)."""
    transaction_timeout_ms: int = 6_000
    """RocketMQ's ``transactionTimeOut``: first check of a half message after, ms."""
    transaction_check_interval_ms: int = 30_000
    """RocketMQ's ``transactionCheckInterval``: the check service runs every, ms."""
    transaction_check_max: int = 15
    """RocketMQ's ``transactionCheckMax``: checks before a half message is moved to
    ``TRANS_CHECK_MAX_TIME_TOPIC``."""
    transaction_op_batch_interval_ms: int = 3_000
    """RocketMQ's ``transactionOpBatchInterval``: the broker writes the OP records that end
    transactions in batches this often, ms. Scale it with ``transaction_check_interval_ms``
    (the defaults are 3 s and 30 s): a check that runs before a commit's OP record is written
    checks the decided message again, and a second COMMIT answer writes it to its topic again."""
    timer_precision_ms: int = 1000
    """RocketMQ's ``timerPrecisionMs``."""
    timer_max_delay_sec: int = 3 * 86_400
    """RocketMQ's ``timerMaxDelaySec``, s."""
    start_timeout_ms: int = 120_000
    """How long each process may take to say it booted, ms."""
    stop_timeout_ms: int = 30_000
    """How long a clean stop may take before a process is killed, ms."""
    broker_properties: Mapping[str, str] = field(default_factory=dict)
    """Extra ``broker.conf`` entries (they win over the ones derived above)."""
    proxy: bool = False
    """Run the broker inside RocketMQ 5's gRPC proxy in local mode (one JVM; the broker's
    remoting port stays), for RocketMQ 5's gRPC clients."""
    grpc_port: int = 0
    """The proxy's gRPC port (0: a free one); with ``proxy`` only."""
    proxy_properties: Mapping[str, str | int | bool] = field(default_factory=dict)
    """Extra ``rmq-proxy.json`` entries under the proxy's own names (``ProxyConfig``), e.g.
    ``minInvisibleTimeMillsForRecv``; they win over the ones derived here."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(
            self, "broker_properties", MappingProxyType(dict(self.broker_properties))
        )
        object.__setattr__(self, "proxy_properties", MappingProxyType(dict(self.proxy_properties)))
        if (self.grpc_port or self.proxy_properties) and not self.proxy:
            raise InvalidArgumentError("grpc_port and proxy_properties need proxy=True")
        for name in ("namesrv_port", "broker_port", "grpc_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgumentError(f"{name} must be 0..65535, got {value}")
        if self.broker_port and self.broker_port < 3:
            raise InvalidArgumentError(
                f"broker_port must be 0 or at least 3, got {self.broker_port}"
            )
        for name in ("namesrv_heap_mb", "broker_heap_mb", "broker_direct_memory_mb"):
            if getattr(self, name) < 64:
                raise InvalidArgumentError(f"{name} must be at least 64, got {getattr(self, name)}")
        parse_delay_levels(self.message_delay_level)
        for name in (
            "transaction_timeout_ms", "transaction_check_interval_ms", "transaction_check_max",
            "transaction_op_batch_interval_ms", "timer_max_delay_sec", "start_timeout_ms",
            "stop_timeout_ms",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} must be positive, got {getattr(self, name)}")
        if self.timer_precision_ms not in TIMER_PRECISIONS_MS:
            raise InvalidArgumentError(
                f"timer_precision_ms must be one of {TIMER_PRECISIONS_MS}, "
                f"got {self.timer_precision_ms}"
            )


def _broker_ports() -> int:
    """A listen port ``p`` with ``p - 2`` (VIP channel) and ``p + 1`` (HA) free too."""
    for _ in range(200):
        port = free_port()
        if port > 3 and not port_in_use(port - 2) and not port_in_use(port + 1):
            return port
    raise BrokerStartError("found no free port p with p-2 and p+1 free for the RocketMQ broker")


def _pid_rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class LocalRocketMQ(Startable):
    """Start, stop and kill one local RocketMQ name server and broker.

    ``with LocalRocketMQ(LocalRocketMQConfig(data_dir)) as rmq: rmq.namesrv_addr``.
    """

    def __init__(self, config: LocalRocketMQConfig) -> None:
        self.config = config
        self._namesrv: subprocess.Popen[bytes] | None = None
        self._broker: subprocess.Popen[bytes] | None = None
        self._state: dict[str, Any] = {}
        self._marks: dict[str, int] = {}
        """Sizes of ``<name>.out`` when the last start began (what it wrote comes after)."""
        self.start_seconds: float | None = None
        """Wall time of the last :meth:`start`, from launching the name server until the
        broker said it booted, s."""

    # --- paths and state ----------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        """The data directory."""
        return self.config.data_dir

    @property
    def libs(self) -> Path:
        """The jar directory (fetched on first use): the proxy's set (which holds the broker
        and name server) with ``proxy``, else the broker's."""
        return ensure_jars("rocketmq-proxy" if self.config.proxy else "rocketmq")

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "rocketmq.json"

    @property
    def namesrv_addr(self) -> str:
        """``127.0.0.1:<port>`` of the name server (what clients are given)."""
        return f"127.0.0.1:{self._load_state()['namesrv_port']}"

    @property
    def broker_addr(self) -> str:
        """``127.0.0.1:<port>`` of the broker."""
        return f"127.0.0.1:{self._load_state()['broker_port']}"

    @property
    def proxy_addr(self) -> str:
        """``127.0.0.1:<port>`` of the gRPC proxy (RocketMQ 5 clients' endpoint); only with
        ``proxy``."""
        if not self.config.proxy:
            raise InvalidArgumentError("this RocketMQ runs without a proxy (proxy=False)")
        return f"127.0.0.1:{self._load_state()['grpc_port']}"

    @property
    def pids(self) -> list[int]:
        """Process ids of the running name server and broker."""
        return [p.pid for p in (self._namesrv, self._broker) if p is not None and p.poll() is None]

    @property
    def is_running(self) -> bool:
        """True while both processes are alive."""
        return len(self.pids) == 2

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each running process, bytes: ``{"namesrv": .., "broker": ..}``."""
        out: dict[str, int] = {}
        for name, proc in (("namesrv", self._namesrv), ("broker", self._broker)):
            if proc is not None and proc.poll() is None:
                out[name] = _pid_rss_bytes(proc.pid)
        return out

    def _load_state(self) -> dict[str, Any]:
        if not self._state:
            if self._state_file.is_file():
                self._state = json.loads(self._state_file.read_text())
            else:
                self._state = {
                    "namesrv_port": self.config.namesrv_port or free_port(),
                    "broker_port": self.config.broker_port or _broker_ports(),
                }
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._save_state()
            if self.config.proxy and "grpc_port" not in self._state:
                # The proxy's remoting server listens too (its default port is 8080).
                self._state["grpc_port"] = self.config.grpc_port or free_port()
                self._state["proxy_remoting_port"] = free_port()
                self._save_state()
            for name in ("namesrv_port", "broker_port", "grpc_port"):
                if getattr(self.config, name):
                    self._state[name] = getattr(self.config, name)
        return self._state

    def _save_state(self) -> None:
        self._state_file.write_text(json.dumps(self._state, indent=2) + "\n")

    def broker_conf(self) -> dict[str, str]:
        """The ``broker.conf`` entries this configuration gives."""
        state = self._load_state()
        port = int(state["broker_port"])
        store = self.data_dir / "store"
        conf = {
            "brokerClusterName": CLUSTER_NAME,
            "brokerName": BROKER_NAME,
            "brokerId": "0",
            "brokerRole": "ASYNC_MASTER",
            "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": self.namesrv_addr,
            "brokerIP1": "127.0.0.1",
            "bindAddress": "127.0.0.1",
            "listenPort": str(port),
            "haListenPort": str(port + 1),
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            "autoCreateTopicEnable": "true",
            "autoCreateSubscriptionGroup": "true",
            # The broker refuses writes when the disk is 75 % full by default; a shared
            # development disk is often fuller than that.
            "diskMaxUsedSpaceRatio": "95",
            "messageDelayLevel": self.config.message_delay_level,
            "transactionTimeOut": str(self.config.transaction_timeout_ms),
            "transactionCheckInterval": str(self.config.transaction_check_interval_ms),
            "transactionCheckMax": str(self.config.transaction_check_max),
            "transactionOpBatchInterval": str(self.config.transaction_op_batch_interval_ms),
            "timerWheelEnable": "true",
            "timerPrecisionMs": str(self.config.timer_precision_ms),
            "timerMaxDelaySec": str(self.config.timer_max_delay_sec),
        }
        conf.update(self.config.broker_properties)
        return conf

    def proxy_conf(self) -> dict[str, str | int | bool]:
        """The ``rmq-proxy.json`` entries this configuration gives (with ``proxy``)."""
        state = self._load_state()
        conf: dict[str, str | int | bool] = {
            "rocketMQClusterName": CLUSTER_NAME,
            "proxyMode": "local",
            "namesrvAddr": self.namesrv_addr,
            "grpcServerPort": int(state["grpc_port"]),
            "remotingListenPort": int(state["proxy_remoting_port"]),
            # Small thread pools: the defaults size for a server (16 + 2 per core, and more).
            "grpcThreadPoolNums": 8,
            "grpcWorkerLoopNum": 2,
            "enablePrintJstack": False,
        }
        conf.update(self.config.proxy_properties)
        return conf

    # --- lifecycle ------------------------------------------------------------------------
    def _java(self, java: str, heap_mb: int, *extra: str) -> list[str]:
        home = self.data_dir / "home"
        return [
            java,
            f"-Xms{heap_mb}m",
            f"-Xmx{heap_mb}m",
            "-XX:+UseG1GC",
            "-XX:-OmitStackTraceInFastThrow",
            *extra,
            # RocketMQ's logback configuration writes under ${user.home}/logs/rocketmqlogs.
            f"-Duser.home={home}",
            f"-Drocketmq.home.dir={self.data_dir}",
            "-cp",
            f"{self.libs}/*",
        ]

    def _stop_stale(self) -> None:
        """Stop processes left running on this data directory by a process that died."""
        for key in ("broker_pid", "namesrv_pid"):
            pid = self._state.get(key)
            if not pid:
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"org.apache.rocketmq" in cmdline and str(self.data_dir).encode() in cmdline:
                logger.warning(
                    "stopping a stale RocketMQ process (pid %s) on %s", pid, self.data_dir
                )
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.1)

    def _launch(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{name}.out").open("ab") as out:
            # Own session: Ctrl-C in a terminal reaches us, and we stop the processes in order.
            return subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _wait_for(self, name: str, proc: subprocess.Popen[bytes], marker: bytes, mark: int) -> None:
        """Wait until ``marker`` appears in ``<name>.out`` past byte ``mark``."""
        out = self.data_dir / "logs" / f"{name}.out"
        deadline = time.monotonic() + self.config.start_timeout_ms / 1000
        while True:
            if out.is_file():
                with out.open("rb") as f:
                    f.seek(mark)
                    if marker in f.read():
                        return
            code = proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"the RocketMQ {name} exited with code {code} while starting; "
                    f"log tail:\n{self.log_tail(name)}"
                )
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"the RocketMQ {name} did not boot within {self.config.start_timeout_ms} ms; "
                    f"log tail:\n{self.log_tail(name)}"
                )
            time.sleep(0.1)

    def start(self) -> None:
        """Fetch the jars if needed, start the name server, then the broker, and wait until
        both say they booted. Raises :class:`BrokerStartError` with the log's tail on failure.

        The broker also binds ports it was not given a check for until it starts (its HA port,
        ``broker_port + 1``): on a busy machine another process's outgoing connection can take
        one between the pick and the bind. A start that fails on a port in use is tried again
        on newly picked ports (unless the configuration fixed them), up to three times."""
        if self.is_running:
            return
        java = require_tool("java", JAVA_HINT)
        self.libs  # noqa: B018 - fetch before timing the start
        for attempt in range(1, _START_TRIES + 1):
            try:
                self._start_once(java)
                return
            except BrokerStartError:
                if attempt == _START_TRIES or not self._lost_a_port() or not self._repick_ports():
                    raise
                logger.warning("RocketMQ lost a port race while starting; trying new ports")

    def _lost_a_port(self) -> bool:
        """Whether the last start failed because a port was in use."""
        for name, mark in self._marks.items():
            out = self.data_dir / "logs" / f"{name}.out"
            if out.is_file():
                with out.open("rb") as f:
                    f.seek(mark)
                    if b"Address already in use" in f.read():
                        return True
        return False

    def _repick_ports(self) -> bool:
        """Pick new free ports for those the configuration left to us; False if none."""
        state = self._load_state()
        picked = False
        if not self.config.namesrv_port:
            state["namesrv_port"], picked = free_port(), True
        if not self.config.broker_port:
            state["broker_port"], picked = _broker_ports(), True
        if self.config.proxy:
            state["proxy_remoting_port"], picked = free_port(), True
            if not self.config.grpc_port:
                state["grpc_port"] = free_port()
        self._save_state()
        return picked

    def _start_once(self, java: str) -> None:
        state = self._load_state()
        self._stop_stale()
        ports = ["namesrv_port", "broker_port"]
        if self.config.proxy:
            ports += ["grpc_port", "proxy_remoting_port"]
        for name in ports:
            if port_in_use(int(state[name])):
                raise BrokerStartError(
                    f"cannot start RocketMQ: 127.0.0.1:{state[name]} ({name}) is in use"
                )
        (self.data_dir / "home").mkdir(parents=True, exist_ok=True)
        namesrv_props = self.data_dir / "namesrv.properties"
        namesrv_props.write_text(
            f"listenPort={state['namesrv_port']}\nbindAddress=127.0.0.1\n"
            f"rocketmqHome={self.data_dir}\n"
        )
        broker_conf = self.data_dir / "broker.conf"
        broker_conf.write_text("".join(f"{k}={v}\n" for k, v in self.broker_conf().items()))
        started = time.monotonic()
        self._marks = {name: self._out_size(name) for name in ("namesrv", "broker")}
        try:
            mark = self._out_size("namesrv")
            self._namesrv = self._launch(
                "namesrv",
                [*self._java(java, self.config.namesrv_heap_mb), NAMESRV_MAIN,
                 "-c", str(namesrv_props)],
            )  # fmt: skip
            state["namesrv_pid"] = self._namesrv.pid
            self._save_state()
            self._wait_for("namesrv", self._namesrv, _NAMESRV_READY, mark)
            mark = self._out_size("broker")
            direct = f"-XX:MaxDirectMemorySize={self.config.broker_direct_memory_mb}m"
            if self.config.proxy:
                proxy_json = self.data_dir / "rmq-proxy.json"
                proxy_json.write_text(json.dumps(self.proxy_conf(), indent=2) + "\n")
                main = [PROXY_MAIN, "-pm", "local", "-bc", str(broker_conf),
                        "-pc", str(proxy_json), "-n", self.namesrv_addr]  # fmt: skip
                ready = _PROXY_READY
            else:
                main, ready = [BROKER_MAIN, "-c", str(broker_conf)], _BROKER_READY
            self._broker = self._launch(
                "broker", [*self._java(java, self.config.broker_heap_mb, direct), *main]
            )
            state["broker_pid"] = self._broker.pid
            self._save_state()
            self._wait_for("broker", self._broker, ready, mark)
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - started
        logger.info(
            "local RocketMQ %s: name server %s, broker %s, up in %.1f s (data in %s)",
            self.libs.parent.name, self.namesrv_addr, self.broker_addr, self.start_seconds,
            self.data_dir,
        )  # fmt: skip

    def _out_size(self, name: str) -> int:
        out = self.data_dir / "logs" / f"{name}.out"
        return out.stat().st_size if out.is_file() else 0

    def log_tail(self, name: str = "broker", lines: int = 30) -> str:
        """The last lines of the ``namesrv`` or ``broker`` stdout and RocketMQ's own log."""
        out: list[str] = []
        own = ["namesrv.log"] if name == "namesrv" else ["broker.log", "proxy.log"]
        for path in (
            *(self.data_dir / "home" / "logs" / "rocketmqlogs" / log for log in own),
            self.data_dir / "logs" / f"{name}.out",
        ):
            if path.is_file():
                out.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(out[-2 * lines :])

    def _stop_one(self, proc: subprocess.Popen[bytes] | None, name: str) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.config.stop_timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            logger.warning("RocketMQ %s did not stop in time; killing it", name)
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop the broker, then the name server (SIGTERM; killed if too slow)."""
        self._stop_one(self._broker, "broker")
        self._stop_one(self._namesrv, "namesrv")
        self._broker = self._namesrv = None

    def kill(self) -> None:
        """Kill both processes with SIGKILL (no clean shutdown)."""
        for proc in (self._broker, self._namesrv):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        self._broker = self._namesrv = None
