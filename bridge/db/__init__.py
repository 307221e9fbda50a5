"""Your database in the loop (the ``db`` extra: ``pip install 'rocketmq-kafka-bridge[db]'``).

::

    from sqlalchemy import create_engine, text
    from bridge import Message, TransactionMQProducer
    from bridge.db import DatabaseTransactionListener, create_tables

    engine = create_engine("sqlite:///orders.db")
    create_tables(engine)
    listener = DatabaseTransactionListener(engine)
    with TransactionMQProducer("order_tx_group", listener, bootstrap_servers=...) as producer:
        producer.send_message_in_transaction(
            Message("orders", b"order-1", keys="order-1"),
            lambda conn: conn.execute(text("INSERT INTO orders VALUES ('order-1')")),
        )

:class:`DatabaseTransactionListener` writes the business work and the transaction-log row in
one database transaction and answers check-back from the log; :class:`IdempotentListener`
handles each consumed message once, recording it in the same database transaction as the
handler's work. :mod:`bridge.db.aio` has the asyncio twins. See ``docs/database.md``.
"""

try:
    import sqlalchemy  # noqa: F401 - the extra's dependency, named in the error below
except ImportError as exc:
    raise ModuleNotFoundError(
        "bridge.db needs the db extra: pip install 'rocketmq-kafka-bridge[db]' (SQLAlchemy 2)",
        name=exc.name,
    ) from exc

from bridge.db.inbox import Handler, IdempotentListener
from bridge.db.rows import message_key
from bridge.db.tables import (
    DEFAULT_RETENTION_MS,
    Purged,
    consumed_message,
    create_tables,
    ddl,
    metadata,
    purge,
    transaction_log,
)
from bridge.db.transaction import DatabaseTransactionListener, LocalWork

__all__ = [
    "DEFAULT_RETENTION_MS",
    "DatabaseTransactionListener",
    "Handler",
    "IdempotentListener",
    "LocalWork",
    "Purged",
    "consumed_message",
    "create_tables",
    "ddl",
    "message_key",
    "metadata",
    "purge",
    "transaction_log",
]
