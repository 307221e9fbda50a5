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
DEFAULT_PARTITIONS_PER_SLOT = 1
"""SCHEDULE partitions per delay level and timer partitions per tier by default (the client
setting's default, ``bridge.delay_policy.DEFAULT_LANES``)."""
TOPIC_PARTITIONS_MAX = 10_000
"""The most partitions a topic of the catalog may have (SCHEDULE and the timer topic: slots
times partitions per slot)."""
DEFAULT_RETRY_PARTITIONS = 1
"""RocketMQ creates each ``%RETRY%`` and ``%DLQ%`` topic with one queue."""

FILE_RESERVED_TIME_MS = 72 * HOUR_MS
"""RocketMQ's ``fileReservedTime`` (72 h): half messages older than this are discarded."""

DEFAULT_TIMER_MAX_DELAY_MS = 3 * DAY_MS
"""RocketMQ 5's default ``timerMaxDelaySec`` (3 days)."""

RECALL_SEGMENT_MS = HOUR_MS
"""``segment.ms`` of the recall topic, ms: the ticks of at most about this long (a few
thousand per coordinator process) wait in its active segment, out of the log cleaner's
reach."""


class SystemTopic(Enum):
    """The system topics, valued by their RocketMQ names."""

    HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
    """Half (prepared) transactional messages, never visible on their real topic."""
    OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    """Decisions on half messages; partition ``p`` holds the decisions for HALF partition ``p``."""
    CHECK_MAX = "TRANS_CHECK_MAX_TIME_TOPIC"
    """Half messages checked ``transaction_check_max`` times, parked for an operator."""
    SCHEDULE = "SCHEDULE_TOPIC_XXXX"
    """Delay-level messages; ``level_partitions`` partitions per level (partition ``level - 1``
    is the first), each FIFO in due time."""
    TIMER = "rmq_sys_wheel_timer"
    """Timer messages (arbitrary delivery time)."""
    QUARANTINE = "QUARANTINE"
    """Records that could not be decoded, kept byte for byte with the reason in headers."""
    RECALL = "rmq_sys_timer_recall"
    """Recall markers of timer messages (``recall_message``) and the coordinators' clock
    ticks, in one partition: a marker stamped by the broker early enough before its
    message's time keeps it from being delivered (see ``bridge.delay.recall``)."""


RECORD_SCHEMAS: Mapping[SystemTopic, str | None] = MappingProxyType(
    {
        SystemTopic.HALF: "MessageEnvelope",  # and EndTransactionRequest
        SystemTopic.OP: "OpRecord",
        SystemTopic.CHECK_MAX: "MessageEnvelope",
        # No one Avro schema: header-format records (the body as the value, the routing in
        # headers, see bridge.codec.delayed_headers); MessageEnvelope records of earlier
        # releases (or ClientConfig.delay_record_format = "envelope") are still read.
        SystemTopic.SCHEDULE: None,
        SystemTopic.TIMER: None,
        SystemTopic.QUARANTINE: None,
        SystemTopic.RECALL: None,  # header-only records keyed by message id (markers) or TICK_KEY
    }
)
"""The Avro schema of each system topic's values (None: no one Avro schema; raw bytes kept as
they came, or header-format records)."""


