"""The two tables of the database in the loop, as SQLAlchemy Core metadata.

``bridge_transaction_log``: one row per local transaction of a database-backed transactional
producer (:class:`bridge.db.DatabaseTransactionListener`), written in the same database
transaction as the business work: ``state`` is ``COMMIT``. A check that finds no row writes
one with ``state`` ``ROLLBACK`` (a fence: the primary key keeps the local transaction's own
row from ever committing after it). ``bridge_consumed_message``: one row per message an
idempotent consumer (:class:`bridge.db.IdempotentListener`) has handled, written in the same
database transaction as the handler's work.

:data:`metadata` is what an Alembic ``env.py`` adds to its ``target_metadata`` (autogenerate
then writes the migration); ``bridge db init URL`` creates the tables directly and ``bridge db
ddl --dialect postgresql`` prints the DDL. Times are epoch milliseconds (``BIGINT``), the same
on every database, indexed for the retention clean-up (:func:`purge`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    MetaData,
    String,
    Table,
    create_engine,
    delete,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.schema import CreateIndex, CreateTable

from bridge.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_RETENTION_MS",
    "KEY_MAX_CHARS",
    "MIN_TRANSACTION_RETENTION_MS",
    "TEXT_MAX_CHARS",
    "ArgumentError",
    "DBAPIError",
    "NoSuchModuleError",
    "Purged",
    "consumed_message",
    "create_engine",
    "create_tables",
    "ddl",
    "metadata",
    "now_ms",
    "purge",
    "transaction_log",
]
"""``create_engine``, SQLAlchemy's URL errors and its database error are re-exported for
``bridge db``, which imports this module only when it runs."""

KEY_MAX_CHARS = 255
"""The longest business key (or message id) the consumed-message table takes, characters."""
TEXT_MAX_CHARS = 255
"""The width of the informational ``message_id`` and ``topic`` columns, characters; a longer
value (an id another Kafka client made up) is stored cut to it."""

DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
"""How long :func:`purge` keeps a row by default, ms (7 days): longer than any half message
can still be checked (72 h at most, G4), and than the whole retry ladder (about 4 h 46 min
over 16 retries)."""

MIN_TRANSACTION_RETENTION_MS = 72 * 3600 * 1000
"""The shortest transaction-log retention :func:`purge` takes, ms (72 h, the coordinator's
default ``file_reserved_time_ms``): a row purged while its half message can still be checked
would let the check fence a committed transaction as rolled back."""

metadata = MetaData()

# ``doc`` and ``info`` describe the tables for the documentation; neither reaches the DDL.
transaction_log = Table(
    "bridge_transaction_log",
    metadata,
    Column(
        "transaction_id",
        String(64),
        primary_key=True,
        doc="The half message's transaction id (its message id if it has none).",
    ),
    Column("producer_group", String(255), nullable=False, doc="The producer's group."),
    Column(
        "message_id",
        String(TEXT_MAX_CHARS),
        nullable=False,
        doc="The half message's id, cut to the column's width.",
    ),
    Column(
        "topic",
        String(TEXT_MAX_CHARS),
        nullable=False,
        doc="The message's real topic, cut to the column's width.",
    ),
    Column(
        "state",
        String(16),
        nullable=False,
        doc="``COMMIT`` (the local transaction's own row) or ``ROLLBACK`` (a check's fence).",
    ),
    Column("created_ms", BigInteger, nullable=False, doc="When the row was written, epoch ms."),
    Index("ix_bridge_transaction_log_created_ms", "created_ms"),
    info={"doc": "One row per local transaction of a database-backed transactional producer."},
)

consumed_message = Table(
    "bridge_consumed_message",
    metadata,
    Column(
        "consumer_group",
        String(255),
        primary_key=True,
        doc="The consumer's group: each group handles each message once.",
    ),
    Column(
        "message_key",
        String(KEY_MAX_CHARS),
        primary_key=True,
        doc="The business event's key (by default the message id every copy keeps).",
    ),
    Column(
        "message_id",
        String(TEXT_MAX_CHARS),
        nullable=False,
        doc="The id of the message handled, cut to the column's width.",
    ),
    Column(
        "topic",
        String(TEXT_MAX_CHARS),
        nullable=False,
        doc="The topic it was read from, cut to the column's width.",
    ),
    Column("consumed_ms", BigInteger, nullable=False, doc="When it was handled, epoch ms."),
    Index("ix_bridge_consumed_message_consumed_ms", "consumed_ms"),
    info={"doc": "One row per message an idempotent consumer has handled."},
)


def now_ms() -> int:
    """The time written into the tables: epoch milliseconds."""
    return time.time_ns() // 1_000_000


def create_tables(bind: Engine | Connection) -> None:
    """Create both tables and their indexes where they do not exist yet (idempotent)."""
    metadata.create_all(bind)


_DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.dialect(),  # type: ignore[no-untyped-call]
    "sqlite": sqlite.dialect(),
}


def ddl(dialect: str) -> str:
    """The ``CREATE TABLE`` and ``CREATE INDEX`` statements for ``dialect`` (``postgresql``
    or ``sqlite``), each ending with ``;``."""
    found = _DIALECTS.get(dialect)
    if found is None:
        raise InvalidArgumentError(f"unknown dialect {dialect!r}: one of {sorted(_DIALECTS)}")
    statements = []
    for table in metadata.sorted_tables:
        statements.append(str(CreateTable(table).compile(dialect=found)))
        statements.extend(
            str(CreateIndex(index).compile(dialect=found))
            for index in sorted(table.indexes, key=lambda i: str(i.name))
        )
    # SQLAlchemy ends column lines with ", "; the printed DDL has no trailing blanks.
    tidy = ("\n".join(line.rstrip() for line in s.strip().splitlines()) for s in statements)
    return "".join(f"{s};\n\n" for s in tidy)


@dataclass(frozen=True, slots=True)
class Purged:
    """Rows :func:`purge` deleted, per table."""

    transactions: int
    consumed: int


def _retention(name: str, value: int, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgumentError(f"{name} must be an int of at least {least} (ms), got {value!r}")
    return value


def purge(
    engine: Engine,
    *,
    transaction_retention_ms: int = DEFAULT_RETENTION_MS,
    consumed_retention_ms: int = DEFAULT_RETENTION_MS,
) -> Purged:
    """Delete transaction-log rows older than ``transaction_retention_ms`` and consumed-message
    rows older than ``consumed_retention_ms`` (ms, default 7 days), in one database
    transaction.

    ``transaction_retention_ms`` under :data:`MIN_TRANSACTION_RETENTION_MS` (72 h, the longest
    a half message waits for checks with the coordinator's defaults) raises
    :class:`InvalidArgumentError`: a check that finds no row fences the transaction as rolled
    back (keep it above a longer ``file_reserved_time_ms`` of your own too). A message
    redelivered after its consumed row is gone (a DLQ replay weeks later, say) is handled
    again."""
    tx_keep = _retention(
        "transaction_retention_ms", transaction_retention_ms, MIN_TRANSACTION_RETENTION_MS
    )
    consumed_keep = _retention("consumed_retention_ms", consumed_retention_ms)
    now = now_ms()
    with engine.begin() as conn:
        transactions = conn.execute(
            delete(transaction_log).where(transaction_log.c.created_ms < now - tx_keep)
        ).rowcount
        consumed = conn.execute(
            delete(consumed_message).where(consumed_message.c.consumed_ms < now - consumed_keep)
        ).rowcount
    return Purged(transactions, consumed)
