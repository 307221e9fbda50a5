"""The bridge's Prometheus metrics: one :class:`BridgeMetrics` per registry.

Names follow RocketMQ 5's metrics where RocketMQ has one (``rocketmq_messages_in_total``,
``rocketmq_send_cost_time``, ``rocketmq_process_time``, ``rocketmq_half_messages``, ...; with
RocketMQ's units, milliseconds, and histogram buckets), and Prometheus conventions (``bridge_``
prefix, base units such as seconds, ``_total`` counters) for the rest.
``docs/observability.md`` lists them.

Recording is opt-in per process: :func:`enable_metrics` makes a :class:`BridgeMetrics` the
process's active one, and the instrumented code asks :func:`active_metrics` (None while
disabled, so a disabled process pays one global read per event).
"""

from __future__ import annotations

import threading
import weakref
from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.registry import Collector

from topics.catalog import SystemTopic

SEND_COST_BUCKETS_MS: Final = (1.0, 5.0, 10.0, 20.0, 50.0, 200.0, 500.0)
"""RocketMQ 5's buckets of ``rocketmq_send_cost_time``, ms (then +Inf)."""
PROCESS_TIME_BUCKETS_MS: Final = (1.0, 5.0, 10.0, 100.0, 10_000.0, 60_000.0)
"""RocketMQ 5's buckets of ``rocketmq_process_time``, ms (then +Inf)."""
FINISH_LATENCY_BUCKETS_MS: Final = (
    100.0, 1_000.0, 5_000.0, 10_000.0, 30_000.0, 60_000.0, 300_000.0, 1_800_000.0, 3_600_000.0,
)  # fmt: skip
"""Buckets of the time from a half message's send to its decision being applied, ms."""
LATENESS_BUCKETS_S: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Buckets of how late a delayed message reached its topic, s."""

MESSAGE_TYPE_NORMAL: Final = "normal"
MESSAGE_TYPE_DELAY: Final = "delay"
MESSAGE_TYPE_TRANSACTION: Final = "transaction"

_TRANSACTION_SUFFIX: Final = "." + SystemTopic.HALF.value
_DELAY_SUFFIXES: Final = ("." + SystemTopic.SCHEDULE.value, "." + SystemTopic.TIMER.value)


def message_type(kafka_topic: str) -> str:
    """RocketMQ's ``message_type`` label of a record written to ``kafka_topic``: a HALF
    record is a transaction message, a SCHEDULE or timer record a delay message."""
    if kafka_topic.endswith(_TRANSACTION_SUFFIX):
        return MESSAGE_TYPE_TRANSACTION
    if kafka_topic.endswith(_DELAY_SUFFIXES):
        return MESSAGE_TYPE_DELAY
    return MESSAGE_TYPE_NORMAL


class BridgeMetrics:
    """Every metric the bridge records, registered in :attr:`registry`.

    ``namespace`` is the label value of the client metrics (producers, push consumers) of
    this process; coordinator metrics carry their own coordinator's namespace.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "rmq",
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.namespace = namespace
        r = self.registry
        if process_metrics and registry is None:
            # A registry of our own: add the process figures prometheus_client's default
            # registry has (memory, CPU, open files, GC).
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                r.register(collector)

        # --- producers (RocketMQ's client metrics) -------------------------------------
        self.messages_in = Counter(
            "rocketmq_messages_in",
            "Messages the producers of this process stored in Kafka (acknowledged), counted "
            "from the delivery reports.",
            ["namespace", "topic", "message_type"],
            registry=r,
        )
        self.throughput_in = Counter(
            "rocketmq_throughput_in",
            "Bytes of the record values the producers of this process stored in Kafka.",
            ["namespace", "topic", "message_type"],
            registry=r,
        )
        self.recalls = Counter(
            "bridge_recalls",
            "recall_message calls of the producers of this process by outcome: recalled (the "
            "message is never delivered) or too_late (it is delivered, or was).",
            ["namespace", "outcome"],
            registry=r,
        )
        self.send_cost = Histogram(
            "rocketmq_send_cost_time",
            "Time from a sync or async send to its acknowledgement or failure, ms; a message sent "
            "again alone after the broker refused its request batch is one sample, from its first "
            "send to its last outcome.",
            ["namespace", "topic", "invocation_status"],
            buckets=SEND_COST_BUCKETS_MS,
            registry=r,
        )
        # --- push consumers ------------------------------------------------------------
        self.messages_out = Counter(
            "rocketmq_messages_out",
            "Messages a push consumer's listener consumed successfully.",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.consume_failures = Counter(
            "bridge_consumer_failures",
            "Messages a push consumer's listener failed (a failure status, an exception, a "
            "timeout).",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.process_time = Histogram(
            "rocketmq_process_time",
            "Time a push consumer's listener took per call, ms.",
            ["namespace", "topic", "consumer_group", "invocation_status"],
            buckets=PROCESS_TIME_BUCKETS_MS,
            registry=r,
        )
        self.retries = Counter(
            "bridge_retry_messages",
            "Failed messages sent back to the group's %RETRY% topic.",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.dead_letters = Counter(
            "rocketmq_send_to_dlq_messages",
            "Messages sent to the group's %DLQ% topic (retries spent).",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.local_retries = Counter(
            "bridge_consumer_local_retries",
            "Messages consumed again locally because their send-back could not be written.",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.dropped = Counter(
            "bridge_consumer_dropped_messages",
            "Failed messages dropped (BROADCASTING consumers do not retry).",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.filtered = Counter(
            "bridge_consumer_filtered_messages",
            "Messages skipped by the subscription's tag filter.",
            ["namespace", "consumer_group"],
            registry=r,
        )
        self.quarantined = Counter(
            "bridge_quarantined_messages",
            "Records moved to the QUARANTINE topic. source=consumer: undecodable records, "
            "copies that could not be built or were refused for good; source=delay "
            "(coordinator): delayed messages their topic refused delivery_attempts times, "
            "malformed ones, topics not allowed; source=transaction (coordinator): malformed "
            "HALF records, conflicting half messages.",
            ["namespace", "source"],
            registry=r,
        )
        self.cached_messages = Gauge(
            "rocketmq_consumer_cached_messages",
            "Messages a push consumer holds (received, not yet done), updated every second.",
            ["namespace", "topic", "consumer_group"],
            registry=r,
        )
        self.cached_bytes = Gauge(
            "rocketmq_consumer_cached_bytes",
            "Bytes of the messages a push consumer holds.",
            ["namespace", "topic", "consumer_group"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "rocketmq_consumer_lag_messages",
            "Records beyond a push consumer group's committed offset, summed over the assigned "
            "partitions (librdkafka's consumer_lag_stored).",
            ["namespace", "topic", "consumer_group"],
            registry=r,
        )
        # --- coordinator: transactions ---------------------------------------------------
        self.half_messages = Gauge(
            "rocketmq_half_messages",
            "Undecided transactions (half messages) in the HALF partitions this coordinator owns "
            "(sum over the coordinators for the namespace).",
            ["namespace"],
            registry=r,
        )
        self.oldest_undecided_age = Gauge(
            "bridge_transaction_oldest_undecided_age_seconds",
            "Age of the oldest undecided transaction (0 when there is none), s.",
            ["namespace"],
            registry=r,
        )
        self.commits = Counter(
            "rocketmq_commit_messages",
            "Transactions decided COMMIT and applied by the coordinator (the message goes to its "
            "real topic, or is parked if it cannot be written there). topic is '(not allowed)' "
            "for a real topic outside allowed_topics (or one no Kafka topic can be named from), "
            "so a HALF writer cannot add series of names it chooses.",
            ["namespace", "topic"],
            registry=r,
        )
        self.rollbacks = Counter(
            "rocketmq_rollback_messages",
            "Transactions decided ROLLBACK and applied by the coordinator; topic as for "
            "rocketmq_commit_messages.",
            ["namespace", "topic"],
            registry=r,
        )
        self.finish_latency = Histogram(
            "rocketmq_finish_message_latency",
            "Time from a half message's send to its decision being applied, ms.",
            ["namespace"],
            buckets=FINISH_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.checks_sent = Counter(
            "bridge_transaction_checks",
            "Check-back requests the coordinator wrote to a producer group's check topic.",
            ["namespace", "producer_group"],
            registry=r,
        )
        self.check_answers = Counter(
            "bridge_transaction_check_answers",
            "Answers to checks the coordinator received (status COMMIT, ROLLBACK, UNKNOWN). An "
            "UNKNOWN is counted only when it names a transaction pending in this coordinator's "
            "partitions and that transaction's own producer group (another is not a series of "
            "its own).",
            ["namespace", "producer_group", "status"],
            registry=r,
        )
        self.parked = Counter(
            "bridge_transactions_parked",
            "Transactions moved to the check-max topic; reason: check_max (checks spent), too_old "
            "(past file_reserved_time_ms), undeliverable (its real record could not be "
            "written), check_failed (its check could not be written), refused (its producer "
            "group is not in allowed_producer_groups).",
            ["namespace", "reason"],
            registry=r,
        )
        # --- coordinator: delays -----------------------------------------------------------
        self.delay_waiting = Gauge(
            "bridge_delay_waiting_messages",
            "Delayed messages waiting per delay level (kind=level) and timer tier (kind=tier), "
            "from the coordinator group's committed offsets and the partitions' ends "
            "(refreshed at most every 5 s; a tier written by the coordinator may count a "
            "transaction marker or two).",
            ["namespace", "kind", "level"],
            registry=r,
        )
        self.delay_deliveries = Counter(
            "bridge_delay_deliveries",
            "Delayed messages the coordinator delivered to their real topic (kind=schedule: delay "
            "levels, kind=timer: timers).",
            ["namespace", "kind"],
            registry=r,
        )
        self.delay_lateness = Histogram(
            "bridge_delay_lateness_seconds",
            "How late a delayed message reached its real topic (delivery time minus due time), s.",
            ["namespace", "kind"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.delay_recalled = Counter(
            "bridge_delay_recalled",
            "Timer messages the coordinator did not deliver because they were recalled in time "
            "(recall_message); their offsets committed as a delivery's.",
            ["namespace"],
            registry=r,
        )
        self.recall_ticks = Counter(
            "bridge_delay_recall_ticks",
            "Ticks the coordinator wrote to the recall topic to be sure it read every recall "
            "stored before a delivery (at most about one per second while timers are due).",
            ["namespace"],
            registry=r,
        )
        # --- coordinator: Kafka transactions and services --------------------------------
        self.kafka_transactions = Counter(
            "bridge_kafka_transactions",
            "Kafka transactions a coordinator service committed.",
            ["namespace", "service"],
            registry=r,
        )
        self.kafka_aborts = Counter(
            "bridge_kafka_transaction_aborts",
            "Kafka transactions of a coordinator service that failed (aborted or fenced; not "
            "those in doubt, see bridge_kafka_transactions_in_doubt).",
            ["namespace", "service"],
            registry=r,
        )
        self.kafka_in_doubt = Counter(
            "bridge_kafka_transactions_in_doubt",
            "Kafka transactions of a coordinator service whose commit failed without saying "
            "whether it completed (a timeout, a fatal error); the decisions and deliveries "
            "they carried may be uncounted.",
            ["namespace", "service"],
            registry=r,
        )
        self.service_up = Gauge(
            "bridge_service_up",
            "1 while a coordinator service runs and its consumer is a member of its group.",
            ["namespace", "service"],
            registry=r,
        )
        # --- librdkafka statistics --------------------------------------------------------
        self.broker_rtt = Gauge(
            "bridge_kafka_broker_rtt_seconds",
            "Average request round trip of a Kafka client per connected broker (librdkafka's "
            "brokers[].rtt.avg), s.",
            ["client", "broker"],
            registry=r,
        )
        self.producer_queue_messages = Gauge(
            "bridge_kafka_producer_queue_messages",
            "Messages waiting in a Kafka producer's local queue (librdkafka's msg_cnt).",
            ["client"],
            registry=r,
        )
        self.producer_queue_bytes = Gauge(
            "bridge_kafka_producer_queue_bytes",
            "Bytes waiting in a Kafka producer's local queue (librdkafka's msg_size).",
            ["client"],
            registry=r,
        )
        self.client_errors = Gauge(
            "bridge_kafka_client_request_errors",
            "Transmit and receive errors and request timeouts of a Kafka client's broker "
            "connections since the client started (librdkafka's txerrs + rxerrs + "
            "req_timeouts).",
            ["client"],
            registry=r,
        )

    def register(self, collector: Collector) -> None:
        """Add a collector read at each scrape (e.g. the coordinator's state)."""
        self.registry.register(collector)

    def unregister(self, collector: Collector) -> None:
        """Remove a collector added with :meth:`register`."""
        self.registry.unregister(collector)

    def exported_names(self) -> set[str]:
        """Every metric family name this registry exports (``_total`` included for counters,
        as the exposition format names them)."""
        names: set[str] = set()
        for family in self.registry.collect():
            names.add(family.name + "_total" if family.type == "counter" else family.name)
        return names


_lock = threading.Lock()
_active: BridgeMetrics | None = None
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, BridgeMetrics] = (
    weakref.WeakKeyDictionary()
)
"""The :class:`BridgeMetrics` made in each caller's registry: a registry holds one set of the
bridge's metrics, so enabling again in it (after :func:`disable_metrics`) reuses them."""


def enable_metrics(
    registry: CollectorRegistry | None = None, *, namespace: str | None = None
) -> BridgeMetrics:
    """Turn recording on in this process and return the active :class:`BridgeMetrics`.

    With ``registry`` (e.g. ``prometheus_client.REGISTRY``, to serve the bridge's metrics
    with the rest of an application's), the bridge's metrics in that registry become the
    active ones: made there by the first call, reused by every later one (also after
    :func:`disable_metrics`). Without it, the active metrics are kept if any, else they are
    made in a registry of their own. ``namespace`` labels the client metrics (default
    ``rmq``); a call that names one sets it on the metrics it returns, also when they exist
    already (a later call's namespace wins; the series recorded so far keep theirs).
    """
    global _active  # noqa: PLW0603 - the process-wide switch
    with _lock:
        if registry is not None:
            metrics = _by_registry.get(registry)
            if metrics is None:
                metrics = BridgeMetrics(registry, namespace=namespace or "rmq")
                _by_registry[registry] = metrics
            _active = metrics
        elif _active is None:
            _active = BridgeMetrics(namespace=namespace or "rmq")
        if namespace is not None:
            _active.namespace = namespace
        return _active


def disable_metrics() -> None:
    """Stop recording (the registry keeps what was recorded)."""
    global _active  # noqa: PLW0603 - the process-wide switch
    with _lock:
        _active = None


def active_metrics() -> BridgeMetrics | None:
    """The process's :class:`BridgeMetrics` while recording is on, else None."""
    return _active
