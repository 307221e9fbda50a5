"""The asyncio API (``bridge.aio``) against a real broker, beside the threaded API.

The tests of transactions, delays, retry and the DLQ, orderly retry and offsets run once per
API through a small adapter (``api``): the threaded clients, or the asyncio clients run on an
event loop in a thread of their own with ``async def`` listeners (each checks it runs on that
loop) and ``async with`` lifecycles. Then what only the asyncio API has: a loop that makes no
librdkafka call under load, cancellation, the bound on listeners in flight, ``send_batch``.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from bridge import (
    ClientConfig,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
    TransactionListener,
    TransactionMQProducer,
    TransactionSendResult,
    TransactionStatus,
    aio,
    read_messages,
)
from bridge.consumer.admin import read_dead_letters
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.errors import InvalidMessageError, KafkaClientError
from bridge.kafka.admin import TopicAdmin
from bridge.lifecycle import ServiceState
from tests.conftest import wait_until
from topics.catalog import TopicSpec

# One worker runs the module: its coordinator (a module fixture) is built once.
pytestmark = [pytest.mark.broker, pytest.mark.xdist_group("test_aio")]

T = TypeVar("T")
C, R, U = TransactionStatus.COMMIT, TransactionStatus.ROLLBACK, TransactionStatus.UNKNOWN
OK, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
LEVELS = "1s 1s 1s 2s 3s"
"""Level 1 waits 1 s; a first retry (level 3) 1 s, a second (level 4) 2 s."""


# --- the broker-side set-up ----------------------------------------------------------------
@pytest.fixture(scope="module")
def config(kafka_bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=kafka_bootstrap,
        namespace=f"ns{uuid.uuid4().hex[:10]}",
        message_delay_level=LEVELS,
        kafka={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"},
    )


@pytest.fixture(scope="module")
def coordinator(config: ClientConfig) -> Iterator[Coordinator]:
    settings = CoordinatorConfig(
        client=config, coordinator_id="aio-tests", transaction_partitions=2,
        transaction_timeout_ms=1500, check_interval_ms=1000, transaction_check_max=3,
        session_timeout_ms=6000,
    )  # fmt: skip
    with Coordinator(settings) as running:
        warm = f"warmup-{uuid.uuid4().hex[:6]}"
        with Producer("warmup", config=config) as producer:
            producer.send_sync(Message(warm, b"w", delay_time_level=1))
        assert len(list(read_messages(config, [warm], max_messages=1, timeout_ms=60_000))) == 1
        yield running


def make_topic(config: ClientConfig, name: str, partitions: int = 1) -> str:
    TopicAdmin(config).ensure_topics([TopicSpec(name, partitions)])
    return name


def committed(config: ClientConfig, group: str, topic: str, partitions: int = 1) -> int:
    """The sum of the group's committed offsets over the topic's partitions."""
    reader = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        offsets = reader.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
        return sum(max(int(tp.offset), 0) for tp in offsets)
    finally:
        reader.close()


def bodies(config: ClientConfig, topic: str, expected: int, idle_ms: int = 3000) -> list[str]:
    """Bodies on the real topic, read until ``expected`` arrived and then ``idle_ms`` more."""
    out = [
        m.body.decode()
        for m in read_messages(config, [topic], max_messages=expected, timeout_ms=60_000)
    ]
    out += [m.body.decode() for m in read_messages(config, [topic], timeout_ms=idle_ms)][len(out) :]
    return sorted(out)


# --- the two APIs behind one face ----------------------------------------------------------
class Send(Protocol):
    def __call__(self, msg: Message) -> SendResult: ...


class SendInTransaction(Protocol):
    def __call__(self, msg: Message, arg: Any = None) -> TransactionSendResult: ...


class Stats(Protocol):
    def stats(self) -> Any: ...


Decide = Callable[[MessageExt], ConsumeStatus]
DecideBatch = Callable[[list[MessageExt]], ConsumeOrderlyStatus]


class Scripted:
    """A transaction listener answering by body: ``execute[body]``, then ``check[body]``."""

    def __init__(self, execute: dict[str, TransactionStatus], check: dict[str, Any]) -> None:
        self.execute = execute
        self.check = check
        self.checked: list[str] = []

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        assert arg == msg.body.decode()
        return self.execute.get(msg.body.decode(), U)

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        body = msg.body.decode()
        self.checked.append(body)
        answer = self.check.get(body, U)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


class Threaded:
    """The threaded API as it is."""

    name = "threaded"

    @contextmanager
    def producer(self, config: ClientConfig) -> Iterator[Send]:
        with Producer("aio_test_pg", config=config) as producer:
            yield producer.send_sync

    @contextmanager
    def transaction_producer(
        self, group: str, listener: Scripted, config: ClientConfig
    ) -> Iterator[SendInTransaction]:
        with TransactionMQProducer(group, listener, config=config) as producer:  # type: ignore[arg-type]
            yield producer.send_message_in_transaction

    @contextmanager
    def consumer(
        self, group: str, config: ClientConfig, topic: str, decide: Decide, **options: Any
    ) -> Iterator[Stats]:
        consumer = PushConsumer(group, config=config, **_consumer_options(options))
        consumer.subscribe(topic, decide)
        with consumer:
            yield consumer

    @contextmanager
    def orderly_consumer(
        self, group: str, config: ClientConfig, topic: str, decide: DecideBatch, **options: Any
    ) -> Iterator[Stats]:
        class Orderly(aio.MessageListenerOrderly):
            def consume_message(self, msgs: list[MessageExt], context: Any) -> Any:
                return decide(msgs)

        consumer = PushConsumer(group, config=config, **_consumer_options(options))
        consumer.subscribe(topic, Orderly())
        with consumer:
            yield consumer


def _consumer_options(options: dict[str, Any]) -> dict[str, Any]:
    options.setdefault("consume_from_where", ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    options.setdefault("persist_consumer_offset_interval_ms", 200)
    options.setdefault("send_back_retry_delay_ms", 300)
    return options


class LoopThread:
    """An event loop running in a thread of its own; the test's thread hands it coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop")
        self.thread.start()
        self.ident = self.thread.ident

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def on_loop(self) -> bool:
        return threading.get_ident() == self.ident

    @contextmanager
    def held(self, client: Any) -> Iterator[None]:
        """Run ``async with client:`` on the loop for the duration of the block."""
        entered: asyncio.Future[None] = self.loop.create_future()
        leave = asyncio.Event()

        async def hold() -> None:
            try:
                async with client:
                    entered.set_result(None)
                    await leave.wait()
            except BaseException as exc:
                if not entered.done():  # start() failed: the test gets its error
                    entered.set_exception(exc)
                raise

        done = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        asyncio.run_coroutine_threadsafe(_wait(entered), self.loop).result(120)
        try:
            yield
        finally:
            self.loop.call_soon_threadsafe(leave.set)
            done.result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _wait(future: asyncio.Future[None]) -> None:
    await future


