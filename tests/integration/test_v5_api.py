"""RocketMQ 5's names (``bridge.v5``) against a real broker: a v5 producer's sends reach a v5
push consumer and a simple consumer; a failure comes back and a timed message waits; a
transaction committed is delivered once and one rolled back never; a transaction left open
is decided by the checker of a producer declaring its topic (another process's included);
a checker that raises or does not know leaves it undecided until it is parked."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from bridge import ClientConfig, ConsumeFromWhere, read_messages
from bridge.cli.admin.transactions import list_undecided, read_parked
from bridge.coordinator import Coordinator
from bridge.errors import IllegalStateError, InvalidArgumentError, InvalidMessageError
from bridge.v5 import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    FilterType,
    Message,
    MessageListener,
    MessageView,
    Producer,
    PushConsumer,
    SendReceipt,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from tests.conftest import wait_until
from tests.integration.test_transactions import bodies, coordinator_config

pytestmark = pytest.mark.broker

FROM_FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
"""The consumers here start before or after the sends: they read the test's topic whole."""


class Recorder(MessageListener):
    """Consumes every message (FAILURE for the bodies in ``fail_first`` on their first
    delivery), keeping what it was given."""

    def __init__(self, fail_first: tuple[bytes, ...] = ()) -> None:
        self.fail_first = fail_first
        self.seen: list[MessageView] = []
        self.arrived: list[float] = []
        """When each message of :attr:`seen` was given, ``time.time()``."""
        self.lock = threading.Lock()

    def consume(self, message: MessageView) -> ConsumeResult:
        with self.lock:
            self.seen.append(message)
            self.arrived.append(time.time())
        if message.body in self.fail_first and message.delivery_attempt == 1:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.seen]


