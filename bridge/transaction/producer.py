"""``TransactionMQProducer``: half messages tied to a local transaction, with check-back.

``send_message_in_transaction`` stores a half message in the HALF topic (never visible on its
real topic), runs ``execute_local_transaction`` and writes the decision after the half
message; the coordinator applies it. Its two halves are public too, for RocketMQ 5's model
(``bridge.v5``: begin a transaction, send, commit or roll back later): ``send_half_message``
and ``end_transaction``. Undecided transactions are checked: the coordinator
writes a check request to the producer group's check topic, which every producer of the
group consumes as one Kafka consumer group, so each request reaches exactly one live member
(and a dead member's requests move to the others). Checks are answered on named threads
(RocketMQ's defaults: 1 thread, 2000 requests held). Every wait is bounded: a
``check_local_transaction`` that runs longer than ``check_timeout_ms`` gets a thread started
in its place, so the checks queued behind it go on; a hung one delays ``shutdown()`` by at
most its timeout, and an unanswered check is simply asked again by the coordinator at its
next check interval.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import count
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bridge.client.records import RecordBuilder, producer_settings
from bridge.client.send_results import SendStatus
from bridge.codec import PreparedRecord, decode_envelope, encode_envelope
from bridge.config import ClientConfig
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    KafkaClientError,
    WireFormatError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageConst, MessageExt, local_ipv4
from bridge.serialization import Serializer
from bridge.transaction.model import (
    CheckRequest,
    EndTransaction,
    TransactionListener,
    TransactionStatus,
)
from bridge.transaction.sender import HalfSender
from topics.catalog import SystemTopic, TopicCatalog
from topics.naming import transaction_check_group, validate_user_group

logger = logging.getLogger(__name__)

_HOLD_WAIT_S = 0.05
"""How long the check loop waits for a request, or for room in the check hold, before it
looks at the stop flag and the hung checks again, s."""
_ANSWERS_KEPT = 20_000
"""Answers of the last this many checks are kept: a check asked again is answered the same
way without a second call of ``check_local_transaction``."""
_COMMIT_INTERVAL_S = 1.0
"""The check consumer commits the offsets of the requests it took at most this often, s."""


@dataclass(slots=True)
class _RunningCheck:
    """A ``check_local_transaction`` call in progress on a check thread."""

    transaction_id: str
    check_times: int
    started_s: float
    """When it started, ``time.monotonic()`` s."""
    replaced: bool = False
    """Past ``check_timeout_ms``: another check thread was started in its place, and its
    place in the check hold released."""
    refused: bool = False
    """Past ``check_timeout_ms`` with no thread left to start (logged once)."""


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The outcome of ``send_message_in_transaction``.

    ``queue_id`` and ``offset`` locate the half message in the HALF topic (the real message's
    place is known once the coordinator commits it); ``local_transaction_state`` is what
    ``execute_local_transaction`` returned.
    """

    status: SendStatus
    msg_id: str
    transaction_id: str
    topic: str
    queue_id: int
    offset: int
    local_transaction_state: TransactionStatus


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """A half message stored and not decided yet (:meth:`TransactionMQProducer.send_half_message`),
    what :meth:`TransactionMQProducer.end_transaction` decides."""

    transaction_id: str
    """The transaction's id, also the message's id."""
    topic: str
    """The real topic the message goes to once committed."""
    half_partition: int
    """Where the half message waits: its HALF partition and offset."""
    half_offset: int
    message: MessageExt
    """The message as stored (as the listener and the check-back see it)."""


def _run_listener(what: str, call: Any, transaction_id: str) -> TransactionStatus:
    try:
        status = call()
    except Exception:
        logger.exception("transaction %s: %s raised; state is UNKNOWN", transaction_id, what)
        return TransactionStatus.UNKNOWN
    if not isinstance(status, TransactionStatus):
        logger.error(
            "transaction %s: %s returned %r, not a TransactionStatus; state is UNKNOWN",
            transaction_id,
            what,
            status,
        )
        return TransactionStatus.UNKNOWN
    return status


