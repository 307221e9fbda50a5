"""The simple consumer against a real broker: receive and ack, invisible durations that pass
(a redelivery with its attempt counted, then the DLQ), deadlines moved both ways, two
consumers sharing a group, a kill -9 with messages out, filters, bad input, and the asyncio
twin."""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from bridge import (
    ClientConfig,
    FilterExpression,
    FilterExpressionError,
    FilterExpressionType,
    InvalidReceiptHandleError,
    Message,
    MessageView,
    Producer,
    SimpleConsumer,
    SimpleConsumerConfig,
)
from bridge import aio as bridge_aio
from bridge.consumer import ConsumeFromWhere
from bridge.consumer.admin import read_dead_letters
from bridge.errors import IllegalStateError, InvalidArgumentError
from bridge.kafka.admin import TopicAdmin
from tests.conftest import REPO_ROOT, wait_until
from topics.catalog import TopicSpec

pytestmark = pytest.mark.broker

SESSION_MS = 6000


@pytest.fixture(scope="module")
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        kafka={"session.timeout.ms": str(SESSION_MS), "heartbeat.interval.ms": "500"},
    )


@pytest.fixture()
def made() -> Iterator[list[SimpleConsumer]]:
    consumers: list[SimpleConsumer] = []
    yield consumers
    for consumer in consumers:
        consumer.shutdown()


def make_topic(config: ClientConfig, name: str, partitions: int = 1) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def send(config: ClientConfig, topic: str, msgs: list[Message], spread: int = 1) -> list[str]:
    with Producer("test_pg", config=config) as producer:
        return [producer.send_sync(m, partition=i % spread).msg_id for i, m in enumerate(msgs)]


def new_consumer(
    made: list[SimpleConsumer],
    config: ClientConfig,
    group: str,
    subscription: dict[str, FilterExpression | str],
    await_duration: float = 2,
    **options: Any,
) -> SimpleConsumer:
    settings = SimpleConsumerConfig(
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        persist_consumer_offset_interval_ms=200,
    ).replace(**options)
    made.append(SimpleConsumer(config, group, subscription, await_duration, settings=settings))
    made[-1].startup()
    return made[-1]


def committed(config: ClientConfig, group: str, topic: str, partitions: int = 1) -> int:
    """The group's committed offsets of the topic's partitions, summed (none counts 0)."""
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    offsets = reader.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    reader.close()
    return sum(max(0, tp.offset) for tp in offsets)


def receive_until(
    consumer: SimpleConsumer,
    done: Callable[[list[MessageView]], bool],
    invisible_s: float = 60,
    timeout_s: float = 60,
    ack: bool = True,
) -> list[MessageView]:
    """Receive (and ack, unless told) until ``done(all received)``."""
    got: list[MessageView] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < deadline, f"only {len(got)} received"
        views = consumer.receive(16, invisible_s)
        for view in views:
            if ack:
                consumer.ack(view)
        got += views
    return got


