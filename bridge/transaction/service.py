"""The coordinator's transaction service: end-transaction handling and check-back.

One consumer (group ``<namespace>.coordinator.transaction``) reads the HALF topic; Kafka's
group protocol spreads its partitions over the running coordinators and moves a dead one's
partitions to the others. For each partition the service keeps a :class:`HalfPartition`.

Every decision is applied in one Kafka transaction that writes the real message (on commit),
the OP record, and the HALF offset from which a restart must read again (the oldest undecided
half message). So a crash at any point either applies a decision completely or not at all,
and a decision is applied at most once: each committed message reaches its real topic exactly
once (G2, G3). Checks run in a transaction of their own that writes a copy of the half message
with ``TRANSACTION_CHECK_TIMES`` + 1 (RocketMQ's put-back) and the check request; a half
message whose check is more than an interval away is put back unchanged once per interval.

Isolation: a commit whose real record cannot be written (an internal topic, a topic that does
not exist or was deleted, a partition it does not have, a record larger than the topic takes,
no authorization) never holds the others back. Such a commit is found before it is written
(the target's metadata) or from the delivery reports of a failed Kafka transaction; it is then
tried on its own, in a Kafka transaction of its own, a bounded number of times with back-off,
and finally parked in the check-max topic with ``DELIVERY_ERROR`` (the reason) and
``DELIVERY_ATTEMPTS``, where ``bridge transactions replay`` re-drives it once the cause is
fixed. When the Kafka transaction failed as a whole for a record's reason that no report
names (a topic that denies Write but allows Describe), each of its commits is tried on its own.
A commit on its own whose outcome is unknown (a commit timeout) re-reads its partition from
Kafka before it is tried again. A failure that names no record (the broker, the network)
rebuilds and retries the whole batch, with back-off: nothing is lost. Check-back is isolated
the same way: a check that cannot be made counts as a check, and a transaction whose check
outputs cannot be written is checked on its own and parked with the reason.

Recovery of a partition: read OP records written since the oldest undecided half message
(found by time: HALF and OP use the broker's clock), then replay HALF from the committed offset.
An OP record that cannot be decoded (a newer schema during a rolling upgrade) still marks its
transaction (its Kafka key) decided; a recovery that cannot read what it needs fails and is
tried again rather than guessing.

Guarantees kept here (see ``docs/guarantees.md``): G1-G4, G9.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from bridge.codec import ENVELOPE_SCHEMA, PreparedRecord, encode_envelope, envelope_to_message
from bridge.config import ClientConfig
from bridge.errors import BridgeError, KafkaClientError, WireFormatError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.batch_writer import Delivered, TransactionBatch, is_purge, kafka_error
from bridge.kafka.clients import new_consumer, new_producer, read_record_at
from bridge.kafka.quarantine import quarantine_copy
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.kafka.transactional import is_permanent_delivery_error
from bridge.lifecycle import FatalServiceError
from bridge.message import MessageConst, PropertyValue, now_ms
from bridge.transaction.model import (
    END_TRANSACTION_SCHEMA,
    CheckRequest,
    EndTransaction,
    OpAction,
    OpEntry,
    TransactionStatus,
    committed_record,
)
from bridge.transaction.state import CheckAction, CheckPolicy, HalfPartition, PendingHalf
from topics.avro import default_registry
from topics.catalog import SystemTopic
from topics.naming import (
    coordinator_group,
    coordinator_group_instance_id,
    is_kafka_internal,
    reader_group,
)

logger = logging.getLogger(__name__)

_POLL_TIMEOUT_S = 0.05
_BATCH = 500
_CHECKS_PER_CYCLE = 1000
_OP_SCAN_SLACK_MS = 60_000
"""Read OP records from this long before the oldest undecided half message (broker clock
differences between partition leaders)."""

DELIVERY_ATTEMPTS: Final = MessageConst.DELIVERY_ATTEMPTS
"""Property of a parked message: how many times writing its real record failed."""
DELIVERY_ERROR: Final = MessageConst.DELIVERY_ERROR
"""Property of a parked message: why its real record could not be written."""
_MAX_DELIVERY_ERROR_CHARS = 500
_TRANSIENT_BACKOFF_MAX_MS = 30_000
"""Longest wait between attempts of a commit that fails for a transient reason, ms."""
_ALONE_PER_CYCLE = 20
"""Commits tried on their own per iteration (the others wait for the next one)."""
_TARGET_CACHE_MS = 30_000
"""How long a real topic's partition count is trusted before it is asked again, ms."""
_MISSING_CACHE_MS = 5_000
"""How long a real topic found missing stays missing before it is asked again, ms."""
_FRESH_MS = 1_000
"""A fresh answer about a real topic (after a failure, before a retry) is at most this old."""
_CONFIRM_MISSING_S = 0.75
"""How long an unknown topic is asked about again before it counts as missing, s."""
_TARGET_CACHE_SIZE = 10_000
_FAILURES: Final = (KafkaException, SystemError)
"""What a failed Kafka transaction of this service raises (see
:func:`~bridge.kafka.batch_writer.as_kafka_exception`)."""


def auto_create_allowed(config: ClientConfig) -> bool:
    """False when the client never creates a topic by writing to it
    (``allow.auto.create.topics=false``); the broker may still refuse when True."""
    return config.kafka.get("allow.auto.create.topics", "true").strip().lower() not in (
        "false",
        "0",
    )


