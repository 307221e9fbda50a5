"""The coordinator process: provisions the system topics and runs the services.

Services (end-transaction handling, check-back, delayed delivery, ...) are
:class:`~bridge.lifecycle.ServiceThread` instances registered with the coordinator; several
coordinator processes share the system topics' partitions through Kafka's group protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Self

from bridge.config import ALLOW_ALL, ClientConfig, TrustLimits
from bridge.coordinator.delay.service import ScheduleDeliveryService, TimerService
from bridge.coordinator.transaction.service import TransactionService
from bridge.coordinator.transaction.state import CheckPolicy
from bridge.errors import InvalidArgumentError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.service import ServiceConfig, TransactionalService
from bridge.lifecycle import FatalServiceError, Lifecycle, ServiceState, ServiceThread, Startable
from bridge.settings import env_values, require_int
from topics.catalog import DEFAULT_TRANSACTION_PARTITIONS, TopicCatalog

logger = logging.getLogger(__name__)

RENEWALS_ALLOWED = 3
"""Fresh services a coordinator runs in place of one service that lost its group membership
(:class:`MembershipLostError`) within :data:`RENEWAL_WINDOW_S`; one more stops it. Counted per
service: one broker restart can cost each service its membership once."""
RENEWAL_WINDOW_S = 600.0


def _default_coordinator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Settings of one coordinator process."""

    client: ClientConfig = field(default_factory=ClientConfig)
    """The Kafka connection and delay settings (``ClientConfig.from_env`` in ``from_env``)."""
    coordinator_id: str = field(default_factory=_default_coordinator_id)
    """Names this process in logs and Kafka client ids (default ``<host>-<pid>``); its services'
    static member ids and transactional ids derive from it, so a coordinator started again with
    the same id takes its partitions back at once."""
    transaction_partitions: int = DEFAULT_TRANSACTION_PARTITIONS
    """Partitions of the HALF and OP topics when the coordinator creates them (checked at
    start only: add partitions to both together, with the coordinators and transactional
    producers stopped)."""
    status_interval_ms: int = 60_000
    """How often the coordinator logs the state of its services, ms."""
    transaction_timeout_ms: int = 6_000
    """RocketMQ's ``transactionTimeOut``: a half message is first checked this long after its
    birth (unless its ``CHECK_IMMUNITY_TIME_IN_SECONDS`` says otherwise), ms."""
    check_interval_ms: int = 30_000
    """RocketMQ 5.2+'s ``transactionCheckInterval`` (4.x: 60 s), ms."""
    transaction_check_max: int = 15
    """RocketMQ's ``transactionCheckMax``: checks before a half message is parked."""
    file_reserved_time_ms: int = 72 * 3_600_000
    """RocketMQ's ``fileReservedTime``: older half messages are parked (after one check), ms."""
    session_timeout_ms: int = 10_000
    """Kafka's ``session.timeout.ms`` for the coordinator's consumers: how long a crashed
    coordinator keeps its partitions before the others take them over, ms (Kafka: 45 s). A
    stopped one's too (its consumers are static members, which do not leave their groups),
    unless a coordinator with the same ``coordinator_id`` starts again."""
    kafka_transaction_timeout_ms: int = 10_000
    """``transaction.timeout.ms`` of the coordinator's Kafka transactions: how long a crashed
    coordinator's unfinished transaction can hold readers back, ms (only the coordinator's
    transactions have one: it is no client property)."""
    delivery_attempts: int = 3
    """Deliveries of a committed or delayed message that its real topic refuses (missing,
    internal, partition out of range, too large, not authorized) before it is parked (a
    committed message) or quarantined (a delayed one)."""
    delivery_backoff_ms: int = 1000
    """Wait before the second such delivery attempt, ms; doubles for each further one."""
    allowed_topics: str = ALLOW_ALL
    """The real topics the coordinator may write, committed and delayed messages alike:
    comma-separated glob patterns over Kafka topic names (``orders,payments-*``; retry topics
    are ``<namespace>.RETRY.<group>``; a pattern with a character no Kafka topic name has, e.g.
    ``%RETRY%g``, is refused, naming the setting). A commit to another topic is parked, a
    delayed message quarantined, each with the reason; ``*`` (the default) allows every topic. See
    ``docs/trust-model.md``."""
    allowed_producer_groups: str = ALLOW_ALL
    """The producer groups whose half messages the coordinator checks (creating their check
    topic) and commits: comma-separated glob patterns. A half message of another group is never
    checked nor committed (a rollback is applied) and is parked at its first check time with
    the reason; ``*`` (the default) allows every group."""

    def __post_init__(self) -> None:
        if not self.coordinator_id:
            raise InvalidArgumentError("coordinator_id must not be empty")
        require_int("status_interval_ms", self.status_interval_ms)
        self.catalog  # noqa: B018 - validates the partition counts
        for name in (
            "transaction_timeout_ms",
            "check_interval_ms",
            "transaction_check_max",
            "file_reserved_time_ms",
            "kafka_transaction_timeout_ms",
            "session_timeout_ms",
            "delivery_attempts",
            "delivery_backoff_ms",
        ):
            require_int(name, getattr(self, name))
        self.trust_limits  # noqa: B018 - validates the patterns

    @property
    def trust_limits(self) -> TrustLimits:
        """The topics and producer groups the coordinator acts for (:attr:`allowed_topics`,
        :attr:`allowed_producer_groups`)."""
        return TrustLimits.parse(self.allowed_topics, self.allowed_producer_groups)

    @property
    def catalog(self) -> TopicCatalog:
        """The system topic catalog these settings describe."""
        return self.client.catalog(self.transaction_partitions)

    def with_client(self, client: ClientConfig) -> Self:
        """A copy using ``client``."""
        return dataclasses.replace(self, client=client)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """``ClientConfig.from_env`` plus ``BRIDGE_<FIELD>`` for each field here
        (``BRIDGE_COORDINATOR_ID``, ``BRIDGE_TRANSACTION_PARTITIONS``, ...)."""
        env = os.environ if environ is None else environ
        values = env_values(cls, env, lambda name: f"BRIDGE_{name.upper()}", skip=("client",))
        return cls(client=ClientConfig.from_env(env), **values)  # type: ignore[arg-type]


