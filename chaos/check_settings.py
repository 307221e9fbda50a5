"""What a run's start config says the checker should expect, with the bridge's defaults: delay
levels, each group's ``max_reconsume_times``, batch size and orderly suspension, the
check-back bound of an undecided transaction, the stall budget and the broadcast observers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DEFAULT_DELAY_LEVELS_MS: Final = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip
"""RocketMQ's ``messageDelayLevel``, ms (the start config's ``delay_levels_ms`` overrides)."""

DEFAULT_MAX_RECONSUME_TIMES: Final = 16
"""A concurrent group's failures before the DLQ when the start config names none."""

FIRST_RETRY_LEVEL: Final = 3
"""A failed message with ``reconsume_times`` n is retried through delay level 3 + n."""


def _config_int(
    config: Mapping[str, Any], key: str, group: str | None, *, shared: bool = True
) -> int | None:
    """``key`` for ``group``: from ``config["groups"][group]``, from ``config[key]`` when it is
    a map by group, else (``shared``) from ``config[key]`` itself."""
    groups = config.get("groups")
    value: Any = None
    if isinstance(groups, dict) and isinstance(groups.get(group), dict):
        value = groups[group].get(key)
    if value is None:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get(group)
        elif not shared:
            value = None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


STALL_MARGIN_MS: Final = 10_000.0
"""Room in the stall budget for rebalances, metadata refreshes and client retries, ms."""


class Settings:
    """What the start config says, with the bridge's defaults."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        levels = config.get("delay_levels_ms")
        self.delay_levels_ms: tuple[float, ...] = (
            tuple(float(x) for x in levels)
            if isinstance(levels, list)
            and levels
            and all(isinstance(x, int | float) for x in levels)
            else tuple(float(x) for x in DEFAULT_DELAY_LEVELS_MS)
        )
        self.transaction_timeout_ms = float(config.get("transaction_timeout_ms") or 6_000)
        self.check_interval_ms = float(config.get("check_interval_ms") or 30_000)
        self.check_bound_ms = (
            self.transaction_timeout_ms
            + self.check_interval_ms
            + float(config.get("session_timeout_ms") or 10_000)
            + float(config.get("kafka_transaction_timeout_ms") or 10_000)
        )
        """The first check is due ``transaction_timeout_ms`` after the send, the next one
        ``check_interval_ms`` later; a crashed coordinator's partitions move after
        ``session_timeout_ms`` and its open Kafka transaction aborts after
        ``kafka_transaction_timeout_ms`` (README, G4)."""
        budget = config.get("stall_budget_ms")
        self.stall_budget_ms = (
            float(budget)
            if isinstance(budget, int | float) and not isinstance(budget, bool)
            else float(config.get("session_timeout_ms") or 10_000)
            + float(config.get("kafka_transaction_timeout_ms") or 10_000)
            + float(config.get("transaction_abort_interval_ms") or 10_000)
            + STALL_MARGIN_MS
        )
        """How long past due an observation may come before it is ``stalled``, ms, on top
        of the length of the fault it fell in."""
        self._max: dict[tuple[str | None, bool], int | None] = {}

    def max_reconsume(self, group: str | None, *, orderly: bool) -> int | None:
        """The group's ``max_reconsume_times``; None: unlimited."""
        key = (group, orderly)
        if key not in self._max:
            if orderly:
                value = _config_int(self.config, "max_reconsume_times", group, shared=False)
                limit = None if value is None or value < 0 else value
            else:
                value = _config_int(self.config, "max_reconsume_times", group)
                limit = DEFAULT_MAX_RECONSUME_TIMES if value is None or value < 0 else value
            self._max[key] = limit
        return self._max[key]

    def one_per_call(self, group: str | None) -> bool:
        size = _config_int(self.config, "consume_message_batch_max_size", group)
        return size is None or size == 1

    def suspend_ms(self, group: str | None) -> float:
        value = _config_int(self.config, "suspend_current_queue_time_millis", group)
        return float(value if value is not None and value >= 0 else 1_000)

    def retry_delay_ms(self, reconsume_times: int) -> float:
        level = min(FIRST_RETRY_LEVEL + reconsume_times, len(self.delay_levels_ms))
        return self.delay_levels_ms[max(level, 1) - 1]

    def broadcast_observers(self, seen: set[str], start_t: float) -> dict[str, float]:
        named = self.config.get("broadcast_observers")
        if isinstance(named, dict):
            return {
                str(k): float(v) if isinstance(v, int | float) else start_t
                for k, v in named.items()
            }
        if isinstance(named, list):
            return {str(k): start_t for k in named}
        return dict.fromkeys(sorted(seen), start_t)
