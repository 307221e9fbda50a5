"""An asyncio order service: an order is written in a local SQLite transaction and announced
by a transactional (half) message; a consumer receives only the orders that were stored.

A small HTTP service (plain asyncio, no framework) takes ``POST /orders`` with a JSON order.
For each one ``bridge.aio.TransactionMQProducer`` stores the half message, then runs the
listener's ``async def execute_local_transaction``, which writes the order in SQLite (on a
worker thread: SQLite blocks) and answers COMMIT, or ROLLBACK for an order it refuses. One
order's service "crashes" right after its database commit, before it could answer (UNKNOWN):
the coordinator's check-back asks ``check_local_transaction``, which reads SQLite and commits
it. A ``bridge.aio.PushConsumer`` with an ``async def`` listener ships the
orders it receives. Needs a running coordinator: ``make up`` (or set
``KAFKA_BOOTSTRAP_SERVERS`` and run ``bridge coordinator``)::

    .venv/bin/python -m examples.async_service
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    TransactionStatus,
)
from bridge.aio import AsyncTransactionListener, PushConsumer, TransactionMQProducer
from bridge.kafka.admin import TopicAdmin
from topics.catalog import TopicSpec


class Orders:
    """The service's own database: one SQLite file, one connection per operation (each runs
    on a worker thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER, state TEXT)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def insert(self, order_id: str, amount: int) -> None:
        with self._connect() as db:  # one transaction: committed on leaving the block
            db.execute("INSERT INTO orders VALUES (?, ?, 'created')", (order_id, amount))

    def exists(self, order_id: str) -> bool:
        with self._connect() as db:
            row = db.execute("SELECT 1 FROM orders WHERE id = ?", (order_id,)).fetchone()
        return row is not None

    def ship(self, order_id: str) -> int:
        with self._connect() as db:
            return db.execute(
                "UPDATE orders SET state = 'shipped' WHERE id = ? AND state = 'created'",
                (order_id,),
            ).rowcount


class OrderTransactions(AsyncTransactionListener):
    """Ties each half message to the SQLite transaction that stores its order."""

    def __init__(self, orders: Orders) -> None:
        self.orders = orders

    async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        order: dict[str, Any] = arg
        if order["amount"] <= 0:
            return TransactionStatus.ROLLBACK  # refused: nothing stored, nothing announced
        await asyncio.to_thread(self.orders.insert, order["id"], order["amount"])
        if order.get("crash_after_commit"):
            # As if the service died right after its commit: no answer, the coordinator asks.
            return TransactionStatus.UNKNOWN
        return TransactionStatus.COMMIT

    async def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        stored = await asyncio.to_thread(self.orders.exists, msg.keys[0])
        print(f"check    {msg.keys[0]}: {'stored' if stored else 'not stored'}", flush=True)
        return TransactionStatus.COMMIT if stored else TransactionStatus.ROLLBACK


class OrderService:
    """``POST /orders`` with ``{"id": ..., "amount": ...}``: 201 with the transaction's state."""

    def __init__(self, producer: TransactionMQProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            head = request.decode("latin-1").split("\r\n")
            length = next(
                (int(h.split(":", 1)[1]) for h in head if h.lower().startswith("content-length")),
                0,
            )
            order = json.loads(await reader.readexactly(length))
            if not head[0].startswith("POST /orders "):
                await _respond(writer, 404, {"error": "not found"})
                return
            result = await self.producer.send_message_in_transaction(
                Message(self.topic, json.dumps(order).encode(), keys=order["id"]), order
            )
            await _respond(
                writer, 201, {"id": order["id"], "state": result.local_transaction_state.value}
            )
        finally:
            writer.close()


async def _respond(writer: asyncio.StreamWriter, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    writer.write(
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()


async def post_order(port: int, order: dict[str, Any]) -> dict[str, Any]:
    """A client of the service: POST one order, return the JSON answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(order).encode()
    writer.write(
        b"POST /orders HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    response = await reader.read()
    writer.close()
    answer: dict[str, Any] = json.loads(response.split(b"\r\n\r\n", 1)[1])
    return answer


async def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)  # retriable hiccups
    config = ClientConfig.from_env()
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    shipped: asyncio.Queue[str] = asyncio.Queue()

    # The consumer subscribes before the first order is committed: the topic must exist.
    await asyncio.to_thread(TopicAdmin(config).ensure_topics, [TopicSpec(topic, 2)])
    with tempfile.TemporaryDirectory() as tmp:
        orders = Orders(Path(tmp) / "orders.db")

        async def ship(msg: MessageExt) -> ConsumeStatus:
            print(f"received {msg.keys[0]}", flush=True)
            if await asyncio.to_thread(orders.ship, msg.keys[0]):
                await shipped.put(msg.keys[0])
            return ConsumeStatus.CONSUME_SUCCESS

        consumer = PushConsumer(
            "order_shipping",
            config=config,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )
        consumer.subscribe(topic, ship)
        producer = TransactionMQProducer("order_service", OrderTransactions(orders), config=config)
        async with producer, consumer:
            service = OrderService(producer, topic)
            server = await asyncio.start_server(service.handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            async with server:
                for order in (
                    {"id": "order-1", "amount": 30},
                    {"id": "order-2", "amount": 0},
                    {"id": "order-3", "amount": 12, "crash_after_commit": True},
                ):
                    answer = await post_order(port, order)
                    print(f"posted   {answer['id']}: {answer['state']}", flush=True)
                print("waiting for the consumer (order-3 after its check-back) ...", flush=True)
                for _ in range(2):
                    order_id = await asyncio.wait_for(shipped.get(), 60)
                    print(f"shipped  {order_id}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
