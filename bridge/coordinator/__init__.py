"""The coordinator: our stand-in for the RocketMQ broker's internal services.

The coordinator process runs what is in this package and nothing of the client library: the
system topics and the services' lifecycle (``coordinator.py``, several processes under one
command in ``processes.py``), the metrics and health endpoint (``health.py``), the transaction
service (``transaction/``) and the delay services (``delay/``)."""

from bridge.coordinator.coordinator import Coordinator, CoordinatorConfig

__all__ = ["Coordinator", "CoordinatorConfig"]
