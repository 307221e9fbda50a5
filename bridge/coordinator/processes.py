"""Several coordinator processes run by one command (``bridge coordinator --processes N``).

Each coordinator service is one Python thread, so one process uses about one core however many
partitions it owns. Several coordinator processes already share the system topics' partitions
through Kafka's group protocol; this module starts ``N`` of them as child processes of one
command, with coordinator ids derived from the given one (``<id>-1`` ... ``<id>-N``: distinct,
and the same again after a restart, so each child takes its partitions back at once through
static membership), and stops them together:

- SIGINT or SIGTERM to the command stops every child (SIGTERM, then SIGKILL after a grace
  period) and the command exits 0 once they all stopped cleanly;
- a child that ends by itself (a failed service, a crash) is reported with its id, pid and exit
  status; the others are stopped and the command ends non-zero, so whatever supervises the
  command restarts the whole group (one process of a single-process coordinator stops the same
  way when one of its services fails);
- the children are in their own process group and die with the command: a SIGKILL of the
  command sends each child SIGTERM (Linux ``PR_SET_PDEATHSIG``), so none is left behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from bridge.errors import InvalidArgumentError
from bridge.lifecycle import FatalServiceError

logger = logging.getLogger(__name__)

ENV_PROCESSES: Final = "BRIDGE_COORDINATOR_PROCESSES"
"""How many coordinator processes ``bridge coordinator`` runs (default 1: itself)."""
MAX_PROCESSES: Final = 64
"""The most processes one command starts (a typo such as 1000 would exhaust the machine)."""
STOP_GRACE_S: Final = 30.0
"""How long the children may take to stop after SIGTERM before they are killed, s."""
_WATCH_S = 0.2
_PR_SET_PDEATHSIG = 1
_MAX_PORT: Final = 65535


def parse_processes(value: str | int | None) -> int:
    """A process count from ``--processes`` or :data:`ENV_PROCESSES`: 1 when unset or empty,
    else an integer 1 to :data:`MAX_PROCESSES`; anything else raises
    :class:`InvalidArgumentError` naming the setting."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 1
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"--processes ({ENV_PROCESSES}) must be a whole number, got {value!r}"
        ) from None
    if not 1 <= count <= MAX_PROCESSES:
        raise InvalidArgumentError(
            f"--processes ({ENV_PROCESSES}) must be 1 to {MAX_PROCESSES}, got {value!r}"
        )
    return count


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """One coordinator process to start: its id, command line and environment."""

    coordinator_id: str
    argv: list[str]
    env: dict[str, str]


def child_specs(  # noqa: PLR0917 - what one command line says about its children
    count: int,
    coordinator_id: str,
    base_env: Mapping[str, str],
    root_args: Sequence[str] = (),
    overrides: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
) -> list[ChildSpec]:
    """The ``count`` children of one ``bridge coordinator --processes count``: each runs
    ``python -m bridge.cli <root_args> coordinator`` with ``base_env`` plus ``overrides``,
    the id ``<coordinator_id>-<i>`` (i from 1), one process (never a group of its own) and,
    when ``metrics_port`` is set, the port ``metrics_port + i - 1`` (0 stays 0: any free
    port); a range past port 65535 raises :class:`InvalidArgumentError` before any child
    starts."""
    if metrics_port and metrics_port + count - 1 > _MAX_PORT:
        raise InvalidArgumentError(
            f"--metrics-port {metrics_port} with --processes {count} needs ports up to "
            f"{metrics_port + count - 1}, past {_MAX_PORT}: choose a port at most "
            f"{_MAX_PORT - count + 1}"
        )
    specs = []
    for i in range(1, count + 1):
        child_id = f"{coordinator_id}-{i}"
        env = {**base_env, **(overrides or {})}
        env["BRIDGE_COORDINATOR_ID"] = child_id
        env[ENV_PROCESSES] = "1"
        if metrics_port is not None:
            env["BRIDGE_METRICS_PORT"] = str(metrics_port + i - 1 if metrics_port else 0)
        else:
            env.pop("BRIDGE_METRICS_PORT", None)
        argv = [sys.executable, "-m", "bridge.cli", *root_args, "coordinator"]
        specs.append(ChildSpec(child_id, argv, env))
    return specs


