"""The coordinator's trust rules against a real broker (G12, docs/trust-model.md): someone who
can write the HALF topic writes end requests, check answers and half messages for transactions
that are not theirs, and the coordinator writes only where its configuration allows."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.cli.admin.transactions import read_parked, resolve_parked
from bridge.client.reader import read_to_end
from bridge.codec import decode_envelope, encode_envelope
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.kafka.quarantine import read_quarantine
from bridge.message import MessageConst, now_ms
from bridge.transaction.model import CheckRequest, EndTransaction, OpAction
from bridge.transaction.producer import TransactionSendResult
from tests.conftest import wait_until
from topics.catalog import SystemTopic, TopicCatalog

pytestmark = pytest.mark.broker

C, U = TransactionStatus.COMMIT, TransactionStatus.UNKNOWN
GROUP = "orders_tx"
FORGER = "mallory_tx"


def coordinator_config(client: ClientConfig, **overrides: Any) -> CoordinatorConfig:
    settings: dict[str, Any] = {
        "transaction_partitions": 1,
        "transaction_timeout_ms": 1500,
        "check_interval_ms": 1000,
        "transaction_check_max": 15,
        "session_timeout_ms": 6000,
        **overrides,
    }
    return CoordinatorConfig(client=client, coordinator_id=f"c-{uuid.uuid4().hex[:8]}", **settings)


class Gate(TransactionListener):
    """Leaves every transaction undecided (UNKNOWN) until :attr:`release` is set; then its
    checks answer COMMIT. Notes each check."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.checks: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return U

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        with self._lock:
            self.checks.append((msg.body.decode(), time.monotonic()))
        return C if self.release.is_set() else U

    def checks_since(self, since: float) -> int:
        with self._lock:
            return sum(1 for _, at in self.checks if at > since)


class Forger:
    """Writes records straight into a HALF partition, as anyone with Write on the topic can."""

    def __init__(self, config: ClientConfig) -> None:
        self.half = TopicCatalog(namespace=config.namespace).topic(SystemTopic.HALF)
        self.raw = RawProducer(
            {"bootstrap.servers": config.bootstrap_servers, "enable.idempotence": True}
        )

    def write(self, value: bytes, key: str, partition: int) -> int:
        offsets: list[int] = []
        self.raw.produce(
            self.half, value, key.encode(), partition=partition,
            on_delivery=lambda err, m: offsets.append(-1 if err else (m.offset() or 0)),
        )  # fmt: skip
        self.raw.flush(10)
        assert offsets and offsets[0] >= 0, "HALF record not stored"
        return offsets[0]

    def end(self, sent: TransactionSendResult, group: str, *, from_check: bool = False) -> int:
        """A COMMIT of ``sent``'s transaction in the name of producer ``group``."""
        tid = sent.transaction_id
        end = EndTransaction(tid, sent.msg_id, group, C, from_check, "forger-1", now_ms())
        return self.write(end.encode(), tid, sent.queue_id)


@pytest.fixture()
def coordinator(client_config: ClientConfig) -> Iterator[Coordinator]:
    with Coordinator(coordinator_config(client_config)) as running:
        yield running


def nothing_on(config: ClientConfig, topic: str, wait_ms: int = 1500) -> bool:
    """True when a read_committed reader finds no record on ``topic`` within ``wait_ms``."""
    return list(read_messages(config, [topic], timeout_ms=wait_ms)) == []


def bodies(config: ClientConfig, topic: str, expected: int, idle_ms: int = 3000) -> list[str]:
    """The bodies on ``topic``: ``expected`` of them, then ``idle_ms`` more of waiting so that
    a duplicate would show."""
    out = [
        m.body.decode()
        for m in read_messages(config, [topic], max_messages=expected, timeout_ms=60_000)
    ]
    out += [m.body.decode() for m in read_messages(config, [topic], timeout_ms=idle_ms)][len(out) :]
    return sorted(out)


def checked_twice_or_committed(config: ClientConfig, topic: str, gate: Gate, since: float) -> bool:
    """True once ``gate`` was checked twice after ``since`` (monotonic s), or a message is on
    ``topic``."""
    return gate.checks_since(since) >= 2 or not nothing_on(config, topic, wait_ms=300)


def refusals(caplog: pytest.LogCaptureFixture, tid: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and tid in r.getMessage() and "ignored" in r.getMessage()
    ]


# --- end requests and check answers of another group ----------------------------------------


@pytest.mark.check("G12")
def test_a_forged_end_from_another_group_changes_nothing_then_the_group_commits_once(
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bridge.coordinator.transaction.decisions")
    gate = Gate()
    with TransactionMQProducer(GROUP, gate, config=client_config) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"genuine"), None)
        assert sent.local_transaction_state is U
        forged_at = time.monotonic()
        Forger(client_config).end(sent, FORGER)
        # Still pending: checked with its own group, twice after the forged commit.
        wait_until(lambda: checked_twice_or_committed(client_config, topic, gate, forged_at), 30)
        assert nothing_on(client_config, topic), "a forged COMMIT of another group committed it"
        warning = refusals(caplog, sent.transaction_id)[0]  # read again after a rebuild: more
        assert repr(FORGER) in warning and repr(GROUP) in warning
        gate.release.set()  # the group's own answer decides it
        assert bodies(client_config, topic, 1) == ["genuine"]