class Aio:
    """The asyncio API, on a loop of its own, with ``async def`` listeners that check they run
    on that loop."""

    name = "aio"

    def __init__(self, loop: LoopThread) -> None:
        self.runner = loop
        self.off_loop: list[str] = []
        """Listener calls that did not run on the loop (there must be none)."""

    def _on_loop(self, what: str) -> None:
        if not self.runner.on_loop():
            self.off_loop.append(what)

    @contextmanager
    def producer(self, config: ClientConfig) -> Iterator[Send]:
        producer = aio.Producer("aio_test_pg", config=config)
        with self.runner.held(producer):
            yield lambda msg: self.runner.run(producer.send(msg))

    @contextmanager
    def transaction_producer(
        self, group: str, listener: Scripted, config: ClientConfig
    ) -> Iterator[SendInTransaction]:
        api = self

        class OnLoop(aio.AsyncTransactionListener):
            async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> Any:
                api._on_loop("execute")
                await asyncio.sleep(0.001)
                return listener.execute_local_transaction(msg, arg)

            async def check_local_transaction(self, msg: MessageExt) -> Any:
                api._on_loop("check")
                await asyncio.sleep(0.001)
                return listener.check_local_transaction(msg)

        producer = aio.TransactionMQProducer(group, OnLoop(), config=config)
        with self.runner.held(producer):
            yield lambda msg, arg=None: self.runner.run(
                producer.send_message_in_transaction(msg, arg)
            )

    @contextmanager
    def consumer(
        self, group: str, config: ClientConfig, topic: str, decide: Decide, **options: Any
    ) -> Iterator[Stats]:
        async def listener(msg: MessageExt) -> ConsumeStatus:
            self._on_loop("consume")
            await asyncio.sleep(0)
            return decide(msg)

        consumer = aio.PushConsumer(group, config=config, **_consumer_options(options))
        consumer.subscribe(topic, listener)
        with self.runner.held(consumer):
            yield consumer

    @contextmanager
    def orderly_consumer(
        self, group: str, config: ClientConfig, topic: str, decide: DecideBatch, **options: Any
    ) -> Iterator[Stats]:
        api = self

        class Orderly(aio.AsyncMessageListenerOrderly):
            async def consume_message(self, msgs: list[MessageExt], context: Any) -> Any:
                api._on_loop("orderly")
                await asyncio.sleep(0)
                return decide(msgs)

        consumer = aio.PushConsumer(group, config=config, **_consumer_options(options))
        consumer.subscribe(topic, Orderly())
        with self.runner.held(consumer):
            yield consumer


