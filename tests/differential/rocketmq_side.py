"""The RocketMQ side: compile ``RocketMQDriver.java`` and run its workloads.

Why a Java driver on the 4.x-style remoting client rather than the Python v5 client over gRPC:
the remoting client talks to the name server and broker directly, so no proxy JVM runs (one
process and ~300 MiB fewer on a 2-core machine), and it has every feature the workloads use as
the bridge exposes it: delay levels set on the message, ``DefaultMQPushConsumer`` with
``maxReconsumeTimes``, orderly listeners with ``suspendCurrentQueueTimeMillis``, broadcasting,
and ``TransactionMQProducer`` with a check-back listener (seed 003 is written against it). The
v5 client has no push consumer with orderly or broadcasting modes and no delay levels.

RocketMQ 5's own client model (``SimpleConsumer``, FIFO consumer groups) has no remoting-client
equivalent, so those rows go through ``RocketMQV5Driver.java`` instead: RocketMQ 5's Java gRPC
client (``rocketmq-client-java``) against the proxy, which runs in local mode in the broker's
JVM (``LocalRocketMQ`` with ``proxy=True``). That client bundles its own copy of the gRPC
protocol classes, so it is compiled and run on a class path of its own (set
``rocketmq-client-v5``); the topics and groups it needs are created by ``RocketMQDriver``'s
``v5admin`` workload, which also reads the dead-letter queue afterwards. The recall of timer
messages goes through it too (``Producer#recallMessage`` of client 5.2.0; the remoting
client 5.3.3 has ``DefaultMQProducer#recallMessage`` as well), since the bridge's
``bridge.v5.Producer.recall_message`` follows the v5 client.

Each driver is compiled with ``javac``, together with ``DriverOutput.java`` (the JSON output
both share), against its cached jars into the cache (once per version of the two sources) and
prints one JSON object per line; lines that are not such objects (a
library writing to stdout) are ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any, ClassVar

from bridge.runtime.jars import cache_dir, ensure_jars
from tests.differential import settings

SOURCE = Path(__file__).with_name("RocketMQDriver.java")
MAIN_CLASS = "RocketMQDriver"
V5_SOURCE = Path(__file__).with_name("RocketMQV5Driver.java")
V5_MAIN_CLASS = "RocketMQV5Driver"
V5_JARS = "rocketmq-client-v5"
OUTPUT_SOURCE = Path(__file__).with_name("DriverOutput.java")
"""The drivers' JSON output, compiled with each driver (their class paths differ)."""

Event = dict[str, Any]


def compile_driver(v5: bool = False) -> Path:
    """Compile the driver (the v5 one with ``v5``) with :data:`OUTPUT_SOURCE` if either source
    changed and return the classes directory."""
    source, main = (V5_SOURCE, V5_MAIN_CLASS) if v5 else (SOURCE, MAIN_CLASS)
    sources = (source, OUTPUT_SOURCE)
    libs = ensure_jars(V5_JARS if v5 else "rocketmq")
    hashed = hashlib.sha256()
    for path in sources:
        hashed.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest = hashed.hexdigest()[:16]
    out = cache_dir() / "differential" / f"{'v5-' if v5 else ''}driver-{digest}"
    if (out / f"{main}.class").is_file():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac was not found: install a JDK 17+ (openjdk-17-jdk-headless)")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run(
        [javac, "-Xlint:-deprecation", "-nowarn", "-cp", f"{libs}/*", "-d", str(tmp),
         *map(str, sources)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"javac failed:\n{proc.stdout}{proc.stderr}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class DriverRun:
    """One workload running in its own JVM; :meth:`events` waits for it and parses its output."""

    v5: ClassVar[bool] = False
    """Whether this runs ``RocketMQV5Driver`` (:class:`V5DriverRun`)."""

    def __init__(
        self, workload: str, namesrv: str, home: Path, timeout_s: float, **args: object
    ) -> None:
        v5 = self.v5
        classes = compile_driver(v5)
        libs = ensure_jars(V5_JARS if v5 else "rocketmq")
        home.mkdir(parents=True, exist_ok=True)
        java = shutil.which("java") or "java"
        cmd = [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            # RocketMQ's shaded logback prints its own configuration status on stdout.
            "-Dlogback.statusListenerClass="
            "org.apache.rocketmq.logging.ch.qos.logback.core.status.NopStatusListener",
            # RocketMQ's clients rebalance every 20 s; a consumer group's retry topic, created
            # by its first failure, gets its queues assigned at the next rebalance, so the
            # first retry could wait that long. Scaled down like the other settings.
            f"-Drocketmq.client.rebalance.waitInterval={settings.CLIENT_REBALANCE_INTERVAL_MS}",
            # Client logs (and broadcasting consumers' local offsets) go under this home.
            f"-Duser.home={home}",
            "-cp",
            f"{classes}{os.pathsep}{libs}/*",
            V5_MAIN_CLASS if v5 else MAIN_CLASS,
            workload,
            namesrv,
            *(f"{k}={v}" for k, v in args.items()),
        ]
        self.workload = workload
        self.timeout_s = timeout_s
        # A file of its own: runs of one workload overlap (the suite runs workloads at once).
        self._stderr = home / f"{workload}-{uuid.uuid4().hex[:8]}.stderr"
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self._stderr.open("wb"), text=True
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name=f"driver-{workload}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    def events(self) -> list[Event]:
        """Wait for the run to end (killing it after ``timeout_s``) and return its events."""
        try:
            code = self._proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            raise RuntimeError(
                f"the RocketMQ {self.workload} workload did not finish within {self.timeout_s} s; "
                f"stderr tail:\n{self.stderr_tail()}"
            ) from None
        self._reader.join(10)
        if code != 0:
            raise RuntimeError(
                f"the RocketMQ {self.workload} workload exited with {code}; "
                f"stderr tail:\n{self.stderr_tail()}"
            )
        out = []
        for line in self._lines:
            if line.startswith('{"ev":'):
                out.append(json.loads(line))
        if not out or out[-1]["ev"] != "done":
            raise RuntimeError(f"the RocketMQ {self.workload} workload ended without 'done'")
        return out

    def kill(self) -> None:
        """Stop the run if it is still going."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stderr_tail(self, lines: int = 30) -> str:
        """The last lines the driver wrote on stderr."""
        if not self._stderr.is_file():
            return ""
        return "\n".join(self._stderr.read_text(errors="replace").splitlines()[-lines:])


class V5DriverRun(DriverRun):
    """A workload of ``RocketMQV5Driver``: ``namesrv`` is the proxy's gRPC endpoint."""

    v5 = True
