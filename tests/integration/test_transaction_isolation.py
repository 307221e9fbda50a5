"""The transaction service against a real broker when records or timing are unkind: commits
whose real record cannot be written, restarts at awkward moments, unreadable decisions, long
immunities, and operators replaying one message twice at once."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Producer as RawProducer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from bridge import (
    ClientConfig,
    Message,
    MessageExt,
    TransactionListener,
    TransactionMQProducer,
    TransactionStatus,
    read_messages,
)
from bridge.cli.admin.transactions import list_undecided, read_parked, resolve_parked
from bridge.client.reader import read_to_end
from bridge.codec import encode_envelope
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.transaction import recovery as recovery_module
from bridge.coordinator.transaction.service import TransactionService
from bridge.errors import BridgeError, KafkaClientError
from bridge.kafka import clients as clients_module
from bridge.kafka.acls import await_acls_shown
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_admin
from bridge.kafka.quarantine import read_quarantine
from bridge.message import MessageConst, now_ms
from bridge.transaction.model import CheckRequest, EndTransaction, OpAction
from tests.conftest import wait_until
from tests.integration.test_cli import run_cli
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

pytestmark = pytest.mark.broker

C, R, U = TransactionStatus.COMMIT, TransactionStatus.ROLLBACK, TransactionStatus.UNKNOWN
GROUP = "tx_iso"
DELIVERY_ATTEMPTS = "DELIVERY_ATTEMPTS"
DELIVERY_ERROR = "DELIVERY_ERROR"
"""Properties of a message parked because its real record could not be written."""


def coordinator_config(
    client: ClientConfig,
    *,
    check_max: int = 15,
    coordinator_id: str | None = None,
    check_interval_ms: int = 2000,
) -> CoordinatorConfig:
    return CoordinatorConfig(
        client=client,
        coordinator_id=coordinator_id or f"c-{uuid.uuid4().hex[:8]}",
        transaction_partitions=1,
        transaction_timeout_ms=2000,
        check_interval_ms=check_interval_ms,
        transaction_check_max=check_max,
        session_timeout_ms=6000,
    )


def no_auto_create(client: ClientConfig) -> ClientConfig:
    """Clients that never create a topic by writing to it (as a broker with auto-create off)."""
    return client.replace(kafka={"allow.auto.create.topics": "false"})


def transaction_service(coordinator: Coordinator) -> TransactionService:
    (service,) = [s for s in coordinator.services if isinstance(s, TransactionService)]
    return service


class HalfWriter:
    """Writes half messages and end requests straight into HALF partition 0, as a producer
    would, without the producer's send-time checks (a poison half message is one they refuse
    today, or one written by an older client)."""

    def __init__(self, config: ClientConfig) -> None:
        self.catalog = TopicCatalog(namespace=config.namespace)
        self.half = self.catalog.topic(SystemTopic.HALF)
        self.raw = RawProducer(
            {"bootstrap.servers": config.bootstrap_servers, "enable.idempotence": True}
        )

    def _write(self, value: bytes, key: str) -> int:
        offsets: list[int] = []
        self.raw.produce(
            self.half, value, key.encode(), partition=0,
            on_delivery=lambda err, m: offsets.append(-1 if err else (m.offset() or 0)),
        )  # fmt: skip
        self.raw.flush(10)
        assert offsets and offsets[0] >= 0, "HALF record not stored"
        return offsets[0]

    def half_message(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = -1,
        properties: dict[str, str] | None = None,
    ) -> tuple[str, int]:
        """A half message for ``topic``: (transaction id, HALF offset)."""
        tid = uuid.uuid4().hex.upper()
        props = {
            MessageConst.TRANSACTION_PREPARED: "true",
            MessageConst.PRODUCER_GROUP: GROUP,
            MessageConst.REAL_TOPIC: topic,
            MessageConst.REAL_QUEUE_ID: str(queue_id),
            MessageConst.TRANSACTION_ID: tid,
            MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: tid,
            **(properties or {}),
        }
        envelope = encode_envelope(tid, body, props, now_ms(), "127.0.0.1")
        return tid, self._write(envelope, tid)

    def end(self, tid: str, status: TransactionStatus = C) -> int:
        end = EndTransaction(tid, tid, GROUP, status, False, "test", now_ms())
        return self._write(end.encode(), tid)

    def commit(self, topic: str, body: bytes, *, queue_id: int = -1) -> str:
        tid, _ = self.half_message(topic, body, queue_id=queue_id)
        self.end(tid, C)
        return tid


def create_topic(config: ClientConfig, name: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(30)
    TopicAdmin(config).wait_for_topics([name])


def delete_topic(config: ClientConfig, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": config.bootstrap_servers})
    admin.delete_topics([name])[name].result(30)


def bodies(config: ClientConfig, topic: str, expected: int, idle_ms: int = 3000) -> list[str]:
    """Bodies on ``topic`` (read_committed): ``expected`` of them, then ``idle_ms`` more of
    waiting so that duplicates would show."""
    out = [
        m.body.decode()
        for m in read_messages(config, [topic], max_messages=expected, timeout_ms=30_000)
    ]
    out += [m.body.decode() for m in read_messages(config, [topic], timeout_ms=idle_ms)][len(out) :]
    return sorted(out)


def check_requests(config: ClientConfig, group: str) -> list[CheckRequest]:
    topic = TopicCatalog(namespace=config.namespace).check_topic(group)
    return [CheckRequest.decode(r.value()) for r in read_to_end(config, topic, 5000)]


def committed_checkpoint(config: ClientConfig) -> int:
    """Where the transaction service would read HALF partition 0 again after a restart."""
    half = TopicCatalog(namespace=config.namespace).topic(SystemTopic.HALF)
    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap_servers,
            "group.id": f"{config.namespace}.coordinator.transaction",
        }
    )
    try:
        return int(consumer.committed([TopicPartition(half, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


class Arrivals:
    """Reads ``topic`` in the background and notes when each body arrives."""

    def __init__(self, config: ClientConfig, topic: str) -> None:
        self.seen: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": config.bootstrap_servers,
                "group.id": f"arrivals-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, name="arrivals", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            record = self._consumer.poll(0.1)
            if record is not None and record.error() is None:
                self.seen.append(((record.value() or b"").decode(), time.time()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


# --- commits whose real record cannot be written --------------------------------------------------


@pytest.mark.check("G9")
def test_poison_commits_are_parked_with_their_reason_and_the_others_flow(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    client = no_auto_create(client_config)
    good, small, doomed, missing = (unique(n) for n in ("good", "small", "doomed", "missing"))
    create_topic(client, good)
    create_topic(client, small, **{"max.message.bytes": "2048"})
    create_topic(client, doomed)
    writer = HalfWriter(client)
    poisons: dict[str, tuple[str, int, bytes]] = {
        "internal": ("__consumer_offsets", -1, b"internal"),
        "missing": (missing, -1, b"missing"),
        "partition": (good, 7, b"partition"),
        "large": (small, -1, b"x" * 8192),
        "deleted": (doomed, -1, b"deleted"),
    }
    arrivals = Arrivals(client, good)
    try:
        with Coordinator(coordinator_config(client)):
            # The service writes to ``doomed`` once (so it knows the topic), then it goes.
            writer.commit(doomed, b"before")
            assert bodies(client, doomed, 1, idle_ms=0) == ["before"]
            delete_topic(client, doomed)
            sent: dict[str, float] = {}
            poison_ids: dict[str, str] = {}
            kinds = iter(poisons)
            for i in range(25):
                if i % 5 == 2:
                    kind = next(kinds)
                    topic, queue_id, body = poisons[kind]
                    poison_ids[writer.commit(topic, body, queue_id=queue_id)] = kind
                writer.commit(good, f"good-{i}".encode())
                sent[f"good-{i}"] = time.time()
                time.sleep(0.1)  # pacing: a stream, not one batch
            wait_until(lambda: len(arrivals.seen) >= len(sent), timeout_s=60)
            parked = wait_until(
                lambda: (p := read_parked(client, timeout_ms=2000)) and len(p) >= 5 and p,
                timeout_s=60,
            )
            latencies = {body: at - sent[body] for body, at in arrivals.seen}
            print(f"good ones: max latency {max(latencies.values()):.2f} s")
            time.sleep(2)  # duplicates would arrive within this
    finally:
        arrivals.close()
    assert Counter(body for body, _ in arrivals.seen) == Counter(list(sent))
    # Bounded by send_msg_timeout_ms (a record for a deleted topic times out) plus a rebuild.
    assert max(latencies.values()) < 15, latencies
    reasons = {poison_ids[m.msg_id]: m for m in parked}
    assert sorted(reasons) == sorted(poisons)
    expected = {
        "internal": "internal topic",
        "missing": f"{missing} does not exist",
        "partition": "partition 7",
        "large": "MSG_SIZE_TOO_LARGE",
        "deleted": f"{doomed} does not exist",
    }
    for kind, text in expected.items():
        msg = reasons[kind]
        assert text in (msg.get_property(DELIVERY_ERROR) or ""), (kind, msg.properties)
        assert msg.get_property(DELIVERY_ATTEMPTS) == "3", (kind, msg.properties)
    assert list(read_messages(client, [small], timeout_ms=500)) == []
    shown = run_cli(
        "transactions", "parked",
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": client.bootstrap_servers,
             "BRIDGE_NAMESPACE": client.namespace},
    )  # fmt: skip
    internal = next(m for m in parked if poison_ids[m.msg_id] == "internal")
    assert f"{internal.msg_id} " in shown and "delivery failed 3 times: " in shown, shown


class Unknown(TransactionListener):
    """Never knows: every half message stays undecided."""

    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        return U

    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        return U


def park_by_checks(client: ClientConfig, writer: HalfWriter, topic: str, body: bytes) -> str:
    """A half message for ``topic`` that nobody decides, parked after its single check."""
    with Coordinator(coordinator_config(client, check_max=1)):
        tid, _ = writer.half_message(topic, body)
        wait_until(
            lambda: [m for m in read_parked(client, timeout_ms=2000) if m.msg_id == tid],
            timeout_s=30,
        )
    return tid


def test_replay_to_a_missing_topic_raises_a_typed_error_and_the_message_stays_parked(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    client = no_auto_create(client_config)
    later = unique("later")
    tid = park_by_checks(client, HalfWriter(client), later, b"late")
    with pytest.raises(KafkaClientError, match=f"{later} does not exist"):
        resolve_parked(client, tid, OpAction.COMMIT)
    assert [m.msg_id for m in read_parked(client)] == [tid]
    create_topic(client, later)
    assert resolve_parked(client, tid, OpAction.COMMIT).msg_id == tid
    assert bodies(client, later, 1) == ["late"]
    assert read_parked(client) == []


def test_a_poison_parked_message_is_replayed_without_its_delivery_error(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    client = no_auto_create(client_config)
    later = unique("later")
    writer = HalfWriter(client)
    with Coordinator(coordinator_config(client)):
        tid = writer.commit(later, b"late")
        (parked,) = wait_until(lambda: read_parked(client, timeout_ms=2000), timeout_s=60)
    assert f"{later} does not exist" in (parked.get_property(DELIVERY_ERROR) or "")
    create_topic(client, later)
    resolve_parked(client, tid, OpAction.COMMIT)
    (replayed,) = read_messages(client, [later], timeout_ms=3000)
    assert replayed.body == b"late" and replayed.msg_id == tid
    assert DELIVERY_ERROR not in replayed.properties
    assert DELIVERY_ATTEMPTS not in replayed.properties


# --- two operators replay one message at once -----------------------------------------------------


def test_two_concurrent_replays_of_one_message_deliver_it_once(
    client_config: ClientConfig, topic: str
) -> None:
    create_topic(client_config, topic)
    tid = park_by_checks(client_config, HalfWriter(client_config), topic, b"once")
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def replay() -> None:
        start.wait()
        try:
            outcomes.append(resolve_parked(client_config, tid, OpAction.COMMIT))
        except BridgeError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=replay, name=f"replay-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert bodies(client_config, topic, 1, idle_ms=4000) == ["once"]
    # One replays it; the other fails with a typed error (fenced, or found it resolved).
    assert len(outcomes) == 2, outcomes
    assert sum(isinstance(o, MessageExt) for o in outcomes) == 1, outcomes
    print("the other replay:", [o for o in outcomes if isinstance(o, BridgeError)])
    assert read_parked(client_config) == []


# --- check-back after a restart -------------------------------------------------------------------


def test_check_back_resumes_after_a_coordinator_restart(
    client_config: ClientConfig, topic: str
) -> None:
    config = coordinator_config(
        client_config, check_max=5, coordinator_id=f"restarted-{uuid.uuid4().hex[:6]}"
    )
    with Coordinator(config):
        with TransactionMQProducer("tx_restart", Unknown(), config=client_config) as producer:
            sent = producer.send_message_in_transaction(Message(topic, "waits"))
        # The producer has exited; its first check is written and nobody answers it.
        wait_until(lambda: check_requests(client_config, "tx_restart"), timeout_s=30)
    with Coordinator(config):  # restarted with the same id
        (parked,) = wait_until(lambda: read_parked(client_config, timeout_ms=2000), timeout_s=40)
    assert parked.msg_id == sent.msg_id
    # The checks counted before the restart count after it: 5 in all, each finding no live
    # producer (no request sent then; one unanswered before that was known counts too).
    assert parked.get_property(MessageConst.TRANSACTION_CHECK_TIMES) == "5"
    assert "no live producer" in str(parked.get_property(MessageConst.DELIVERY_ERROR))
    # A request is sent only while the group's live producers are not known yet: in the first
    # check interval after each start (the group, gone with its producer, is left out of
    # Kafka's answers; that is known to mean no producer once it lasts an interval). Never
    # answered, each counted once: a check's request is sent at most once per start.
    checks = [r.check_times for r in check_requests(client_config, "tx_restart")]
    assert len(checks) <= 4 and max(checks) <= 3, checks
    assert max(Counter(checks).values()) <= 2, checks


# --- an end request between a checked copy and its new copy ---------------------------------------


class FrozenReads:
    """A real consumer whose reads can be held back (a slow fetch), everything else as is."""

    def __init__(self, real: Consumer) -> None:
        self._real = real
        self.frozen = threading.Event()
        self.frozen_polls = 0

    def poll(self, timeout: float = -1) -> Any:
        if self.frozen.is_set():
            self.frozen_polls += 1
            time.sleep(timeout)
            return None
        return self._real.poll(timeout)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if self.frozen.is_set():
            return []
        return self._real.consume(num_messages, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_commit_read_after_the_checkpoint_moved_survives_a_restart(
    client_config: ClientConfig, topic: str
) -> None:
    config = coordinator_config(client_config, coordinator_id=f"cp-{uuid.uuid4().hex[:6]}")
    writer = HalfWriter(client_config)
    with Coordinator(config) as coordinator:
        service = transaction_service(coordinator)
        tid, _ = writer.half_message(topic, b"committed")
        wait_until(lambda: tid in getattr(service._partitions.get(0), "pending", {}))
        frozen = FrozenReads(service._consumer)  # type: ignore[arg-type]
        frozen.frozen.set()
        service._consumer = frozen  # type: ignore[assignment]
        wait_until(lambda: frozen.frozen_polls >= 2)
        writer.end(tid, C)  # not read before the check below
        wait_until(lambda: check_requests(client_config, GROUP), timeout_s=20)
    with Coordinator(config):
        assert bodies(client_config, topic, 1) == ["committed"]


# --- recovery -------------------------------------------------------------------------------------


class SlowReads:
    """A real consumer whose every poll finds nothing (a fetch that does not come back)."""

    def __init__(self, real: Consumer) -> None:
        self._real = real

    def poll(self, timeout: float = -1) -> Any:
        time.sleep(min(timeout, 0.2))
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_recovery_that_cannot_read_its_first_half_message_is_retried_not_guessed(
    client_config: ClientConfig, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_config.replace(request_timeout_ms=3000)
    config = coordinator_config(
        client, coordinator_id=f"rec-{uuid.uuid4().hex[:6]}", check_interval_ms=60_000
    )
    writer = HalfWriter(client)
    with Coordinator(config):
        # Neither checked nor put back while this test runs: it holds the checkpoint at 0.
        immune = {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "3600"}
        writer.half_message(topic, b"undecided", properties=immune)
        writer.commit(topic, b"once")
        assert bodies(client, topic, 1, idle_ms=0) == ["once"]
        wait_until(lambda: committed_checkpoint(client) == 0)
    # Decisions are found from the first half message's time: no slack, so a guess of "now"
    # misses the decision on "once" (as a guess of 60 s misses one older than that).
    monkeypatch.setattr(recovery_module, "_OP_SCAN_SLACK_MS", 0)
    real_new_reader = clients_module.new_reader
    slowed: list[str] = []

    def new_reader(config: ClientConfig, group_id: str, client_id: str, **kw: Any) -> Any:
        consumer = real_new_reader(config, group_id, client_id, **kw)
        if "-recovery-" in group_id and not slowed:
            slowed.append(group_id)
            return SlowReads(consumer)
        return consumer

    monkeypatch.setattr(recovery_module, "new_reader", new_reader)
    with Coordinator(config):
        writer.commit(topic, b"after")
        assert bodies(client, topic, 2, idle_ms=4000) == ["after", "once"]
    assert slowed


def unknown_schema_op(config: ClientConfig, tid: str) -> None:
    """An OP record written by a newer version: a schema fingerprint this one does not know."""
    op = TopicCatalog(namespace=config.namespace).topic(SystemTopic.OP)
    raw = RawProducer({"bootstrap.servers": config.bootstrap_servers})
    raw.produce(op, b"\xc3\x01" + b"\x00" * 8 + b"a future OP record", tid.encode(), partition=0)
    assert raw.flush(10) == 0


def test_an_op_record_in_an_unknown_schema_still_marks_its_transaction_decided(
    client_config: ClientConfig, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = coordinator_config(client_config)
    TopicAdmin(client_config).ensure_system_topics(config.catalog)
    writer = HalfWriter(client_config)
    # A newer coordinator committed "decided" (its OP record is in a newer schema), then
    # stopped before its checkpoint moved; the END is read again here.
    decided, _ = writer.half_message(topic, b"decided")
    writer.end(decided, C)
    unknown_schema_op(client_config, decided)
    writer.commit(topic, b"sentinel")
    with caplog.at_level(logging.WARNING), Coordinator(config):
        assert bodies(client_config, topic, 1, idle_ms=3000) == ["sentinel"]
    assert any(decided in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_an_op_record_that_is_no_op_record_decides_nothing(
    client_config: ClientConfig, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Something else than a coordinator wrote to OP, keyed by a waiting transaction's id:
    # bytes that are no Avro record, an empty value, a tombstone. None is a decision: the
    # transaction's END is still read and its message committed.
    config = coordinator_config(client_config)
    TopicAdmin(client_config).ensure_system_topics(config.catalog)
    writer = HalfWriter(client_config)
    tid, _ = writer.half_message(topic, b"kept")
    op = TopicCatalog(namespace=client_config.namespace).topic(SystemTopic.OP)
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    for value in (b"hello, not avro", b"", None):
        raw.produce(op, value, tid.encode(), partition=0)
    assert raw.flush(10) == 0
    writer.end(tid, C)
    writer.commit(topic, b"sentinel")
    with caplog.at_level(logging.WARNING), Coordinator(config):
        assert sorted(bodies(client_config, topic, 2, idle_ms=3000)) == ["kept", "sentinel"]
    ignored = [r for r in caplog.records if "is no decision, ignored" in r.getMessage()]
    assert len(ignored) == 3, [r.getMessage() for r in ignored]


# --- a long immunity does not hold the checkpoint back --------------------------------------------


def test_a_long_immune_transaction_does_not_hold_the_checkpoint_back(
    client_config: ClientConfig, topic: str
) -> None:
    writer = HalfWriter(client_config)
    started = time.monotonic()
    with Coordinator(coordinator_config(client_config)):
        tid, first = writer.half_message(
            topic, b"immune", properties={MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "3600"}
        )
        last = first
        for i in range(3):
            good, _ = writer.half_message(topic, f"g{i}".encode())
            last = writer.end(good, C)
        assert bodies(client_config, topic, 3, idle_ms=0) == ["g0", "g1", "g2"]
        wait_until(lambda: committed_checkpoint(client_config) > last, timeout_s=20)
        writer.end(tid, C)
        assert bodies(client_config, topic, 4) == ["g0", "g1", "g2", "immune"]
    elapsed = time.monotonic() - started
    assert check_requests(client_config, GROUP) == []  # put back, never checked
    half = TopicCatalog(namespace=client_config.namespace).topic(SystemTopic.HALF)
    copies = [
        r for r in read_to_end(client_config, half, 5000) if r.key() == tid.encode()
    ]  # the half message, its put-back copies and its END
    assert 2 <= len(copies) - 1 <= elapsed / 2 + 2, (len(copies), elapsed)


# --- counts that are not numbers, offsets the broker could not look up ----------------------------


def test_a_check_count_that_is_not_a_number_is_listed_as_zero(
    client_config: ClientConfig, topic: str
) -> None:
    TopicAdmin(client_config).ensure_system_topics(TopicCatalog(namespace=client_config.namespace))
    writer = HalfWriter(client_config)
    # "²" passes str.isdigit(), which int() refuses.
    tid, _ = writer.half_message(
        topic, b"odd", properties={MessageConst.TRANSACTION_CHECK_TIMES: "²"}
    )
    (undecided,) = list_undecided(client_config, timeout_ms=5000)
    assert undecided.transaction_id == tid and undecided.check_times == 0


class ErrorTopicPartition:
    """What ``offsets_for_times`` returns for a partition whose offset lookup failed."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition, self.offset = topic, partition, -1
        self.error = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "leader moving")


