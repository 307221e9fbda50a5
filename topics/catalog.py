"""The catalog of system topics: names, partition counts, configs and record schemas.

Kafka topics stand in for RocketMQ's internal queues. Each system topic keeps RocketMQ's own
name under a configurable namespace (``rmq`` by default), e.g. ``rmq.RMQ_SYS_TRANS_HALF_TOPIC``.
Retry and dead-letter topics are per group and named by :mod:`topics.naming`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from topics.errors import InvalidArgumentError
from topics.naming import (
    DEFAULT_NAMESPACE,
    ParsedTopic,
    check_topic,
    dlq_topic,
    parse_kafka_topic,
    retry_topic,
    system_topic,
    validate_namespace,
)

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

DEFAULT_TRANSACTION_PARTITIONS = 8
DEFAULT_DELAY_LEVEL_COUNT = 18
DEFAULT_TIMER_PARTITIONS = 18
"""Timer tiers of the default delay settings (1 s precision, 3 days at most)."""
DEFAULT_RETRY_PARTITIONS = 1
"""RocketMQ creates each ``%RETRY%`` and ``%DLQ%`` topic with one queue."""

FILE_RESERVED_TIME_MS = 72 * HOUR_MS
"""RocketMQ's ``fileReservedTime`` (72 h): half messages older than this are discarded."""

DEFAULT_TIMER_MAX_DELAY_MS = 3 * DAY_MS
"""RocketMQ 5's default ``timerMaxDelaySec`` (3 days)."""


class SystemTopic(Enum):
    """The system topics, valued by their RocketMQ names."""

    HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
    """Half (prepared) transactional messages, never visible on their real topic."""
    OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    """Decisions on half messages; partition ``p`` holds the decisions for HALF partition ``p``."""
    CHECK_MAX = "TRANS_CHECK_MAX_TIME_TOPIC"
    """Half messages checked ``transaction_check_max`` times, parked for an operator."""
    SCHEDULE = "SCHEDULE_TOPIC_XXXX"
    """Delay-level messages; partition ``level - 1`` per level, so each is FIFO in due time."""
    TIMER = "rmq_sys_wheel_timer"
    """Timer messages (arbitrary delivery time)."""
    QUARANTINE = "QUARANTINE"
    """Records that could not be decoded, kept byte for byte with the reason in headers."""


RECORD_SCHEMAS: Mapping[SystemTopic, str | None] = MappingProxyType(
    {
        SystemTopic.HALF: "MessageEnvelope",  # and EndTransactionRequest
        SystemTopic.OP: "OpRecord",
        SystemTopic.CHECK_MAX: "MessageEnvelope",
        SystemTopic.SCHEDULE: "MessageEnvelope",
        SystemTopic.TIMER: "MessageEnvelope",
        SystemTopic.QUARANTINE: None,
    }
)
"""The Avro schema of each system topic's values (None: raw bytes kept as they came)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How one Kafka topic should be created."""

    kafka_name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    record_schema: str | None = None
    system: SystemTopic | None = None
    replication_factor: int = -1
    """-1 takes the broker's ``default.replication.factor``."""


