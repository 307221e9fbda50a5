"""The coordinator: our stand-in for the RocketMQ broker's internal services."""

from bridge.coordinator.coordinator import Coordinator, CoordinatorConfig

__all__ = ["Coordinator", "CoordinatorConfig"]
