"""The two applications of the crash proof (tests/integration/test_db_crash.py), run as
processes of their own and killed with SIGKILL at a chosen step::

    python -m tests.db_crash_apps produce URL TOPIC FIRST LAST [--crash STEP:ORDER] [--stay]
    python -m tests.db_crash_apps consume URL TOPIC GROUP [--crash-after N]

``produce`` places orders FIRST..LAST in the orders database through a
``DatabaseTransactionListener`` (every order whose number is 2 mod 5 fails in its work and is
rolled back); ``--crash`` kills the process at a step of one order: ``before_db_commit`` (in
the work, after the business row), ``after_db_commit`` (the database transaction committed,
before the END is sent), ``after_end`` (once the committed message is visible on its topic).
``--stay`` keeps the producer running to answer check-backs until it is killed. ``consume``
records an effect per order in its own database through an ``IdempotentListener`` keyed by the
order id; ``--crash-after N`` kills it after the Nth handled message's database commit, before
its offset is committed (offsets are committed every 5 s). Both print ``ready`` once running.
The kill is the process's own SIGKILL at the exact step: nothing runs after it, no ``finally``,
no flush, no offset commit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
)

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    PushConsumer,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.db import DatabaseTransactionListener, IdempotentListener

PRODUCER_GROUP = "crash_orders_tx"

app_tables = MetaData()
orders = Table(
    "orders",
    app_tables,
    Column("id", String(64), primary_key=True),
    Column("body", LargeBinary, nullable=False),
)
effects = Table(  # no unique key on purpose: an effect applied twice shows as two rows
    "effects",
    app_tables,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(64), nullable=False),
    Column("body", LargeBinary, nullable=False),
)


def order_id(number: int) -> str:
    return f"order-{number:04d}"


def order_body(number: int) -> bytes:
    """Text in several scripts, then bytes that are not UTF-8."""
    return f"order {number} ✓ café 注文".encode() + b"\xff\xfe\x00\x80"


def fails(number: int) -> bool:
    """The orders whose business work fails (rolled back: no row, no message, no effect)."""
    return number % 5 == 2


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class _CrashingListener(DatabaseTransactionListener):
    """Dies between the database commit and the END, for one transaction."""

    crash_transaction: str | None = None

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        status = super().execute_local_transaction(msg, arg)
        if msg.keys and msg.keys[0] == self.crash_transaction:
            print(f"killed after_db_commit {msg.keys[0]} ({status.value})", flush=True)
            die()
        return status


def produce(args: argparse.Namespace) -> None:
    config = ClientConfig.from_env()
    engine = create_engine(args.url)
    app_tables.create_all(engine)
    step, _, at = (args.crash or ":").partition(":")
    crash_order = order_id(int(at)) if at else None
    listener = _CrashingListener(engine)
    if step == "after_db_commit":
        listener.crash_transaction = crash_order
    producer = TransactionMQProducer(PRODUCER_GROUP, listener, config=config)
    producer.start()
    print("ready", flush=True)
    for number in range(args.first, args.last + 1):
        oid = order_id(number)

        def work(conn: Connection, number: int = number, oid: str = oid) -> None:
            conn.execute(insert(orders).values(id=oid, body=order_body(number)))
            if fails(number):
                raise ValueError(f"{oid}: business rule refused it")
            if step == "before_db_commit" and oid == crash_order:
                print(f"killed before_db_commit {oid}", flush=True)
                die()

        msg = Message(args.topic, order_body(number), keys=oid)
        result = producer.send_message_in_transaction(msg, work)
        print(f"{oid} {result.local_transaction_state.value}", flush=True)
        if step == "after_end" and oid == crash_order:
            # The END has been applied once the message is on its topic.
            for seen in read_messages(config, [args.topic], timeout_ms=60_000):
                if seen.keys == [oid]:
                    print(f"killed after_end {oid}", flush=True)
                    die()
            raise SystemExit(f"{oid} never reached {args.topic}")
    print("done", flush=True)
    if args.stay:
        threading.Event().wait()
    producer.shutdown()


def consume(args: argparse.Namespace) -> None:
    config = ClientConfig.from_env()
    engine = create_engine(args.url)
    app_tables.create_all(engine)

    def apply(conn: Connection, msg: MessageExt) -> None:
        conn.execute(insert(effects).values(order_id=msg.keys[0], body=msg.body))

    inbox = IdempotentListener(engine, args.group, apply, key=lambda m: m.keys[0])
    handled = 0
    lock = threading.Lock()

    def listener(msg: MessageExt) -> ConsumeStatus:
        nonlocal handled
        status = inbox(msg)  # the database transaction has committed when this returns
        with lock:
            handled += 1
            if handled == args.crash_after:
                print(f"killed after handling {msg.keys[0]}", flush=True)
                die()
        return status

    consumer = PushConsumer(
        args.group,
        config=config,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        consume_thread_count=4,
    )
    consumer.subscribe(args.topic, listener)
    consumer.start()
    print("ready", flush=True)
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.db_crash_apps")
    sub = parser.add_subparsers(dest="app", required=True)
    p = sub.add_parser("produce")
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("first", type=int)
    p.add_argument("last", type=int)
    p.add_argument("--crash", default=None)
    p.add_argument("--stay", action="store_true")
    c = sub.add_parser("consume")
    c.add_argument("url")
    c.add_argument("topic")
    c.add_argument("group")
    c.add_argument("--crash-after", type=int, default=0)
    args = parser.parse_args()
    produce(args) if args.app == "produce" else consume(args)


if __name__ == "__main__":
    main()
