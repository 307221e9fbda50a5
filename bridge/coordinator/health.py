"""Is a coordinator running? From outside (:func:`coordinator_health`, ``bridge health``): each
of its services is a member of a Kafka consumer group, and the stack is healthy when every
group has a member and is not rebalancing. From inside (:func:`serve_coordinator_metrics`,
``bridge coordinator --metrics-port``): an HTTP endpoint with ``/healthz``, ``/readyz`` and the
coordinator's Prometheus metrics."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import TopicPartition

from bridge.config import ClientConfig
from bridge.coordinator.coordinator import Coordinator
from bridge.coordinator.transaction.service import TransactionService
from bridge.delay_policy import partition_slot
from bridge.errors import BrokerUnreachableError
from bridge.kafka.clients import new_admin, new_consumer
from bridge.kafka.service import TransactionalService
from bridge.lifecycle import ServiceState, ServiceThread
from bridge.message import now_ms
from bridge.observability import (
    DEFAULT_METRICS_HOST,
    BridgeMetrics,
    HealthReport,
    MetricsServer,
    enable_metrics,
)
from bridge.observability.server import WsgiApp
from topics.catalog import SystemTopic
from topics.naming import COORDINATOR_SERVICE_KINDS, coordinator_group

logger = logging.getLogger(__name__)

SERVICE_KINDS = COORDINATOR_SERVICE_KINDS

DELAY_REFRESH_S: Final = 5.0
"""How old the per-level and per-tier waiting counts may be at a scrape, seconds (each
refresh asks Kafka for the committed offsets and the ends of the delay partitions)."""


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """One coordinator service's consumer group."""

    kind: str
    group: str
    state: str
    """Kafka's group state (``STABLE``, ``EMPTY``, ``PREPARING_REBALANCE``, ...)."""
    members: int

    @property
    def healthy(self) -> bool:
        """At least one member and a stable group."""
        return self.members > 0 and self.state == "STABLE"


def coordinator_health(config: ClientConfig) -> list[ServiceHealth]:
    """The group of every coordinator service of ``config.namespace``. Raises
    :class:`BrokerUnreachableError` if Kafka does not answer within ``request_timeout_ms``."""
    groups = {kind: coordinator_group(config.namespace, kind) for kind in SERVICE_KINDS}
    timeout_s = config.request_timeout_ms / 1000
    admin = new_admin(config, "bridge-health")
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception as exc:
        raise BrokerUnreachableError(f"Kafka at {config.bootstrap_servers}: {exc}") from exc
    futures = admin.describe_consumer_groups(list(groups.values()), request_timeout=timeout_s)
    out = []
    for kind, group in groups.items():
        try:
            described = futures[group].result(timeout=timeout_s)
        except Exception as exc:  # a group that never existed cannot be described
            out.append(ServiceHealth(kind, group, f"UNKNOWN ({exc})", 0))
            continue
        state = getattr(described.state, "name", str(described.state))
        out.append(ServiceHealth(kind, group, state, len(described.members)))
    return out


def _service_kind(service: ServiceThread) -> str:
    return service.kind if isinstance(service, TransactionalService) else service.name


def _service_ready(service: ServiceThread) -> bool:
    """Running and, for a Kafka service, a member of its consumer group."""
    if service.state is not ServiceState.RUNNING or service.failure is not None:
        return False
    return not isinstance(service, TransactionalService) or service.joined()


def coordinator_report(coordinator: Coordinator) -> HealthReport:
    """The health of a coordinator in this process: alive unless it or one of its services
    failed; ready while it runs and every service runs and has joined its group."""
    services = list(coordinator.services)
    failure = coordinator.failure or next(
        (s.failure for s in services if s.failure is not None), None
    )
    states = {
        _service_kind(s): {"state": s.state.value, "ready": _service_ready(s)} for s in services
    }
    ready = coordinator.state is ServiceState.RUNNING and all(
        entry["ready"] for entry in states.values()
    )
    details: dict[str, Any] = {
        "coordinator": coordinator.config.coordinator_id,
        "namespace": coordinator.config.client.namespace,
        "state": coordinator.state.value,
        "services": states,
    }
    if failure is not None:
        details["failure"] = str(failure)
    return HealthReport(alive=failure is None, ready=ready, details=details)