@dataclass(frozen=True, slots=True)
class ConfigMismatch:
    """A setting of an existing topic that breaks a guarantee, and the value that fixes it."""

    setting: str
    actual: str | None
    """The topic's value (None: not reported by the broker)."""
    required: str
    """What the guarantee needs, in words (e.g. ``LogAppendTime``, ``no compact``)."""
    fix: str
    """The value to set (``kafka-configs.sh --alter --add-config <setting>=<fix>``)."""
    reason: str
    """Which guarantee breaks otherwise."""


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
    min_retention_ms: int | None = None
    """The shortest ``retention.ms`` an existing topic may have: records must outlive the
    longest wait they are kept for, ms (None: not checked)."""
    exact_partitions: bool = False
    """An existing topic must have exactly :attr:`partitions`, not more: its readers look at
    those partitions only (the parked and quarantine topics: partition 0)."""
    expandable: bool = False
    """An existing topic with fewer than :attr:`partitions` may be given more: adding
    partitions changes the meaning of none that exists (SCHEDULE and the timer topic, whose
    partition serves a level or tier by its number alone)."""

    def config_mismatches(self, actual: Mapping[str, str | None]) -> list[ConfigMismatch]:
        """The settings of an existing topic (``actual``, as ``describe_configs`` reports them)
        that break a guarantee of a system topic; empty for other topics, whose settings are
        their owner's choice.

        Checked: ``message.timestamp.type`` (delays and transaction recovery count from the
        broker's clock), ``cleanup.policy`` (compaction would delete half messages, decisions
        and delayed messages that share a key) and, for topics whose records wait to be due
        (:attr:`min_retention_ms` set), ``retention.ms`` against it and ``retention.bytes``
        (size-based deletion can remove records before they are due).
        """
        if self.system is None:
            return []
        out: list[ConfigMismatch] = []
        wanted_type = self.configs.get("message.timestamp.type")
        if wanted_type is not None and actual.get("message.timestamp.type") != wanted_type:
            out.append(
                ConfigMismatch(
                    "message.timestamp.type",
                    actual.get("message.timestamp.type"),
                    wanted_type,
                    wanted_type,
                    "with the producers' clocks, clock skew delivers delayed messages early "
                    "and misplaces transaction decisions",
                )
            )
        policy = actual.get("cleanup.policy") or ""
        policies = {p.strip() for p in policy.split(",")}
        wanted_policies = {p.strip() for p in self.configs.get("cleanup.policy", "").split(",")}
        if "compact" in wanted_policies:
            # The recall topic: compaction is wanted (one tick kept), and deletion must stay
            # with it, or the markers (each of its own key) would be kept for ever.
            if "delete" not in policies:
                out.append(
                    ConfigMismatch(
                        "cleanup.policy",
                        policy,
                        "delete (with or without compact)",
                        self.configs["cleanup.policy"],
                        "without deletion the topic's records are never removed",
                    )
                )
        elif "compact" in policies:
            out.append(
                ConfigMismatch(
                    "cleanup.policy",
                    policy,
                    "no compact",
                    "delete",
                    "compaction keeps one record per key and drops the others",
                )
            )
        retention_bytes = actual.get("retention.bytes")
        if self.min_retention_ms is not None and retention_bytes not in (None, "-1"):
            out.append(
                ConfigMismatch(
                    "retention.bytes",
                    retention_bytes,
                    "-1",
                    "-1",
                    "size-based deletion removes records before they are due",
                )
            )
        retention_ms = actual.get("retention.ms")
        if (
            self.min_retention_ms is not None
            and retention_ms is not None
            and retention_ms != "-1"
            and _as_int(retention_ms, self.min_retention_ms) < self.min_retention_ms
        ):
            out.append(
                ConfigMismatch(
                    "retention.ms",
                    retention_ms,
                    f"at least {self.min_retention_ms} (or -1)",
                    self.configs.get("retention.ms", str(self.min_retention_ms)),
                    "records would be deleted before their longest wait ends",
                )
            )
        return out


def _as_int(raw: str, default: int) -> int:
    try:
        return int(raw)
    except ValueError:
        return default