@pytest.mark.check("G6")
def test_each_message_is_received_once_and_nothing_comes_back_after_ack_and_restart(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    bodies = [f"m{i}".encode() for i in range(60)]
    topic, group = make_topic(config, unique("t"), partitions=2), unique("g")
    ids = send(config, topic, [Message(topic, b, tags="T") for b in bodies], spread=2)
    first = new_consumer(made, config, group, {topic: "*"})
    got = receive_until(first, lambda seen: len(seen) >= len(bodies))
    assert sorted(v.body for v in got) == sorted(bodies)
    assert sorted(v.message_id for v in got) == sorted(ids)
    assert {v.delivery_attempt for v in got} == {1}
    assert {v.topic for v in got} == {topic}
    assert first.receive(16, 60) == [], "a message came back after its ack"
    first.shutdown()
    assert committed(config, group, topic, 2) == len(bodies)

    second = new_consumer(made, config, group, {topic: "*"})
    send(config, topic, [Message(topic, b"marker")])
    after = receive_until(second, lambda seen: any(v.body == b"marker" for v in seen))
    assert [v.body for v in after] == [b"marker"], "acked messages came back after a restart"


@pytest.mark.check("G6")
def test_not_acked_comes_back_after_its_invisible_duration_then_goes_to_the_dlq(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    body = b"\xff\x00not utf-8\xfe"
    msg = Message(topic, body, keys="k1", tags="TagA")
    msg.put_user_property("p", "v")
    msg.put_user_property("raw", b"\xc3\x28")
    [msg_id] = send(config, topic, [msg])
    consumer = new_consumer(made, config, group, {topic: "*"}, max_delivery_attempts=3)
    invisible_s = 2.0
    deliveries: list[tuple[float, MessageView]] = []
    deadline = time.monotonic() + 60
    while len(deliveries) < 3:
        assert time.monotonic() < deadline
        for view in consumer.receive(1, invisible_s):
            deliveries.append((time.monotonic(), view))
    assert [v.delivery_attempt for _, v in deliveries] == [1, 2, 3]
    for (at, _), (next_at, _) in itertools.pairwise(deliveries):
        assert next_at - at >= invisible_s - 0.05, "redelivered before its invisible duration"
        assert next_at - at < invisible_s + 5, "redelivered long after its invisible duration"
    for _, view in deliveries:
        assert (view.message_id, view.body, view.tag, view.keys) == (msg_id, body, "TagA", ["k1"])
        assert view.properties == {"p": "v", "raw": b"\xc3\x28"}
        assert view.topic == topic
    last = deliveries[-1][1]
    time.sleep(invisible_s + 0.5)
    with pytest.raises(InvalidReceiptHandleError) as stale:
        consumer.ack(last)
    assert stale.value.reason == "expired"
    letters = wait_until(lambda: read_dead_letters(config, group), timeout_s=30)
    [letter] = letters
    assert (letter.msg_id, letter.body, letter.reconsume_times) == (msg_id, body, 3)
    assert letter.get_property("raw") == b"\xc3\x28"
    assert letter.get_property("CONSUME_FAILURE") == "NOT_ACKED"
    assert consumer.receive(1, invisible_s) == [], "delivered again after the DLQ"
    wait_until(lambda: committed(config, group, topic) == 1, timeout_s=30)


def test_change_invisible_duration_extends_and_shortens(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, [Message(topic, b"long"), Message(topic, b"short")])
    consumer = new_consumer(made, config, group, {topic: "*"}, await_duration=0.5)
    views = receive_until(consumer, lambda seen: len(seen) >= 2, invisible_s=2, ack=False)
    by_body = {v.body: v for v in views}
    started = time.monotonic()
    old_handle = by_body[b"long"].receipt_handle
    consumer.change_invisible_duration(by_body[b"long"], 8)
    assert by_body[b"long"].receipt_handle != old_handle
    consumer.change_invisible_duration(by_body[b"short"], 600)
    consumer.change_invisible_duration(by_body[b"short"], 0.5)
    back: list[MessageView] = []
    while time.monotonic() - started < 5:  # past long's first deadline (2 s)
        back += consumer.receive(4, 60)
    assert [v.body for v in back] == [b"short"], "extended came back early, or shortened late"
    assert back[0].delivery_attempt == 2
    consumer.ack(back[0])
    consumer.ack(by_body[b"long"])  # still its: its deadline moved to 8 s
    time.sleep(max(0.0, 9 - (time.monotonic() - started)))
    assert consumer.receive(4, 60) == []
    wait_until(lambda: committed(config, group, topic) == 2, timeout_s=30)


def test_two_consumers_of_a_group_share_the_work_and_each_message_is_acked_once(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=4)
    group = unique("g")
    bodies = [f"w{i}".encode() for i in range(400)]
    send(config, topic, [Message(topic, b) for b in bodies], spread=4)
    acked: collections.Counter[bytes] = collections.Counter()
    per_consumer: list[collections.Counter[bytes]] = [collections.Counter(), collections.Counter()]
    lock = threading.Lock()
    stop = threading.Event()

    def work(index: int) -> None:
        consumer = new_consumer(made, config, group, {topic: "*"}, await_duration=0.5)
        while not stop.is_set():
            for view in consumer.receive(8, 30):
                time.sleep(0.02)  # some work: the stream lasts while the second joins
                try:
                    consumer.ack(view)
                except InvalidReceiptHandleError as exc:
                    assert exc.reason == "released"
                    continue
                with lock:
                    acked[view.body] += 1
                    per_consumer[index][view.body] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    threads[0].start()
    wait_until(lambda: sum(per_consumer[0].values()) >= 20)
    threads[1].start()
    try:
        wait_until(lambda: len(acked) == len(bodies), timeout_s=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert set(acked) == set(bodies)
    assert max(acked.values()) == 1, [b for b, n in acked.items() if n > 1]
    assert sum(per_consumer[1].values()) > 0, "the second consumer got no work"
    for consumer in made:
        consumer.shutdown()
    assert committed(config, group, topic, 4) == len(bodies)


def test_a_consumer_joining_takes_only_the_partitions_that_move_and_the_rest_stay_out(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    """RocketMQ keeps a received message invisible however the group changes. Here the group
    rebalances incrementally: a joining consumer takes some partitions, and the messages
    received from the others stay with their receiver, whose acks go through."""
    topic = make_topic(config, unique("t"), partitions=4)
    group = unique("g")
    bodies = {f"p{i}".encode() for i in range(4)}
    send(config, topic, [Message(topic, b) for b in sorted(bodies)], spread=4)
    first = new_consumer(made, config, group, {topic: "*"}, drain_timeout_ms=1000)
    out = receive_until(first, lambda got: len(got) == 4, invisible_s=120, ack=False)
    second = new_consumer(made, config, group, {topic: "*"}, await_duration=0.5)
    # The second gets the messages of the partitions that moved (released by the first after
    # its 1 s drain): at least one partition moves to a new member.
    taken = receive_until(second, lambda got: len(got) >= 1, invisible_s=120)
    kept: set[bytes] = set()
    for view in out:
        try:
            first.ack(view)
        except InvalidReceiptHandleError as exc:
            assert exc.reason == "released"
            continue
        kept.add(view.body)
    assert kept, "every partition was taken from the first consumer"
    # What moved is received by the second (once); what stayed is not received again.
    rest = receive_until(second, lambda got: len(got) >= 4 - len(kept) - len(taken))
    moved = [v.body for v in taken + rest]
    assert sorted(moved) == sorted(bodies - kept)
    assert second.receive(16, 30) == [] and first.receive(16, 30) == []
    for consumer in made:
        consumer.shutdown()
    assert committed(config, group, topic, 4) == 4


HOLDER_SCRIPT = """
import os, sys, time
from bridge import ClientConfig, SimpleConsumer
from bridge.consumer import ConsumeFromWhere
config = ClientConfig(bootstrap_servers=sys.argv[1], namespace=sys.argv[2],
                      kafka={"session.timeout.ms": sys.argv[6]})
out = os.open(sys.argv[5], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
consumer = SimpleConsumer(config, sys.argv[3], {sys.argv[4]: "*"}, 1,
                          consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                          persist_consumer_offset_interval_ms=100)
consumer.startup()
n = 0
while True:
    for view in consumer.receive(4, 300):
        time.sleep(0.02)  # the work: the kill comes before everything is received
        n += 1
        if n % 2:
            consumer.ack(view)
            os.write(out, b"acked " + view.body + b" %f\\n" % time.time())
        else:
            os.write(out, b"held " + view.body + b" %f\\n" % time.time())
"""


def test_a_killed_consumers_unacked_messages_come_back_to_the_group_after_its_session(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    bodies = [f"k{i}" for i in range(300)]
    topic, group, log = make_topic(config, unique("t"), 2), unique("g"), tmp_path / "received"
    send(config, topic, [Message(topic, b) for b in bodies], spread=2)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT, config.bootstrap_servers, config.namespace,
         group, topic, str(log), str(SESSION_MS)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip

    def lines() -> list[list[str]]:
        return [line.split() for line in log.read_text().splitlines()] if log.exists() else []

    try:
        wait_until(lambda: sum(1 for kind, *_ in lines() if kind == "held") >= 20, timeout_s=60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_at, killed_wall = time.monotonic(), time.time()
    held = {body for kind, body, _ in lines() if kind == "held"}
    acked = {body for kind, body, _ in lines() if kind == "acked"}
    # Held for half a second before the kill: its delivery was committed (within 0.1 s).
    held_long = {
        body for kind, body, at in lines() if kind == "held" and float(at) < killed_wall - 0.5
    }
    assert held_long
    assert len(held | acked) < len(bodies), "the kill came after everything was received"
    survivor = new_consumer(made, config, group, {topic: "*"}, await_duration=1)
    seen: set[str] = set()
    attempts: dict[str, int] = {}
    deadline = time.monotonic() + 120
    while not held <= seen or (held | acked | seen) != set(bodies):
        assert time.monotonic() < deadline, f"{len(held - seen)} held messages never came back"
        for view in survivor.receive(16, 60):
            survivor.ack(view)
            seen.add(view.body.decode())
            if view.body.decode() in held:
                attempts[view.body.decode()] = view.delivery_attempt
    back_after = time.monotonic() - killed_at
    # Their invisible duration was 300 s: they came back with the partitions, once the
    # killed member's session ended.
    assert back_after < 120
    # Each was received and never acked by the killed consumer: that delivery counts (the
    # commit its poll thread made after the receive says so), as RocketMQ's broker counts it.
    assert {attempts[body] for body in held_long} == {2}, "a delivery to the killed one is lost"
    assert set(attempts.values()) <= {1, 2}  # 1: received within 0.1 s of the kill


CRASHER_SCRIPT = """
import os, signal, sys, time
from bridge import ClientConfig, SimpleConsumer
from bridge.consumer import ConsumeFromWhere
config = ClientConfig(bootstrap_servers=sys.argv[1], namespace=sys.argv[2],
                      kafka={"session.timeout.ms": sys.argv[5]})
consumer = SimpleConsumer(config, sys.argv[3], {sys.argv[4]: "*"}, 1,
                          consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                          max_delivery_attempts=3)
consumer.startup()
while True:
    for view in consumer.receive(1, 300):
        if view.body == b"poison":  # it kills the process working on it
            print("poison", view.delivery_attempt, flush=True)
            time.sleep(0.5)  # the work before the crash (a delivery is committed within 0.1 s)
            os.kill(os.getpid(), signal.SIGKILL)
        consumer.ack(view)
        print("acked", view.body.decode(), flush=True)
"""


def test_a_message_that_kills_every_consumer_receiving_it_reaches_the_dlq(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """Before: each consumer started after the crash received it again as delivery 1, for
    ever."""
    topic, group = make_topic(config, unique("t"), 1), unique("g")
    send(config, topic, [Message(topic, body) for body in ("before", "poison", "after")])
    attempts: list[str] = []
    acked: list[str] = []
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", CRASHER_SCRIPT, config.bootstrap_servers, config.namespace,
             group, topic, str(SESSION_MS)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        lines = [line.split() for line in proc.stdout.splitlines()]
        attempts += [value for kind, value in lines if kind == "poison"]
        acked += [value for kind, value in lines if kind == "acked"]
    assert attempts == ["1", "2", "3"]
    # The next consumer of the group counts the third and last delivery: the message goes to
    # the DLQ instead of to it, and the rest was received and acked once, by the others.
    with SimpleConsumer(
        config, group, {topic: "*"}, 1,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, max_delivery_attempts=3,
    ) as survivor:  # fmt: skip
        dead = wait_until(lambda: read_dead_letters(config, group, timeout_ms=2000), timeout_s=60)
        assert [letter.body for letter in dead] == [b"poison"]
        assert dead[0].get_property("CONSUME_FAILURE") == "NOT_ACKED"
        assert dead[0].reconsume_times == 3
        assert survivor.receive(16, 3) == []
    assert sorted(acked) == ["after", "before"]


def test_tag_and_sql92_filters_apply_and_filtered_messages_are_committed(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    tagged = make_topic(config, unique("tag"))
    props = make_topic(config, unique("sql"))
    group = unique("g")
    msgs: list[Message] = []
    for i in range(10):
        msgs.append(Message(tagged, f"t{i}", tags="TagA" if i % 2 else "TagB"))
    send(config, tagged, msgs)
    sql_msgs: list[Message] = []
    for i in range(10):
        m = Message(props, f"s{i}", tags="TagS")
        m.put_user_property("amount", str(i * 50))
        sql_msgs.append(m)
    send(config, props, sql_msgs)
    consumer = new_consumer(
        made, config, group,
        {
            tagged: FilterExpression("TagA"),
            props: FilterExpression("amount > 100 AND TAGS = 'TagS'", FilterExpressionType.SQL92),
        },
    )  # fmt: skip
    expected = {f"t{i}" for i in range(10) if i % 2} | {f"s{i}" for i in range(10) if i * 50 > 100}
    got = receive_until(consumer, lambda seen: {v.body.decode() for v in seen} >= expected)
    assert sorted(v.body.decode() for v in got) == sorted(expected)
    wait_until(
        lambda: committed(config, group, tagged) == 10 and committed(config, group, props) == 10,
        timeout_s=30,
    )


def test_a_topic_subscribed_while_running_is_received_and_one_unsubscribed_is_not(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    first, later = make_topic(config, unique("a")), make_topic(config, unique("b"))
    consumer = new_consumer(made, config, unique("g"), {first: "*"})
    send(config, first, [Message(first, b"a1")])
    receive_until(consumer, lambda seen: [v.body for v in seen] == [b"a1"])
    consumer.subscribe(later, FilterExpression("TagB"))
    consumer.unsubscribe(first)
    send(
        config, later, [Message(later, b"skipped", tags="TagX"), Message(later, b"b1", tags="TagB")]
    )
    got = receive_until(consumer, bool)
    assert [v.body for v in got] == [b"b1"]
    send(config, first, [Message(first, b"a2")])
    assert consumer.receive(4, 60) == [], "a topic unsubscribed is still received"


def test_bad_input_gets_typed_errors(
    config: ClientConfig, made: list[SimpleConsumer], unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    with pytest.raises(FilterExpressionError) as bad_sql:
        SimpleConsumer(
            config, unique("g"), {topic: FilterExpression("a >", FilterExpressionType.SQL92)}
        )
    assert bad_sql.value.position == 3
    with pytest.raises(InvalidArgumentError, match="consumer_group"):
        SimpleConsumer(config, None, {topic: "*"})
    with pytest.raises(InvalidArgumentError, match="await_duration"):
        SimpleConsumer(config, unique("g"), {topic: "*"}, await_duration=-1)
    with pytest.raises(InvalidArgumentError, match="may not start"):
        SimpleConsumer(config, "%RETRY%g", {topic: "*"})
    idle = SimpleConsumer(config, unique("g"), {topic: "*"})
    with pytest.raises(IllegalStateError):
        idle.receive(1, 10)
    with pytest.raises(IllegalStateError, match="no subscription"):
        SimpleConsumer(config, unique("g")).startup()

    send(config, topic, [Message(topic, b"a"), Message(topic, b"b")])
    consumer = new_consumer(made, config, unique("g"), {topic: "*"})
    other = new_consumer(made, config, unique("g"), {topic: "*"})
    for bad_count in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="max_message_num"):
            consumer.receive(bad_count, 10)  # type: ignore[arg-type]
    for bad_duration in (0, -5, float("nan"), 13 * 3600):
        with pytest.raises(InvalidArgumentError, match="invisible_duration"):
            consumer.receive(1, bad_duration)
    mine = receive_until(consumer, lambda seen: len(seen) >= 2, ack=False)
    theirs = receive_until(other, lambda seen: len(seen) >= 1, ack=False)
    with pytest.raises(InvalidReceiptHandleError) as foreign:
        consumer.ack(theirs[0])
    assert foreign.value.reason == "foreign"
    with pytest.raises(InvalidArgumentError, match="MessageView"):
        consumer.ack(mine[0].message)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="invisible_duration"):
        consumer.change_invisible_duration(mine[0], -1)
    consumer.ack(mine[0])
    with pytest.raises(InvalidReceiptHandleError) as twice:
        consumer.ack(mine[0])
    assert twice.value.reason == "acked"
    consumer.shutdown()
    with pytest.raises(IllegalStateError):
        consumer.ack(mine[1])
    with pytest.raises(IllegalStateError):
        consumer.receive(1, 10)
    with pytest.raises(IllegalStateError):
        consumer.subscribe(topic)


def test_the_asyncio_twin_receives_acks_and_redelivers_after_expiry(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    send(config, topic, [Message(topic, b"acked"), Message(topic, b"left")])

    async def main() -> list[tuple[bytes, int]]:
        seen: list[tuple[bytes, int]] = []
        async with bridge_aio.SimpleConsumer(
            config, group, {topic: "*"}, 1,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            persist_consumer_offset_interval_ms=200,
        ) as consumer:  # fmt: skip
            deadline = time.monotonic() + 60
            while not any(attempt == 2 for _, attempt in seen):
                assert time.monotonic() < deadline
                for view in await consumer.receive(4, 1.5):
                    seen.append((view.body, view.delivery_attempt))
                    if view.body == b"acked" or view.delivery_attempt == 2:
                        await consumer.ack(view)
            # A receive cancelled while it waits gives back what it took: nothing is lost.
            waiting = asyncio.ensure_future(consumer.receive(4, 30))
            await asyncio.sleep(0.1)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert await consumer.receive(4, 30) == []
        return seen

    seen = asyncio.run(main())
    assert sorted(seen) == [(b"acked", 1), (b"left", 1), (b"left", 2)]
    wait_until(lambda: committed(config, group, topic) == 2, timeout_s=30)


def test_an_asyncio_shutdown_is_not_held_up_by_receives_still_waiting(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """Receives wait on the consumer's own threads: cancelled ones still waiting (up to
    their await_duration) neither hold up ``shutdown`` nor take the loop's default
    executor."""
    topic = make_topic(config, unique("t"))

    async def main() -> float:
        consumer = bridge_aio.SimpleConsumer(
            config, unique("g"), {topic: "*"}, 30,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        )  # fmt: skip
        await consumer.startup()
        # More receives than the default executor has threads, all cancelled while waiting.
        waiting = [asyncio.ensure_future(consumer.receive(1, 60)) for _ in range(40)]
        await asyncio.sleep(0.2)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        began = time.monotonic()
        await asyncio.wait_for(consumer.shutdown(), timeout=25)
        return time.monotonic() - began

    took_s = asyncio.run(main())
    assert took_s < 15, f"shutdown took {took_s:.1f} s behind waiting receives"
