"""A throwaway PostgreSQL server on loopback, from the machine's PostgreSQL binaries (Debian's
``postgresql`` package: ``/usr/lib/postgresql/<version>/bin``), for the database tests and
benchmarks, as :mod:`bridge.runtime.local_kafka` runs a broker from jars.

``initdb`` and ``postgres`` refuse to run as root: as root the server runs as the ``postgres``
system user the package creates (CI runs as root). Everything lives in one temporary directory
(the data directory, ``server.log``), removed by :meth:`LocalPostgres.stop`. Only TCP on
127.0.0.1 on a free port, trust authentication for user ``postgres``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bridge.errors import MissingToolError, RuntimeSetupError
from bridge.runtime.node_config import free_port

INSTALL_HINT = "apt-get install -y postgresql (Debian), or point the tests at a server of yours"


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<v>/bin`` holding ``initdb``, else the directory of an
    ``initdb`` on PATH; None when there is neither."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class LocalPostgres:
    """``start()``, then :attr:`url` (a SQLAlchemy URL for psycopg 3); ``stop()``."""

    def __init__(self, bin_dir: Path | None = None, *, start_timeout_s: float = 60.0) -> None:
        found = bin_dir or postgres_bin_dir()
        if found is None:
            raise MissingToolError(f"PostgreSQL's binaries are missing: {INSTALL_HINT}")
        self.bin_dir = found
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bridge-pg-"))
        self.data = self.dir / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._start_timeout_s = start_timeout_s
        self._user: str | None = None
        self._gid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Make the data directory and start the server; returns once it accepts connections.
        Raises :class:`RuntimeSetupError` with the log's tail if it does not."""
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            self._user, self._gid = "postgres", entry.pw_gid
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        with (self.dir / "initdb.log").open("wb") as log:
            done = subprocess.run(
                [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
                 "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"],
                stdout=log, stderr=subprocess.STDOUT, user=self._user, group=self._gid,
                check=False,
            )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeSetupError(f"initdb failed: {self._tail('initdb.log')}")
        with (self.dir / "server.log").open("wb") as log:
            self._proc = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                 "-c", "max_connections=200"],
                stdout=log, stderr=subprocess.STDOUT, user=self._user, group=self._gid,
            )  # fmt: skip
        deadline = time.monotonic() + self._start_timeout_s
        while not self._ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop(remove=False)
                raise RuntimeSetupError(f"PostgreSQL did not start: {self._tail('server.log')}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        probe = subprocess.run(
            [str(self.bin_dir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            check=False,
        )
        return probe.returncode == 0

    def _tail(self, name: str) -> str:
        return (self.dir / name).read_text(errors="replace")[-2000:]

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server (fast shutdown) and remove its directory. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
