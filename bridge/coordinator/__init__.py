"""The coordinator: our stand-in for the RocketMQ broker's internal services.

The coordinator process runs what is in this package and nothing of the client library: the
system topics and the services' lifecycle (:mod:`~bridge.coordinator.coordinator`, several
processes under one command in :mod:`~bridge.coordinator.processes`), the metrics and health
endpoint (:mod:`~bridge.coordinator.health`), the transaction service
(:mod:`bridge.coordinator.transaction`) and the delay services
(:mod:`bridge.coordinator.delay`)."""

from bridge.coordinator.coordinator import Coordinator, CoordinatorConfig

__all__ = ["Coordinator", "CoordinatorConfig"]
