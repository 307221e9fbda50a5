"""Base of the coordinator services that consume, transform and produce in Kafka
transactions (:class:`TransactionalService`): their producer, its replacement after a failure,
and how a service tells that another coordinator with its id fenced it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.config import ClientConfig
from bridge.errors import DuplicateCoordinatorError, MembershipLostError
from bridge.kafka.batch_writer import (
    TRANSACTION_FAILURES,
    Check,
    Refused,
    TransactionBatch,
    write_batch,
)
from bridge.kafka.clients import new_admin
from bridge.kafka.transactional import BoundedTransactions, transactional_producer
from bridge.lifecycle import FatalServiceError, ServiceThread
from bridge.observability.metrics import BridgeMetrics, active_metrics
from topics.catalog import TopicCatalog
from topics.naming import (
    coordinator_group,
    coordinator_group_instance_id,
    coordinator_transactional_id,
)

__all__ = [
    "DuplicateCoordinatorError",
    "MembershipLostError",
    "ServiceConfig",
    "TransactionalService",
]
"""The two errors are defined in :mod:`bridge.errors` and importable from here."""

logger = logging.getLogger(__name__)

_REPLACE_BACKOFF_S: Final = 1.0
"""Wait after a failed producer replacement before the next try, s."""
_RETRY_BACKOFF_MS: Final = 10
"""``retry.backoff.ms`` of a service's producer (librdkafka's default: 100), unless the
client's Kafka properties set it. A service begins its next Kafka transaction as soon as the
last one committed, so its partitions and offsets often reach the transaction coordinator while
the previous transaction's markers are still being written: the broker answers
``CONCURRENT_TRANSACTIONS`` and librdkafka asks again after this back-off. At 100 ms, that wait
was the largest part of a late timer's lateness (``send_offsets_to_transaction`` took 80-130 ms
in about one transaction in ten at 5,000 timers a second)."""
_REJOIN_SESSIONS: Final = 5
"""Session timeouts a service's consumer may stay out of its group after having been in it
before the service is renewed (:class:`MembershipLostError`)."""
_REJOIN_MIN_S: Final = 30.0
"""The least time a service's consumer may stay out of its group before the renewal, s."""
_ON_COMMIT_BATCHES: Final = 64
"""Batches whose :meth:`TransactionalService.on_commit` actions are kept until written; a
batch given up without a commit is forgotten once this many newer ones have actions."""


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
        self.kind = kind
        """The kind of service (``transaction``, ``schedule``, ``timer``): its metrics label."""
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
        self._joined_once = False
        self._out_since: float | None = None
        """When the consumer was first seen out of its group (monotonic s), None while in."""
        self._membership_seen = float("-inf")
        """When :meth:`check_membership` last looked (monotonic s)."""
        self._on_commit: dict[int, tuple[TransactionBatch, list[Callable[[], object]]]] = {}
        """id(batch) -> (batch, what to run once it commits), oldest first."""

    @property
    def timeout_s(self) -> float:
        """Bound on each Kafka call, seconds."""
        return self.client.request_timeout_ms / 1000

    def renewed(self) -> TransactionalService:
        """A new, not started service of this kind with the same settings and none of this
        one's state, to run in its place after :class:`MembershipLostError`. Raises
        :class:`NotImplementedError` where a subclass does not say how to build one."""
        raise NotImplementedError(f"{type(self).__name__} cannot be renewed")

    def start_producer(self) -> None:
        """Create the transactional producer and register its id with the broker."""
        self._producer = transactional_producer(
            self.client,
            self.name,
            self._transactional_id,
            self.timeout_s,
            transaction_timeout_ms=self._kafka_transaction_timeout_ms,
            # librdkafka requires a message to time out within its transaction.
            message_timeout_ms=min(
                self.client.send_msg_timeout_ms, self._kafka_transaction_timeout_ms
            ),
            linger_ms=1,
            **self.producer_overrides(),
        )
        self._producer_broken = False

    def producer_overrides(self) -> dict[str, Any]:
        """Producer settings a service sets beside the shared ones (keyword arguments of
        :func:`~bridge.kafka.transactional.transactional_producer`): by default
        :data:`_RETRY_BACKOFF_MS`, unless the client settings name ``retry.backoff.ms``."""
        if "retry.backoff.ms" in self.client.kafka:
            return {}
        return {"retry_backoff_ms": _RETRY_BACKOFF_MS}

    def write(
        self,
        batch: TransactionBatch,
        *,
        on_failure: Callable[[KafkaException], None] | None = None,
        offsets: Callable[[], list[TopicPartition]] | None = None,
        after_produce: Check | None = None,
        before_commit: Check | None = None,
        on_refused: Refused | None = None,
        failures: tuple[type[BaseException], ...] = TRANSACTION_FAILURES,
    ) -> bool:
        """Write ``batch`` in one Kafka transaction of this service's producer, with the
        ``offsets`` of its consumer's group (see :func:`~bridge.kafka.batch_writer.write_batch`);
        a failure goes to ``on_failure`` (default :meth:`transaction_failed`). True once
        committed."""
        consumer = self._consumer
        handler = self.transaction_failed if on_failure is None else on_failure

        def failed(exc: KafkaException) -> None:
            metrics = active_metrics()
            if metrics is not None:
                # A commit that failed in doubt may have completed: not an abort. Its
                # after-commit actions (metric counts) are dropped all the same, since the
                # bridge cannot tell; the in-doubt counter says how often that happened.
                counter = metrics.kafka_in_doubt if batch.in_doubt else metrics.kafka_aborts
                counter.labels(self.client.namespace, self.kind).inc()
            handler(exc)

        committed = write_batch(
            self._producer,
            batch,
            timeout_s=self.timeout_s,
            on_failure=failed,
            offsets=offsets,
            group_metadata=None if consumer is None else consumer.consumer_group_metadata,
            after_produce=after_produce,
            before_commit=before_commit,
            on_refused=on_refused,
            failures=failures,
        )
        if committed:
            self._run_on_commit(batch)
            metrics = active_metrics()
            if metrics is not None:
                metrics.kafka_transactions.labels(self.client.namespace, self.kind).inc()
        return committed

    def nothing_to_write(self, batch: TransactionBatch) -> None:
        """``batch`` needs no Kafka transaction (nothing in it to write, its offsets those
        committed last): run its :meth:`on_commit` actions now, as its commit would have. A
        decision set aside to be committed on its own leaves such a batch, and its count
        must not be lost with it."""
        self._run_on_commit(batch)

    def _run_on_commit(self, batch: TransactionBatch) -> None:
        entry = self._on_commit.pop(id(batch), None)
        if entry is not None and entry[0] is batch:
            for action in entry[1]:
                try:
                    action()
                except Exception:  # bookkeeping never fails a committed batch
                    logger.exception("%s: an action after a commit raised", self.name)

    def count(self, batch: TransactionBatch, record: Callable[[BridgeMetrics], object]) -> None:
        """While metrics are on, call ``record(metrics)`` once ``batch`` commits (see
        :meth:`on_commit`): ``svc.count(batch, lambda m: m.checks_sent.labels(...).inc())``."""
        metrics = active_metrics()
        if metrics is not None:
            self.on_commit(batch, lambda: record(metrics))

    def on_commit(self, batch: TransactionBatch, action: Callable[[], object]) -> None:
        """Run ``action`` (e.g. a metric's ``inc``) once ``batch`` commits through
        :meth:`write`, on this service's thread; never if it does not (a batch rebuilt after a
        failed transaction adds its own). So metrics count what Kafka committed, once."""
        entry = self._on_commit.get(id(batch))
        if entry is None or entry[0] is not batch:
            entry = (batch, [])
            self._on_commit[id(batch)] = entry
            while len(self._on_commit) > _ON_COMMIT_BATCHES:
                del self._on_commit[next(iter(self._on_commit))]
        entry[1].append(action)

    def joined(self) -> bool:
        """True while this service's consumer is a member of its group (it has a member id);
        safe to call from another thread (False when it cannot tell)."""
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            return bool(consumer.memberid())
        except Exception:  # closed meanwhile, or not joined yet
            return False

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
        old one left open. False (after a short wait) while it cannot be replaced.

        Also raises :class:`MembershipLostError` when the consumer has stayed out of its group
        too long (:meth:`check_membership`)."""
        self.check_membership(time.monotonic())
        producer = self._producer
        wedged = isinstance(producer, BoundedTransactions) and producer.wedged is not None
        if not (self._producer_broken or wedged):
            return True
        self._replace_producer()
        if self._producer_broken:
            self._stopped.wait(_REPLACE_BACKOFF_S)
            return False
        return True

    def check_membership(self, now: float) -> None:
        """Raise :class:`MembershipLostError` when this service's consumer, once a member of
        its group, has had no member id for :data:`_REJOIN_SESSIONS` session timeouts (at least
        :data:`_REJOIN_MIN_S`; ``now`` in monotonic seconds). librdkafka clears the member id
        when a session times out and rejoins; after a broker restart a consumer was seen never
        to get back in, polled and assigned nothing for minutes, while a fresh consumer with
        the same static membership joined at once. Looked at once a second. A consumer that
        never joined (a broker down since the start) is left to join: renewing it would not
        help."""
        if self._consumer is None or now - self._membership_seen < 1.0:
            return
        self._membership_seen = now
        if self.joined():
            self._joined_once = True
            self._out_since = None
            return
        if not self._joined_once:
            return
        if self._out_since is None:
            self._out_since = now
            return
        limit_s = max(_REJOIN_MIN_S, _REJOIN_SESSIONS * self.config.session_timeout_ms / 1000)
        if now - self._out_since >= limit_s:
            raise MembershipLostError(
                f"{self.name}: its consumer has not rejoined group {self.group_id} "
                f"in {now - self._out_since:.0f} s since it left it"
            )

    def check_fencing(self, error: KafkaError) -> None:
        """Raise :class:`DuplicateCoordinatorError` if ``error`` (from the producer or the
        consumer) means another live coordinator has this one's id.

        Static membership fenced (``FENCED_INSTANCE_ID``) is proof unless this service's own
        consumer gave the membership up first: then :class:`MembershipLostError` is raised
        instead. A fenced producer is not proof: a transaction that outlived
        ``transaction.timeout.ms`` is fenced the same way, so the group is asked whether
        another member holds this service's instance id.
        """
        code = error.code()
        # librdkafka reports a fenced static member as a fatal consumer error (_FATAL).
        static_fenced = code == KafkaError._FATAL and "group.instance.id" in error.str()
        if code == KafkaError.FENCED_INSTANCE_ID or static_fenced:
            if self._fenced_by_own_rejoin():
                raise MembershipLostError(
                    f"{self.name}: its consumer's group session expired and Kafka fenced a "
                    f"request sent under the old membership ({error.str()})"
                )
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
            holders = self._instance_holders()
        except Exception as exc:  # unknown: assume not (a duplicate is found next time)
            logger.info("%s: could not describe group %s: %s", self.name, self.group_id, exc)
            return False
        return any(holder != mine for holder in holders)

    def _fenced_by_own_rejoin(self) -> bool:
        """True if a static-membership fence hit this service's own stale membership: its
        consumer has no member id any more (librdkafka cleared it when the session timed
        out), or the member now holding the instance id is this consumer. A member id
        held by another member means another coordinator; so does not knowing."""
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            mine = consumer.memberid()
            if not mine:
                return True
            holders = self._instance_holders()
        except Exception as exc:
            logger.info("%s: could not tell who fenced it: %s", self.name, exc)
            return False
        return all(holder == mine for holder in holders)

    def _instance_holders(self) -> list[str]:
        """Member ids in :attr:`group_id` holding :attr:`group_instance_id` (at most one
        unless the group is changing). Raises what the admin client raises."""
        # describe_consumer_groups can abort the process when the group's coordinator comes
        # back mid-lookup (see bridge.coordinator.transaction.liveness); list_groups, which liveness
        # asks instead, does not give a member's group.instance.id. Asked once per fencing error.
        if self._fencing_admin is None:
            self._fencing_admin = new_admin(self.client, f"{self.name}-fencing")
        futures = self._fencing_admin.describe_consumer_groups(
            [self.group_id], request_timeout=self.timeout_s
        )
        group = futures[self.group_id].result(timeout=self.timeout_s)
        return [m.member_id for m in group.members if m.group_instance_id == self.group_instance_id]
