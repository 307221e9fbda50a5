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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from bridge.db import create_tables
from bridge.runtime.local_postgres import INSTALL_HINT, LocalPostgres, postgres_bin_dir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A SQLAlchemy URL (psycopg 3) of the session's PostgreSQL server's ``postgres``
    database."""
    given = os.environ.get("BRIDGE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    if postgres_bin_dir() is None:
        pytest.fail(f"PostgreSQL's binaries are missing: {INSTALL_HINT} (BRIDGE_TEST_POSTGRES_URL)")
    server = LocalPostgres()
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