class CoordinatorGauges:
    """Sets the gauges read from a running coordinator: undecided transactions and the age of
    the oldest, services up, and (at most every :data:`DELAY_REFRESH_S`) what waits per delay
    level and timer tier. Call :meth:`refresh` before each scrape; :meth:`close` when done."""

    def __init__(
        self,
        coordinator: Coordinator,
        metrics: BridgeMetrics,
        delay_refresh_s: float = DELAY_REFRESH_S,
    ) -> None:
        self._coordinator = coordinator
        self._metrics = metrics
        self._delay_refresh_s = delay_refresh_s
        self._namespace = coordinator.config.client.namespace
        self._lock = threading.Lock()
        self._last_delay = -float("inf")
        self._readers: dict[str, Any] = {}
        """A consumer per delay service kind, reading its group's committed offsets."""

    def refresh(self) -> None:
        """Update every gauge (thread-safe: scrapes may overlap)."""
        with self._lock:
            self._refresh_services()
            if time.monotonic() - self._last_delay >= self._delay_refresh_s:
                self._last_delay = time.monotonic()
                try:
                    self._refresh_delays()
                except Exception:
                    logger.warning("delay gauges not updated", exc_info=True)

    def _refresh_services(self) -> None:
        metrics, ns = self._metrics, self._namespace
        undecided, oldest_born = 0, None
        for service in list(self._coordinator.services):
            metrics.service_up.labels(ns, _service_kind(service)).set(
                1 if _service_ready(service) else 0
            )
            if isinstance(service, TransactionService):
                count, born = _undecided(service)
                undecided += count
                if born is not None:
                    oldest_born = born if oldest_born is None else min(oldest_born, born)
        metrics.half_messages.labels(ns).set(undecided)
        age_s = 0.0 if oldest_born is None else max(now_ms() - oldest_born, 0) / 1000
        metrics.oldest_undecided_age.labels(ns).set(age_s)

    def _refresh_delays(self) -> None:
        config = self._coordinator.config
        client = config.client
        policy = client.delay_policy
        timeout_s = client.request_timeout_ms / 1000
        for kind, system, count, label in (
            ("schedule", SystemTopic.SCHEDULE, policy.level_count, "level"),
            ("timer", SystemTopic.TIMER, policy.tier_count, "tier"),
        ):
            reader = self._readers.get(kind)
            if reader is None:
                reader = new_consumer(
                    client,
                    coordinator_group(self._namespace, kind),
                    f"bridge-metrics-{kind}-{uuid.uuid4().hex[:6]}",
                )
                self._readers[kind] = reader
            topic = config.catalog.topic(system)
            # Every partition of the topic: a level or tier has several (and an older
            # layout's topic fewer), each serving the slot its number says.
            info = reader.list_topics(topic, timeout=timeout_s).topics.get(topic)
            partitions = len(info.partitions) if info is not None and info.partitions else count
            committed = reader.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout_s
            )
            waiting = [0] * count
            for tp in committed:
                low, high = reader.get_watermark_offsets(tp, timeout=timeout_s)
                start = tp.offset if tp.offset >= 0 else low
                waiting[partition_slot(tp.partition, count)] += max(high - start, 0)
            for slot, pending in enumerate(waiting):
                index = slot + 1 if label == "level" else slot
                self._metrics.delay_waiting.labels(self._namespace, label, str(index)).set(pending)

    def close(self) -> None:
        """Close the Kafka consumers (idempotent)."""
        with self._lock:
            readers, self._readers = self._readers, {}
        for reader in readers.values():
            try:
                reader.close()
            except Exception:
                logger.debug("closing a metrics reader", exc_info=True)


def _undecided(service: TransactionService) -> tuple[int, int | None]:
    """How many transactions ``service`` holds undecided, and the birth (epoch ms) of the
    oldest. Read from another thread: a partition changing meanwhile is read again."""
    for _ in range(3):
        try:
            count, oldest = 0, None
            for state in list(service._partitions.values()):
                for pending in list(state.pending.values()):
                    count += 1
                    if oldest is None or pending.born_ms < oldest:
                        oldest = pending.born_ms
            return count, oldest
        except RuntimeError:  # a dict changed size while read
            continue
    return 0, None


class CoordinatorEndpoint:
    """The HTTP endpoint of a coordinator: ``/metrics``, ``/healthz``, ``/readyz``. Made by
    :func:`serve_coordinator_metrics`; :meth:`stop` ends it."""

    def __init__(self, server: MetricsServer, gauges: CoordinatorGauges) -> None:
        self.server = server
        self.gauges = gauges

    @property
    def port(self) -> int:
        """The port served."""
        return self.server.port

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return self.server.url

    def stop(self) -> None:
        """Stop serving and close the Kafka consumers of the gauges (idempotent)."""
        self.server.stop()
        self.gauges.close()

    def __enter__(self) -> CoordinatorEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_coordinator_metrics(
    coordinator: Coordinator,
    port: int,
    *,
    host: str = DEFAULT_METRICS_HOST,
    delay_refresh_s: float = DELAY_REFRESH_S,
    app: WsgiApp | None = None,
) -> CoordinatorEndpoint:
    """Turn metrics on in this process (:func:`~bridge.observability.enable_metrics`) and serve
    them with the coordinator's health on ``host:port`` (0: a free port), and ``app`` (the
    operator console, ``bridge coordinator --console``) on every other path. Start it before
    or after the coordinator: ``/readyz`` answers 503 until every service has joined its
    group. Raises :class:`~bridge.errors.InvalidArgumentError` if the port cannot be bound."""
    metrics = enable_metrics(namespace=coordinator.config.client.namespace)
    gauges = CoordinatorGauges(coordinator, metrics, delay_refresh_s)
    server = MetricsServer(
        metrics.registry,
        port,
        host=host,
        health=lambda: coordinator_report(coordinator),
        before_scrape=gauges.refresh,
        app=app,
    )
    server.start()
    return CoordinatorEndpoint(server, gauges)
