"""Metrics and health of the bridge: a Prometheus registry of RocketMQ-named metrics
(:mod:`~bridge.observability.metrics`), librdkafka's statistics folded in
(:mod:`~bridge.observability.rdkafka_stats`) and an HTTP endpoint serving ``/metrics``,
``/healthz`` and ``/readyz`` (:mod:`~bridge.observability.server`).

In an application's own process, metrics of its producers and push consumers are opt-in::

    from bridge.observability import serve_metrics

    server = serve_metrics(9464)  # recording on; http://127.0.0.1:9464/metrics

or ``enable_metrics(prometheus_client.REGISTRY)`` to have them served with the application's
other metrics. The coordinator serves them with ``bridge coordinator --metrics-port N``
(``BRIDGE_METRICS_PORT``). See ``docs/observability.md``.
"""

from __future__ import annotations

from bridge.observability.metrics import (
    BridgeMetrics,
    active_metrics,
    disable_metrics,
    enable_metrics,
)
from bridge.observability.server import (
    DEFAULT_METRICS_HOST,
    ENV_METRICS_HOST,
    ENV_METRICS_PORT,
    HealthCheck,
    HealthReport,
    MetricsServer,
    always_ready,
)

__all__ = [
    "DEFAULT_METRICS_HOST",
    "ENV_METRICS_HOST",
    "ENV_METRICS_PORT",
    "BridgeMetrics",
    "HealthCheck",
    "HealthReport",
    "MetricsServer",
    "active_metrics",
    "disable_metrics",
    "enable_metrics",
    "serve_metrics",
]


def serve_metrics(
    port: int,
    *,
    host: str = DEFAULT_METRICS_HOST,
    namespace: str | None = None,
    health: HealthCheck = always_ready,
) -> MetricsServer:
    """Turn recording on (:func:`enable_metrics`) and serve the active registry on
    ``host:port`` (port 0: a free one, see :attr:`MetricsServer.port`); ``stop()`` the
    returned server when done. Raises :class:`~bridge.errors.InvalidArgumentError` when the
    port cannot be bound."""
    metrics = enable_metrics(namespace=namespace)
    server = MetricsServer(metrics.registry, port, host=host, health=health)
    server.start()
    return server
