"""librdkafka's statistics (``statistics.interval.ms``, delivered to ``stats_cb`` as JSON) folded
into a few gauges: broker round-trip time, the producer's local queue, request errors and,
for consumers, the lag of each topic."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from bridge.observability.metrics import BridgeMetrics

logger = logging.getLogger(__name__)

_INSTANCE_SUFFIX: Final = re.compile(r"#(?:producer|consumer)-\d+$")
"""librdkafka's numbering of the clients of a process, appended to ``client.id``."""

STATISTICS_INTERVAL_MS: Final = 5_000
"""How often librdkafka reports statistics to a client made while metrics are on, ms."""


@dataclass(frozen=True, slots=True)
class StatsSummary:
    """What the bridge keeps of one librdkafka statistics report."""

    client: str
    """The client's ``client.id``-based name (librdkafka's ``name``)."""
    kind: str
    """``producer`` or ``consumer``."""
    queue_messages: int
    """Messages in the producer's local queue (``msg_cnt``)."""
    queue_bytes: int
    """Their size (``msg_size``), bytes."""
    broker_rtt_s: dict[str, float] = field(default_factory=dict)
    """Average round-trip time per broker that has a connection, s (``brokers[].rtt.avg``)."""
    request_errors: int = 0
    """Request errors and timeouts over all brokers (``txerrs + rxerrs + req_timeouts``)."""
    consumer_lag: dict[str, int] = field(default_factory=dict)
    """Per topic, the sum over assigned partitions of ``consumer_lag_stored`` (or
    ``consumer_lag`` where none is stored); partitions without a known lag are left out."""


def summarize_stats(text: str) -> StatsSummary:
    """Read a librdkafka statistics JSON report. Raises ``ValueError`` for text that is not
    a JSON object."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("librdkafka statistics must be a JSON object")
    rtt: dict[str, float] = {}
    errors = 0
    for broker in (data.get("brokers") or {}).values():
        if not isinstance(broker, dict):
            continue
        errors += sum(int(broker.get(k, 0) or 0) for k in ("txerrs", "rxerrs", "req_timeouts"))
        if broker.get("nodeid", -1) < 0:
            continue  # the bootstrap entries, not a broker of the cluster
        avg_us = (broker.get("rtt") or {}).get("avg", 0)
        if broker.get("state") == "UP" and avg_us:
            rtt[str(broker.get("nodename") or broker.get("name"))] = avg_us / 1_000_000
    lag: dict[str, int] = {}
    for topic, info in (data.get("topics") or {}).items():
        for pid, part in ((info or {}).get("partitions") or {}).items():
            if pid == "-1" or not isinstance(part, dict):
                continue  # the unassigned-messages pseudo partition
            value = part.get("consumer_lag_stored", -1)
            if value is None or value < 0:
                value = part.get("consumer_lag", -1)
            if value is not None and value >= 0:
                lag[topic] = lag.get(topic, 0) + int(value)
    return StatsSummary(
        client=str(data.get("name", "")),
        kind=str(data.get("type", "")),
        queue_messages=int(data.get("msg_cnt", 0) or 0),
        queue_bytes=int(data.get("msg_size", 0) or 0),
        broker_rtt_s=rtt,
        request_errors=errors,
        consumer_lag=lag,
    )


def client_label(name: str) -> str:
    """The ``client`` label of librdkafka's ``name`` of a client: its ``client.id`` without
    the instance suffix (``orders#producer-3`` -> ``orders``), which grows with each client
    the process makes."""
    return _INSTANCE_SUFFIX.sub("", name) or name


def record_stats(
    metrics: BridgeMetrics,
    summary: StatsSummary,
    group: str | None = None,
    namespace: str | None = None,
) -> None:
    """Set the gauges of ``summary``; a consumer's lag is labelled with ``group`` and
    ``namespace`` (default: the metrics' own). The ``client`` label is the client's
    ``client.id`` (:func:`client_label`), so a client made again (a coordinator's producer
    replaced after fencing) sets the same series instead of adding new ones."""
    client = client_label(summary.client)
    for broker, seconds in summary.broker_rtt_s.items():
        metrics.broker_rtt.labels(client, broker).set(seconds)
    metrics.client_errors.labels(client).set(summary.request_errors)
    if summary.kind == "producer":
        metrics.producer_queue_messages.labels(client).set(summary.queue_messages)
        metrics.producer_queue_bytes.labels(client).set(summary.queue_bytes)
    if group is not None:
        for topic, lag in summary.consumer_lag.items():
            metrics.consumer_lag.labels(namespace or metrics.namespace, topic, group).set(lag)


def stats_callback(
    metrics: BridgeMetrics, group: str | None = None, namespace: str | None = None
) -> Callable[[str], None]:
    """A ``stats_cb`` for a confluent-kafka client that records into ``metrics`` (a
    consumer's lag labelled with ``group`` and ``namespace``); never raises (a report it
    cannot read is logged)."""

    def on_stats(text: str) -> None:
        try:
            record_stats(metrics, summarize_stats(text), group, namespace)
        except Exception:
            logger.debug("librdkafka statistics not recorded", exc_info=True)

    return on_stats


def statistics_overrides(
    metrics: BridgeMetrics | None, group: str | None = None, namespace: str | None = None
) -> dict[str, Any]:
    """The client settings that feed librdkafka's statistics into ``metrics``: none while
    metrics are off, else ``statistics.interval.ms`` and ``stats_cb``."""
    if metrics is None:
        return {}
    return {
        "statistics.interval.ms": STATISTICS_INTERVAL_MS,
        "stats_cb": stats_callback(metrics, group, namespace),
    }