def _pdeathsig_call() -> Callable[[], None] | None:
    """A function that asks Linux to send the calling process SIGTERM when its parent dies
    (no orphans), or None where there is no ``prctl``. Looked up here, in the parent: loading
    a library between fork and exec can deadlock on a lock another thread held at the fork."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return die_with_parent


@dataclass(slots=True)
class Child:
    """A started coordinator process."""

    spec: ChildSpec
    process: subprocess.Popen[bytes]

    def describe(self) -> str:
        """``<id> (pid N)``."""
        return f"{self.spec.coordinator_id} (pid {self.process.pid})"


class CoordinatorProcesses:
    """Starts the children of :func:`child_specs`, watches them and stops them together
    (see the module docstring). ``run_until(stop)`` returns when ``stop`` is set and raises
    :class:`FatalServiceError` when a child ended by itself."""

    def __init__(self, specs: Sequence[ChildSpec], grace_s: float = STOP_GRACE_S) -> None:
        if not specs:
            raise InvalidArgumentError("no coordinator process to run")
        self.specs = list(specs)
        self.grace_s = grace_s
        self.children: list[Child] = []

    def start(self) -> None:
        """Start every child (stopping those started already if one cannot start)."""
        die_with_parent = _pdeathsig_call()
        try:
            for spec in self.specs:
                process = subprocess.Popen(
                    spec.argv,
                    env=spec.env,
                    preexec_fn=die_with_parent,  # noqa: PLW1509
                    start_new_session=True,
                )
                self.children.append(Child(spec, process))
                logger.info("coordinator process %s started", self.children[-1].describe())
        except BaseException:
            self.stop()
            raise

    def ended(self) -> list[Child]:
        """The children that ended."""
        return [c for c in self.children if c.process.poll() is not None]

    def run_until(self, stop: threading.Event) -> None:
        """Block until ``stop`` is set or a child ends; stop every child; raise
        :class:`FatalServiceError` naming the children that ended by themselves or did not
        stop cleanly."""
        ended: list[Child] = []
        while not stop.wait(_WATCH_S):
            ended = self.ended()
            if ended:
                break
        unasked = {id(c): c.process.returncode for c in ended}
        for child in ended:
            logger.error(
                "coordinator process %s ended with status %s; stopping the others",
                child.describe(),
                child.process.returncode,
            )
        self.stop()
        if unasked:
            others = len(self.children) - len(unasked)
            raise FatalServiceError(
                "coordinator process "
                + ", ".join(
                    f"{c.describe()} ended with status {unasked[id(c)]}"
                    for c in self.children
                    if id(c) in unasked
                )
                + (f"; the other {others} stopped" if others else "")
            )
        unclean = [c for c in self.children if c.process.returncode not in (0, -signal.SIGTERM)]
        if unclean:
            raise FatalServiceError(
                "coordinator process "
                + ", ".join(
                    f"{c.describe()} stopped with status {c.process.returncode}" for c in unclean
                )
            )

    def stop(self) -> None:
        """SIGTERM to every child still running, SIGKILL to those still running after
        :attr:`grace_s`; returns once all ended. Idempotent."""
        for child in self.children:
            child.process.send_signal(signal.SIGTERM)  # a no-op for one that ended
        deadline = time.monotonic() + self.grace_s
        for child in self.children:
            try:
                child.process.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                logger.error(
                    "coordinator process %s did not stop within %.0f s; killed",
                    child.describe(),
                    self.grace_s,
                )
                child.process.kill()
                child.process.wait()

    def pids(self) -> list[int]:
        """The children's process ids, in start order."""
        return [c.process.pid for c in self.children]


def current_environment() -> dict[str, str]:
    """This process's environment (what the children start from)."""
    return dict(os.environ)
