"""What the workload sends and where: its topics and groups, the sharding keys of the orderly
kind, the poison kinds, the default rates (:data:`DEFAULT_RATES`), the :class:`WorkloadConfig`
and the :class:`Spec` of one operation. :mod:`chaos.workload` re-exports every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from bridge import ClientConfig

TX_TOPIC: Final = "chaos-tx"
DELAY_TOPIC: Final = "chaos-delay"
TIMER_TOPIC: Final = "chaos-timer"
CONSUME_TOPIC: Final = "chaos-consume"
ORDERLY_TOPIC: Final = "chaos-orderly"
BROADCAST_TOPIC: Final = "chaos-broadcast"
DB_TOPIC: Final = "chaos-db"
"""The orders application's topic: each message is an order row committed with it."""
SMALL_TOPIC: Final = "chaos-poison-small"
"""A real topic with a tiny ``max.message.bytes``: a delayed message larger than that is
poison for the delay service."""
MISSING_TOPIC: Final = "chaos-poison-missing"
"""Never created (the run's brokers do not create topics on first use)."""
SMALL_TOPIC_MAX_BYTES: Final = 1024

TX_GROUP: Final = "chaos-tx-producer"
PRODUCER_GROUP: Final = "chaos-producer"
CONSUME_GROUP: Final = "chaos-consume"
ORDERLY_GROUP: Final = "chaos-orderly"
BROADCAST_GROUP: Final = "chaos-broadcast"
BROADCAST_INSTANCES: Final = ("a", "b")
DB_PRODUCER_GROUP: Final = "chaos-db-orders"
DB_CONSUME_GROUP: Final = "chaos-db-inventory"
DB_ORDERS: Final = "orders"
DB_INVENTORY: Final = "inventory"
"""The two applications' databases (SQLite files ``<name>.db`` in the run's directory): the
orders application's (its orders and the transaction log) and the inventory application's (its
effects and the consumed messages)."""

ORDER_KEYS: Final = ("order-0", "order-1", "order-2", "order-3")
ORDERLY_SUSPEND_MS: Final = 300
"""How long the orderly consumer waits before it retries a failed message in place, ms."""

POISON_KINDS: Final = ("missing_topic", "too_large", "malformed_schedule", "malformed_retry")
"""What is wrong with a poison record (the ``poison`` field of its ``send`` event)."""

DEFAULT_RATES: Final[Mapping[str, float]] = {
    "tx": 4.0,
    "delay": 2.0,
    "timer": 2.0,
    "consume": 4.0,
    "orderly": 3.0,
    "broadcast": 2.0,
    "db": 2.0,
}
"""Operations per second of each kind: about 19 in all, what 2 cores running three brokers and
two coordinators besides keep up with comfortably."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What the workload sends, how fast, and where."""

    seed: int
    client_bootstrap: str
    """Producers and push consumers connect here (the fault proxy in a cluster run)."""
    reader_bootstrap: str
    """Readers and topic administration connect here (the brokers directly)."""
    namespace: str = "rmq"
    message_delay_level: str = "1s 2s 3s"
    """RocketMQ's ``messageDelayLevel``, scaled down; the coordinators use the same."""
    timer_precision_ms: int = 500
    max_reconsume_times: int = 2
    """Of the CLUSTERING consumer: a message failed more often goes to the DLQ."""
    replication_factor: int = 3
    min_insync_replicas: int = 2
    partitions: int = 4
    """Of each workload topic (the broadcast topic has 2)."""
    rates: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    """Operations per second per kind; a kind at 0 is not sent."""
    send_msg_timeout_ms: int = 3000
    database_dir: str | None = None
    """Where the ``db`` kind's two SQLite databases live; None: no ``db`` operations."""

    def client_config(self, bootstrap: str | None = None) -> ClientConfig:
        """The bridge client settings (same delay table and precision as the coordinators)."""
        return ClientConfig(
            bootstrap_servers=bootstrap or self.client_bootstrap,
            namespace=self.namespace,
            message_delay_level=self.message_delay_level,
            timer_precision_ms=self.timer_precision_ms,
            send_msg_timeout_ms=self.send_msg_timeout_ms,
        )

    @property
    def delay_levels_ms(self) -> list[int]:
        """The delay of each level, ms."""
        return list(self.client_config().delay_policy.level_delays_ms)


@dataclass(slots=True)
class Spec:
    """What one operation is meant to do (kept in memory for the listeners and the drain)."""

    id: str
    kind: str
    intent: str | None = None
    fail_times: int = 0
    key: str | None = None
    seq: int | None = None
    poison: str | None = None
    committed: bool = False
    """``db``: its orders listener answered COMMIT (on execute or on a check)."""
