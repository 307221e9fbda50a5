"""Base of the coordinator services that consume, transform and produce in Kafka transactions,
and the rules they share about delivery errors and fencing."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from bridge.config import ClientConfig
from bridge.kafka.clients import new_admin, new_producer
from bridge.lifecycle import FatalServiceError, ServiceThread
from bridge.message import DELAY_PROPERTIES, MessageConst
from topics.catalog import TopicCatalog
from topics.naming import (
    coordinator_group,
    coordinator_group_instance_id,
    coordinator_transactional_id,
)

logger = logging.getLogger(__name__)

DELIVERY_ATTEMPTS: Final = "DELIVERY_ATTEMPTS"
"""Property: how many times delivering a message to its real topic failed so far (the same
name as ``MessageConst.DELIVERY_ATTEMPTS``); removed when it gets there."""
DELIVERY_ERROR: Final = "DELIVERY_ERROR"
"""Property: why the last delivery attempt failed (``MessageConst.DELIVERY_ERROR``)."""
MAX_DELIVERY_ERROR_CHARS: Final = 500
"""``DELIVERY_ERROR`` is cut to this many characters."""
REMOVED_ON_DELIVERY: Final = frozenset(
    {
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QUEUE_ID,
        *DELAY_PROPERTIES,
        DELIVERY_ATTEMPTS,
        DELIVERY_ERROR,
    }
)
"""Properties a delayed message loses when it reaches its real topic."""

_PERMANENT: Final = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        # Retriable for the broker, but in a delivery report librdkafka has already retried
        # for message.timeout.ms: the topic or partition is gone (deleted, never created).
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)
_NEVER_PERMANENT: Final = frozenset(
    {
        # What happened to the transaction or the client, not to one record.
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.INVALID_TXN_STATE,
        KafkaError._STATE,
        KafkaError._FATAL,
        KafkaError._INCONSISTENT,
        KafkaError._DESTROY,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        # Time and transport: the broker may come back.
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
    }
)


def is_permanent_delivery_error(err: KafkaError | None) -> bool:
    """True if a record's delivery failed for a reason that will not go away by retrying it
    (unknown topic or partition, authorization, record too large, invalid or internal
    topic), False for transient, transport, timeout, purge and fencing errors and for None.

    Meant for delivery reports and ``produce()`` errors of one record; the error a failed
    transaction raises names a record's problem only when such a report does.
    """
    if err is None:
        return False
    code = err.code()
    if code in _PERMANENT:
        return True
    if code in _NEVER_PERMANENT or err.fatal() or err.retriable():
        return False
    return code >= 0  # other broker errors that are not retriable; local ones are ours


WATCHDOG_GRACE_S: Final = 5.0
"""How long past its own timeout a transactional call may run before its producer is given up."""
MAX_STUCK_CALLS: Final = 8
"""Given-up calls still running in this process past which the process stops instead: each
holds a thread and a librdkafka instance, and a restart is safe by design."""
_REPLACE_BACKOFF_S: Final = 1.0
_stuck_lock = threading.Lock()
_stuck_calls = 0


class BoundedTransactions:
    """A transactional producer whose transaction calls return by their timeout, plus
    :data:`WATCHDOG_GRACE_S`.

    librdkafka's ``send_offsets_to_transaction`` can block past its timeout, for ever, once the
    coordinator it waits for is lost (a dropped connection, a broker gone from the metadata:
    confluentinc/librdkafka#5456 and #5511), and with it the service thread and every message
    the service moves. Each of these calls therefore runs on a thread of its own; one that
    has not returned in time raises a *fatal* ``_TIMED_OUT`` :class:`KafkaException`, and the
    producer counts as wedged: every later transactional call fails the same way at once.
    The service then replaces it (:meth:`TransactionalService.transaction_failed`): the new
    producer's ``init_transactions`` fences the wedged one and has the broker abort what it
    left open, and a commit whose outcome that leaves unknown is handled as any commit that
    timed out. The stuck call's thread ends whenever librdkafka lets go; until then it keeps the
    old producer alive, so it is never destroyed under a running call.

    Everything else (``produce``, ``poll``, ``flush``, ``list_topics``...) goes straight to
    the producer.
    """

    def __init__(self, producer: Any, name: str) -> None:
        self._producer = producer
        self._name = name
        self._wedged: str | None = None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._producer, attr)

    def __len__(self) -> int:
        return len(self._producer)

    def __bool__(self) -> bool:  # not len(): an empty queue is still a producer
        return True

    @property
    def wedged(self) -> str | None:
        """The call that never returned, once one did not; else None."""
        return self._wedged

    def init_transactions(self, timeout: float) -> None:
        """``Producer.init_transactions``, bounded; ``timeout`` in seconds."""
        self._bounded("init_transactions", timeout, timeout)

    def begin_transaction(self) -> None:
        """``Producer.begin_transaction`` (local: it never waits for the broker)."""
        if self._wedged is not None:
            raise self._wedged_error(self._wedged)
        self._producer.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        """``Producer.send_offsets_to_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("send_offsets_to_transaction", timeout, offsets, metadata, timeout)

    def commit_transaction(self, timeout: float) -> None:
        """``Producer.commit_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("commit_transaction", timeout, timeout)

    def abort_transaction(self, timeout: float) -> None:
        """``Producer.abort_transaction``, bounded; ``timeout`` in seconds."""
        self._bounded("abort_transaction", timeout, timeout)

    def _bounded(self, call: str, timeout_s: float, *args: Any) -> None:
        if self._wedged is not None:
            raise self._wedged_error(self._wedged)
        done = threading.Event()
        outcome: list[BaseException] = []
        producer = self._producer

        given_up = threading.Event()

        def run() -> None:
            global _stuck_calls  # noqa: PLW0603 - one count per process
            try:
                getattr(producer, call)(*args)
            except BaseException as exc:
                outcome.append(exc)
            finally:
                with _stuck_lock:
                    done.set()
                    if given_up.is_set():
                        _stuck_calls -= 1

        threading.Thread(target=run, name=f"{self._name}-{call}", daemon=True).start()
        limit_s = timeout_s + WATCHDOG_GRACE_S
        if not done.wait(limit_s):
            global _stuck_calls  # noqa: PLW0603 - one count per process
            with _stuck_lock:
                if not done.is_set():
                    given_up.set()
                    _stuck_calls += 1
                stuck = _stuck_calls
            if given_up.is_set():
                self._wedged = call
                logger.error(
                    "%s: %s did not return within %.0f s although its timeout is %.0f s; "
                    "giving this producer up (%d given-up calls still running)",
                    self._name, call, limit_s, timeout_s, stuck,
                )  # fmt: skip
                if stuck > MAX_STUCK_CALLS:
                    raise FatalServiceError(
                        f"{stuck} Kafka transaction calls did not return within their "
                        "timeout; stopping so that a restart frees their threads"
                    )
                raise self._wedged_error(call)
        if outcome:
            error = outcome.pop()  # no cycle through this frame keeps the producer alive
            raise error

    def _wedged_error(self, call: str) -> KafkaException:
        return KafkaException(
            KafkaError(
                KafkaError._TIMED_OUT,
                f"{call} did not return within its timeout plus {WATCHDOG_GRACE_S:.0f} s "
                "(the producer lost its transaction coordinator); the producer is replaced",
                fatal=True,
            )
        )


class DuplicateCoordinatorError(FatalServiceError):
    """Another running coordinator uses this coordinator's id: Kafka fenced this one."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What every coordinator service needs (see ``CoordinatorConfig``)."""

    client: ClientConfig
    catalog: TopicCatalog
    coordinator_id: str
    kafka_transaction_timeout_ms: int = 10_000
    """How long an unfinished Kafka transaction of a crashed coordinator blocks readers, ms."""
    session_timeout_ms: int = 10_000
    """How long a crashed coordinator keeps its partitions, ms."""
    delivery_attempts: int = 3
    """Deliveries of one message that fail for a permanent reason before it is moved aside."""
    delivery_backoff_ms: int = 1000
    """Wait before the second delivery attempt, ms; doubles for each further one."""


class TransactionalService(ServiceThread):
    """A service whose every batch is one Kafka transaction: its outputs and the offsets of the
    inputs they came from commit together, so a crash applies a batch completely or not at all.

    ``transactional_id`` should be stable per coordinator and service: a restarted process
    with the same id fences its predecessor and aborts what it left open. Two live processes
    with the same id would fence each other for ever; the one that finds the other holding
    its static group membership stops with :class:`DuplicateCoordinatorError` instead.
    """

    def __init__(self, kind: str, config: ServiceConfig) -> None:
        super().__init__(f"bridge-{kind}-{config.coordinator_id}", interval_ms=1)
        self.config = config
        self.client = config.client
        namespace = config.client.namespace
        self._transactional_id = coordinator_transactional_id(
            namespace, kind, config.coordinator_id
        )
        self.group_id = coordinator_group(namespace, kind)
        """The consumer group of this kind of service."""
        self.group_instance_id = coordinator_group_instance_id(config.coordinator_id, kind)
        """This service's static membership in :attr:`group_id`."""
        self._kafka_transaction_timeout_ms = config.kafka_transaction_timeout_ms
        self._consumer: Consumer | None = None
        self._producer: Any = None
        self._producer_broken = False
        self._replace_after = 0.0
        self._fencing_admin: AdminClient | None = None

    @property
    def timeout_s(self) -> float:
        """Bound on each Kafka call, seconds."""
        return self.client.request_timeout_ms / 1000

    def start_producer(self) -> None:
        """Create the transactional producer and register its id with the broker."""
        producer = new_producer(
            self.client,
            self.name,
            transactional_id=self._transactional_id,
            transaction_timeout_ms=self._kafka_transaction_timeout_ms,
            # librdkafka requires a message to time out within its transaction.
            message_timeout_ms=min(
                self.client.send_msg_timeout_ms, self._kafka_transaction_timeout_ms
            ),
            linger_ms=1,
        )
        bounded = BoundedTransactions(producer, self.name)
        bounded.init_transactions(self.timeout_s)
        self._producer = bounded
        self._producer_broken = False

    def on_stop(self) -> None:
        """Close the consumer and flush the producer (idempotent)."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(5)

    def transaction_failed(self, exc: KafkaException) -> None:
        """Abort the failed transaction, or replace a fenced or broken producer. The caller
        then re-reads its inputs from the committed offsets.

        Raises :class:`DuplicateCoordinatorError` when the fencing came from another
        coordinator running with this one's id (recreating the producer would fence it back).
        """
        error = exc.args[0] if exc.args else None
        logger.warning("%s: Kafka transaction failed (%s); re-reading", self.name, exc)
        if isinstance(error, KafkaError):
            self.check_fencing(error)
        fatal = isinstance(error, KafkaError) and error.fatal()
        if not fatal:
            try:
                self._producer.abort_transaction(self.timeout_s)
            except KafkaException:
                fatal = True
        if fatal:
            self._replace_producer()

    def _replace_producer(self) -> None:
        """Start a new producer in place of a fenced, broken or wedged one. When that fails
        too (the coordinator it needs is still unreachable), the producer stays marked broken
        and :meth:`producer_ready` keeps trying; this raises nothing else, so whoever called
        :meth:`transaction_failed` still does its own bookkeeping (rewind, rebuild); only a
        :class:`FatalServiceError` passes. After a failed try the next one waits
        :data:`_REPLACE_BACKOFF_S` (counted from the failure), so the rest of a pass fails
        fast rather than trying once per transaction."""
        if self._producer_broken and time.monotonic() < self._replace_after:
            return  # tried a moment ago
        try:
            self.start_producer()
        except FatalServiceError:
            raise
        except Exception as exc:
            logger.warning("%s: could not start a new producer yet: %s", self.name, exc)
            self._producer_broken = True
            self._replace_after = time.monotonic() + _REPLACE_BACKOFF_S

    def producer_ready(self) -> bool:
        """Call first in every iteration: True when the producer can be used. A producer that
        was given up (:class:`BoundedTransactions`) or could not be replaced is replaced here,
        and until that worked nothing else may run: a rebuild of state from the logs is only
        right once the new producer's ``init_transactions`` has completed or aborted what the
        old one left open. False (after a short wait) while it cannot be replaced."""
        producer = self._producer
        wedged = isinstance(producer, BoundedTransactions) and producer.wedged is not None
        if not (self._producer_broken or wedged):
            return True
        self._replace_producer()
        if self._producer_broken:
            self._stopped.wait(_REPLACE_BACKOFF_S)
            return False
        return True

    def check_fencing(self, error: KafkaError) -> None:
        """Raise :class:`DuplicateCoordinatorError` if ``error`` (from the producer or the
        consumer) means another live coordinator has this one's id.

        Static membership fenced (``FENCED_INSTANCE_ID``) is proof. A fenced producer is not:
        a transaction that outlived ``transaction.timeout.ms`` is fenced the same way, so the
        group is asked whether another member holds this service's instance id.
        """
        code = error.code()
        # librdkafka reports a fenced static member as a fatal consumer error (_FATAL).
        static_fenced = code == KafkaError._FATAL and "group.instance.id" in error.str()
        if code == KafkaError.FENCED_INSTANCE_ID or static_fenced:
            raise self._duplicate(error.str())
        if code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED) and self._membership_taken():
            raise self._duplicate(error.str())

    def _duplicate(self, detail: str) -> DuplicateCoordinatorError:
        return DuplicateCoordinatorError(
            f"another coordinator with coordinator_id {self.config.coordinator_id!r} is running "
            f"in namespace {self.client.namespace!r} and fenced {self.name} ({detail}); "
            "stopping this one: give every coordinator its own BRIDGE_COORDINATOR_ID"
        )

    def _membership_taken(self) -> bool:
        """True if another member of :attr:`group_id` holds :attr:`group_instance_id`."""
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            mine = consumer.memberid()
            if self._fencing_admin is None:
                self._fencing_admin = new_admin(self.client, f"{self.name}-fencing")
            futures = self._fencing_admin.describe_consumer_groups(
                [self.group_id], request_timeout=self.timeout_s
            )
            group = futures[self.group_id].result(timeout=self.timeout_s)
        except Exception as exc:  # unknown: assume not (a duplicate is found next time)
            logger.info("%s: could not describe group %s: %s", self.name, self.group_id, exc)
            return False
        return any(
            m.group_instance_id == self.group_instance_id and m.member_id != mine
            for m in group.members
        )
