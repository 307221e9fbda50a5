"""The run's two coordinators: ``bridge coordinator`` child processes with the settings
scaled down (:class:`~chaos.run_config.RunConfig`), restarted by a watchdog when one exits on
its own, killed, paused, resumed and restarted by the nemeses, each with its own log that ends
with a dump of its threads' stacks; and the wait until every coordinator service is healthy.
:mod:`chaos.runner` re-exports every public name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bridge.config import ClientConfig
from bridge.coordinator.health import coordinator_health
from chaos.run_config import REPO_ROOT, RunConfig

logger = logging.getLogger("chaos")

COORDINATOR_NAMES: Final = ("coordinator-1", "coordinator-2")

_COORDINATOR_MAIN: Final = (
    "import signal, sys\n"
    "from chaos.stacks import dump_stacks_on\n"
    "dump_stacks_on(signal.SIGUSR1)\n"
    "from bridge.cli import main\n"
    "sys.argv[0] = 'bridge'\n"
    "main()\n"
)
"""``bridge coordinator`` as the CLI runs it, plus a dump of every thread's stack on stderr
(the coordinator's log) on SIGUSR1 (:mod:`chaos.stacks`): the runner asks for one when the load
ends and before it stops the coordinators, so a service stuck in a call shows where."""


class CoordinatorProcess:
    """One ``bridge coordinator`` child process (its own session: a terminal's Ctrl-C reaches
    the runner only, which stops it in order)."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_path
        self.coordinator_id = env["BRIDGE_COORDINATOR_ID"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, coordinator_id: str | None = None) -> None:
        if coordinator_id:
            self.coordinator_id = coordinator_id
        env = {**self.env, "BRIDGE_COORDINATOR_ID": self.coordinator_id}
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.coordinator_id} at {datetime.now(UTC)} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _COORDINATOR_MAIN, "-v", "coordinator"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                start_new_session=True,
            )  # fmt: skip
        self.paused = False

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.paused = False

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGCONT (if paused), SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %.0f s; killing it", self.name, timeout_s)
            self.kill()
        self.paused = False


class Coordinators:
    """The two coordinators, restarted by a watchdog if one exits on its own (counted and
    reported: a coordinator should not die of the faults)."""

    def __init__(self, config: RunConfig, bootstrap: str, out_dir: Path) -> None:
        self.config = config
        base = {
            **os.environ,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "BRIDGE_NAMESPACE": config.namespace,
            "BRIDGE_MESSAGE_DELAY_LEVEL": config.message_delay_level,
            "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
            "BRIDGE_TRANSACTION_TIMEOUT_MS": str(config.transaction_timeout_ms),
            "BRIDGE_CHECK_INTERVAL_MS": str(config.check_interval_ms),
            "BRIDGE_SESSION_TIMEOUT_MS": str(config.session_timeout_ms),
            "BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS": str(config.kafka_transaction_timeout_ms),
            "BRIDGE_TRANSACTION_PARTITIONS": "4",
            "BRIDGE_STATUS_INTERVAL_MS": "15000",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs = {
            name: CoordinatorProcess(
                name, {**base, "BRIDGE_COORDINATOR_ID": f"chaos-{name}"}, out_dir / f"{name}.log"
            )
            for name in COORDINATOR_NAMES
        }
        self._lock = threading.Lock()
        self._down: set[str] = set()
        """Names a nemesis keeps down on purpose."""
        self.unexpected_exits: list[str] = []
        self._stop = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="chaos-coordinators", daemon=True
        )

    @property
    def names(self) -> Sequence[str]:
        return list(self.procs)

    @property
    def session_timeout_s(self) -> float:
        return self.config.session_timeout_ms / 1000

    def start_all(self) -> None:
        for proc in self.procs.values():
            proc.start()
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                for name, proc in self.procs.items():
                    if name in self._down or proc.alive() or proc.proc is None:
                        continue
                    code = proc.proc.returncode
                    note = f"{name} ({proc.coordinator_id}) exited by itself with code {code}"
                    logger.warning("%s; restarting it", note)
                    self.unexpected_exits.append(f"{datetime.now(UTC):%H:%M:%S} {note}")
                    proc.restarts += 1
                    proc.start()

    def kill(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            self._down.add(name)
            pid = proc.pid
            proc.kill()
        return f"pid {pid}, id {proc.coordinator_id}"

    def start(self, name: str, new_id: bool = False) -> str:
        with self._lock:
            proc = self.procs[name]
            if new_id:
                proc.restarts += 1
                base = proc.env["BRIDGE_COORDINATOR_ID"]
                proc.start(f"{base}-r{proc.restarts}")
            else:
                proc.start()
            self._down.discard(name)
        return f"pid {proc.pid}, id {proc.coordinator_id}" + (" (new id)" if new_id else "")

    def pause(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            self._down.add(name)
            proc.signal(signal.SIGSTOP)
            proc.paused = True
        return f"pid {proc.pid}, id {proc.coordinator_id}"

    def resume(self, name: str) -> str:
        with self._lock:
            proc = self.procs[name]
            proc.signal(signal.SIGCONT)
            proc.paused = False
            self._down.discard(name)
        return f"pid {proc.pid}, id {proc.coordinator_id}"

    def dump_stacks(self, why: str) -> None:
        """Every live coordinator writes its threads' stacks to its log (SIGUSR1)."""
        with self._lock:
            for proc in self.procs.values():
                if proc.alive() and not proc.paused:
                    with proc.log_path.open("ab") as log:
                        log.write(f"\n=== thread dump: {why} at {datetime.now(UTC)} ===\n".encode())
                    proc.signal(signal.SIGUSR1)

    def stop_all(self) -> None:
        self.dump_stacks("stopping")
        time.sleep(0.5)
        self._stop.set()
        if self._watchdog.is_alive():
            self._watchdog.join(5)
        with self._lock:
            for proc in self.procs.values():
                proc.signal(signal.SIGCONT)
            for proc in self.procs.values():
                proc.stop()


def wait_coordinators_healthy(bootstrap: str, namespace: str, timeout_s: float) -> None:
    """Until every coordinator service's group is stable with a member."""
    config = ClientConfig(bootstrap_servers=bootstrap, namespace=namespace)
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = coordinator_health(config)
            if all(s.healthy for s in last):
                return
        except Exception as exc:
            last = exc
        time.sleep(1.0)
    raise TimeoutError(f"coordinators not healthy within {timeout_s:.0f} s: {last}")
