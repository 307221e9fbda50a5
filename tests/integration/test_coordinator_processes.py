"""``bridge coordinator --processes 2``: two coordinator processes started by one command share
the delay services' partitions and both deliver, each delayed message exactly once; stopping
the command stops both (none left behind), and a child that dies ends the command non-zero
with the other stopped."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bridge import ClientConfig, Message, Producer, read_messages
from bridge.coordinator.health import coordinator_health
from tests.conftest import wait_until
from tests.integration.test_delay_isolation import isolation_config

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def config(kafka_bootstrap: str, namespace: str) -> ClientConfig:
    return isolation_config(kafka_bootstrap, namespace)


def _two_free_ports() -> int:
    """A port P with P and P+1 free (now), below the kernel's range for outgoing connections:
    a port from that range (bind to 0) can be taken by any client's connection before the
    second child binds it (a CI run lost P+1 to one)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, min(low, 65_535) - 1)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    pytest.fail("no two consecutive free ports")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


@contextmanager
def _command(
    config: ClientConfig, tmp_path: Path, metrics_port: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], list[int], Path]]:
    """``bridge coordinator --processes 2`` running; yields it, its children's pids and its
    stderr file. Whatever is still running at the end is killed."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "BRIDGE_NAMESPACE": config.namespace,
        "BRIDGE_MESSAGE_DELAY_LEVEL": config.message_delay_level,
        "BRIDGE_TIMER_PRECISION_MS": str(config.timer_precision_ms),
        "BRIDGE_TIMER_MAX_DELAY_MS": str(config.timer_max_delay_ms),
        "BRIDGE_TRANSACTION_PARTITIONS": "1",
        "BRIDGE_SESSION_TIMEOUT_MS": "6000",
        "BRIDGE_COORDINATOR_ID": f"procs-{uuid.uuid4().hex[:6]}",
    }
    env.pop("BRIDGE_METRICS_PORT", None)
    if metrics_port is not None:
        env["BRIDGE_METRICS_PORT"] = str(metrics_port)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge.cli", "coordinator", "--processes", "2"],
            env=env,
            cwd=ROOT,
            stdout=stdout,
            stderr=stderr,
        )
    pids: list[int] = []
    try:
        line = wait_until(
            lambda: re.search(r"2 coordinator processes running: (.*)", out.read_text()),
            timeout_s=60,
        )
        pids = [int(p) for p in re.findall(r"pid (\d+)", line.group(1))]
        assert len(pids) == 2, out.read_text()

        # Both processes are members of each delay service's group.
        def shared() -> bool:
            delay = [h for h in coordinator_health(config) if h.kind in ("schedule", "timer")]
            return len(delay) == 2 and all(h.members == 2 for h in delay)

        wait_until(shared, timeout_s=90)
        yield proc, pids, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _deliveries(port: int) -> float:
    """The delay deliveries a child counted (its ``/metrics``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("bridge_delay_deliveries_total{")
    )


def test_two_processes_of_one_command_deliver_and_stop_together(
    config: ClientConfig, topic: str, tmp_path: Path
) -> None:
    port = _two_free_ports()
    with _command(config, tmp_path, metrics_port=port) as (proc, pids, err):
        expected = []
        with Producer("procs", config=config) as producer:
            # Levels 1-3 are SCHEDULE partitions 0-2 and short timers the low tiers: the
            # range assignment gives some of each to each process.
            for level in (1, 2, 3):
                for i in range(3):
                    body = f"level{level}-{i}"
                    producer.send_sync(Message(topic, body, delay_time_level=level))
                    expected.append(body.encode())
            for i in range(3):
                timer = Message(topic, f"timer-{i}")
                timer.set_delay_time_ms(300)
                producer.send_sync(timer)
                expected.append(f"timer-{i}".encode())
        got = [m.body for m in read_messages(config, [topic], timeout_ms=8000)]
        assert sorted(got) == sorted(expected)  # all, each once
        per_process = [_deliveries(port), _deliveries(port + 1)]
        assert all(n > 0 for n in per_process), per_process
        assert sum(per_process) == len(expected), per_process
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, err.read_text()
        wait_until(lambda: not any(_alive(pid) for pid in pids), timeout_s=30)


def test_a_child_that_dies_ends_the_command_non_zero_and_stops_the_other(
    config: ClientConfig, tmp_path: Path
) -> None:
    with _command(config, tmp_path) as (proc, pids, err):
        os.kill(pids[1], signal.SIGKILL)
        assert proc.wait(90) == 1
        wait_until(lambda: not _alive(pids[0]), timeout_s=30)
        last = err.read_text().strip().splitlines()[-1]
        assert last.startswith("Error: FatalServiceError: coordinator process"), last
        assert f"(pid {pids[1]}) ended with status -9" in last, last
