"""The ``db`` kind's two applications and their databases (SQLite files in the run's
directory): the orders application places an order (its row and its message together,
through :class:`~bridge.db.DatabaseTransactionListener`), and the inventory application applies
each order once (:class:`~bridge.db.IdempotentListener`), writing an effect row.

The effect table has no unique key on the order: a handler run twice leaves two rows, which is
what the checker looks for. After the run, :func:`committed` reads both databases for the
``database`` event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
)

from bridge import MessageExt
from bridge.db import LocalWork, create_tables
from chaos.history import ID_PROPERTY
from chaos.workload_observers import prop_text
from chaos.workload_spec import DB_INVENTORY, DB_ORDERS

_tables = MetaData()
orders = Table(
    "chaos_orders",
    _tables,
    Column("order_id", String(64), primary_key=True),
    Column("body", String(200), nullable=False),
)
effects = Table(
    "chaos_effects",
    _tables,
    Column("effect_id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(64), nullable=False, index=True),
)


class BusinessRuleError(Exception):
    """An order the orders application refuses (intent ``rollback``): its work raises this,
    which rolls back the database transaction and the half message."""


class DatabaseAwayError(Exception):
    """The orders database during a ``db_outage``."""


def open_databases(directory: str) -> tuple[Engine, Engine]:
    """The orders and inventory databases in ``directory``, their tables created."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    engines = []
    for name, table in ((DB_ORDERS, orders), (DB_INVENTORY, effects)):
        engine = create_engine(f"sqlite:///{Path(directory) / name}.db")
        create_tables(engine)  # the bridge's transaction log and consumed-message tables
        table.create(engine, checkfirst=True)
        engines.append(engine)
    return engines[0], engines[1]


def place_order(wid: str, body: str, *, refuse: bool, database_away: bool) -> LocalWork:
    """The business work of order ``wid``: its row; raises when ``refuse`` (the row goes in
    first, so a rollback has something to undo) or when the database is away."""

    def work(conn: Connection) -> None:
        if database_away:
            raise DatabaseAwayError("the orders database is away (db_outage)")
        conn.execute(insert(orders).values(order_id=wid, body=body))
        if refuse:
            raise BusinessRuleError(f"order {wid} fails its business rule")

    return work


def apply_order(conn: Connection, msg: MessageExt) -> None:
    """The inventory application's handler: one effect row per run."""
    wid = prop_text(msg.user_properties.get(ID_PROPERTY)) or msg.msg_id
    conn.execute(insert(effects).values(order_id=wid))


def committed(orders_db: Engine, inventory_db: Engine) -> dict[str, Any]:
    """The ``database`` event's fields: every order row's id, and effect rows per order."""
    with orders_db.connect() as conn:
        ids = sorted(conn.execute(select(orders.c.order_id)).scalars())
    with inventory_db.connect() as conn:
        counted = conn.execute(
            select(effects.c.order_id, func.count()).group_by(effects.c.order_id)
        )
        applied = {str(order_id): int(count) for order_id, count in counted}
    return {"orders": ids, "effects": applied}