def check_policy(config: CoordinatorConfig) -> CheckPolicy:
    """The transaction check-back rules ``config`` gives: the checker's, and the operator
    views' that work out its next checks (``bridge transactions list``, the console)."""
    return CheckPolicy(
        transaction_timeout_ms=config.transaction_timeout_ms,
        check_interval_ms=config.check_interval_ms,
        transaction_check_max=config.transaction_check_max,
        file_reserved_time_ms=config.file_reserved_time_ms,
    )


def default_services(config: CoordinatorConfig) -> list[ServiceThread]:
    """The services a coordinator runs: end-transaction handling and check-back, delay levels
    and timers."""
    shared = ServiceConfig(
        client=config.client,
        catalog=config.catalog,
        coordinator_id=config.coordinator_id,
        kafka_transaction_timeout_ms=config.kafka_transaction_timeout_ms,
        session_timeout_ms=config.session_timeout_ms,
        delivery_attempts=config.delivery_attempts,
        delivery_backoff_ms=config.delivery_backoff_ms,
    )
    policy = check_policy(config)
    limits = config.trust_limits
    return [
        TransactionService(shared, policy, limits=limits),
        ScheduleDeliveryService(shared, allowed_topics=limits.topics),
        TimerService(shared, allowed_topics=limits.topics),
    ]


class _StatusService(ServiceThread):
    def __init__(self, coordinator: Coordinator, interval_ms: int) -> None:
        super().__init__(
            f"bridge-coordinator-status-{coordinator.config.coordinator_id}", interval_ms
        )
        self._coordinator = coordinator

    def run_once(self) -> None:
        states = {s.name: s.state.value for s in self._coordinator.services}
        logger.info("coordinator %s: services %s", self._coordinator.config.coordinator_id, states)