class ScriptedChecker(TransactionChecker):
    """Answers each check by the message's body: a list of answers, one per check (the last
    repeated); an exception is raised."""

    def __init__(self, script: dict[bytes, list[object]]) -> None:
        self.script = script
        self.checks: dict[bytes, list[MessageView]] = {}
        self.lock = threading.Lock()

    def check(self, message: MessageView) -> TransactionResolution:
        with self.lock:
            asked = self.checks.setdefault(message.body, [])
            asked.append(message)
            answers = self.script.get(message.body, [TransactionResolution.UNKNOWN])
            answer = answers[min(len(asked), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]  # some answers are wrong on purpose

    def times(self, body: bytes) -> int:
        with self.lock:
            return len(self.checks.get(body, []))


@pytest.fixture()
def configuration(kafka_bootstrap: str, namespace: str) -> ClientConfiguration:
    """RocketMQ 5's configuration of the session broker, in this test's own namespace."""
    return ClientConfiguration(kafka_bootstrap, Credentials(), namespace)


@pytest.fixture()
def coordinator(client_config: ClientConfig) -> Iterator[Coordinator]:
    with Coordinator(coordinator_config(client_config, transaction_check_max=3)) as running:
        yield running


def parked_bodies(config: ClientConfig, count: int) -> list[bytes]:
    """The bodies of the half messages parked in ``config``'s namespace, once ``count``
    are."""

    def parked() -> list[bytes] | None:
        found = sorted(m.body for m in read_parked(config, timeout_ms=2000))
        return found if len(found) >= count else None

    found: list[bytes] = wait_until(parked, timeout_s=90)
    return found


def test_a_v5_producers_sends_reach_a_v5_push_consumer_and_a_simple_consumer(
    configuration: ClientConfiguration, topic: str
) -> None:
    listener = Recorder()
    consumer = PushConsumer(
        configuration,
        f"{topic}-push",
        listener,
        {topic: FilterExpression("TagA")},
        consume_from_where=FROM_FIRST,
    )
    simple = SimpleConsumer(
        configuration,
        f"{topic}-simple",
        {topic: FilterExpression("region = 'eu'", FilterType.SQL)},
        2,
        consume_from_where=FROM_FIRST,
    )
    producer = Producer(configuration, (topic,))
    producer.startup()
    try:
        msg = Message()
        msg.topic = topic
        msg.body = b"order created"
        msg.tag = "TagA"
        msg.keys = "order-1"
        msg.add_property("region", "eu")
        receipt = producer.send(msg)
        assert isinstance(receipt, SendReceipt) and receipt.message_id == msg.message_id
        assert (receipt.topic, receipt.transaction_id) == (topic, None)
        async_receipt: Future[SendReceipt] = producer.send_async(
            Message(topic, b"order paid", tag="TagA", message_group="order-1")
        )
        # Filtered out; then a last message: every message is keyed order-1, so all are in
        # one partition, and once the last is consumed a duplicate of the others (or the
        # TagB message) would have been consumed too.
        producer.send(Message(topic, b"order audited", tag="TagB", keys="order-1"))
        producer.send(Message(topic, b"last", tag="TagA", keys="order-1"))
        paid = async_receipt.result(timeout=30)
        consumer.startup()
        wait_until(lambda: b"last" in listener.bodies(), timeout_s=60)
        simple.startup()
        received = wait_until(lambda: simple.receive(16, 30), timeout_s=60)
    finally:
        producer.shutdown()
        consumer.shutdown()
    try:
        for view in received:
            simple.ack(view)
    finally:
        simple.shutdown()
    views = {v.body: v for v in listener.seen}
    assert sorted(listener.bodies()) == [b"last", b"order created", b"order paid"]  # once each
    created = views[b"order created"]
    assert (created.message_id, created.topic, created.tag) == (receipt.message_id, topic, "TagA")
    assert (created.keys, created.properties) == (["order-1"], {"region": "eu"})
    assert created.delivery_attempt == 1 and created.receipt_handle is None
    assert views[b"order paid"].message_id == paid.message_id
    assert views[b"order paid"].message_group == "order-1"
    # The SQL92 filter of the simple consumer took the one message with region = 'eu'.
    assert [(v.body, v.message_id) for v in received] == [(b"order created", receipt.message_id)]


def test_a_failure_comes_back_and_a_timed_message_waits_for_its_time(
    kafka_bootstrap: str, namespace: str, topic: str
) -> None:
    # A ClientConfig is taken wherever a ClientConfiguration is: here for short delay levels.
    config = ClientConfig(
        bootstrap_servers=kafka_bootstrap, namespace=namespace, message_delay_level="1s 1s 1s 1s"
    )
    listener = Recorder(fail_first=(b"retried",))
    consumer = PushConsumer(
        config, f"{topic}-push", listener, {topic: None}, consume_from_where=FROM_FIRST
    )
    with Coordinator(coordinator_config(config)), Producer(config) as producer:
        producer.send(Message(topic, b"retried"))
        due_s = time.time() + 3
        producer.send(Message(topic, b"timed", delivery_timestamp=due_s))
        with consumer:
            wait_until(lambda: listener.bodies().count(b"retried") == 2, 90)
            wait_until(lambda: b"timed" in listener.bodies(), 90)
    retried = [v for v in listener.seen if v.body == b"retried"]
    assert [(v.delivery_attempt, v.topic) for v in retried] == [(1, topic), (2, topic)]
    assert retried[0].message_id == retried[1].message_id
    ((timed, arrived_s),) = [
        (v, at) for v, at in zip(listener.seen, listener.arrived, strict=True) if v.body == b"timed"
    ]
    assert timed.born_timestamp < due_s * 1000 and arrived_s >= due_s  # never early
    assert timed.delivery_attempt == 1


def test_a_committed_transaction_is_delivered_once_and_a_rolled_back_one_never(
    configuration: ClientConfiguration,
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
) -> None:
    checker = ScriptedChecker({})
    with Producer(configuration, (topic,), checker) as producer:
        committed = producer.begin_transaction()
        receipt = producer.send(Message(topic, b"commit", keys="order-1"), committed)
        assert receipt.transaction_id == receipt.message_id == committed.message_id
        with pytest.raises(InvalidArgumentError, match="one message"):
            producer.send(Message(topic, b"second"), committed)
        committed.commit()
        with pytest.raises(IllegalStateError, match="committed"):
            committed.rollback()

        rolled_back = producer.begin_transaction()
        producer.send(Message(topic, b"rollback"), rolled_back)
        rolled_back.rollback()
        with pytest.raises(IllegalStateError, match="rolled back"):
            rolled_back.commit()

        with pytest.raises(InvalidMessageError, match="message_group"):
            producer.send(Message(topic, b"x", message_group="g"), producer.begin_transaction())
        with pytest.raises(InvalidArgumentError, match="not among this producer's topics"):
            producer.send(Message(f"{topic}-other", b"x"), producer.begin_transaction())
        other = Producer(configuration, (topic,), ScriptedChecker({}))
        with other, pytest.raises(InvalidArgumentError, match="not a transaction of this"):
            producer.send(Message(topic, b"x"), other.begin_transaction())
        # The OP records are written once the coordinator applied both decisions.
        assert bodies(client_config, topic, 1) == ["commit"]
    (real,) = read_messages(client_config, [topic], max_messages=1)
    assert real.msg_id == receipt.message_id and real.keys == ["order-1"]
    # A check that came before a decision (a loaded machine) was answered UNKNOWN: the
    # decisions above decided, whatever the timing.
    assert set(checker.checks) <= {b"commit", b"rollback"}


def test_a_commit_after_the_checker_rolled_the_transaction_back_raises_and_delivers_nothing(
    configuration: ClientConfiguration,
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
) -> None:
    # The local transaction outlasts transaction_timeout_ms (1.5 s here): the coordinator
    # checks it back, this producer's checker answers ROLLBACK, and that decision stands.
    checker = ScriptedChecker({b"slow": [TransactionResolution.ROLLBACK]})
    with Producer(configuration, (topic,), checker) as producer:
        transaction = producer.begin_transaction()
        producer.send(Message(topic, b"slow"), transaction)

        def rolled_back() -> bool:
            undecided = list_undecided(client_config, timeout_ms=2000)
            return checker.times(b"slow") >= 1 and all(
                u.transaction_id != transaction.message_id for u in undecided
            )

        wait_until(rolled_back, timeout_s=60)
        with pytest.raises(IllegalStateError) as refused:
            transaction.commit()  # it would be ignored: the coordinator applied the ROLLBACK
        assert "the TransactionChecker answered ROLLBACK" in str(refused.value)
        transaction.rollback()  # the same decision: no error
        # A transaction committed afterwards is delivered; the rolled-back one never.
        last = producer.begin_transaction()
        producer.send(Message(topic, b"last"), last)
        last.commit()
        assert bodies(client_config, topic, 1) == ["last"]


def test_begin_transaction_needs_a_checker(configuration: ClientConfiguration, topic: str) -> None:
    producer = Producer(configuration, (topic,))
    with producer, pytest.raises(IllegalStateError, match="TransactionChecker"):
        producer.begin_transaction()


def test_a_transaction_left_open_is_committed_by_the_checker_of_a_later_producer(
    configuration: ClientConfiguration, client_config: ClientConfig, topic: str
) -> None:
    # The first producer's checker does not know (it may be asked before it shuts down); a
    # producer started later for the same topic answers: check-backs go to the topic's
    # producers, as RocketMQ 5's proxy sends them.
    first = ScriptedChecker({})
    later = ScriptedChecker({b"open": [TransactionResolution.COMMIT]})
    config = coordinator_config(client_config, transaction_check_max=10)
    with Coordinator(config):
        with Producer(configuration, (topic,), first) as producer:
            transaction = producer.begin_transaction()
            msg = Message(topic, b"open", tag="TagA", properties={"order": "7"})
            producer.send(msg, transaction)
        with pytest.raises(IllegalStateError, match="startup"):
            transaction.commit()  # its producer is gone: the checkers decide now
        with Producer(configuration, (topic,), later):
            assert bodies(client_config, topic, 1) == ["open"]
    assert later.times(b"open") >= 1  # once, or more if an answer came after the next check
    for asked in later.checks[b"open"]:
        assert (asked.message_id, asked.topic, asked.tag) == (transaction.message_id, topic, "TagA")
        assert asked.properties == {"order": "7"}
    assert all(v.message_id == transaction.message_id for v in first.checks.get(b"open", []))


def test_a_checker_that_raises_or_does_not_know_leaves_the_transaction_to_be_parked(
    configuration: ClientConfiguration,
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    undecided = [b"raises", b"unspecified", b"none", b"junk"]
    checker = ScriptedChecker(
        {
            b"raises": [RuntimeError("db down")],
            b"unspecified": [TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED],
            b"none": [None],
            b"junk": ["COMMIT"],
            b"asked-again": [TransactionResolution.UNKNOWN, TransactionResolution.COMMIT],
        }
    )
    caplog.set_level(logging.ERROR, logger="bridge.v5.transaction")
    with Producer(configuration, (topic,), checker) as producer:
        for body in [*undecided, b"asked-again"]:
            producer.send(Message(topic, body), producer.begin_transaction())
        assert parked_bodies(client_config, 4) == sorted(undecided)
        assert bodies(client_config, topic, 1) == ["asked-again"]
    assert {body: checker.times(body) for body in undecided} == dict.fromkeys(undecided, 3)
    assert checker.times(b"asked-again") >= 2  # UNKNOWN, then COMMIT
    assert "answered 'COMMIT', not a TransactionResolution" in caplog.text