def topic_problem(
    producer: Any, topic: str, timeout_s: float, *, confirm_s: float = 0.0
) -> tuple[str | None, int]:
    """Why records cannot be written to ``topic``, as the cluster's metadata tells (None when
    nothing is known to be wrong), and its partition count (0 when unknown). Raises
    ``KafkaException`` when the broker does not answer within ``timeout_s`` seconds.

    ``producer`` is a confluent-kafka producer *without* a transactional id: its metadata
    request creates a missing topic exactly where writing to it would (broker and client
    allow auto-creation), which a transactional producer's does not. A broker that creates
    it answers "unknown" first and knows it some 50 ms later: an unknown topic is asked
    about again for ``confirm_s`` seconds before it counts as missing (0 when the client
    does not auto-create).
    """
    if is_kafka_internal(topic):
        return f"{topic} is a Kafka internal topic (only the broker writes to it)", 0
    deadline = time.monotonic() + confirm_s
    wait_s = 0.05
    while True:
        info = producer.list_topics(topic, timeout_s).topics.get(topic)
        error = None if info is None else info.error
        unknown = info is None or (
            error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        if not unknown or time.monotonic() + wait_s > deadline:
            break
        time.sleep(wait_s)  # a topic being created: nothing to wait on but time
        wait_s *= 2
    if unknown:
        return f"topic {topic} does not exist (and writing to it does not create it)", 0
    assert info is not None
    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return f"not authorized to write to topic {topic}", 0
    if error is not None and error.code() == KafkaError.TOPIC_EXCEPTION:
        return f"{topic} is not a valid topic name", 0
    if error is not None:
        return None, 0  # e.g. a leader being elected: let the write find out
    return None, len(info.partitions)


def partition_problem(topic: str, partition: int, partition_count: int) -> str | None:
    """Why ``partition`` (-1: any) of ``topic`` cannot be written, or None."""
    if partition_count > 0 and partition >= partition_count:
        return f"partition {partition} of topic {topic} does not exist (it has {partition_count})"
    return None


def delivery_problem(topic: str, err: KafkaError) -> str:
    """The text of a failed delivery to ``topic``."""
    return f"writing to {topic} failed: {err.str()} ({err.name()})"


class _Batch(TransactionBatch):
    """What one Kafka transaction writes, and what the transaction service notes about it: the
    commits in it (their real records' reports) and the bridge-made outputs of each
    transaction (check copies, check requests, parked copies)."""

    def __init__(self, *, dirty: bool = False, current: str | None = None) -> None:
        super().__init__()
        self.dirty = dirty
        self.real: dict[str, tuple[int, PreparedRecord]] = {}
        """Transaction id -> (HALF partition, real record) of each commit in the batch."""
        self.outcome: dict[str, KafkaError | None] = {}
        """Transaction id -> what became of its real record (None: stored)."""
        self.current = current
        """While set, what :meth:`add` writes is a bridge-made output for this transaction."""
        self.about: dict[str, int] = {}
        """Transaction id -> HALF partition of each transaction with bridge-made outputs."""
        self.side: dict[str, KafkaError | None] = {}
        """Transaction id -> what became of its bridge-made outputs (the first failure, or
        None once one was stored and none failed)."""
        self._owner: dict[int, str] = {}
        """Record index -> the transaction whose real record it is."""
        self._about: dict[int, str] = {}
        """Record index -> the transaction a bridge-made output is for."""

    def add_record(self, record: PreparedRecord, on_delivery: Delivered | None = None) -> None:
        """Add ``record``; while :attr:`current` is set, as an output for that transaction."""
        about = self.current
        if about is not None:
            on_delivery = self._noting(about, on_delivery)
            self._about[len(self.records)] = about
        self.add(record, on_delivery)
        self.dirty = True

    def put(
        self,
        topic: str,
        value: bytes,
        *,
        partition: int = -1,
        key: bytes | None = None,
        on_delivery: Delivered | None = None,
    ) -> None:
        """Add a record of ``topic`` without headers (see :meth:`add_record`)."""
        self.add_record(
            PreparedRecord(topic, key, value, [], self.current or "", 0, partition), on_delivery
        )

    def _noting(self, about: str, then: Delivered | None) -> Delivered:
        """A delivery callback that notes the outcome of an output for ``about``."""

        def report(err: KafkaError | None, kmsg: Any) -> None:
            if err is not None:
                if self.side.get(about) is None:
                    self.side[about] = err
            else:
                self.side.setdefault(about, None)
            if then is not None:
                then(err, kmsg)

        return report

    def add_real(self, transaction_id: str, half_partition: int, real: PreparedRecord) -> None:
        """The real record of a commit, its delivery report noted in :attr:`outcome`."""

        def delivered(err: KafkaError | None, kmsg: Any) -> None:
            self.outcome[transaction_id] = err

        self.real[transaction_id] = (half_partition, real)
        self._owner[len(self.records)] = transaction_id
        self.add(real, delivered)
        self.dirty = True

    def refused(self, index: int, record: PreparedRecord, exc: KafkaException) -> None:
        """A record ``produce`` refused at once is noted as its commit's (or its output's)
        outcome; the transaction then fails with it."""
        err = kafka_error(exc)
        if err is not None:
            owner = self._owner.get(index)
            if owner is not None:
                self.outcome[owner] = err
            about = self._about.get(index)
            if about is not None:
                self.side[about] = err


@dataclass(slots=True)
class _BadCheck:
    """A transaction whose check-back outputs made a Kafka transaction fail: it is checked
    on its own, and parked after ``ServiceConfig.delivery_attempts`` permanent failures."""

    attempts: int = 0
    """Failures for a permanent reason so far (0: only a suspect)."""
    reason: str = ""
    park_failures: int = 0
    """Parked copies refused so far (the next one leaves the body out)."""
    failures: int = 0
    """Failed tries on its own, of any kind: the back-off grows with them."""
    next_attempt_ms: int = 0
    """Not tried on its own again before this (epoch ms): a failure rebuilds the partition,
    and without a wait the rebuilt transaction would be due, and fail, at once."""


@dataclass(slots=True)
class _Poison:
    """A commit whose real record could not be written with the others: it is applied on its
    own, and parked after ``ServiceConfig.delivery_attempts`` failures that do not go away."""

    half_partition: int
    attempts: int
    """Failed deliveries so far, for a reason that does not go away by itself."""
    reason: str
    next_attempt_ms: int
    transient_failures: int = 0
    park_failures: int = 0
    """Times its parked copy was refused; after one, it is parked without its body."""


class TransactionService(TransactionalService):
    """End-transaction handling and ``CheckBackService`` for the HALF partitions this
    coordinator owns."""

    def __init__(
        self,
        config: ServiceConfig,
        policy: CheckPolicy | None = None,
        check_topic_partitions: int = 4,
    ) -> None:
        super().__init__("transaction", config)
        self.policy = policy or CheckPolicy()
        self.check_topic_partitions = check_topic_partitions
        self.catalog = config.catalog
        self._half = config.catalog.topic(SystemTopic.HALF)
        self._op = config.catalog.topic(SystemTopic.OP)
        self._partitions: dict[int, HalfPartition] = {}
        self._to_recover: set[int] = set()
        self._known_check_topics: set[str] = set()
        self._check_topic_errors: dict[str, tuple[str, int]] = {}
        self._bad_checks: dict[str, _BadCheck] = {}
        self._shrink_quarantine: set[tuple[int, int]] = set()
        """HALF (partition, offset) of malformed records whose whole quarantine copy was
        refused: quarantined without their value next time."""
        """Transactions checked on their own (their check-back outputs failed), by id."""
        """Check topic -> (why it could not be had, when that was found, ms)."""
        self._admin: TopicAdmin | None = None
        self._poison: dict[str, _Poison] = {}
        """Commits applied on their own, by transaction id (kept across rebuilds)."""
        self._targets: dict[str, tuple[str | None, int, int]] = {}
        """Real topic -> (what is wrong with it or None, partition count, when asked, ms)."""
        self._metadata: Any = None
        self._metadata_silent_until = 0
        """A plain producer that only asks for metadata (see :func:`topic_problem`)."""
        self._offsets_dirty = False
        """A commit applied on its own moved a checkpoint: the next batch commits offsets."""
        self._failures = 0
        """Consecutive failed Kafka transactions that named no record."""
        self.committed_transactions = 0
        """How many Kafka transactions this service committed (for tests and metrics)."""

    @property
    def parked_for_delivery(self) -> int:
        """Commits being applied on their own (their real record could not be written)."""
        return len(self._poison)

    # --- lifecycle ----------------------------------------------------------------------
    def on_start(self) -> None:
        client = self.config.client
        self._admin = TopicAdmin(client)
        self._metadata = new_producer(client, f"{self.name}-metadata")
        self.start_producer()
        self._consumer = new_consumer(
            client,
            coordinator_group(client.namespace, "transaction"),
            client_id=self.name,
            partition_assignment_strategy="range",
            fetch_wait_max_ms=50,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=max(self.config.session_timeout_ms // 6, 500),
            # Static membership: a coordinator restarted with the same id takes its
            # partitions back at once instead of after the session timeout.
            group_instance_id=coordinator_group_instance_id(
                self.config.coordinator_id, "transaction"
            ),
        )
        self._consumer.subscribe([self._half], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._to_recover.add(tp.partition)
        logger.info(
            "%s: assigned HALF partitions %s", self.name, [tp.partition for tp in partitions]
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        for p in revoked:
            self._partitions.pop(p, None)
            self._to_recover.discard(p)
        # The next owner finds these commits again (from its own delivery attempts).
        self._poison = {t: x for t, x in self._poison.items() if x.half_partition not in revoked}
        self._bad_checks.clear()  # found again (if still bad) by whoever owns them next
        logger.info("%s: revoked HALF partitions %s", self.name, sorted(revoked))

    def on_stop(self) -> None:
        super().on_stop()
        self._metadata = None

    # --- main loop ------------------------------------------------------------------------
    def run_once(self) -> None:
        consumer = self._consumer
        if consumer is None or not self.producer_ready():
            return
        if self._to_recover:
            self._recover(sorted(self._to_recover))
        first = consumer.poll(_POLL_TIMEOUT_S)
        records = [first] if first is not None else []
        if first is not None:
            records.extend(consumer.consume(_BATCH, 0))
        batch = _Batch(dirty=self._offsets_dirty)
        for record in records:
            self._handle(record, batch)
        self._follow_positions(consumer)
        self._commit(batch)
        now = now_ms()
        self._commit_alone_due(now)
        checks = _Batch()
        alone: list[tuple[HalfPartition, PendingHalf]] = []
        for state in list(self._partitions.values()):
            for pending in state.put_backs_due(now, _CHECKS_PER_CYCLE):
                checks.current = pending.transaction_id
                checks.about[pending.transaction_id] = state.partition
                self._put_back(state, pending, checks)
            for pending in state.due(now, _CHECKS_PER_CYCLE):
                bad = self._bad_checks.get(pending.transaction_id)
                if bad is not None:
                    if bad.next_attempt_ms > now:
                        state.postpone(pending, now, bad.next_attempt_ms - now)
                    else:
                        alone.append((state, pending))
                    continue
                checks.current = pending.transaction_id
                checks.about[pending.transaction_id] = state.partition
                self._check_or_discard(state, pending, now, checks)
        checks.current = None
        if not self._commit(checks):
            # A check topic deleted meanwhile is created again by the next check.
            self._known_check_topics.clear()
            self._set_aside_checks(checks)
        for state, pending in alone[:_ALONE_PER_CYCLE]:
            if self._partitions.get(state.partition) is state:
                self._check_alone(state, pending, now)
        for state, pending in alone[_ALONE_PER_CYCLE:]:
            state.postpone(pending, now, self.config.delivery_backoff_ms)

    # --- checks whose outputs cannot be written ----------------------------------------------
    def _set_aside_checks(self, batch: _Batch) -> None:
        """After a failed checks transaction: the transactions whose outputs (check copy,
        check request, put-back or parked copy) failed for a permanent reason are checked on
        their own from now on, and parked after ``delivery_attempts`` such failures; when the
        transaction's own error is permanent and no report names an output, every
        transaction of the batch is a suspect, checked on its own (uncounted) to find it."""
        named = {
            tid: err for tid, err in batch.side.items()
            if err is not None and is_permanent_delivery_error(err)
        }  # fmt: skip
        suspects: list[str] = []
        if not named and is_permanent_delivery_error(batch.error):
            assert batch.error is not None
            unacknowledged = [t for t in batch.about if batch.side.get(t, batch.error) is not None]
            if len(unacknowledged) == 1:
                named[unacknowledged[0]] = batch.error
            else:
                suspects = unacknowledged
        for tid, err in named.items():
            bad = self._bad_checks.setdefault(tid, _BadCheck())
            bad.attempts += 1
            bad.reason = f"its check-back output could not be written: {err.str()} ({err.name()})"
            logger.warning(
                "transaction %s: %s (attempt %d of %d); checked on its own",
                tid, bad.reason, bad.attempts, self.config.delivery_attempts,
            )  # fmt: skip
        for tid in suspects:
            self._bad_checks.setdefault(tid, _BadCheck())

    def _check_alone(self, state: HalfPartition, pending: PendingHalf, now: int) -> None:
        """Check (or park) one transaction whose check-back outputs made a transaction fail,
        in a Kafka transaction of its own; parked with the reason after
        ``delivery_attempts`` permanent failures."""
        tid = pending.transaction_id
        bad = self._bad_checks[tid]
        batch = _Batch(current=tid)
        batch.about[tid] = state.partition
        parking = bad.attempts >= self.config.delivery_attempts
        if parking:
            self._park_check(state, pending, bad, batch)
        else:
            self._check_or_discard(state, pending, now, batch)
        if self._commit_alone(batch):
            self._bad_checks.pop(tid, None)
            self._offsets_dirty = True
            return
        err = batch.side.get(tid)
        if not is_permanent_delivery_error(err):
            err = batch.error
        if err is not None and is_permanent_delivery_error(err) and not batch.in_doubt:
            if parking:
                bad.park_failures += 1
            else:
                bad.attempts += 1
            bad.reason = f"its check-back output could not be written: {err.str()} ({err.name()})"
            logger.warning(
                "transaction %s: %s (attempt %d of %d)",
                tid, bad.reason, bad.attempts, self.config.delivery_attempts,
            )  # fmt: skip
        bad.failures += 1
        bad.next_attempt_ms = now_ms() + min(
            self.config.delivery_backoff_ms * 2 ** (bad.failures - 1), _TRANSIENT_BACKOFF_MAX_MS
        )
        # The state was changed optimistically (or the outcome is unknown): rebuild the
        # partition from Kafka before this is tried again.
        self._partitions.pop(state.partition, None)
        self._to_recover.add(state.partition)

    def _park_check(
        self, state: HalfPartition, pending: PendingHalf, bad: _BadCheck, batch: _Batch
    ) -> None:
        """Park a transaction whose check-back cannot be written, with the reason. When even
        its parked copy was refused, the copy leaves the body out (its size and where the
        half message is are in the reason; it stays there until the HALF retention)."""
        reason = bad.reason
        body: bytes | None = None
        if bad.park_failures:
            body = b""
            reason += (
                f"; parked without its body of {len(pending.message.body)} bytes (the half "
                f"message is at {self._half}[{state.partition}]@{pending.offset})"
            )
        msg = pending.message
        props = msg.properties
        if body is not None:  # replaying this copy would deliver an empty message
            props[MessageConst.BODY_OMITTED_BYTES] = str(len(msg.body))
        props[MessageConst.TRANSACTION_CHECK_TIMES] = str(pending.check_times)
        props[DELIVERY_ATTEMPTS] = str(bad.attempts)
        props[DELIVERY_ERROR] = reason[:_MAX_DELIVERY_ERROR_CHARS]
        parked = encode_envelope(
            msg.msg_id, msg.body if body is None else body, props, msg.born_timestamp_ms,
            msg.born_host,
        )  # fmt: skip
        logger.warning(
            "transaction %s (group %s) parked in %s: %s",
            pending.transaction_id, pending.producer_group,
            self.catalog.topic(SystemTopic.CHECK_MAX), reason,
        )  # fmt: skip
        batch.put(
            self.catalog.topic(SystemTopic.CHECK_MAX), parked, key=pending.transaction_id.encode()
        )
        self._write_op(state, pending, OpAction.DISCARD, batch)
        state.resolve(pending)

    def _follow_positions(self, consumer: Consumer) -> None:
        """Move each partition's read position to the consumer's: past the transaction
        markers that end every batch the services write, which no consumer receives (a
        partition whose last record is a marker would otherwise never count as read up to
        its end, and its checks would wait for new traffic)."""
        owned = [TopicPartition(self._half, p) for p in self._partitions]
        if not owned:
            return
        try:
            positions = consumer.position(owned)
        except KafkaException:
            return
        for tp in positions:
            state = self._partitions.get(tp.partition)
            # Negative: nothing returned since the last seek (a recovery).
            if state is not None and tp.error is None and tp.offset >= 0:
                state.on_position(tp.offset)

    def _handle(self, record: Any, batch: _Batch) -> None:
        error = record.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return
            self.check_fencing(error)  # another coordinator with this id: stop, say why
            if error.fatal():  # the consumer cannot go on: stop rather than idle unseen
                raise FatalServiceError(f"{self.name}: Kafka consumer failed: {error.str()}")
            logger.warning("%s: consumer error %s", self.name, error.str())
            return
        state = self._partitions.get(record.partition())
        if state is None or record.partition() in self._to_recover:
            return  # revoked meanwhile, or replayed after recovery
        offset = record.offset()
        try:
            name, fields = default_registry().decode_any(record.value())
            if name == ENVELOPE_SCHEMA:
                msg = envelope_to_message(fields)
                state.on_half(offset, record.timestamp()[1], record.value(), msg, now_ms())
                batch.dirty = True
            elif name == END_TRANSACTION_SCHEMA:
                self._on_end(state, offset, EndTransaction.from_record(fields), batch)
            else:
                raise WireFormatError(f"a {name} record does not belong in the HALF topic")
        except (WireFormatError, ValueError, KeyError) as exc:
            where = (record.partition(), offset)
            copy = quarantine_copy(
                self.catalog, record, str(exc), self.name,
                keep_value=where not in self._shrink_quarantine,
            )  # fmt: skip

            def refused(err: KafkaError | None, _: Any, where: tuple[int, int] = where) -> None:
                # Too large for QUARANTINE whole (a record near HALF's limit): the rebuilt
                # batch quarantines it without its value, so the others are not held back.
                if is_permanent_delivery_error(err):
                    self._shrink_quarantine.add(where)
                elif err is None:
                    self._shrink_quarantine.discard(where)

            batch.add_record(copy, refused)
            state.on_other(offset)

    def _on_end(
        self, state: HalfPartition, offset: int, end: EndTransaction, batch: _Batch
    ) -> None:
        if end.status is TransactionStatus.UNKNOWN:
            state.on_other(offset)
            logger.debug("transaction %s: UNKNOWN from %s", end.transaction_id, end.producer_id)
            return
        pending = state.on_end(offset, end.transaction_id)
        if pending is None:
            logger.info(
                "transaction %s: %s from %s ignored (already decided, being committed, or "
                "unknown)",
                end.transaction_id, end.status.value, end.producer_id,
            )  # fmt: skip
            return
        # Decided by its producer: no check of it is needed any more, on its own or not.
        self._bad_checks.pop(end.transaction_id, None)
        if end.status is TransactionStatus.COMMIT:
            self._apply_commit(state, pending, batch)
        else:
            self._write_op(state, pending, OpAction.ROLLBACK, batch)
            state.resolve(pending)
        logger.debug("transaction %s: %s", end.transaction_id, end.status.value)

    def _apply_commit(self, state: HalfPartition, pending: PendingHalf, batch: _Batch) -> None:
        """Commit ``pending`` in ``batch``, or set it aside to be committed on its own when its
        real record is known not to fit (so the rest of the batch does not fail with it)."""
        tid = pending.transaction_id
        poison = self._poison.get(tid)
        real: PreparedRecord | None = None
        if poison is None:
            try:
                real = committed_record(pending.message, self.catalog.namespace)
            except (BridgeError, ValueError) as exc:
                # No retry makes a name or a property that cannot be written writable.
                poison = self._set_aside(
                    state,
                    tid,
                    f"its real record cannot be built: {exc}",
                    self.config.delivery_attempts,
                )
            else:
                problem = self._target_problem(real.kafka_topic, real.partition, fresh=False)
                if problem is not None:
                    poison = self._set_aside(state, tid, problem, 1)
        if poison is not None or real is None:
            state.hold(pending)  # committed on its own by _commit_alone_due
            return
        batch.add_real(tid, state.partition, real)
        self._write_op(state, pending, OpAction.COMMIT, batch)
        state.resolve(pending)

    def _set_aside(self, state: HalfPartition, tid: str, reason: str, attempts: int) -> _Poison:
        poison = _Poison(
            state.partition, attempts, reason, now_ms() + self.config.delivery_backoff_ms
        )
        self._poison[tid] = poison
        logger.warning(
            "transaction %s: its message cannot be written with the others (%s); "
            "committing it on its own (attempt %d of %d failed)",
            tid, reason, attempts, self.config.delivery_attempts,
        )  # fmt: skip
        return poison

    def _target_problem(self, topic: str, partition: int, *, fresh: bool) -> str | None:
        """Why a record for ``topic`` / ``partition`` cannot be written, from metadata; None
        when nothing is known wrong or the broker does not answer (the write then decides).
        Answers are kept (a topic's partitions :data:`_TARGET_CACHE_MS`, a missing topic
        :data:`_MISSING_CACHE_MS`, :data:`_FRESH_MS` when ``fresh``), so many records for
        one missing topic cost one question."""
        now = now_ms()
        known = self._targets.get(topic)
        if known is not None:
            max_age = _TARGET_CACHE_MS if known[0] is None else _MISSING_CACHE_MS
            if now - known[2] > (_FRESH_MS if fresh else max_age):
                known = None
        if known is None and now < self._metadata_silent_until:
            return None  # the broker did not answer a moment ago: do not wait on it again
        if known is None:
            confirm_s = _CONFIRM_MISSING_S if auto_create_allowed(self.client) else 0.0
            try:
                problem, count = topic_problem(
                    self._metadata, topic, self.timeout_s, confirm_s=confirm_s
                )
            except KafkaException as exc:
                logger.info("%s: no metadata for %s (%s)", self.name, topic, exc)
                self._metadata_silent_until = now_ms() + _FRESH_MS
                return None
            if problem is None and count == 0:
                return None  # e.g. being created: the write decides
            if len(self._targets) >= _TARGET_CACHE_SIZE:
                self._targets.clear()
            known = self._targets[topic] = (problem, count, now_ms())
        return known[0] or partition_problem(topic, partition, known[1])

    def _write_op(
        self, state: HalfPartition, pending: PendingHalf, action: OpAction, batch: _Batch
    ) -> None:
        entry = OpEntry(
            half_partition=state.partition,
            # The newest copy, read back or not: a restart that reads it knows it is decided.
            half_offset=pending.latest_offset,
            transaction_id=pending.transaction_id,
            msg_id=pending.message.msg_id,
            producer_group=pending.producer_group,
            action=action,
            decided_at_ms=now_ms(),
        )
        batch.put(
            self._op, entry.encode(), partition=state.partition, key=pending.transaction_id.encode()
        )

    def _check_or_discard(
        self, state: HalfPartition, pending: PendingHalf, now: int, batch: _Batch
    ) -> None:
        action = self.policy.action(pending.check_times, pending.born_ms, now)
        try:
            if action is CheckAction.DISCARD:
                self._discard(state, pending, batch)
            else:
                self._check(state, pending, now, batch)
        except BridgeError as exc:
            # One failing check (e.g. its group's check topic cannot be created) must not
            # stall the others (RocketMQ #9500). It counts as a check, so a check that can
            # never be made ends with the message parked (with the reason), not pinning the
            # checkpoint for ever.
            self._check_failed(state, pending, now, f"check-back failed: {exc}", batch)

    def _check_failed(
        self, state: HalfPartition, pending: PendingHalf, now: int, reason: str, batch: _Batch
    ) -> None:
        """Count a check of ``pending`` that could not be made: a copy with
        ``TRANSACTION_CHECK_TIMES`` + 1 is written (as for a check, without the request), so
        the count survives a restart and the copy moves the checkpoint on."""
        tid = pending.transaction_id
        try:
            copy = self._with_check_times(pending, pending.check_times + 1)
        except BridgeError:
            logger.exception("transaction %s: check failed (%s); retrying later", tid, reason)
            state.postpone(pending, now)
            return
        state.check_failed(pending, now, reason)
        logger.warning(
            "transaction %s (group %s): check %d of %d could not be made: %s",
            tid, pending.producer_group, pending.check_times,
            self.policy.transaction_check_max, reason,
        )  # fmt: skip
        self._add_half_copy(state, tid, copy, batch)

    def _add_half_copy(self, state: HalfPartition, tid: str, copy: bytes, batch: _Batch) -> None:
        """Write ``copy`` of transaction ``tid``'s half message at the end of its partition;
        its offset is noted once Kafka acknowledged it."""

        def copy_delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is None:
                state.copy_written(tid, kmsg.offset())

        batch.put(
            self._half, copy, partition=state.partition, key=tid.encode(),
            on_delivery=copy_delivered,
        )  # fmt: skip

    def _envelope(
        self, pending: PendingHalf, body: bytes | None = None, /, **changes: PropertyValue
    ) -> bytes:
        """``pending``'s half message with properties ``changes`` set (and ``body`` instead
        of its own, if given)."""
        msg = pending.message
        props = msg.properties
        props.update(changes)
        return encode_envelope(
            msg.msg_id, msg.body if body is None else body, props, msg.born_timestamp_ms,
            msg.born_host,
        )  # fmt: skip

    def _with_check_times(self, pending: PendingHalf, check_times: int) -> bytes:
        return self._envelope(pending, **{MessageConst.TRANSACTION_CHECK_TIMES: str(check_times)})

    def _discard(self, state: HalfPartition, pending: PendingHalf, batch: _Batch) -> None:
        logger.warning(
            "transaction %s (group %s) parked in %s after %d checks%s",
            pending.transaction_id, pending.producer_group,
            self.catalog.topic(SystemTopic.CHECK_MAX), pending.check_times,
            f" ({pending.check_error})" if pending.check_error else "",
        )  # fmt: skip
        changes: dict[str, PropertyValue] = {
            MessageConst.TRANSACTION_CHECK_TIMES: str(pending.check_times)
        }
        if pending.check_error is not None:
            # Its last check could not be made: the operator sees why.
            changes[DELIVERY_ATTEMPTS] = str(pending.check_failures)
            changes[DELIVERY_ERROR] = pending.check_error[:_MAX_DELIVERY_ERROR_CHARS]
        batch.put(
            self.catalog.topic(SystemTopic.CHECK_MAX),
            self._envelope(pending, **changes),
            key=pending.transaction_id.encode(),
        )
        self._write_op(state, pending, OpAction.DISCARD, batch)
        state.resolve(pending)

    def _put_back(self, state: HalfPartition, pending: PendingHalf, batch: _Batch) -> None:
        """Copy ``pending`` unchanged to the end of its partition (no check request), so its
        old offset stops holding the checkpoint back."""
        tid = pending.transaction_id
        self._add_half_copy(state, tid, pending.envelope, batch)
        logger.debug("transaction %s: put back (next check at %d)", tid, pending.next_check_ms)

    def _check(self, state: HalfPartition, pending: PendingHalf, now: int, batch: _Batch) -> None:
        group = pending.producer_group
        topic = self._ensure_check_topic(group, now)
        checked_offset = pending.offset
        copy = self._with_check_times(pending, pending.check_times + 1)
        state.checked(pending, now)
        pending.check_error = None
        tid = pending.transaction_id
        self._add_half_copy(state, tid, copy, batch)
        request = CheckRequest(
            transaction_id=tid,
            msg_id=pending.message.msg_id,
            half_partition=state.partition,
            half_offset=checked_offset,
            check_times=pending.check_times,
            message=copy,
        )
        batch.put(topic, request.encode(), key=tid.encode())
        logger.info(
            "transaction %s (group %s): check %d of %d",
            tid, group, pending.check_times, self.policy.transaction_check_max,
        )  # fmt: skip

    def _ensure_check_topic(self, group: str, now: int) -> str:
        """The check topic of producer ``group``, created if missing. Any partition count
        will do (a producer may have created it with its own ``check_topic_partitions``: a
        consumer group reads them all). Raises :class:`BridgeError` when it cannot be had;
        that answer is kept :data:`_MISSING_CACHE_MS` ms (many checks, one question)."""
        topic = self.catalog.check_topic(group)
        if topic in self._known_check_topics:
            return topic
        failed = self._check_topic_errors.get(topic)
        if failed is not None and now - failed[1] < _MISSING_CACHE_MS:
            raise BridgeError(failed[0])
        try:
            assert_admin(self._admin).ensure_topics(
                [self.catalog.check_topic_spec(group, self.check_topic_partitions)], strict=False
            )
        except BridgeError as exc:
            self._check_topic_errors[topic] = (str(exc), now)
            raise
        self._check_topic_errors.pop(topic, None)
        self._known_check_topics.add(topic)
        return topic

    # --- commits applied on their own -------------------------------------------------------------
    def _commit_alone_due(self, now: int) -> None:
        """Try the commits set aside whose next attempt is due, each in its own transaction."""
        tried = 0
        for tid, poison in list(self._poison.items()):
            if tried >= _ALONE_PER_CYCLE:
                return
            state = self._partitions.get(poison.half_partition)
            if state is None or poison.half_partition in self._to_recover:
                continue  # being rebuilt: its end request is read again
            pending = state.pending.get(tid)
            if pending is None or not pending.held:
                if state.caught_up:
                    # Its end request was read again and found it decided (or gone).
                    self._poison.pop(tid, None)
                continue
            if poison.next_attempt_ms > now:
                continue
            tried += 1
            self._deliver_alone(state, pending, poison)

    def _deliver_alone(self, state: HalfPartition, pending: PendingHalf, poison: _Poison) -> None:
        tid = pending.transaction_id
        now = now_ms()
        if poison.attempts >= self.config.delivery_attempts:
            self._park(state, pending, poison)
            return
        try:
            real = committed_record(pending.message, self.catalog.namespace)
        except (BridgeError, ValueError) as exc:
            poison.attempts = self.config.delivery_attempts
            poison.reason = f"its real record cannot be built: {exc}"
            self._park(state, pending, poison)
            return
        problem = self._target_problem(real.kafka_topic, real.partition, fresh=True)
        if problem is None:
            batch = _Batch()
            batch.add_real(tid, state.partition, real)
            self._write_op(state, pending, OpAction.COMMIT, batch)
            if self._commit_alone(batch):
                state.resolve(pending)
                self._poison.pop(tid, None)
                self._offsets_dirty = True
                logger.info("transaction %s: committed on its own", tid)
                return
            if batch.in_doubt:
                self._reread(state, tid)
                return
            err = batch.outcome.get(tid)
            if not is_permanent_delivery_error(err) and is_permanent_delivery_error(batch.error):
                # Alone in its transaction: the transaction's own error (e.g. its topic could
                # not be added to it, not authorized) is this record's.
                err = batch.error
            if err is None or not is_permanent_delivery_error(err):
                # The broker, not this record (as far as anyone can tell): again later, and
                # this does not count towards parking it.
                poison.transient_failures += 1
                poison.next_attempt_ms = now + min(
                    self.config.delivery_backoff_ms * 2**poison.transient_failures,
                    _TRANSIENT_BACKOFF_MAX_MS,
                )
                return
            problem = delivery_problem(real.kafka_topic, err)
            self._remember_refusal(real.kafka_topic, err, problem)
        poison.attempts += 1
        poison.reason = problem
        logger.warning(
            "transaction %s: delivery attempt %d of %d failed: %s",
            tid, poison.attempts, self.config.delivery_attempts, problem,
        )  # fmt: skip
        if poison.attempts >= self.config.delivery_attempts:
            self._park(state, pending, poison)
        else:
            poison.next_attempt_ms = now + self.config.delivery_backoff_ms * 2 ** (
                poison.attempts - 1
            )

    def _remember_refusal(self, topic: str, err: KafkaError, problem: str) -> None:
        """A topic that refuses every write (not authorized) while its metadata looks fine
        (Describe allowed) is remembered as refusing for :data:`_MISSING_CACHE_MS`: the commits
        for it meanwhile are set aside before the batch instead of failing it, one at a
        time, for the others."""
        if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            if len(self._targets) >= _TARGET_CACHE_SIZE:
                self._targets.clear()
            self._targets[topic] = (problem, 0, now_ms())

    def _reread(self, state: HalfPartition, tid: str) -> None:
        """A transaction of its own for ``tid`` may or may not have committed: rebuild its
        HALF partition from what Kafka holds (the OP records decide) before anything is tried
        again, so the commit is never written twice. Its set-aside entry is kept (uncounted):
        if the commit did not happen, its end request is read again and it is retried."""
        logger.warning(
            "transaction %s: whether its own Kafka transaction committed is unknown; "
            "re-reading HALF partition %d",
            tid, state.partition,
        )  # fmt: skip
        self._partitions.pop(state.partition, None)
        self._to_recover.add(state.partition)

    def _park(self, state: HalfPartition, pending: PendingHalf, poison: _Poison) -> None:
        """Move a commit that cannot be delivered to the check-max topic with its reason (an
        operator replays it with ``bridge transactions replay`` once the cause is fixed)."""
        tid = pending.transaction_id
        changes: dict[str, PropertyValue] = {
            MessageConst.TRANSACTION_CHECK_TIMES: str(pending.check_times),
            DELIVERY_ATTEMPTS: str(poison.attempts),
            DELIVERY_ERROR: poison.reason[:_MAX_DELIVERY_ERROR_CHARS],
        }
        body = None
        if poison.park_failures:
            # The whole copy was refused (too large for the check-max topic): park it without
            # its body, marked so that it is never replayed as an empty message.
            body = b""
            changes[MessageConst.BODY_OMITTED_BYTES] = str(len(pending.message.body))
            changes[DELIVERY_ERROR] = (
                f"{poison.reason}; parked without its body (the half message is at "
                f"{self._half}[{state.partition}]@{pending.offset})"
            )[:_MAX_DELIVERY_ERROR_CHARS]
        parked = self._envelope(pending, body, **changes)
        batch = _Batch()
        batch.put(self.catalog.topic(SystemTopic.CHECK_MAX), parked, key=tid.encode())
        self._write_op(state, pending, OpAction.DISCARD, batch)
        if not self._commit_alone(batch):
            if batch.in_doubt:
                self._reread(state, tid)
                return
            poison.park_failures += 1
            if poison.park_failures > 1:
                logger.error(
                    "transaction %s: even its body-less parked copy was refused %d times; "
                    "its HALF partition %d cannot move past it until the check-max topic "
                    "takes it", tid, poison.park_failures - 1, state.partition,
                )  # fmt: skip
            poison.next_attempt_ms = now_ms() + min(
                self.config.delivery_backoff_ms * 2 ** (poison.park_failures - 1),
                _TRANSIENT_BACKOFF_MAX_MS,
            )
            return
        state.resolve(pending)
        self._poison.pop(tid, None)
        self._offsets_dirty = True
        logger.warning(
            "transaction %s (group %s) parked in %s after %d failed deliveries: %s",
            tid, pending.producer_group, self.catalog.topic(SystemTopic.CHECK_MAX),
            poison.attempts, poison.reason,
        )  # fmt: skip

    # --- Kafka transaction ----------------------------------------------------------------
    def _commit(self, batch: _Batch) -> bool:
        """Write ``batch`` and every owned partition's checkpoint in one Kafka transaction.
        False when it failed: the state is rebuilt and the commits that made it fail are set
        aside."""
        if not batch.dirty or self._consumer is None:
            return True
        self._offsets_dirty = False
        producer = self._producer
        timeout_s = self.timeout_s
        failed: KafkaError | None = None

        def settle(_: TransactionBatch) -> None:
            nonlocal failed
            producer.flush(timeout_s)
            failed = next((e for e in batch.outcome.values() if e is not None), None)
            if failed is not None and not is_purge(failed):
                # Doomed: fail before the offsets join it, so that the group's offsets are
                # not left pending on the abort (the rebuild would wait for them to settle).
                raise KafkaException(failed)

        def checkpoints() -> list[TopicPartition]:
            # After a purge (the transaction failed as a whole, e.g. a partition it could not
            # add) sending them raises the transaction's own error, which names the cause.
            return [
                TopicPartition(self._half, p, state.checkpoint())
                for p, state in self._partitions.items()
                if p not in self._to_recover
            ]

        def unless_lost(_: TransactionBatch) -> None:
            if failed is not None:
                raise KafkaException(failed)  # never commit what lost a record

        if not self.write(
            batch,
            on_failure=self._transaction_failed,
            offsets=checkpoints,
            after_produce=settle,
            before_commit=unless_lost,
            on_refused=batch.refused,
            failures=_FAILURES,
        ):
            self._set_aside_culprits(batch)
            return False
        self.committed_transactions += 1
        self._failures = 0
        return True

    def _commit_alone(self, batch: _Batch) -> bool:
        """Write ``batch`` in a Kafka transaction of its own (no offsets). False when it
        failed (:attr:`_Batch.in_doubt` says whether it may have committed all the same);
        nothing else is rebuilt (nothing else was in it)."""
        producer = self._producer
        if not self.write(
            batch,
            after_produce=lambda _: producer.flush(self.timeout_s),
            on_refused=batch.refused,
            failures=_FAILURES,
        ):
            return False
        self.committed_transactions += 1
        return True

    def _transaction_failed(self, exc: KafkaException) -> None:
        self.transaction_failed(exc)
        # State was changed optimistically: rebuild it from what Kafka committed.
        self._to_recover.update(self._partitions)
        self._partitions.clear()

    def _set_aside_culprits(self, batch: _Batch) -> None:
        """After a failed transaction: set aside the commits whose real record made it fail
        (a permanent delivery error, or a target the metadata shows is wrong), so the rebuilt
        batch goes through without them. If none is found, back off before the retry."""
        found = 0
        for tid, (half_partition, real) in batch.real.items():
            err = batch.outcome.get(tid)
            if tid in batch.outcome and err is None:
                continue  # stored (and aborted with the rest): not the cause
            if is_permanent_delivery_error(err):
                assert err is not None
                reason: str | None = delivery_problem(real.kafka_topic, err)
            else:
                # Timed out, purged, or the whole transaction refused (a partition could
                # not be added to it): ask the metadata about its target.
                reason = self._target_problem(real.kafka_topic, real.partition, fresh=True)
            if reason is not None and tid not in self._poison:
                now = now_ms()
                self._poison[tid] = _Poison(
                    half_partition, 1, reason, now + self.config.delivery_backoff_ms
                )
                found += 1
                logger.warning(
                    "transaction %s: its message made the Kafka transaction fail (%s); "
                    "committing it on its own",
                    tid, reason,
                )  # fmt: skip
        if not found and is_permanent_delivery_error(batch.error):
            found = self._suspect_all(batch)
        if found:
            self._failures = 0
            return
        self._failures += 1
        if self._failures >= 2:
            self._set_aside_lone_failures(batch)
        # Transient (the broker, the network): retry the rebuilt batch, not in a tight loop.
        self._stopped.wait(min(0.05 * 2**self._failures, 5.0))

    def _suspect_all(self, batch: _Batch) -> int:
        """The transaction failed for a record's reason (its own error says so, e.g. a topic
        it was not authorized to add) but no delivery report names the record (all say
        "purged"): every commit not acknowledged is a suspect, committed on its own (uncounted
        at first), so the innocent ones go through and the guilty one fails alone and is
        parked in the end. Returns how many were set aside."""
        assert batch.error is not None
        now = now_ms()
        found = 0
        for tid, (half_partition, _) in batch.real.items():
            if (tid in batch.outcome and batch.outcome[tid] is None) or tid in self._poison:
                continue
            reason = (
                f"the Kafka transaction it was in failed: {batch.error.str()} "
                f"({batch.error.name()})"
            )
            self._poison[tid] = _Poison(half_partition, 0, reason, now)
            found += 1
        if found:
            logger.warning(
                "%s: a Kafka transaction failed (%s) and no record is named: committing its "
                "%d commits on their own",
                self.name, batch.error.str(), found,
            )  # fmt: skip
        return found

    def _set_aside_lone_failures(self, batch: _Batch) -> None:
        """Transactions keep failing and nothing names a cause: if some real records of the
        batch were stored and others were not, the others are the odd ones out. They are
        committed on their own (retried for as long as it takes: nothing shows their failure
        is permanent), so the rest goes on."""
        stored = any(err is None for err in batch.outcome.values())
        purged = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)
        failed = {
            tid: err
            for tid, err in batch.outcome.items()
            if err is not None and err.code() not in purged
        }
        if not stored or not failed:
            return
        now = now_ms()
        for tid, err in failed.items():
            half_partition, real = batch.real[tid]
            if tid not in self._poison:
                reason = delivery_problem(real.kafka_topic, err)
                self._poison[tid] = _Poison(half_partition, 0, reason, now)
                logger.warning("transaction %s: %s; committing it on its own", tid, reason)

    # --- recovery -----------------------------------------------------------------------------
    def _recover(self, partitions: list[int]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        timeout_s = self.timeout_s
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == self._half}
        reader = new_consumer(
            self.config.client, reader_group("recovery", uuid.uuid4().hex[:12]), self.name,
            enable_partition_eof=True,
        )  # fmt: skip
        try:
            for p in partitions:
                try:
                    self._recover_partition(consumer, reader, p, p in assigned, timeout_s)
                except (KafkaException, KafkaClientError) as exc:
                    # E.g. a leader not elected yet: the partition stays to be recovered and
                    # is tried again on the next iteration.
                    logger.warning("%s: recovering HALF partition %d failed: %s", self.name, p, exc)
        finally:
            reader.close()

    def _recover_partition(
        self, consumer: Consumer, reader: Consumer, p: int, assigned: bool, timeout_s: float
    ) -> None:
        started = time.monotonic()
        if not assigned:
            self._to_recover.discard(p)
            return
        committed = consumer.committed([TopicPartition(self._half, p)], timeout_s)[0].offset
        low, high = consumer.get_watermark_offsets(TopicPartition(self._half, p), timeout_s)
        start = committed if committed >= 0 else low
        state = HalfPartition(p, self.policy, position=start, catch_up_offset=high)
        if start < high:
            self._load_decisions(reader, state, start)
        consumer.seek(TopicPartition(self._half, p, start if start >= 0 else OFFSET_BEGINNING))
        self._partitions[p] = state
        self._to_recover.discard(p)
        logger.info(
            "%s: HALF partition %d recovered in %.2f s: reading from %d (end %d), "
            "%d decisions loaded",
            self.name, p, time.monotonic() - started, start, high, state.decided_count,
        )  # fmt: skip

    def _load_decisions(self, reader: Consumer, state: HalfPartition, start: int) -> None:
        """Mark the transactions decided since the half message at ``start``."""
        # A read that times out raises: the recovery is tried again, never guessed (a guess
        # too recent misses decisions and commits them twice).
        first = read_record_at(
            reader, TopicPartition(self._half, state.partition, start), self.timeout_s
        )
        since_ms = (first.timestamp()[1] if first is not None else now_ms()) - _OP_SCAN_SLACK_MS
        tp = reader.offsets_for_times(
            [TopicPartition(self._op, state.partition, max(since_ms, 0))], self.timeout_s
        )[0]
        if tp.error is not None:
            # The lookup failed (e.g. a leader moving): read as "no decisions", it would apply
            # them again. The recovery is tried again instead.
            raise KafkaException(tp.error)
        if tp.offset < 0:
            return
        reader.assign([tp])
        deadline = time.monotonic() + self.timeout_s
        while True:
            record = reader.poll(0.2)
            if record is None:
                if time.monotonic() > deadline:
                    raise KafkaClientError(
                        f"OP partition {state.partition}: no record nor its end within "
                        f"{self.client.request_timeout_ms} ms"
                    )
                continue
            deadline = time.monotonic() + self.timeout_s
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                raise KafkaException(error)
            try:
                entry = OpEntry.decode(record.value())
            except WireFormatError as exc:
                self._undecodable_decision(state, record, exc)
                continue
            if entry.half_offset >= start:
                state.mark_decided(entry.transaction_id, entry.half_offset)

    def _undecodable_decision(self, state: HalfPartition, record: Any, exc: Exception) -> None:
        """An OP record this version cannot decode (a newer schema, during a rolling upgrade)
        still decides its transaction: its Kafka key is the transaction id. Which copy it
        names is unknown, so it counts for every copy read during this recovery."""
        key = record.key()
        if not key:
            logger.warning(
                "%s: OP record at %d of partition %d cannot be read and has no key (%s)",
                self.name, record.offset(), state.partition, exc,
            )  # fmt: skip
            return
        tid = key.decode("utf-8", "replace")
        state.mark_decided(tid, state.catch_up_offset)
        logger.warning(
            "%s: OP record at %d of partition %d cannot be read (%s); transaction %s counts "
            "as decided",
            self.name, record.offset(), state.partition, exc, tid,
        )  # fmt: skip


def assert_admin(admin: TopicAdmin | None) -> TopicAdmin:
    """The admin client, created in ``on_start``."""
    if admin is None:
        raise BridgeError("transaction service used before it started")
    return admin