@dataclass(frozen=True, slots=True)
class TopicCatalog:
    """Every system topic of one namespace, with partition counts and retention.

    ``transaction_partitions`` is the partition count of HALF and OP (equal, so that one
    coordinator owns a HALF partition and its OP partition together). ``delay_level_count``
    is the number of delay levels, ``level_partitions`` SCHEDULE partitions each;
    ``timer_partitions`` the number of timer tiers, ``tier_partitions`` timer partitions each
    (``bridge.delay_policy`` lays them out).
    """

    namespace: str = DEFAULT_NAMESPACE
    transaction_partitions: int = DEFAULT_TRANSACTION_PARTITIONS
    delay_level_count: int = DEFAULT_DELAY_LEVEL_COUNT
    timer_partitions: int = DEFAULT_TIMER_PARTITIONS
    """The number of timer tiers."""
    half_retention_ms: int = FILE_RESERVED_TIME_MS + DAY_MS
    schedule_max_delay_ms: int = 2 * HOUR_MS
    """The longest delay level: SCHEDULE keeps records a week longer."""
    timer_max_delay_ms: int = DEFAULT_TIMER_MAX_DELAY_MS
    replication_factor: int = -1
    """-1 takes the broker's ``default.replication.factor``."""
    level_partitions: int = DEFAULT_PARTITIONS_PER_SLOT
    """SCHEDULE partitions per delay level."""
    tier_partitions: int = DEFAULT_PARTITIONS_PER_SLOT
    """Timer topic partitions per tier."""

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        for name in (
            "transaction_partitions",
            "delay_level_count",
            "timer_partitions",
            "level_partitions",
            "tier_partitions",
        ):
            value = getattr(self, name)
            if not 1 <= value <= TOPIC_PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"{name} must be between 1 and {TOPIC_PARTITIONS_MAX}, got {value}"
                )
        for name, total in (
            ("SCHEDULE", self.delay_level_count * self.level_partitions),
            ("timer", self.timer_partitions * self.tier_partitions),
        ):
            if total > TOPIC_PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"the {name} topic would have {total} partitions (slots times partitions "
                    f"per slot), more than {TOPIC_PARTITIONS_MAX}"
                )
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
            SystemTopic.SCHEDULE: self.delay_level_count * self.level_partitions,
            SystemTopic.TIMER: self.timer_partitions * self.tier_partitions,
            SystemTopic.CHECK_MAX: 1,
            SystemTopic.QUARANTINE: 1,
            # One partition: a coordinator's tick orders every marker before it
            # (bridge.delay.recall).
            SystemTopic.RECALL: 1,
        }[system]
        retention_ms = {
            SystemTopic.HALF: self.half_retention_ms,
            SystemTopic.OP: self.half_retention_ms,
            SystemTopic.SCHEDULE: self.schedule_max_delay_ms + 7 * DAY_MS,
            SystemTopic.TIMER: self.timer_max_delay_ms + 7 * DAY_MS,
            # Parked and quarantined records wait for an operator: never expire them.
            SystemTopic.CHECK_MAX: -1,
            SystemTopic.QUARANTINE: -1,
            SystemTopic.RECALL: self.timer_max_delay_ms + 7 * DAY_MS,
        }[system]
        # The longest a record waits in the topic: an existing topic's retention must cover it.
        min_retention_ms = {
            SystemTopic.HALF: FILE_RESERVED_TIME_MS,
            SystemTopic.OP: FILE_RESERVED_TIME_MS,
            SystemTopic.SCHEDULE: self.schedule_max_delay_ms,
            SystemTopic.TIMER: self.timer_max_delay_ms,
            # How long to keep parked and quarantined records is the operator's choice.
            SystemTopic.CHECK_MAX: None,
            SystemTopic.QUARANTINE: None,
            # A marker must outlive the longest timer it recalls.
            SystemTopic.RECALL: self.timer_max_delay_ms,
        }[system]
        configs = {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}
        if system is SystemTopic.RECALL:
            # Its ticks share one key: compaction keeps the last, so a (re)started coordinator
            # reads the markers and the active segment's ticks instead of every tick of the
            # retention (about one a second per coordinator process while timers come due).
            # Markers have a key each, so compaction never drops one; deletion still ends
            # them after the retention. Segments roll hourly so the cleaner can reach the
            # ticks (it never compacts the active segment).
            configs["cleanup.policy"] = "compact,delete"
            configs["segment.ms"] = str(RECALL_SEGMENT_MS)
        if system in (
            SystemTopic.HALF,
            SystemTopic.OP,
            SystemTopic.SCHEDULE,
            SystemTopic.TIMER,
            SystemTopic.RECALL,
        ):
            # The broker's clock: a delayed message waits from when it was stored,
            # transaction recovery finds OP records by the append time of a half message, and
            # a recall marker applies by the time the broker stored it.
            configs["message.timestamp.type"] = "LogAppendTime"
        return TopicSpec(
            kafka_name=self.topic(system),
            partitions=partitions,
            configs=configs,
            record_schema=RECORD_SCHEMAS[system],
            system=system,
            replication_factor=self.replication_factor,
            min_retention_ms=min_retention_ms,
            # Replay, `transactions parked` and `bridge quarantine` read partition 0 only.
            exact_partitions=system
            in (SystemTopic.CHECK_MAX, SystemTopic.QUARANTINE, SystemTopic.RECALL),
            # Partitions added to SCHEDULE or the timer topic serve new lanes; those that
            # exist keep the level or tier they serve (bridge.delay_policy's layout).
            expandable=system in (SystemTopic.SCHEDULE, SystemTopic.TIMER),
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
