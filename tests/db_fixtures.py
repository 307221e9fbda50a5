"""Database fixtures: one real PostgreSQL server per test session, started from the machine's
PostgreSQL binaries (Debian's ``postgresql`` package: ``/usr/lib/postgresql/<v>/bin``) in a
temporary data directory on a free loopback port, like the Kafka broker from jars; and a
database of its own per test, on that server or in a SQLite file.

PostgreSQL refuses to run as root: as root (CI) the server runs as the ``postgres`` system user
the package creates. A machine without the binaries fails these tests with how to install them
(``.ci/run`` does it), never skips them. ``BRIDGE_TEST_POSTGRES_URL`` points them at a server
of your own instead (a SQLAlchemy URL of a database the tests may create databases from).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from bridge.db import create_tables


def postgres_bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<v>/bin`` holding ``initdb``, else ``pg_config``'s."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalPostgres:
    """A throwaway PostgreSQL server: ``start()``, ``url``, ``stop()``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bridge-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def _gid(self) -> int | None:
        return pwd.getpwnam(self.user).pw_gid if self.user else None

    def start(self) -> None:
        if os.geteuid() == 0:
            # initdb and postgres refuse root; the Debian package's system user owns the data.
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        log = (self.dir / "initdb.log").open("wb")
        subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"],
            check=True, stdout=log, stderr=subprocess.STDOUT, user=self.user, group=self._gid,
        )  # fmt: skip
        server_log = (self.dir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
             "-c", "max_connections=200"],
            stdout=server_log, stderr=subprocess.STDOUT, user=self.user, group=self._gid,
        )  # fmt: skip
        engine = create_engine(self.url)
        deadline = time.monotonic() + 60
        try:
            while True:
                try:
                    with engine.connect() as conn:
                        conn.execute(text("SELECT 1"))
                    return
                except Exception:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            "PostgreSQL did not start: "
                            + (self.dir / "server.log").read_text(errors="replace")[-2000:]
                        ) from None
                    time.sleep(0.1)
        finally:
            engine.dispose()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: smart shutdown; the clients are gone by now
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A SQLAlchemy URL (psycopg 3) of the session's PostgreSQL server's ``postgres``
    database."""
    given = os.environ.get("BRIDGE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.fail(
            "PostgreSQL's binaries are missing: apt-get install -y postgresql (Debian), "
            "or set BRIDGE_TEST_POSTGRES_URL"
        )
    server = LocalPostgres(bin_dir)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


def new_postgres_database(server_url: str) -> str:
    """Create a database of its own on the server; its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database with the bridge's tables, on the session's PostgreSQL server or in a
    SQLite file (WAL mode: readers never wait for the writer)."""
    if request.param == "postgresql":
        url = new_postgres_database(request.getfixturevalue("postgres_server"))
    else:
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    engine = create_engine(url)
    try:
        create_tables(engine)
        if request.param == "sqlite":
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    finally:
        engine.dispose()
    return url


@pytest.fixture()
def db_engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    try:
        yield engine
    finally:
        engine.dispose()