class Coordinator(Startable):
    """Provisions the system topics, then runs its services until stopped.

    ``with Coordinator(CoordinatorConfig.from_env(), services) as c: c.run_until(stop)``.

    A service that cannot go on (e.g. fenced by another coordinator started with the same
    ``coordinator_id``) stops the whole coordinator: :attr:`failure` says why, :meth:`wait`
    returns and :meth:`run_until` raises it. A service whose own consumer lost its group
    membership (a broker restart or a stall past the session timeout) is replaced by a fresh
    one instead, up to :data:`RENEWALS_ALLOWED` times a service in :data:`RENEWAL_WINDOW_S`.
    """

    def __init__(
        self, config: CoordinatorConfig, services: Sequence[ServiceThread] | None = None
    ) -> None:
        self.config = config
        self.services: list[ServiceThread] = (
            list(services) if services is not None else default_services(config)
        )
        self._lifecycle = Lifecycle(f"coordinator {config.coordinator_id}")
        self._status = _StatusService(self, config.status_interval_ms)
        self._stopped = threading.Event()
        self._failure: FatalServiceError | None = None
        self._transition_lock = threading.Lock()
        """Held while starting or stopping: a failing service's stop waits for start."""
        self._renewals: dict[str, deque[float]] = {}
        """Service name -> when it was last renewed (monotonic s), the oldest first."""
        for service in self.services:
            service.add_failure_listener(self._service_failed)

    @property
    def state(self) -> ServiceState:
        """The coordinator's lifecycle state."""
        return self._lifecycle.state

    @property
    def failure(self) -> FatalServiceError | None:
        """Why the coordinator stopped by itself (a service failed), or None."""
        return self._failure

    def _service_failed(self, service: ServiceThread, error: FatalServiceError) -> None:
        # Called on the failed service's thread: whatever takes the transition lock (a stop
        # holds it while it joins this very thread) runs on a thread of its own.
        # Retriable (its consumer lost its group membership): a fresh service may go on.
        if error.retriable and isinstance(service, TransactionalService):
            threading.Thread(
                target=self._renew,
                args=(service, error),
                name=f"bridge-coordinator-renew-{self.config.coordinator_id}",
            ).start()
            return
        self._stop_for(service, error)

    def _stop_for(self, service: ServiceThread, error: FatalServiceError) -> None:
        if self._failure is None:
            self._failure = error
        logger.error(
            "coordinator %s: service %s failed, stopping every service: %s",
            self.config.coordinator_id,
            service.name,
            error,
        )
        # Not on the failed service's thread: stopping joins the other services' threads.
        threading.Thread(
            target=self.stop, name=f"bridge-coordinator-stop-{self.config.coordinator_id}"
        ).start()

    def _renewal_allowed(self, name: str) -> bool:
        """Count a renewal of service ``name`` if fewer than :data:`RENEWALS_ALLOWED` of it
        happened in the last :data:`RENEWAL_WINDOW_S`. Call with the transition lock held."""
        now = time.monotonic()
        renewals = self._renewals.setdefault(name, deque())
        while renewals and now - renewals[0] > RENEWAL_WINDOW_S:
            renewals.popleft()
        if len(renewals) >= RENEWALS_ALLOWED:
            return False
        renewals.append(now)
        return True

    def _renew(self, old: TransactionalService, error: FatalServiceError) -> None:
        """Run a fresh service in place of ``old`` (whose thread is ending), or stop the
        coordinator once renewals are used up. The new producer's ``init_transactions`` aborts
        what ``old`` left open; its consumer joins with the same static membership and
        recovers its partitions from the committed offsets."""
        try:
            with self._transition_lock:
                if self._lifecycle.state is not ServiceState.RUNNING:
                    return
                if not self._renewal_allowed(old.name):
                    failure: FatalServiceError | None = error
                else:
                    failure = None
                    logger.warning(
                        "coordinator %s: service %s lost its group membership; starting it "
                        "afresh: %s",
                        self.config.coordinator_id,
                        old.name,
                        error,
                    )
                    old.stop()
                    new = old.renewed()
                    new.add_failure_listener(self._service_failed)
                    self.services[self.services.index(old)] = new
                    new.start()
        except Exception as exc:
            logger.exception(
                "coordinator %s: could not renew %s", self.config.coordinator_id, old.name
            )
            failure = FatalServiceError(f"could not start {old.name} again: {exc}")
        if failure is not None:
            self._stop_for(old, failure)

    def start(self) -> None:
        """Create missing system topics and start every service."""
        with self._transition_lock:
            self._start()

    def _start(self) -> None:
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            created = TopicAdmin(self.config.client).ensure_system_topics(self.config.catalog)
            logger.info(
                "coordinator %s: system topics ready (%d created) in namespace %s",
                self.config.coordinator_id,
                len(created),
                self.config.client.namespace,
            )
            limits = self.config.trust_limits
            if not (limits.topics.allows_all and limits.producer_groups.allows_all):
                logger.info(
                    "coordinator %s: writes to topics %s only, for producer groups %s only",
                    self.config.coordinator_id,
                    limits.topics,
                    limits.producer_groups,
                )
            for service in self.services:
                service.start()
            self._status.start()
        except BaseException:
            self._stop_services()
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            self._stopped.set()
            raise
        logger.info(
            "coordinator %s started with %d services",
            self.config.coordinator_id,
            len(self.services),
        )

    def _stop_services(self) -> None:
        for service in reversed(self.services):
            if service.state is ServiceState.RUNNING:
                service.stop()
        if self._status.state is ServiceState.RUNNING:
            self._status.stop()

    def stop(self) -> None:
        """Stop every service (in reverse start order). Idempotent and thread-safe."""
        with self._transition_lock:
            if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
                return
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            self._stop_services()
            self._stopped.set()
        if self._failure is not None:
            logger.error("coordinator %s stopped: %s", self.config.coordinator_id, self._failure)
        else:
            logger.info("coordinator %s stopped", self.config.coordinator_id)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stopped (or ``timeout_s`` passes); True if stopped."""
        return self._stopped.wait(timeout_s)

    def run_until(self, stop: threading.Event, poll_s: float = 0.2) -> None:
        """Block until ``stop`` is set (e.g. by a signal handler) or the coordinator stopped;
        raise :attr:`failure` if it stopped because a service failed."""
        while not stop.wait(poll_s) and not self._stopped.is_set():
            pass
        if self._failure is not None:
            raise self._failure