def test_a_forged_check_answer_from_another_group_changes_nothing(
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bridge.coordinator.transaction.decisions")
    gate = Gate()
    with TransactionMQProducer(GROUP, gate, config=client_config) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"genuine"), None)
        wait_until(lambda: gate.checks_since(0) >= 1, timeout_s=30)  # a check is out
        forged_at = time.monotonic()
        Forger(client_config).end(sent, FORGER, from_check=True)
        wait_until(lambda: checked_twice_or_committed(client_config, topic, gate, forged_at), 30)
        assert nothing_on(client_config, topic), "a forged check answer committed it"
        warning = refusals(caplog, sent.transaction_id)[0]
        assert "check answer" in warning and repr(FORGER) in warning and repr(GROUP) in warning
        gate.release.set()
        assert bodies(client_config, topic, 1) == ["genuine"]


# --- a second half message under a pending transaction id -----------------------------------


def test_a_forged_half_message_neither_replaces_nor_loses_the_original(
    client_config: ClientConfig,
    coordinator: Coordinator,
    topic: str,
    unique: Any,
) -> None:
    victim = unique("victim")
    gate = Gate()
    forger = Forger(client_config)
    catalog = TopicCatalog(namespace=client_config.namespace)
    with TransactionMQProducer(GROUP, gate, config=client_config) as producer:
        sent = producer.send_message_in_transaction(Message(topic, b"genuine", keys="k1"), None)
        tid = sent.transaction_id
        (original,) = [
            r.value()
            for r in read_to_end(client_config, catalog.topic(SystemTopic.HALF), 5000)
            if r.offset() == sent.offset
        ]
        props = {
            MessageConst.TRANSACTION_PREPARED: "true",
            MessageConst.PRODUCER_GROUP: GROUP,
            MessageConst.REAL_TOPIC: victim,
            MessageConst.REAL_QUEUE_ID: "-1",
            MessageConst.TRANSACTION_ID: tid,
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: sent.msg_id,
        }
        # The same record again (a send stored twice): the same transaction, no quarantine;
        # the transaction is read from there now (it is the same message).
        again = forger.write(original, tid, sent.queue_id)
        forged = encode_envelope(sent.msg_id, b"forged", props, now_ms(), "10.6.6.6")
        forged_offset = forger.write(forged, tid, sent.queue_id)
        # The checks carry the producer's own message, and its answer commits that one.
        requests = wait_until(
            lambda: [
                CheckRequest.decode(r.value())
                for r in read_to_end(client_config, catalog.check_topic(GROUP), 2000)
                if r.key() == tid.encode()
            ],
            timeout_s=30,
        )
        assert {decode_envelope(r.message).body for r in requests} == {b"genuine"}
        quarantined = wait_until(
            lambda: [
                q
                for q in read_quarantine(client_config, timeout_ms=1000)
                if q.source_offset == forged_offset
            ],
            timeout_s=30,
        )
        (copy,) = quarantined
        assert copy.value == forged  # kept whole: nothing is lost
        assert tid in copy.reason and f"[{sent.queue_id}]@{again}:" in copy.reason, copy.reason
        gate.release.set()
        assert bodies(client_config, topic, 1) == ["genuine"]
        assert nothing_on(client_config, victim)
    sources = [q.source_offset for q in read_quarantine(client_config, timeout_ms=1000)]
    assert sources == [forged_offset], "only the different message is quarantined"


def committed_half_offset(config: ClientConfig) -> int:
    """The HALF partition 0 offset the transaction coordinators' group has committed (its
    checkpoint: where a restart reads again)."""
    half = TopicCatalog(namespace=config.namespace).topic(SystemTopic.HALF)
    group = f"{config.namespace}.coordinator.transaction"
    raw = RawConsumer({"bootstrap.servers": config.bootstrap_servers, "group.id": group})
    try:
        return int(raw.committed([TopicPartition(half, 0)], 10)[0].offset)
    finally:
        raw.close()


class CommitAll(TransactionListener):
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return C

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return C