@dataclass(frozen=True, slots=True)
class TopicCatalog:
    """Every system topic of one namespace, with partition counts and retention.

    ``transaction_partitions`` is the partition count of HALF and OP (equal, so that one
    coordinator owns a HALF partition and its OP partition together). ``delay_level_count``
    is the number of delay levels, one SCHEDULE partition each.
    """

    namespace: str = DEFAULT_NAMESPACE
    transaction_partitions: int = DEFAULT_TRANSACTION_PARTITIONS
    delay_level_count: int = DEFAULT_DELAY_LEVEL_COUNT
    timer_partitions: int = DEFAULT_TIMER_PARTITIONS
    half_retention_ms: int = FILE_RESERVED_TIME_MS + DAY_MS
    schedule_max_delay_ms: int = 2 * HOUR_MS
    """The longest delay level: SCHEDULE keeps records a week longer."""
    timer_max_delay_ms: int = DEFAULT_TIMER_MAX_DELAY_MS
    replication_factor: int = -1
    """-1 takes the broker's ``default.replication.factor``."""

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        for name in ("transaction_partitions", "delay_level_count", "timer_partitions"):
            value = getattr(self, name)
            if not 1 <= value <= 10_000:
                raise InvalidArgumentError(f"{name} must be between 1 and 10000, got {value}")
        if self.half_retention_ms < FILE_RESERVED_TIME_MS:
            raise InvalidArgumentError(
                f"half_retention_ms must be at least {FILE_RESERVED_TIME_MS} (72 h), "
                f"got {self.half_retention_ms}"
            )
        if self.timer_max_delay_ms <= 0:
            raise InvalidArgumentError(
                f"timer_max_delay_ms must be positive, got {self.timer_max_delay_ms}"
            )
        if self.replication_factor == 0 or self.replication_factor < -1:
            raise InvalidArgumentError(
                f"replication_factor must be -1 or positive, got {self.replication_factor}"
            )

    def topic(self, system: SystemTopic) -> str:
        """The Kafka name of a system topic in this namespace."""
        return system_topic(system.value, self.namespace)

    def retry_topic(self, group: str) -> str:
        """The Kafka name of ``%RETRY%<group>`` in this namespace."""
        return retry_topic(group, self.namespace)

    def dlq_topic(self, group: str) -> str:
        """The Kafka name of ``%DLQ%<group>`` in this namespace."""
        return dlq_topic(group, self.namespace)

    def check_topic(self, producer_group: str) -> str:
        """The Kafka name of a producer group's check-request topic."""
        return check_topic(producer_group, self.namespace)

    def check_topic_spec(self, producer_group: str, partitions: int = 4) -> TopicSpec:
        """How to create a producer group's check-request topic (checks expire after a day:
        an unanswered one is asked again at the next check interval anyway)."""
        return TopicSpec(
            self.check_topic(producer_group),
            partitions,
            {"retention.ms": str(DAY_MS)},
            record_schema="CheckRequest",
            replication_factor=self.replication_factor,
        )

    def parse(self, kafka_name: str) -> ParsedTopic:
        """Read a Kafka topic name of this namespace back into RocketMQ terms."""
        return parse_kafka_topic(
            kafka_name, self.namespace, frozenset(t.value for t in SystemTopic)
        )

    def spec(self, system: SystemTopic) -> TopicSpec:
        """How to create one system topic."""
        partitions = {
            SystemTopic.HALF: self.transaction_partitions,
            SystemTopic.OP: self.transaction_partitions,
            SystemTopic.SCHEDULE: self.delay_level_count,
            SystemTopic.TIMER: self.timer_partitions,
            SystemTopic.CHECK_MAX: 1,
            SystemTopic.QUARANTINE: 1,
        }[system]
        retention_ms = {
            SystemTopic.HALF: self.half_retention_ms,
            SystemTopic.OP: self.half_retention_ms,
            SystemTopic.SCHEDULE: self.schedule_max_delay_ms + 7 * DAY_MS,
            SystemTopic.TIMER: self.timer_max_delay_ms + 7 * DAY_MS,
            # Parked and quarantined records wait for an operator: never expire them.
            SystemTopic.CHECK_MAX: -1,
            SystemTopic.QUARANTINE: -1,
        }[system]
        configs = {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}
        if system in (SystemTopic.HALF, SystemTopic.OP, SystemTopic.SCHEDULE, SystemTopic.TIMER):
            # The broker's clock: a delayed message waits from when it was stored, and
            # transaction recovery finds OP records by the append time of a half message.
            configs["message.timestamp.type"] = "LogAppendTime"
        return TopicSpec(
            kafka_name=self.topic(system),
            partitions=partitions,
            configs=configs,
            record_schema=RECORD_SCHEMAS[system],
            system=system,
            replication_factor=self.replication_factor,
        )

    def system_specs(self) -> Iterator[TopicSpec]:
        """Every system topic's spec, in a stable order."""
        for system in SystemTopic:
            yield self.spec(system)

    def group_specs(self, group: str) -> list[TopicSpec]:
        """The retry and dead-letter topics of a consumer group (one partition each)."""
        return [
            TopicSpec(
                self.retry_topic(group),
                DEFAULT_RETRY_PARTITIONS,
                replication_factor=self.replication_factor,
            ),
            # Dead letters wait for an operator, as parked transactions do.
            TopicSpec(
                self.dlq_topic(group),
                DEFAULT_RETRY_PARTITIONS,
                {"retention.ms": "-1"},
                replication_factor=self.replication_factor,
            ),
        ]