class FailingTimeLookup:
    """A real consumer whose first ``offsets_for_times`` answers with an error per partition."""

    def __init__(self, real: Consumer, failed: list[str]) -> None:
        self._real = real
        self._failed = failed

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> Any:
        if not self._failed:
            self._failed.append("failed")
            return [ErrorTopicPartition(tp.topic, tp.partition) for tp in partitions]
        return self._real.offsets_for_times(partitions, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_recovery_whose_decision_lookup_fails_is_retried_not_read_as_no_decisions(
    client_config: ClientConfig, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = coordinator_config(
        client_config, coordinator_id=f"lookup-{uuid.uuid4().hex[:6]}", check_interval_ms=60_000
    )
    writer = HalfWriter(client_config)
    with Coordinator(config):
        immune = {MessageConst.CHECK_IMMUNITY_TIME_IN_SECONDS: "3600"}
        writer.half_message(topic, b"undecided", properties=immune)  # holds the checkpoint
        writer.commit(topic, b"once")
        assert bodies(client_config, topic, 1, idle_ms=0) == ["once"]
        wait_until(lambda: committed_checkpoint(client_config) == 0)
    real_new_reader = clients_module.new_reader
    failed: list[str] = []

    def new_reader(config: ClientConfig, group_id: str, client_id: str, **kw: Any) -> Any:
        consumer = real_new_reader(config, group_id, client_id, **kw)
        if "-recovery-" in group_id:
            return FailingTimeLookup(consumer, failed)
        return consumer

    monkeypatch.setattr(recovery_module, "new_reader", new_reader)
    with Coordinator(config):
        writer.commit(topic, b"after")
        assert bodies(client_config, topic, 2, idle_ms=4000) == ["after", "once"]
    assert failed


# --- a check that cannot be made ------------------------------------------------------------------


def test_a_check_topic_with_fewer_partitions_than_the_coordinator_wants_still_gets_checks(
    client_config: ClientConfig, topic: str
) -> None:
    group = f"tx_two_{uuid.uuid4().hex[:6]}"
    # The producer creates its check topic with 2 partitions; the coordinator asks for 4.
    with (
        Coordinator(coordinator_config(client_config, check_max=2)),
        TransactionMQProducer(
            group, Unknown(), config=client_config, check_topic_partitions=2
        ) as producer,
    ):
        sent = producer.send_message_in_transaction(Message(topic, "waits"))
        parked = wait_until(
            lambda: [m for m in read_parked(client_config, timeout_ms=2000)
                     if m.msg_id == sent.msg_id],
            timeout_s=40,
        )  # fmt: skip
    assert [r.check_times for r in check_requests(client_config, group)] == [1, 2]
    assert parked[0].get_property(MessageConst.TRANSACTION_CHECK_TIMES) == "2"


# --- what the broker's ACLs deny ------------------------------------------------------------------


def deny(config: ClientConfig, topic: str, operation: AclOperation) -> None:
    """Deny ``operation`` on ``topic`` to everyone, and allow Describe (metadata says fine)."""
    anyone = ("User:ANONYMOUS", "*")
    acls = [
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, *anyone,
                   operation, AclPermissionType.DENY),
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, *anyone,
                   AclOperation.DESCRIBE, AclPermissionType.ALLOW),
    ]  # fmt: skip
    admin = new_admin(config)  # kept alive until the futures complete
    for future in admin.create_acls(acls).values():
        future.result(10)
    await_acls_shown(admin, acls, 10_000)


