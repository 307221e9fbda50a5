"""Two services, each with its own database: orders -> Kafka -> inventory, exactly once.

The orders service writes each order and its "order created" message in one database
transaction (``DatabaseTransactionListener``): an order that fails (an unknown item) leaves
neither a row nor a message. The inventory service takes stock for each order it receives in
its own database (``IdempotentListener``, keyed by the order id): a message delivered again (a
redelivery after a crash, a replay) takes nothing more. The databases are SQLite files in a
temporary directory unless ``ORDERS_DATABASE_URL`` and ``INVENTORY_DATABASE_URL`` name others
(the compose stack's PostgreSQL: ``postgresql+psycopg://bridge:bridge@localhost:5432/orders``).
Needs a running coordinator (``make up``)::

    .venv/bin/python -m examples.orders_inventory
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import uuid

from sqlalchemy import Connection, Engine, create_engine, text

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionMQProducer,
)
from bridge.db import DatabaseTransactionListener, IdempotentListener, create_tables
from bridge.kafka.admin import TopicAdmin
from topics.catalog import TopicSpec

ORDERS = [("order-1", "tea", 2), ("order-2", "café", 1), ("order-3", "unobtainium", 1),
          ("order-4", "tea", 3), ("order-5", "茶碗", 1)]  # fmt: skip
STOCK = {"tea": 10, "café": 5, "茶碗": 2}


def database(env: str, name: str, workdir: str) -> Engine:
    engine = create_engine(os.environ.get(env) or f"sqlite:///{workdir}/{name}.db")
    create_tables(engine)  # the bridge's own tables (or: bridge db init URL)
    return engine


# --- the orders service ---------------------------------------------------------------------
def place_orders(engine: Engine, config: ClientConfig, topic: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, "
                          "item VARCHAR(64), qty INTEGER)"))  # fmt: skip
    listener = DatabaseTransactionListener(engine)
    with TransactionMQProducer("orders_tx_group", listener, config=config) as producer:
        for order_id, item, qty in ORDERS:

            def save_order(conn: Connection, order_id: str = order_id, item: str = item,
                           qty: int = qty) -> None:  # fmt: skip
                if item not in STOCK:
                    raise ValueError(f"unknown item {item!r}")  # rolls the order back
                conn.execute(text("INSERT INTO orders VALUES (:id, :item, :qty)"),
                             {"id": order_id, "item": item, "qty": qty})  # fmt: skip

            body = json.dumps({"order_id": order_id, "item": item, "qty": qty})
            msg = Message(topic, body.encode(), keys=order_id)
            result = producer.send_message_in_transaction(msg, save_order)
            print(f"orders    {order_id} {item} x{qty}: {result.local_transaction_state.value}")


# --- the inventory service ------------------------------------------------------------------
def take_stock(conn: Connection, msg: MessageExt) -> None:
    order = json.loads(msg.body)
    conn.execute(text("UPDATE stock SET qty = qty - :qty WHERE item = :item"), order)


def run_inventory(engine: Engine, config: ClientConfig, topic: str, expected: int) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS stock (item VARCHAR(64) PRIMARY KEY, "
                          "qty INTEGER)"))  # fmt: skip
        conn.execute(text("DELETE FROM stock"))
        for item, qty in STOCK.items():
            conn.execute(text("INSERT INTO stock VALUES (:item, :qty)"), {"item": item, "qty": qty})
    seen = threading.Semaphore(0)
    inbox = IdempotentListener(engine, "inventory", take_stock, key=lambda m: m.keys[0])

    def listener(msg: MessageExt) -> ConsumeStatus:
        status = inbox(msg)
        seen.release()
        return status

    consumer = PushConsumer(
        f"inventory-{uuid.uuid4().hex[:6]}", config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )  # fmt: skip
    consumer.subscribe(topic, listener)
    with consumer:
        for _ in range(expected):
            if not seen.acquire(timeout=60):
                raise SystemExit("inventory: the orders did not all arrive within 60 s")
        # A copy of order-1 sent again (a replay, a retrying publisher): takes nothing more.
        with Producer("orders_replay", config=config) as replay:
            body = json.dumps({"order_id": "order-1", "item": "tea", "qty": 2})
            replay.send_sync(Message(topic, body.encode(), keys="order-1"))
        if not seen.acquire(timeout=60):
            raise SystemExit("inventory: the replayed copy did not arrive within 60 s")


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    logging.getLogger("bridge.db").setLevel(logging.CRITICAL)  # the failing order is expected
    config = ClientConfig.from_env()
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    # Created up front: the coordinator would create it with the first committed order, but a
    # consumer subscribed before then learns of it only at its next metadata refresh.
    TopicAdmin(config).ensure_topics([TopicSpec(topic, 2)])
    with tempfile.TemporaryDirectory() as workdir:
        orders_db = database("ORDERS_DATABASE_URL", "orders", workdir)
        inventory_db = database("INVENTORY_DATABASE_URL", "inventory", workdir)
        place_orders(orders_db, config, topic)
        run_inventory(inventory_db, config, topic, expected=4)
        with orders_db.connect() as conn:
            placed = conn.execute(text("SELECT id FROM orders ORDER BY id")).scalars().all()
        with inventory_db.connect() as conn:
            stock: dict[str, int] = dict(
                conn.execute(text("SELECT item, qty FROM stock ORDER BY item")).all()
            )
        print(f"orders db:    {', '.join(placed)}")
        print(f"inventory db: {json.dumps(stock, ensure_ascii=False, sort_keys=True)}")
        orders_db.dispose()
        inventory_db.dispose()


if __name__ == "__main__":
    main()
