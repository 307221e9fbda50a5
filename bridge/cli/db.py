"""``bridge db``: the tables of the database in the loop (the ``db`` extra)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import click

_URL = click.argument("url", envvar="BRIDGE_DATABASE_URL")
_HOUR_MS = 3600 * 1000


def _tables() -> ModuleType:
    """:mod:`bridge.db.tables`, imported when a command runs: SQLAlchemy is an optional extra,
    and the other commands must work without it."""
    try:
        import bridge.db.tables  # noqa: PLC0415
    except ImportError as exc:
        raise click.ClickException(
            "bridge db needs the db extra: pip install 'rocketmq-kafka-bridge[db]'"
        ) from exc
    return bridge.db.tables


def _engine(url: str) -> Any:
    """A SQLAlchemy engine for ``url``; a clear error for a URL SQLAlchemy cannot use."""
    tables = _tables()
    try:
        return tables.create_engine(url)
    except (tables.ArgumentError, tables.NoSuchModuleError, ImportError) as exc:
        raise click.ClickException(f"cannot use database URL: {exc}") from exc


def _unusable(url: Any, exc: Exception) -> click.ClickException:
    """The database at ``url`` refused the command (unreachable, no such file, no tables)."""
    cause = getattr(exc, "orig", None) or exc
    where = url.render_as_string(hide_password=True)
    return click.ClickException(f"database {where}: {type(cause).__name__}: {cause}")


@click.group()
def db() -> None:
    """Create, print and clean the transaction-log and consumed-message tables."""


@db.command("init")
@_URL
def db_init(url: str) -> None:
    """Create bridge_transaction_log and bridge_consumed_message (and their indexes) in the
    database at URL (a SQLAlchemy URL, or BRIDGE_DATABASE_URL) where missing."""
    engine = _engine(url)
    try:
        _tables().create_tables(engine)
    except _tables().DBAPIError as exc:
        raise _unusable(engine.url, exc) from exc
    finally:
        engine.dispose()
    click.echo(f"tables ready in {engine.url.render_as_string(hide_password=True)}")


@db.command("ddl")
@click.option(
    "--dialect",
    type=click.Choice(["postgresql", "sqlite"]),
    default="postgresql",
    show_default=True,
)
def db_ddl(dialect: str) -> None:
    """Print the tables' CREATE statements, for a migration of your own."""
    click.echo(_tables().ddl(dialect), nl=False)


@db.command("purge")
@_URL
@click.option(
    "--transaction-retention-hours",
    type=click.FloatRange(min=72),
    default=168,
    show_default=True,
    help="Keep transaction-log rows this long (at least the 72 h a half message can wait).",
)
@click.option(
    "--consumed-retention-hours",
    type=click.FloatRange(min=0),
    default=168,
    show_default=True,
    help="Keep consumed-message rows this long: a copy redelivered later is handled again.",
)
def db_purge(url: str, transaction_retention_hours: float, consumed_retention_hours: float) -> None:
    """Delete rows older than their retention from both tables."""
    engine = _engine(url)
    try:
        done = _tables().purge(
            engine,
            transaction_retention_ms=int(transaction_retention_hours * _HOUR_MS),
            consumed_retention_ms=int(consumed_retention_hours * _HOUR_MS),
        )
    except _tables().DBAPIError as exc:
        raise _unusable(engine.url, exc) from exc
    finally:
        engine.dispose()
    click.echo(f"deleted {done.transactions} transaction-log rows, {done.consumed} consumed rows")
