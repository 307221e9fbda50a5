"""The process of one local Kafka node: the JVM's command line, formatting its storage,
launching it in its own session, and stopping, killing, pausing and resuming it by signal.

A node left running by a process that died is found by the pid ``broker.json`` remembers and
stopped before a new one starts on the same data directory.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bridge.errors import BrokerStartError

logger = logging.getLogger(__name__)

LOG4J2 = """\
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
"""The node's log4j2 configuration: ``logs/server.log``, rolled at 50 MB, two kept."""


def java_base(java: str, libs: Path, data_dir: Path) -> list[str]:
    """``java`` with the log settings and the class path of the jars in ``libs``: the start of
    every command line run on the node in ``data_dir`` (the main class follows)."""
    logs = data_dir / "logs"
    return [
        java,
        f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={logs}",
        "-cp",
        f"{libs}/*",
    ]


def broker_command(
    base: Sequence[str], heap_mb: int, jvm_options: Sequence[str], props_file: Path
) -> list[str]:
    """The broker's command line: ``base`` (:func:`java_base`) with the heap (``heap_mb``,
    MiB; at most 256 MiB at first) and ``jvm_options``, running ``props_file``."""
    return [
        *base[:1],
        f"-Xmx{heap_mb}m",
        f"-Xms{min(heap_mb, 256)}m",
        *jvm_options,
        *base[1:],
        "kafka.Kafka",
        str(props_file),
    ]


def format_storage(
    base: Sequence[str],
    cluster_id: str,
    props_file: Path,
    extra: Sequence[str],
    redact: Callable[[str], str],
) -> None:
    """Format the log dirs of ``props_file`` for ``cluster_id`` (``extra``: more arguments of
    the storage tool). Raises :class:`BrokerStartError` with the tool's output, passed through
    ``redact``, if it fails."""
    tool = ["kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}"]
    fmt = subprocess.run(
        [*base, *tool, "-c", str(props_file), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if fmt.returncode != 0:
        raise BrokerStartError(
            f"formatting broker storage failed (exit {fmt.returncode}): "
            f"{redact((fmt.stdout + fmt.stderr).strip()[-2000:])}"
        )


def formatted_cluster_id(data_dir: Path) -> str | None:
    """The cluster id in the formatted storage's ``meta.properties``, or None."""
    meta = data_dir / "kraft" / "meta.properties"
    if not meta.is_file():
        return None
    for line in meta.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


def stop_stale(pid: int | None, data_dir: Path, stop_timeout_ms: int) -> None:
    """Stop a broker (process ``pid``) left running on ``data_dir`` by a process that died:
    SIGTERM, SIGKILL after ``stop_timeout_ms``. Nothing if ``pid`` is not such a broker."""
    if not pid:
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return
    if b"kafka.Kafka" in cmdline and str(data_dir).encode() in cmdline:
        logger.warning("stopping a stale broker (pid %s) left on %s", pid, data_dir)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGCONT)  # a paused one would never see the SIGTERM
        deadline = time.monotonic() + stop_timeout_ms / 1000
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


class NodeProcess:
    """The JVM of one node: launched in its own session, then stopped, killed, paused and
    resumed by signal. Not thread-safe: drive it from one thread."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.launched_at = 0.0
        """When the last :meth:`launch` started the process, ``time.monotonic()`` s."""

    @property
    def launched(self) -> bool:
        """True from :meth:`launch` until the process is stopped, killed or forgotten."""
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        """The process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_paused(self) -> bool:
        """True while the process is alive and frozen by :meth:`pause`."""
        return self._paused and self.pid is not None

    def poll(self) -> int | None:
        """The launched process's exit code, or None while it runs (or none was launched)."""
        return self._proc.poll() if self._proc is not None else None

    def launch(self, cmd: Sequence[str], stdout_path: Path) -> int:
        """Start ``cmd`` with its stdout and stderr appended to ``stdout_path``; its pid."""
        stdout = stdout_path.open("ab")
        self.launched_at = time.monotonic()
        # Own session: Ctrl-C in a terminal reaches us, and we stop the broker in order.
        proc = subprocess.Popen(
            list(cmd), stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._proc = proc
        self._paused = False
        stdout.close()
        return proc.pid

    def begin_stop(self) -> None:
        """SIGTERM (and SIGCONT if paused) to a running process, without waiting."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        if self._paused:
            proc.send_signal(signal.SIGCONT)
            self._paused = False

    def wait_stopped(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit, then kill it; False if none was
        launched."""
        proc = self._proc
        if proc is None:
            return False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("local broker did not stop in time; killing it")
            proc.kill()
            proc.wait()
        self.forget()
        return True

    def kill(self) -> None:
        """SIGKILL a running process and wait for it to go."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.forget()

    def forget(self) -> None:
        """Drop the launched process (it has exited)."""
        self._proc = None
        self._paused = False

    def pause(self) -> bool:
        """SIGSTOP the running process and return once the kernel shows it stopped (at most
        5 s); False if it does not run."""
        pid = self.pid
        if pid is None:
            return False
        os.kill(pid, signal.SIGSTOP)
        self._paused = True
        deadline = time.monotonic() + 5.0
        while process_state(pid) not in ("T", None) and time.monotonic() < deadline:
            time.sleep(0.01)
        return True

    def resume(self) -> bool:
        """SIGCONT the running process; False if it does not run."""
        pid = self.pid
        if pid is None:
            return False
        os.kill(pid, signal.SIGCONT)
        self._paused = False
        return True


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``T``: stopped), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    return stat.rsplit(")", 1)[1].split()[0]