def test_a_topic_the_acls_deny_writing_to_is_parked_and_the_other_commits_flow(
    authorizing_broker: str, namespace: str, unique: Callable[[str], str]
) -> None:
    client = ClientConfig(bootstrap_servers=authorizing_broker, namespace=namespace)
    good, denied = unique("good"), unique("denied")
    TopicAdmin(client).ensure_topics([TopicSpec(good, 1), TopicSpec(denied, 1)])
    # Adding `denied` to a Kafka transaction fails, so the whole transaction does, and every
    # record's report says only "purged".
    deny(client, denied, AclOperation.WRITE)
    writer = HalfWriter(client)
    sent: list[str] = []
    with Coordinator(coordinator_config(client)):
        for i in range(8):
            if i == 3:
                doomed = writer.commit(denied, b"denied")
            writer.commit(good, f"good-{i}".encode())
            sent.append(f"good-{i}")
        got = bodies(client, good, len(sent), idle_ms=2000)
        (parked,) = wait_until(lambda: read_parked(client, timeout_ms=2000), timeout_s=60)
    assert got == sorted(sent)
    assert parked.msg_id == doomed
    reason = parked.get_property(DELIVERY_ERROR) or ""
    assert "TOPIC_AUTHORIZATION_FAILED" in reason and denied in reason, parked.properties