def test_a_forged_half_message_with_a_long_immunity_and_a_conflicting_one_hold_no_checkpoint(
    client_config: ClientConfig, coordinator: Coordinator, topic: str
) -> None:
    """A writer of HALF writes its own half message, asking for a 72 h immunity, and a
    different one under the same id. The checkpoint stays before the first only until its
    put-back copy (a check interval on) is read back past the second: then it moves on, and a
    restart reads neither again."""
    forger = Forger(client_config)
    with TransactionMQProducer(GROUP, CommitAll(), config=client_config) as producer:
        producer.send_message_in_transaction(Message(topic, b"warm"), None)
        wait_until(lambda: committed_half_offset(client_config) > 0, timeout_s=30)
        tid = f"forged-{uuid.uuid4().hex}"
        props = {
            MessageConst.TRANSACTION_PREPARED: "true",
            MessageConst.PRODUCER_GROUP: GROUP,
            MessageConst.REAL_TOPIC: topic,
            MessageConst.REAL_QUEUE_ID: "-1",
            MessageConst.TRANSACTION_ID: tid,
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: tid,
            MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: str(72 * 3600),
        }
        first = forger.write(encode_envelope(tid, b"a", props, now_ms(), "10.6.6.6"), tid, 0)
        second = forger.write(encode_envelope(tid, b"b", props, now_ms(), "10.6.6.6"), tid, 0)
        for i in range(5):
            producer.send_message_in_transaction(Message(topic, f"m{i}".encode()), None)
        assert bodies(client_config, topic, 6, idle_ms=500) == [
            *(f"m{i}" for i in range(5)),
            "warm",
        ]
        wait_until(lambda: committed_half_offset(client_config) > second, timeout_s=30)
        # The second one is set aside; the first is still undecided (its check is 72 h away).
        quarantined = [q.source_offset for q in read_quarantine(client_config, timeout_ms=1000)]
        assert quarantined == [second] and first < second


# --- topics outside allowed_topics ------------------------------------------------------------


def test_a_commit_to_a_disallowed_topic_is_parked_not_written_and_replays_after_widening(
    client_config: ClientConfig, topic: str, unique: Any
) -> None:
    allowed = unique("allowed")
    narrow = coordinator_config(client_config, allowed_topics=f"{allowed},nothing-*")

    class Commit(TransactionListener):
        def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
            return C

        def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
            return C

    with (
        Coordinator(narrow),
        TransactionMQProducer(GROUP, Commit(), config=client_config) as producer,
    ):
        refused = producer.send_message_in_transaction(Message(topic, b"outside"), None)
        producer.send_message_in_transaction(Message(allowed, b"inside"), None)
        assert bodies(client_config, allowed, 1, idle_ms=0) == ["inside"]
        (parked,) = wait_until(lambda: read_parked(client_config, timeout_ms=2000), timeout_s=30)
        assert parked.msg_id == refused.msg_id
        reason = parked.get_property(MessageConst.DELIVERY_ERROR) or ""
        assert "allowed_topics" in str(reason) and topic in str(reason), reason
        assert nothing_on(client_config, topic)
    # Widened: new commits to the topic go through, and the parked one is replayed, once.
    wide = coordinator_config(client_config, allowed_topics=f"{allowed},{topic}")
    with (
        Coordinator(wide),
        TransactionMQProducer(GROUP, Commit(), config=client_config) as producer,
    ):
        producer.send_message_in_transaction(Message(topic, b"after"), None)
        assert bodies(client_config, topic, 1, idle_ms=0) == ["after"]
        resolve_parked(client_config, refused.msg_id, OpAction.COMMIT)
        assert bodies(client_config, topic, 2) == ["after", "outside"]
        assert read_parked(client_config, timeout_ms=2000) == []


def test_a_delayed_message_for_a_disallowed_topic_is_quarantined_and_replayable(
    client_config: ClientConfig, topic: str, unique: Any
) -> None:
    from bridge import Producer
    from bridge.kafka.quarantine import replay_quarantined

    allowed = unique("allowed")
    narrow = coordinator_config(client_config, allowed_topics=allowed)
    with Coordinator(narrow), Producer("delay_trust", config=client_config) as producer:
        producer.send_sync(Message(topic, b"outside", delay_time_level=1))
        producer.send_sync(Message(allowed, b"inside", delay_time_level=1))
        assert bodies(client_config, allowed, 1, idle_ms=0) == ["inside"]
        (copy,) = wait_until(lambda: list(read_quarantine(client_config, timeout_ms=1000)), 30)
        assert "allowed_topics" in copy.reason and topic in copy.reason, copy.reason
        assert nothing_on(client_config, topic)
    replay_quarantined(client_config, copy.offset)
    assert bodies(client_config, topic, 1) == ["outside"]


def test_a_half_message_of_a_disallowed_group_is_never_checked_and_is_parked(
    client_config: ClientConfig, topic: str
) -> None:
    config = coordinator_config(client_config, allowed_producer_groups=GROUP)
    gate = Gate()
    gate.release.set()
    with (
        Coordinator(config),
        TransactionMQProducer("legacy_tx", gate, config=client_config) as producer,
    ):
        sent = producer.send_message_in_transaction(Message(topic, b"legacy"), None)
        (parked,) = wait_until(lambda: read_parked(client_config, timeout_ms=2000), timeout_s=30)
        assert parked.msg_id == sent.msg_id
        reason = str(parked.get_property(MessageConst.DELIVERY_ERROR) or "")
        assert "allowed_producer_groups" in reason and "legacy_tx" in reason, reason
        assert gate.checks == []
        assert nothing_on(client_config, topic)