class TransactionMQProducer(Startable):
    """RocketMQ's transactional producer.

    ``TransactionMQProducer("group", listener, bootstrap_servers=...)``; ``start()``, then
    ``send_message_in_transaction(msg, arg)``; ``shutdown()`` (or use ``with``).
    ``kafka_config``, ``key_serializer`` and ``value_serializer`` as for
    :class:`bridge.Producer`: a message given ``value=`` is serialized (with its real topic)
    before its half message is stored, so the commit delivers those bytes and no
    coordinator needs the serializer.
    """

    def __init__(
        self,
        group: str,
        listener: TransactionListener | None,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        config: ClientConfig | None = None,
        check_thread_pool_size: int = 1,
        check_request_hold_max: int = 2000,
        check_topic_partitions: int = 4,
        session_timeout_ms: int = 10_000,
        check_timeout_ms: int = 30_000,
        kafka_config: Mapping[str, Any] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ) -> None:
        if isinstance(check_timeout_ms, bool) or not isinstance(check_timeout_ms, int):
            raise InvalidArgumentError(f"check_timeout_ms must be an int, got {check_timeout_ms!r}")
        if check_timeout_ms < 1:
            raise InvalidArgumentError(f"check_timeout_ms must be positive, got {check_timeout_ms}")
        if check_thread_pool_size < 1 or check_request_hold_max < 1 or check_topic_partitions < 1:
            raise InvalidArgumentError(
                "check_thread_pool_size, check_request_hold_max and check_topic_partitions "
                "must be positive"
            )
        if session_timeout_ms < 6000:
            raise InvalidArgumentError(
                "session_timeout_ms must be at least 6000 (Kafka's minimum), "
                f"got {session_timeout_ms}"
            )
        self.group = group
        self.listener = listener
        self.config, serializers = producer_settings(
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=None,
            config=config,
            kafka_config=kafka_config,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )
        # The check consumers' group is <namespace>.transaction-check.<group>: the group name
        # must not be one of the bridge's own.
        validate_user_group(group, self.config.namespace)
        self._sender = HalfSender(self.config, group)
        # Checks and builds each message (an explicit partition against the sender's
        # metadata); the half messages and end requests go through the sender.
        self._builder = RecordBuilder(self.config, serializers, self._sender.metadata)
        self.catalog = TopicCatalog(namespace=self.config.namespace)
        self.producer_id = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._check_pool_size = check_thread_pool_size
        self._check_hold = threading.BoundedSemaphore(check_request_hold_max)
        self._check_hold_max = check_request_hold_max
        self._check_timeout_ms = check_timeout_ms
        self._check_partitions = check_topic_partitions
        self._session_timeout_ms = session_timeout_ms
        self._lifecycle = Lifecycle(f"transaction producer {group}")
        self._stop = threading.Event()
        self._check_thread: threading.Thread | None = None
        # Checks are answered on daemon threads (_start_worker).
        self._check_queue: queue.SimpleQueue[tuple[str, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._checks_lock = threading.Condition()
        self._checks: dict[int, tuple[str, str]] = {}
        """Check number -> (transaction id, ``queued`` or ``running``), for each check taken
        and not answered yet."""
        self._check_numbers = count()
        self._answered: OrderedDict[tuple[str, int], TransactionStatus] = OrderedDict()
        """(transaction id, check number) -> the listener's answer, for the last
        :data:`_ANSWERS_KEPT` checks called."""
        self._answers_closed = False
        # The watchdog (run by the check loop): a check call past check_timeout_ms no longer
        # counts as one of the pool's threads; one more is started in its place, and a thread
        # stops again once the pool is back above its size.
        self._running: dict[int, _RunningCheck] = {}
        """Check number -> the call in progress, for each check a thread is answering."""
        self._workers_alive = 0
        """Check threads started and not stopped (hung ones included)."""
        self._replaced_running = 0
        """Calls still running that another thread was started in place of."""
        self._worker_names = count()
        self._half_topic = self.catalog.topic(SystemTopic.HALF)
        self._born_host = local_ipv4()

    def set_transaction_listener(self, listener: TransactionListener) -> None:
        """RocketMQ's ``setTransactionListener``; before ``start()``."""
        self.listener = listener

    def _require_listener(self) -> TransactionListener:
        listener = self.listener
        if listener is None or not (
            callable(getattr(listener, "execute_local_transaction", None))
            and callable(getattr(listener, "check_local_transaction", None))
        ):
            raise IllegalStateError(
                f"transaction producer {self.group} has no transaction listener "
                "(one with execute_local_transaction and check_local_transaction)"
            )
        return listener

    # --- lifecycle --------------------------------------------------------------------
    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._lifecycle.state

    def start(self) -> None:
        """Start sending and answering checks. Raises without a listener."""
        self._require_listener()
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            admin = TopicAdmin(self.config)
            admin.ensure_topics([self.catalog.check_topic_spec(self.group, self._check_partitions)])
            # Any HALF partition count works for writing; the coordinator owns that choice.
            admin.ensure_topics(
                [self.catalog.spec(SystemTopic.HALF), self.catalog.spec(SystemTopic.OP)],
                strict=False,
            )
            self._sender.start()
        except BaseException:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        with self._checks_lock:
            self._workers_alive += self._check_pool_size
        for _ in range(self._check_pool_size):
            self._start_worker()
        self._check_thread = threading.Thread(
            target=self._check_loop, name=f"bridge-txn-check-{self.group}", daemon=True
        )
        self._check_thread.start()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop taking check requests, wait at most ``timeout_ms`` (default
        ``send_msg_timeout_ms``) for the checks already taken to be answered, then at most as
        long again for pending sends, and stop. Idempotent.

        Checks still running or queued at the deadline are abandoned and logged (a hung
        ``check_local_transaction`` keeps its thread, a daemon, but no longer the caller); an
        answer that comes later is not sent. Nothing is lost: the coordinator asks an
        undecided transaction again at its next check interval, another producer of the group
        (or this one, restarted) answers.
        """
        if self._lifecycle.state is not ServiceState.RUNNING:
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        timeout = self.config.send_msg_timeout_ms if timeout_ms is None else timeout_ms
        if timeout < 0:
            raise InvalidArgumentError(f"timeout_ms must not be negative, got {timeout}")
        deadline = time.monotonic() + timeout / 1000
        self._stop.set()
        check_thread = self._check_thread
        if check_thread is not None:
            # It sees the stop flag within one poll or hold wait, then leaves its group.
            check_thread.join(max(deadline - time.monotonic(), 0) + 2 * _HOLD_WAIT_S)
            if check_thread.is_alive():
                logger.warning(
                    "transaction producer %s: the check consumer did not stop within %d ms; "
                    "left behind",
                    self.group,
                    timeout,
                )
        with self._checks_lock:
            self._checks_lock.wait_for(
                lambda: not self._checks, max(deadline - time.monotonic(), 0)
            )
            self._answers_closed = True
            abandoned = sorted(self._checks.values())
            workers = self._workers_alive
        for _ in range(workers):
            self._check_queue.put(None)  # idle workers stop; hung ones are daemons
        if abandoned:
            logger.warning(
                "transaction producer %s: shutdown abandoned %d unanswered checks after %d ms "
                "(%s); the coordinator asks again at its next check interval",
                self.group,
                len(abandoned),
                timeout,
                ", ".join(f"{tid} {state}" for tid, state in abandoned),
            )
        self._sender.shutdown(timeout)
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)

    def stop(self) -> None:
        """:meth:`shutdown` with the default timeout."""
        self.shutdown()

    # --- sending --------------------------------------------------------------------------
    def send_message_in_transaction(
        self, msg: Message, arg: Any = None, *, partition: int = -1
    ) -> TransactionSendResult:
        """Store ``msg`` as a half message, run the local transaction, send the decision.

        A delay level on ``msg`` is cleared (RocketMQ does not combine the two). ``partition``
        picks the real partition (-1: the key decides at commit). Raises
        :class:`IllegalStateError` without a listener, typed errors for bad messages.
        """
        listener = self._require_listener()
        self._lifecycle.require_running()
        half = self.send_half_message(msg, partition=partition)
        tid = half.transaction_id
        state = _run_listener(
            "execute_local_transaction",
            lambda: listener.execute_local_transaction(half.message, arg),
            tid,
        )
        self._end(tid, half.half_partition, state, from_check=False)
        return TransactionSendResult(
            SendStatus.SEND_OK, tid, tid, half.topic, half.half_partition, half.half_offset, state
        )

    def send_half_message(self, msg: Message, *, partition: int = -1) -> HalfMessage:
        """Store ``msg`` as a half message and return it, undecided: the first half of
        :meth:`send_message_in_transaction`, without the local transaction. Its transaction
        ends with :meth:`end_transaction`, or else through the coordinator's check-back, which
        this producer group's listener answers (RocketMQ 5's ``send`` within a transaction).

        A delay level on ``msg`` is cleared; ``partition`` picks the real partition (-1: the
        key decides at commit). Raises typed errors for bad messages (nothing stored), and
        :class:`~bridge.errors.SendError` when the half message was not stored
        (:class:`~bridge.errors.SendTimeoutError`: perhaps stored, then checked back).
        """
        self._lifecycle.require_running()
        given = msg
        # A value= object becomes its bytes (SerializationError: nothing stored, no
        # transaction begun); the half message and the listener's message carry them.
        msg = self._builder.serialized(msg)
        # Validates topic, body, size and the partition's range; assigns the id.
        prepared = self._builder.prepare(msg, partition)
        tid = prepared.msg_id
        props = dict(msg.wire_properties())
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        props.update(
            {
                MessageConst.TRANSACTION_PREPARED: "true",
                MessageConst.PRODUCER_GROUP: self.group,
                MessageConst.REAL_TOPIC: msg.topic,
                MessageConst.REAL_QUEUE_ID: str(partition),
                MessageConst.TRANSACTION_ID: tid,
                MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: tid,
            }
        )
        envelope = encode_envelope(
            tid, msg.body, props, prepared.born_timestamp_ms, self._born_host
        )
        half = PreparedRecord(
            self._half_topic, tid.encode(), envelope, [], tid, prepared.born_timestamp_ms
        )
        half_partition, half_offset = self._sender.send_sync(half, half.partition)
        logger.debug("transaction %s: half stored at %d@%d", tid, half_partition, half_offset)

        ext = decode_envelope(envelope, msg.topic)
        if given is not msg:  # the listener sees the objects it was given too
            ext._value, ext._key = given.value, given.key
        return HalfMessage(tid, msg.topic, half_partition, half_offset, ext)

    def end_transaction(self, half: HalfMessage, status: TransactionStatus) -> None:
        """Decide the transaction of ``half`` (from :meth:`send_half_message`): write the
        decision after the half message and wait until Kafka stored it (at most
        ``send_msg_timeout_ms``); the coordinator then applies it. A decision on a transaction
        decided already changes nothing (the first one the coordinator reads stands), and
        UNKNOWN leaves it to the check-back.

        Raises :class:`InvalidArgumentError` for a status that is not a
        :class:`TransactionStatus` and for a half message of another producer group (the
        coordinator takes a decision only from the group that sent the half message),
        :class:`IllegalStateError` unless running, and :class:`~bridge.errors.SendError`
        when the decision was not stored: the check-back decides then (or call again; after a
        :class:`~bridge.errors.SendTimeoutError` it may have been stored, so decide the same
        way again)."""
        if not isinstance(status, TransactionStatus):
            raise InvalidArgumentError(
                f"end_transaction takes a TransactionStatus, got {type(status).__name__}"
            )
        if not isinstance(half, HalfMessage):
            raise InvalidArgumentError(
                f"end_transaction takes the HalfMessage send_half_message returned, got "
                f"{type(half).__name__}"
            )
        sender_group = half.message.get_property(MessageConst.PRODUCER_GROUP)
        if sender_group and sender_group != self.group:
            raise InvalidArgumentError(
                f"end_transaction: transaction {half.transaction_id} was sent by producer group "
                f"{sender_group!r}, and this producer's group is {self.group!r}: the "
                "coordinator takes a decision only from the group that sent the half message, "
                "so decide it with a producer of that group"
            )
        self._lifecycle.require_running()
        record = self._end_record(half.transaction_id, status, from_check=False, check_times=0)
        self._sender.send_sync(record, half.half_partition)

    def _end_record(
        self, tid: str, status: TransactionStatus, *, from_check: bool, check_times: int
    ) -> PreparedRecord:
        """The HALF-topic record of a decision on transaction ``tid``."""
        end = EndTransaction(
            transaction_id=tid,
            msg_id=tid,
            producer_group=self.group,
            status=status,
            from_transaction_check=from_check,
            producer_id=self.producer_id,
            requested_at_ms=time.time_ns() // 1_000_000,
            check_times=check_times,
        )
        return PreparedRecord(
            self._half_topic, tid.encode(), end.encode(), [], tid, end.requested_at_ms
        )

    def _end(
        self,
        tid: str,
        half_partition: int,
        status: TransactionStatus,
        *,
        from_check: bool,
        check_times: int = 0,
    ) -> None:
        record = self._end_record(tid, status, from_check=from_check, check_times=check_times)

        def delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is not None:
                # Not lost: the coordinator checks the transaction back.
                logger.warning("transaction %s: end request not stored (%s)", tid, err.str())

        try:
            self._sender.send_async(record, half_partition, delivered)
        except (IllegalStateError, KafkaClientError) as exc:
            # A shutdown or a full queue after the local transaction ended: its outcome stands
            # and is not the caller's error (a retry would send a second message); the
            # coordinator checks the transaction back, as for an end request not stored.
            logger.warning("transaction %s: end request not sent (%s)", tid, exc)

    # --- check-back ---------------------------------------------------------------------------
    def _check_loop(self) -> None:
        """Take check requests while the check hold has room, and keep the group membership
        whatever the request rate: offsets are committed at most once per
        :data:`_COMMIT_INTERVAL_S` (one commit per storm of requests, not one a request:
        thousands of commits queued on the connection held back the heartbeats until the
        session timed out), and while the hold is full the partitions are paused and polled
        (a consumer that stops polling leaves its group)."""
        topic = self.catalog.check_topic(self.group)
        taken: dict[int, int] = {}
        """Partition -> the offset after the last request taken, not committed yet."""
        committed_at = time.monotonic()
        paused: list[TopicPartition] = []
        rewind: set[int] = set()
        """Partitions sought back (while paused) to a request read but not taken."""

        def commit(partitions: list[TopicPartition] | None = None) -> None:
            # Synchronous when partitions are named (revoked, or closing): their next owner
            # starts after what this member took.
            nonlocal committed_at
            committed_at = time.monotonic()
            wanted = [p.partition for p in partitions] if partitions is not None else list(taken)
            offsets = [TopicPartition(topic, p, taken.pop(p)) for p in wanted if p in taken]
            if not offsets:
                return
            try:
                if partitions is None:
                    consumer.commit(offsets=offsets, asynchronous=True)
                else:
                    consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                # Not lost: a request taken again is answered again (answers are idempotent),
                # and one never answered is asked again by the coordinator.
                logger.info("check consumer: offsets not committed (%s)", exc)

        def revoked(_: Any, partitions: list[TopicPartition]) -> None:
            nonlocal paused
            commit(partitions)
            paused = []  # a new assignment starts unpaused
            rewind.clear()

        def flow_control(call: Callable[[Any], None], partitions: Any) -> bool:
            # Pausing, seeking or resuming a partition revoked meanwhile raises: the loop goes
            # on (a request not taken is read by the partition's next owner, or asked again).
            try:
                call(partitions)
            except KafkaException as exc:
                logger.info("check consumer: %s of %s failed (%s)", call.__name__, partitions, exc)
                return False
            return True

        consumer = new_consumer(
            self.config,
            transaction_check_group(self.config.namespace, self.group),
            client_id=f"{self.group}-check",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(self._session_timeout_ms // 6, 500),
        )
        consumer.subscribe([topic], on_revoke=revoked, on_lost=revoked)
        try:
            while not self._stop.is_set():
                self._watch_checks()
                if time.monotonic() - committed_at >= _COMMIT_INTERVAL_S:
                    commit()
                if not self._check_hold.acquire(blocking=False):
                    # RocketMQ's checkRequestHoldMax: the hold is full (perhaps of checks
                    # behind a hung one). Requests wait in Kafka, for this member or another.
                    if not paused:
                        paused = consumer.assignment()
                        flow_control(consumer.pause, paused)
                    record = consumer.poll(_HOLD_WAIT_S)
                    partition = None if record is None else record.partition()
                    if record is not None and partition is not None and partition not in rewind:
                        # Read before the pause took effect: read again after it.
                        rewind.add(partition)
                        flow_control(
                            consumer.seek, TopicPartition(topic, partition, record.offset() or 0)
                        )
                    continue
                if paused:
                    if not flow_control(consumer.resume, paused):
                        # Whatever was not resumed, this member must not stay paused.
                        flow_control(consumer.resume, consumer.assignment())
                    paused, rewind = [], set()
                record = consumer.poll(_HOLD_WAIT_S)
                if record is None:
                    self._check_hold.release()
                    continue
                error = record.error()
                if error is not None:
                    self._check_hold.release()
                    if error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        logger.warning("check consumer: %s", error.str())
                    continue
                if not self._answer(record):
                    self._check_hold.release()
                taken[record.partition() or 0] = (record.offset() or 0) + 1
            commit(consumer.assignment())
        finally:
            consumer.close()

    def _answer(self, record: Any) -> bool:
        """Queue a check request for the check threads, in the place the caller took in the
        check hold; False when it is not queued (unreadable: its place is the caller's to
        release)."""
        try:
            request = CheckRequest.decode(record.value())
            msg = decode_envelope(request.message)
            # As RocketMQ's listener sees it: this check counted (the coordinator sends the
            # half message as stored).
            msg.put_system_property(MessageConst.TRANSACTION_CHECK_TIMES, str(request.check_times))
        except WireFormatError as exc:
            logger.error(
                "unreadable check request at %s@%d: %s", record.partition(), record.offset(), exc
            )
            return False
        listener = self._require_listener()
        tid = request.transaction_id

        number = next(self._check_numbers)

        def work() -> None:
            replaced = False  # then the watchdog released its place in the hold
            try:
                with self._checks_lock:
                    if self._answers_closed:
                        return
                    # One call per transaction at a time: the checks of a transaction whose
                    # call hangs would each take a thread (up to check_request_hold_max).
                    # Unanswered, it is asked again; the running call's answer still counts.
                    # A check asked again (its answer was late, or lost) is answered as
                    # before, without a second call.
                    before = self._answered.get((tid, request.check_times))
                    busy = next(
                        (r for r in self._running.values() if r.transaction_id == tid), None
                    )
                    if before is None and busy is None:
                        self._checks[number] = (tid, "running")
                        self._running[number] = _RunningCheck(
                            tid, request.check_times, time.monotonic()
                        )
                if before is not None:
                    logger.info(
                        "transaction %s: check %d asked again; answered %s again",
                        tid,
                        request.check_times,
                        before.value,
                    )
                    self._end(
                        tid,
                        request.half_partition,
                        before,
                        from_check=True,
                        check_times=request.check_times,
                    )
                    return
                if busy is not None:
                    # Asked, and still at it: UNKNOWN, so the check counts (a listener that
                    # never returns for it ends with the message parked, not checked for ever).
                    logger.warning(
                        "transaction %s: check %d not called, check %d of it still runs; "
                        "answered UNKNOWN",
                        tid,
                        request.check_times,
                        busy.check_times,
                    )
                    self._end(
                        tid,
                        request.half_partition,
                        TransactionStatus.UNKNOWN,
                        from_check=True,
                        check_times=request.check_times,
                    )
                    return
                status = _run_listener(
                    "check_local_transaction", lambda: listener.check_local_transaction(msg), tid
                )
                with self._checks_lock:
                    late = self._answers_closed
                    run = self._running.pop(number)
                    self._answered[(tid, request.check_times)] = status
                    if len(self._answered) > _ANSWERS_KEPT:
                        self._answered.popitem(last=False)
                    replaced = run.replaced
                    if replaced:
                        self._replaced_running -= 1
                if replaced:
                    logger.warning(
                        "transaction %s: check %d returned %s after %d ms, past "
                        "check_timeout_ms (%d)",
                        tid,
                        request.check_times,
                        status.value,
                        (time.monotonic() - run.started_s) * 1000,
                        self._check_timeout_ms,
                    )
                if late:
                    logger.info(
                        "transaction %s: check %d answered %s after shutdown; not sent, "
                        "the coordinator asks again",
                        tid,
                        request.check_times,
                        status.value,
                    )
                    return
                logger.info(
                    "transaction %s: check %d answered %s", tid, request.check_times, status.value
                )
                try:
                    self._end(
                        tid,
                        request.half_partition,
                        status,
                        from_check=True,
                        check_times=request.check_times,
                    )
                except IllegalStateError:  # shut down meanwhile (at the shutdown deadline)
                    logger.info("transaction %s: check answer not sent, shut down", tid)
            finally:
                with self._checks_lock:
                    left = self._running.pop(number, None)
                    if left is not None and left.replaced:  # raised past _run_listener
                        replaced = True
                        self._replaced_running -= 1
                    self._checks.pop(number, None)
                    self._checks_lock.notify_all()
                if not replaced:
                    self._check_hold.release()

        with self._checks_lock:
            self._checks[number] = (tid, "queued")
        self._check_queue.put((tid, work))
        return True

    def _start_worker(self) -> None:
        """Start a check thread the caller counted in ``_workers_alive`` already (uncounted
        again if it cannot start). A daemon: a listener that never returns must not keep the
        process alive after shutdown() gave up on it."""
        worker = threading.Thread(
            target=self._check_worker,
            name=f"bridge-txn-check-worker-{self.group}-{next(self._worker_names)}",
            daemon=True,
        )
        try:
            worker.start()
        except BaseException:
            with self._checks_lock:
                self._workers_alive -= 1
            raise

    def _watch_checks(self) -> None:
        """Give each check call running longer than ``check_timeout_ms`` a thread in its
        place, and its place in the check hold back, so the checks queued behind it go on
        (RocketMQ's hold counts the requests waiting for a thread): at most one thread per
        call, and never more than ``check_request_hold_max`` such threads in all. Run by the
        check loop (every 0.2 s at least); the call itself goes on, and its answer is sent if
        it returns."""
        now = time.monotonic()
        limit_s = self._check_timeout_ms / 1000
        hung: list[tuple[_RunningCheck, bool]] = []
        with self._checks_lock:
            if self._answers_closed:
                return
            for run in self._running.values():
                if run.replaced or now - run.started_s < limit_s:
                    continue
                extra = self._workers_alive - self._check_pool_size
                if extra >= self._check_hold_max:
                    # Looked at again on every pass: once extra threads end, it is replaced.
                    if not run.refused:  # logged once
                        run.refused = True
                        hung.append((run, False))
                    continue
                run.replaced = True
                self._check_hold.release()
                self._replaced_running += 1
                self._workers_alive += 1  # started below
                hung.append((run, True))
            if not hung:
                return
        for run, replace in hung:
            ran_ms = (now - run.started_s) * 1000
            if not replace:
                logger.error(
                    "transaction producer %s: transaction %s: check %d has run %d ms, past "
                    "check_timeout_ms (%d); no thread started in its place, %d already are "
                    "(check_request_hold_max)",
                    self.group,
                    run.transaction_id,
                    run.check_times,
                    ran_ms,
                    self._check_timeout_ms,
                    self._check_hold_max,
                )
                continue
            logger.error(
                "transaction producer %s: transaction %s: check %d has run %d ms, past "
                "check_timeout_ms (%d); another check thread is started in its place, its "
                "answer is still sent if it returns",
                self.group,
                run.transaction_id,
                run.check_times,
                ran_ms,
                self._check_timeout_ms,
            )
            try:
                self._start_worker()
            except RuntimeError:
                logger.exception("transaction producer %s: no check thread started", self.group)

    def _check_worker(self) -> None:
        while True:
            with self._checks_lock:
                # A thread started in place of a hung call stops once that call returned:
                # whichever thread finds the pool above its size (the one back from the
                # call, as a rule).
                if (
                    not self._answers_closed
                    and self._workers_alive > self._check_pool_size + self._replaced_running
                ):
                    self._workers_alive -= 1
                    return
            item = self._check_queue.get()
            if item is None:
                with self._checks_lock:
                    self._workers_alive -= 1
                return
            _, work = item
            try:
                work()
            except BaseException:
                # Never lose the worker, to a check's SystemExit either (RocketMQ's check
                # thread catches Throwable); the check is asked again.
                logger.exception("transaction producer %s: answering a check failed", self.group)