# --- a commit applied on its own whose outcome is unknown -----------------------------------------


class CommitThenTimeOut:
    """A real transactional producer whose first commit of a transaction that wrote to
    ``topic`` really commits, then reports a timeout (an EndTxn answer that got lost)."""

    def __init__(self, real: Any, topic: str) -> None:
        self._real = real
        self._topic = topic
        self._wrote = False
        self.tripped = 0

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self._wrote = self._wrote or topic == self._topic
        return self._real.produce(topic, *args, **kwargs)

    def begin_transaction(self, *args: Any) -> Any:
        self._wrote = False
        return self._real.begin_transaction(*args)

    def commit_transaction(self, *args: Any) -> Any:
        self._real.commit_transaction(*args)
        if self._wrote and not self.tripped:
            self.tripped += 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_commit_on_its_own_whose_outcome_is_unknown_is_never_written_twice(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    client = no_auto_create(client_config)
    late = unique("late")
    writer = HalfWriter(client)
    with Coordinator(coordinator_config(client)) as coordinator:
        service = transaction_service(coordinator)
        writer.commit(late, b"once")  # its topic is missing: set aside
        wait_until(lambda: service.parked_for_delivery == 1, timeout_s=30)
        wrapper = CommitThenTimeOut(service._producer, late)
        service._producer = wrapper
        create_topic(client, late)  # the next attempt on its own goes through
        wait_until(lambda: wrapper.tripped, timeout_s=30)
        got = bodies(client, late, 1, idle_ms=6000)
        assert service.parked_for_delivery == 0
    assert got == ["once"]
    assert read_parked(client, timeout_ms=2000) == []


def test_a_check_topic_the_acls_deny_writing_to_parks_its_message_and_other_checks_go_on(
    authorizing_broker: str, namespace: str, unique: Callable[[str], str]
) -> None:
    client = ClientConfig(bootstrap_servers=authorizing_broker, namespace=namespace)
    target = unique("target")
    catalog = TopicCatalog(namespace=namespace)
    other = f"tx_ok_{uuid.uuid4().hex[:6]}"
    TopicAdmin(client).ensure_topics([catalog.check_topic_spec(GROUP, 1)])
    # Every check of GROUP fails as a whole (a partition the transaction cannot add), and
    # the reports only say "purged".
    deny(client, catalog.check_topic(GROUP), AclOperation.WRITE)
    writer = HalfWriter(client)
    with (
        # A live producer of GROUP: its checks are written (and refused), not counted as
        # finding no producer.
        TransactionMQProducer(GROUP, Unknown(), config=client, check_topic_partitions=1),
        Coordinator(coordinator_config(client, check_max=2)),
    ):
        denied, _ = writer.half_message(target, b"never checked")
        fine, _ = writer.half_message(
            target, b"checked", properties={MessageConst.PRODUCER_GROUP: other}
        )
        parked = wait_until(
            lambda: (p := read_parked(client, timeout_ms=2000)) and len(p) >= 2 and p,
            timeout_s=90,
        )
    by_id = {m.msg_id: m for m in parked}
    assert sorted(by_id) == sorted([denied, fine])
    # The other group's checks went on: both counted, the group having no live producer (a
    # request is sent only while that is not known yet, the group's first check interval,
    # and is never answered).
    assert by_id[fine].get_property(MessageConst.TRANSACTION_CHECK_TIMES) == "2"
    assert {r.check_times for r in check_requests(client, other)} <= {1, 2}
    reason = by_id[denied].get_property(DELIVERY_ERROR) or ""
    assert "check-back" in reason and "TOPIC_AUTHORIZATION_FAILED" in reason, reason
    assert by_id[denied].get_property(DELIVERY_ATTEMPTS) == "3"


def test_a_commit_too_large_to_park_whole_is_parked_without_its_body_and_never_replayed_empty(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    client = no_auto_create(client_config)
    catalog = TopicCatalog(namespace=client.namespace, transaction_partitions=1)
    # The check-max topic takes less than HALF does: a whole parked copy of a big message
    # does not fit there.
    check_max = catalog.spec(SystemTopic.CHECK_MAX)
    create_topic(client, check_max.kafka_name, **{**check_max.configs, "max.message.bytes": "4096"})
    missing = unique("missing")
    writer = HalfWriter(client)
    with Coordinator(coordinator_config(client)):
        tid = writer.commit(missing, b"x" * 8192)
        parked = wait_until(
            lambda: [m for m in read_parked(client, timeout_ms=2000) if m.msg_id == tid],
            timeout_s=60,
        )
    (msg,) = parked
    assert msg.body == b""
    assert msg.get_property(MessageConst.BODY_OMITTED_BYTES) == "8192", msg.properties
    assert "parked without its body" in (msg.get_property(DELIVERY_ERROR) or ""), msg.properties
    create_topic(client, missing)
    with pytest.raises(KafkaClientError, match="parked without its body of 8192 bytes"):
        resolve_parked(client, tid, OpAction.COMMIT)
    assert list(read_messages(client, [missing], timeout_ms=500)) == []
    resolve_parked(client, tid, OpAction.ROLLBACK)  # an operator can still drop it
    assert read_parked(client, timeout_ms=2000) == []


def test_a_malformed_half_record_too_large_to_quarantine_whole_holds_nothing_back(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    catalog = TopicCatalog(namespace=client_config.namespace, transaction_partitions=1)
    quarantine = catalog.spec(SystemTopic.QUARANTINE)
    create_topic(
        client_config, quarantine.kafka_name, **{**quarantine.configs, "max.message.bytes": "4096"}
    )
    good = unique("good")
    create_topic(client_config, good)
    writer = HalfWriter(client_config)
    with Coordinator(coordinator_config(client_config)):
        writer._write(b"\x00not an envelope" + b"x" * 8192, "garbage")
        for i in range(3):
            writer.commit(good, f"g{i}".encode())
        assert sorted(bodies(client_config, good, 3)) == ["g0", "g1", "g2"]
        kept = wait_until(
            lambda: list(read_quarantine(client_config, timeout_ms=1000)), timeout_s=30
        )
    (q,) = kept
    assert q.value in (None, b"") and q.omitted_bytes >= 8192, q
    assert q.source_topic == catalog.topic(SystemTopic.HALF)


def test_a_transaction_parked_twice_is_replayed_once(
    client_config: ClientConfig, unique: Callable[[str], str]
) -> None:
    """Two parked copies of one transaction (a coordinator that parked it, then parked it again
    after losing its producer mid-way) are one parked message: the first replay resolves both,
    so a second replay cannot deliver it again."""
    real = unique("real")
    create_topic(client_config, real)
    tid = uuid.uuid4().hex.upper()
    props = {
        MessageConst.PRODUCER_GROUP: GROUP,
        MessageConst.REAL_TOPIC: real,
        MessageConst.REAL_QUEUE_ID: "-1",
        MessageConst.TRANSACTION_ID: tid,
        MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: tid,
        DELIVERY_ERROR: "topic was missing",
    }
    catalog = TopicCatalog(namespace=client_config.namespace)
    TopicAdmin(client_config).ensure_system_topics(catalog)
    check_max = catalog.topic(SystemTopic.CHECK_MAX)
    raw = RawProducer({"bootstrap.servers": client_config.bootstrap_servers})
    for _ in range(2):
        raw.produce(check_max, encode_envelope(tid, b"once", props, now_ms(), "127.0.0.1"))
    assert raw.flush(10) == 0
    parked = read_parked(client_config)
    assert [m.msg_id for m in parked] == [tid], "one message, listed once"
    resolve_parked(client_config, tid, OpAction.COMMIT)
    assert read_parked(client_config) == []
    with pytest.raises(BridgeError, match="no parked, unresolved message"):
        resolve_parked(client_config, tid, OpAction.COMMIT)
    bodies_seen = [m.body for m in read_messages(client_config, [real], timeout_ms=2000)]
    assert bodies_seen == [b"once"]