class Api(Protocol):
    name: str

    def producer(self, config: ClientConfig) -> AbstractContextManager[Send]: ...

    def transaction_producer(
        self, group: str, listener: Scripted, config: ClientConfig
    ) -> AbstractContextManager[SendInTransaction]: ...

    def consumer(
        self, group: str, config: ClientConfig, topic: str, decide: Decide, **options: Any
    ) -> AbstractContextManager[Stats]: ...

    def orderly_consumer(
        self, group: str, config: ClientConfig, topic: str, decide: DecideBatch, **options: Any
    ) -> AbstractContextManager[Stats]: ...


@pytest.fixture()
def loop_thread() -> Iterator[LoopThread]:
    running = LoopThread()
    yield running
    running.close()


@pytest.fixture(params=["threaded", "aio"])
def api(request: pytest.FixtureRequest, loop_thread: LoopThread) -> Iterator[Api]:
    if request.param == "threaded":
        yield Threaded()
        return
    made = Aio(loop_thread)
    yield made
    assert made.off_loop == [], "async listeners ran off the loop"


@dataclass
class Recorder:
    """Records deliveries; ``decide(msg, n)`` (n: deliveries of that body so far, this one
    included) says whether it succeeds."""

    decide: Callable[[MessageExt, int], bool] = lambda msg, n: True
    seen: list[tuple[str, int, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, msg: MessageExt) -> ConsumeStatus:
        body = msg.body.decode()
        with self.lock:
            self.seen.append((body, msg.reconsume_times, time.time()))
            n = sum(1 for b, _, _ in self.seen if b == body)
        return OK if self.decide(msg, n) else LATER

    def of(self, body: str) -> list[tuple[str, int, float]]:
        with self.lock:
            return [s for s in self.seen if s[0] == body]


# --- both APIs -------------------------------------------------------------------------------
def test_transactions_commit_roll_back_and_are_checked_back(
    api: Api, config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    topic = unique("t")
    listener = Scripted(
        execute={"commit": C, "rollback": R},
        check={"check-commit": C, "check-rollback": R, "check-raises": RuntimeError("db")},
    )
    names = ["commit", "rollback", "check-commit", "check-rollback"]
    with api.transaction_producer(unique("tx"), listener, config) as send:
        results = {name: send(Message(topic, name, keys=f"k-{name}"), name) for name in names}
        raised = send(Message(topic, "check-raises"), "check-raises")
        assert results["commit"].local_transaction_state is C
        assert results["rollback"].local_transaction_state is R
        assert results["check-commit"].local_transaction_state is U
        assert raised.local_transaction_state is U
        wait_until(lambda: {"check-commit", "check-rollback"} <= set(listener.checked))
        wait_until(lambda: listener.checked.count("check-raises") >= 2)
    assert bodies(config, topic, 2) == ["check-commit", "commit"]
    assert "commit" not in listener.checked and "rollback" not in listener.checked
    [real] = [m for m in read_messages(config, [topic], max_messages=2) if m.body == b"commit"]
    assert real.msg_id == results["commit"].msg_id and real.keys == ["k-commit"]


def test_delayed_messages_are_never_early(
    api: Api, config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    topic = unique("t")  # the broker's append time is the record's time: its delivery time
    TopicAdmin(config).ensure_topics(
        [TopicSpec(topic, 1, {"message.timestamp.type": "LogAppendTime"})]
    )
    with api.producer(config) as send:
        sent_at = time.time()
        result = send(Message(topic, b"later", delay_time_level=1))
        timer = Message(topic, b"timer")
        timer.set_delay_time_ms(2000)
        send(timer)
    assert result.topic == topic
    got = list(read_messages(config, [topic], max_messages=2, timeout_ms=30_000))
    assert sorted(m.body for m in got) == [b"later", b"timer"]
    at = {m.body: (m.store_timestamp_ms or 0) / 1000 for m in got}
    assert at[b"later"] - sent_at >= 1.0 - 0.05, "level 1 (1 s) delivered early"
    assert at[b"timer"] - sent_at >= 2.0 - 0.05, "timer (2 s) delivered early"


def test_retries_then_the_dlq_and_offsets_committed(
    api: Api, config: ClientConfig, coordinator: Coordinator, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    recorder = Recorder(lambda msg, n: msg.body == b"fine" or (msg.body == b"retried" and n > 2))
    with api.producer(config) as send:
        [retried_id] = [send(Message(topic, b"retried", keys="k1", tags="T")).msg_id]
        send(Message(topic, b"doomed", keys="k2"))
        send(Message(topic, b"fine"))
    with api.consumer(group, config, topic, recorder, max_reconsume_times=2) as consumer:
        wait_until(lambda: consumer.stats().dead_lettered == 1, timeout_s=60)
        wait_until(lambda: len(recorder.of("retried")) == 3, timeout_s=60)
        wait_until(lambda: committed(config, group, topic) == 3)
    retried = recorder.of("retried")
    assert [times for _, times, _ in retried] == [0, 1, 2]
    gaps = [b[2] - a[2] for a, b in itertools.pairwise(retried)]
    assert gaps[0] >= 1.0 and gaps[1] >= 2.0, gaps
    assert [times for _, times, _ in recorder.of("doomed")] == [0, 1, 2]
    assert len(recorder.of("fine")) == 1
    [letter] = read_dead_letters(config, group)
    assert (letter.body, letter.reconsume_times, letter.keys) == (b"doomed", 3, ["k2"])
    assert letter.topic == f"%DLQ%{group}"
    assert retried_id


def test_orderly_retry_in_place_keeps_the_order(
    api: Api, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    names = [f"o{i}" for i in range(6)]
    failures = {"o2": 2}
    seen: list[tuple[str, int]] = []

    def decide(msgs: list[MessageExt]) -> ConsumeOrderlyStatus:
        [msg] = msgs
        body = msg.body.decode()
        seen.append((body, msg.reconsume_times))
        if failures.get(body, 0) > 0:
            failures[body] -= 1
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    with api.producer(config) as send:
        for name in names:
            send(Message(topic, name.encode()))
    group = unique("g")
    with api.orderly_consumer(group, config, topic, decide, suspend_current_queue_time_millis=200):
        wait_until(lambda: len(seen) == 8)
    assert [b for b, _ in seen] == ["o0", "o1", "o2", "o2", "o2", "o3", "o4", "o5"]
    assert [t for b, t in seen if b == "o2"] == [0, 1, 2]
    assert committed(config, group, topic) == 6


def test_shutdown_commits_what_was_consumed(
    api: Api, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=3)
    group = unique("g")
    recorder = Recorder()
    with api.producer(config) as send:
        for i in range(60):
            send(Message(topic, f"s{i}".encode(), keys=f"k{i}"))
    # Commits only at shutdown: the interval is longer than the test.
    with api.consumer(
        group, config, topic, recorder, persist_consumer_offset_interval_ms=600_000
    ) as consumer:
        wait_until(lambda: consumer.stats().consumed == 60)
    assert committed(config, group, topic, partitions=3) == 60
    assert len(recorder.seen) == 60


# --- the asyncio API alone -------------------------------------------------------------------
def _librdkafka_call(frame: Any, event: str, arg: Any) -> str | None:
    """What a profile event calls in confluent_kafka (its C extension or its Python code),
    or None."""
    if event == "c_call":
        owner = getattr(arg, "__self__", None)
        module = getattr(type(owner), "__module__", "") or ""
        if "cimpl" in module or module.startswith("confluent_kafka"):
            return f"{type(owner).__name__}.{arg.__name__}"
        if "cimpl" in (getattr(arg, "__module__", "") or ""):
            return str(arg.__name__)
    elif event == "call" and "/confluent_kafka/" in frame.f_code.co_filename:
        return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
    return None


def test_the_loop_never_calls_into_librdkafka_under_load(
    loop_thread: LoopThread, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """Every call the loop's thread makes from before the clients start until after they
    shut down is watched (a profile hook on that thread alone) while 5,000 messages are sent
    (single sends, batches and oneway sends, all at once) and consumed by an async listener:
    not one goes into confluent_kafka, so the loop never waits on librdkafka, whatever the
    broker does. How long the loop is held under this load is a figure of
    ``python -m bench aio`` (it depends on the machine), not of this test."""
    topic = make_topic(config, unique("t"), partitions=4)
    count = 5000
    consumed: set[str] = set()
    calls: list[str] = []

    def watch(frame: Any, event: str, arg: Any) -> None:
        call = _librdkafka_call(frame, event, arg)
        if call is not None:
            calls.append(call)

    async def listener(msg: MessageExt) -> ConsumeStatus:
        consumed.add(msg.body.decode())
        await asyncio.sleep(0)
        return OK

    async def main() -> list[SendResult | KafkaClientError]:
        sys.setprofile(watch)
        try:
            consumer = aio.PushConsumer(
                unique("g"), config=config, **_consumer_options({"consume_thread_count": 8})
            )
            consumer.subscribe(topic, listener)
            async with aio.Producer("loop_pg", config=config) as producer, consumer:
                body = b"x" * 100
                batches = [
                    [Message(topic, body + f"{i}-{j}".encode(), keys=f"{j}") for j in range(100)]
                    for i in range(count // 250)
                ]
                singles = [
                    producer.send(Message(topic, body + f"single-{i}".encode()))
                    for i in range(count // 10)
                ]
                sends = [producer.send_batch(batch) for batch in batches]
                results: list[SendResult | KafkaClientError] = [
                    r for batch in await asyncio.gather(*sends) for r in batch
                ]
                results += await asyncio.gather(*singles)
                for i in range(count - len(results)):
                    await producer.send_oneway(Message(topic, body + f"one-{i}".encode()))
                while len(consumed) < count:
                    await asyncio.sleep(0.05)
            return results
        finally:
            sys.setprofile(None)

    results = loop_thread.run(main(), timeout_s=180)
    assert all(isinstance(r, SendResult) for r in results), [
        r for r in results if not isinstance(r, SendResult)
    ][:3]
    assert len(consumed) == count
    assert not calls, sorted(set(calls))


def test_a_cancelled_listener_counts_as_reconsume_later(
    loop_thread: LoopThread, config: ClientConfig, coordinator: Coordinator,
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = make_topic(config, unique("t"))
    seen: list[int] = []

    async def listener(msg: MessageExt) -> ConsumeStatus:
        seen.append(msg.reconsume_times)
        if msg.reconsume_times == 0:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(10)
        return OK

    async def main() -> Any:
        consumer = aio.PushConsumer(unique("g"), config=config, **_consumer_options({}))
        consumer.subscribe(topic, listener)
        async with aio.Producer("cancel_pg", config=config) as producer, consumer:
            await producer.send(Message(topic, b"cancelled once"))
            while len(seen) < 2:
                await asyncio.sleep(0.05)
            return consumer.stats()

    stats = loop_thread.run(main())
    assert seen == [0, 1], "sent back through the retry topic once"
    assert stats.sent_back == 1


def test_concurrent_listeners_in_flight_are_bounded_by_the_thread_count(
    loop_thread: LoopThread, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=2)
    in_flight = 0
    most = 0
    done = 0

    async def listener(msg: MessageExt) -> ConsumeStatus:
        nonlocal in_flight, most, done
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        done += 1
        return OK

    async def main() -> None:
        consumer = aio.PushConsumer(
            unique("g"), config=config, **_consumer_options({"consume_thread_count": 3})
        )
        consumer.subscribe(topic, listener)
        async with aio.Producer("bound_pg", config=config) as producer:
            await producer.send_batch(Message(topic, f"b{i}".encode()) for i in range(60))
        async with consumer:
            while done < 60:
                await asyncio.sleep(0.05)

    loop_thread.run(main())
    assert most == 3


def test_send_batch_checks_every_message_first_and_reports_each(
    loop_thread: LoopThread, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=2)

    async def main() -> list[SendResult | KafkaClientError]:
        async with aio.Producer("batch_pg", config=config) as producer:
            with pytest.raises(InvalidMessageError, match="body length is zero"):
                await producer.send_batch([Message(topic, b"first"), Message(topic, b"")])
            results = await producer.send_batch(Message(topic, f"m{i}".encode()) for i in range(10))
            one = await producer.send(Message(topic, b"last"), partition=1)
            assert one.queue_id == 1
            return results

    results = loop_thread.run(main())
    assert all(isinstance(r, SendResult) for r in results)
    got = sorted(m.body for m in read_messages(config, [topic], max_messages=11))
    assert got == sorted([f"m{i}".encode() for i in range(10)] + [b"last"])
    assert b"first" not in got


def test_cancelling_a_transactional_send_leaves_it_to_the_check_back(
    loop_thread: LoopThread, config: ClientConfig, coordinator: Coordinator,
    unique: Callable[[str], str],
) -> None:  # fmt: skip
    topic = unique("t")
    started = threading.Event()
    checked: list[str] = []

    class Slow(aio.AsyncTransactionListener):
        async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> Any:
            started.set()
            await asyncio.sleep(60)  # cancelled long before
            return C

        async def check_local_transaction(self, msg: MessageExt) -> Any:
            checked.append(msg.body.decode())
            return C

    async def main() -> None:
        async with aio.TransactionMQProducer(unique("tx"), Slow(), config=config) as producer:
            task = asyncio.create_task(
                producer.send_message_in_transaction(Message(topic, b"cancelled"))
            )
            while not started.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            while not checked:
                await asyncio.sleep(0.05)

    loop_thread.run(main())
    assert checked[0] == "cancelled"
    assert bodies(config, topic, 1) == ["cancelled"]


def test_orderly_listeners_run_one_per_partition_in_offset_order(
    loop_thread: LoopThread, config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"), partitions=3)
    running: dict[int, int] = {}
    most_per_partition = 0
    most = 0
    offsets: dict[int, list[int]] = {}

    class InOrder(aio.AsyncMessageListenerOrderly):
        async def consume_message(self, msgs: list[MessageExt], context: Any) -> Any:
            nonlocal most_per_partition, most
            [msg] = msgs
            partition = msg.queue_id
            running[partition] = running.get(partition, 0) + 1
            most_per_partition = max(most_per_partition, running[partition])
            most = max(most, sum(running.values()))
            await asyncio.sleep(0.01)
            offsets.setdefault(partition, []).append(msg.queue_offset)
            running[partition] -= 1
            return ConsumeOrderlyStatus.SUCCESS

    async def main() -> None:
        async with aio.Producer("orderly_pg", config=config) as producer:
            for p in range(3):
                await producer.send_batch(
                    (Message(topic, f"{p}-{i}".encode()) for i in range(30)), partition=p
                )
        consumer = aio.PushConsumer(
            unique("g"), config=config, **_consumer_options({"consume_thread_count": 8})
        )
        consumer.subscribe(topic, InOrder())
        async with consumer:
            while sum(len(v) for v in offsets.values()) < 90:
                await asyncio.sleep(0.05)

    loop_thread.run(main())
    assert most_per_partition == 1
    assert most > 1, "partitions ran in parallel"
    assert offsets == {p: list(range(30)) for p in range(3)}


@pytest.mark.parametrize("how", ["await", "wait_for", "gather"])
def test_a_listener_awaiting_its_own_consumers_shutdown_starts_it_and_goes_on(
    loop_thread: LoopThread, config: ClientConfig, unique: Callable[[str], str], how: str
) -> None:
    # Awaiting the whole shutdown there would wait for the very listener that awaits it:
    # drain_timeout_ms, then the listener cancelled and its message left to be consumed again.
    topic = make_topic(config, unique("t"))
    group = unique("g")
    with Producer("stop_pg", config=config) as producer:
        producer.send_sync(Message(topic, b"stop"))
    box: list[aio.PushConsumer] = []
    took: list[float] = []
    entered = asyncio.Event()

    async def listener(msg: MessageExt) -> ConsumeStatus:
        entered.set()
        started = time.monotonic()
        if how == "await":
            await box[0].shutdown()
        elif how == "wait_for":  # awaited in a task of its own, started by the listener
            await asyncio.wait_for(box[0].shutdown(), 30)
        else:
            await asyncio.gather(box[0].shutdown())
        took.append(time.monotonic() - started)
        return OK

    async def main() -> None:
        options = _consumer_options({"drain_timeout_ms": 6000})
        consumer = aio.PushConsumer(group, config=config, **options)
        box.append(consumer)
        consumer.subscribe(topic, listener)
        await consumer.start()
        await asyncio.wait_for(entered.wait(), 60)
        await consumer.shutdown()  # waits for the one the listener started

    loop_thread.run(main())
    assert took and took[0] < 2, f"the listener's shutdown took {took} s"
    assert committed(config, group, topic) == 1


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_consumer_whose_loop_ended_without_shutdown_leaves_its_messages_to_the_group(
    config: ClientConfig, unique: Callable[[str], str], orderly: bool
) -> None:
    topic = make_topic(config, unique("t"))
    group = unique("g")
    seen: list[str] = []

    async def on_message(msg: MessageExt) -> ConsumeStatus:
        seen.append(msg.body.decode())
        return OK

    zombie = aio.PushConsumer(group, config=config, orderly=orderly, **_consumer_options({}))
    zombie.subscribe(topic, on_message)
    with Producer(unique("p"), config=config) as producer:
        producer.send_sync(Message(topic, b"before"))

    async def main() -> None:
        await zombie.start()
        while not seen:
            await asyncio.sleep(0.05)

    asyncio.run(main())  # returns without zombie.shutdown(): its loop is closed
    after = [f"after-{i}" for i in range(3)]
    got: list[str] = []

    def live_listener(msg: MessageExt) -> ConsumeStatus:
        got.append(msg.body.decode())
        return OK

    live = PushConsumer(group, config=config, **_consumer_options({}))
    live.subscribe(topic, live_listener)
    try:
        with Producer(unique("p"), config=config) as producer:
            for body in after:
                producer.send_sync(Message(topic, body.encode()))
        # The first message it takes finds the loop closed: it shuts itself down.
        try:
            wait_until(lambda: zombie.state is ServiceState.SHUTDOWN_ALREADY, timeout_s=30)
        except pytest.fail.Exception:
            pytest.fail(f"the consumer still runs after its loop ended: {zombie.stats()}")
        live.start()
        wait_until(lambda: set(got) >= set(after), timeout_s=60)
    finally:
        live.shutdown()
        zombie.threaded.shutdown(2000)
    stats = zombie.stats()
    assert (stats.failed, stats.sent_back, stats.dead_lettered) == (0, 0, 0), stats
    assert seen == ["before"]
    assert sorted(got) == after, "each once, 'before' committed by the closing consumer"
    assert read_dead_letters(config, group, timeout_ms=2000) == []


def test_a_transaction_producer_whose_loop_ended_leaves_its_checks_to_a_live_one(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    # A namespace and a coordinator of its own: unanswered checks while the group rebalances
    # must not exhaust the module coordinator's transaction_check_max of 3.
    config = ClientConfig(bootstrap_servers=kafka_bootstrap, namespace=unique("ns")[:40])
    settings = CoordinatorConfig(
        client=config, coordinator_id="aio-closed", transaction_partitions=2,
        transaction_timeout_ms=1500, check_interval_ms=1000, transaction_check_max=15,
        session_timeout_ms=6000,
    )  # fmt: skip
    topic = unique("t")
    group = unique("tx")
    checked = {"zombie": 0, "live": 0}

    class Live(TransactionListener):
        def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
            return U

        def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
            checked["live"] += 1
            return C

    class Zombie(aio.AsyncTransactionListener):
        async def execute_local_transaction(self, msg: MessageExt, arg: Any) -> Any:
            return U

        async def check_local_transaction(self, msg: MessageExt) -> Any:
            checked["zombie"] += 1
            return C

    sent = [f"tx-{i}" for i in range(4)]
    with Coordinator(settings):
        zombie = aio.TransactionMQProducer(group, Zombie(), config=config)

        async def main() -> None:
            await zombie.start()
            for body in sent:
                await zombie.send_message_in_transaction(Message(topic, body.encode()))

        asyncio.run(main())  # returns without zombie.shutdown(): its loop is closed
        try:
            # Alone in its group, it takes the checks: the first finds the loop closed and
            # it shuts down (it answered each UNKNOWN until parked, staying in the group).
            try:
                wait_until(lambda: zombie.state is ServiceState.SHUTDOWN_ALREADY, timeout_s=30)
            except pytest.fail.Exception:
                pytest.fail("the transaction producer still runs after its loop ended")
            with TransactionMQProducer(group, Live(), config=config):
                assert bodies(config, topic, len(sent)) == sent, checked
        finally:
            zombie.threaded.shutdown(1000)
    assert checked["zombie"] == 0
    assert checked["live"] >= len(sent)


def test_a_listener_task_past_consume_timeout_is_cancelled_and_frees_its_thread(
    config: ClientConfig, unique: Callable[[str], str]
) -> None:
    topic = make_topic(config, unique("t"))
    calls: list[str] = []
    cancelled: list[str] = []

    async def on_message(msg: MessageExt) -> ConsumeStatus:
        body = msg.body.decode()
        calls.append(body)
        if body.startswith("hang") and calls.count(body) == 1:
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                cancelled.append(body)
                raise
        return OK

    # Two threads, two listeners that never return: without the cancellation the consumer
    # runs nothing more.
    consumer = aio.PushConsumer(
        unique("g"), config=config, consume_thread_count=2, consume_timeout=0.02,
        **_consumer_options({}),
    )  # fmt: skip
    consumer.subscribe(topic, on_message)
    sent = ["hang-1", "hang-2", "ok-1", "ok-2", "ok-3"]

    async def main() -> tuple[int, Any]:
        async with consumer:
            with Producer(unique("p"), config=config) as producer:
                for body in sent:
                    producer.send_sync(Message(topic, body.encode()))
            deadline = time.monotonic() + 30
            # A cancelled task is counted out once it has ended, just after its listener saw
            # the cancellation: the wait includes that.
            while time.monotonic() < deadline and not (
                {"ok-1", "ok-2", "ok-3"} <= set(calls)
                and len(cancelled) == 2
                and consumer.listeners_running == 0
            ):
                await asyncio.sleep(0.05)
            return consumer.listeners_running, consumer.stats()

    running, stats = asyncio.run(main())
    assert sorted(cancelled) == ["hang-1", "hang-2"], (calls, stats)
    assert {"ok-1", "ok-2", "ok-3"} <= set(calls), (calls, stats)
    assert running == 0
    assert stats.sent_back >= 2, "the timed-out messages are sent back, not lost"
