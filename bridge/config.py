"""Client configuration: frozen dataclasses validated on construction.

Nothing is read from the environment at import time; :meth:`ClientConfig.from_env` reads it
when an entry point asks. Environment names: ``KAFKA_BOOTSTRAP_SERVERS`` (Kafka's usual
name), ``BRIDGE_<FIELD>`` for every other field (e.g. ``BRIDGE_NAMESPACE``,
``BRIDGE_SEND_MSG_TIMEOUT_MS``), and ``BRIDGE_KAFKA_<PROPERTY>`` for any librdkafka property,
dots written as underscores (``BRIDGE_KAFKA_SECURITY_PROTOCOL=SASL_SSL``), except the
properties the guarantees rely on (:data:`PROTECTED_KAFKA_PROPERTIES`: refused, each with what
to use instead) and ``BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS``, which is
``CoordinatorConfig.kafka_transaction_timeout_ms`` and no client property.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, Self

from bridge.delay_policy import (
    DEFAULT_LANES,
    DEFAULT_MESSAGE_DELAY_LEVEL,
    SPREAD_BY,
    DelayPolicy,
    require_lanes,
)
from bridge.errors import InvalidArgumentError
from bridge.settings import env_values, require_int
from topics.catalog import DEFAULT_TRANSACTION_PARTITIONS, TOPIC_PARTITIONS_MAX, TopicCatalog
from topics.client_security import ENV_KAFKA_PREFIX, NOT_CLIENT_ENV, kafka_env_properties
from topics.naming import DEFAULT_NAMESPACE, validate_namespace

DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
ENV_BOOTSTRAP_SERVERS = "KAFKA_BOOTSTRAP_SERVERS"
ENV_PREFIX = "BRIDGE_"

DELAY_RECORD_FORMATS: Final = ("headers", "envelope")
"""The values of ``ClientConfig.delay_record_format``: the default first."""

_SENT_ONCE = "always idempotent, always acks=all"

# librdkafka properties a user may not set (ClientConfig.kafka, BRIDGE_KAFKA_*), each with why and
# what to use instead. The bridge still sets them itself, per client (the ``**overrides`` of
# ``bridge.kafka.clients``): one value for every client a config builds would break a guarantee.
# librdkafka's aliases are listed with the names they stand for.
PROTECTED_KAFKA_PROPERTIES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        # Where to connect has a field; the kafka entry would silently win over it.
        "bootstrap.servers": (
            "the brokers to connect to are bootstrap_servers",
            "set bootstrap_servers (KAFKA_BOOTSTRAP_SERVERS, -b)",
        ),
        "metadata.broker.list": (
            "the brokers to connect to are bootstrap_servers",
            "set bootstrap_servers (KAFKA_BOOTSTRAP_SERVERS, -b)",
        ),
        # A group is a consumer's identity: one value for all would put the coordinator's three
        # services, every push consumer and every reader into one group.
        "group.id": (
            "every consumer built from this config would join that one group",
            "name the group where the consumer is made: PushConsumer(group), "
            "read_messages(group=...), bridge consume --group",
        ),
        # Static membership: two live consumers with one instance id fence each other.
        "group.instance.id": (
            "every consumer built from this config would share it and fence the others",
            "the coordinator derives one per service from coordinator_id (BRIDGE_COORDINATOR_ID)",
        ),
        # A coordinator's consumers must start at the beginning of the system topics when their
        # group has no offsets yet; 'latest' skips every pending record.
        "auto.offset.reset": (
            "a fresh coordinator would skip the records waiting in the system topics",
            "PushConsumerConfig.consume_from_where for push consumers, "
            "read_messages(from_beginning=...) for readers",
        ),
        # Readers that scan to a partition's end (recovery, admin views) turn it on; the others
        # must not get end-of-partition events in their batches.
        "enable.partition.eof": (
            "scans to a partition's end need it and the other consumers must not have it",
            "nothing: the bridge sets it per consumer",
        ),
        # Aborted coordinator batches and undecided or rolled-back transactions must never be
        # read.
        "isolation.level": (
            "only committed records may be read",
            "nothing: reads are always read_committed",
        ),
        # Offsets move only after a message is processed (or inside the Kafka transaction that
        # processed it); auto-commit would skip messages after a crash.
        "enable.auto.commit": (
            "auto-commit would mark messages consumed before they are processed",
            "nothing: the bridge commits itself, after processing",
        ),
        "auto.commit.enable": (
            "auto-commit would mark messages consumed before they are processed",
            "nothing: the bridge commits itself, after processing",
        ),
        # Retries must neither duplicate nor reorder; Kafka transactions require it.
        "enable.idempotence": (
            "a retried send could be stored twice or out of order",
            f"nothing: the bridge sends {_SENT_ONCE}",
        ),
        # A message reported stored must be on every in-sync replica (never lose).
        "acks": (
            "a send reported stored must be on every in-sync replica",
            f"nothing: the bridge sends {_SENT_ONCE}",
        ),
        "request.required.acks": (
            "a send reported stored must be on every in-sync replica",
            f"nothing: the bridge sends {_SENT_ONCE}",
        ),
        # Each coordinator service fences its predecessor with an id of its own.
        "transactional.id": (
            "every producer built from this config would share it and fence the others",
            "the coordinator derives one per service from coordinator_id (BRIDGE_COORDINATOR_ID)",
        ),
        # Only the coordinator's Kafka transactions have a timeout; it has its own setting.
        "transaction.timeout.ms": (
            "it is a setting of the coordinator's Kafka transactions only",
            "CoordinatorConfig.kafka_transaction_timeout_ms (BRIDGE_KAFKA_TRANSACTION_TIMEOUT_MS)",
        ),
        # The rebalance callbacks take whole assignments (assign()); cooperative strategies and
        # the KIP-848 protocol hand out increments, and the push consumer's callback fails.
        "partition.assignment.strategy": (
            "the bridge's rebalance callbacks need the eager protocol (whole assignments)",
            "nothing: the bridge picks an eager strategy",
        ),
        "group.protocol": (
            "the bridge's rebalance callbacks need the eager protocol (whole assignments)",
            "nothing: the bridge uses the classic, eager protocol",
        ),
        # The send bound is send_msg_timeout_ms; transactional producers keep it within their
        # transaction timeout.
        "message.timeout.ms": (
            "the send timeout is send_msg_timeout_ms",
            "send_msg_timeout_ms (BRIDGE_SEND_MSG_TIMEOUT_MS)",
        ),
        "delivery.timeout.ms": (
            "the send timeout is send_msg_timeout_ms",
            "send_msg_timeout_ms (BRIDGE_SEND_MSG_TIMEOUT_MS)",
        ),
        # Derived from max_message_bytes plus room for key, properties and headers.
        "message.max.bytes": (
            "the record limit is derived from max_message_bytes",
            "max_message_bytes (BRIDGE_MAX_MESSAGE_BYTES)",
        ),
        # It has its own field; two sources would disagree.
        "linger.ms": ("batching delay is linger_ms", "linger_ms (BRIDGE_LINGER_MS)"),
        "queue.buffering.max.ms": ("batching delay is linger_ms", "linger_ms (BRIDGE_LINGER_MS)"),
        # Keyed messages land where the Java client puts them, so every producer of a key (and
        # an orderly consumer's order) agrees on its partition.
        "partitioner": (
            "keyed messages must land on the partition the Java client picks",
            "nothing: the bridge uses murmur2, as the Java client does",
        ),
    }
)
"""librdkafka properties that ``ClientConfig.kafka`` refuses: name -> (why, what instead)."""

# Not protected, on purpose: enable.auto.offset.store (nothing commits stored offsets, every
# commit names its offsets), retries and max.in.flight (librdkafka refuses values that break
# idempotence when the client is made), client.id, session.timeout.ms and other tuning.


def kafka_env_name(name: str) -> str:
    """The environment variable that sets librdkafka property ``name``."""
    return ENV_KAFKA_PREFIX + name.upper().replace(".", "_")


def _refuse_protected(kafka: Mapping[str, str]) -> None:
    for name in kafka:
        protected = PROTECTED_KAFKA_PROPERTIES.get(name.lower())
        if protected is not None:
            why, instead = protected
            env = kafka_env_name(name)
            source = "" if env in NOT_CLIENT_ENV else f" ({env})"
            raise InvalidArgumentError(
                f"kafka property {name!r}{source} cannot be set: {why}; instead: {instead}"
            )


_SECRET_PROPERTIES: Final = frozenset({"ssl.key.pem", "ssl_key", "sasl.oauthbearer.config"})


def is_secret_property(name: str) -> bool:
    """True for a librdkafka property whose value is a secret (passwords, passphrases, client
    secrets, private keys in PEM, OAUTHBEARER configs): never printed."""
    lowered = name.lower()
    # By their words, so that properties librdkafka adds stay covered: 2.10's JWT bearer
    # assertion has sasl.oauthbearer.assertion.private.key.pem and .passphrase.
    return (
        any(word in lowered for word in ("password", "secret", "passphrase"))
        or lowered.endswith("key.pem")
        or lowered in _SECRET_PROPERTIES
    )


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings shared by producers, consumers and services: how to reach Kafka, then the
    delay settings, whose rules are the :attr:`delay_policy` (a
    :class:`~bridge.delay_policy.DelayPolicy`)."""

    # --- connection -----------------------------------------------------------------------
    bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVERS
    """Kafka's ``bootstrap.servers``: comma-separated ``host:port`` pairs (``bridge up`` starts
    a local broker when ``KAFKA_BOOTSTRAP_SERVERS`` is unset)."""
    namespace: str = DEFAULT_NAMESPACE
    """Prefix of system, retry and DLQ topics."""
    send_msg_timeout_ms: int = 3000
    """RocketMQ's ``sendMsgTimeout``: how long a send may take before it fails, in ms."""
    max_message_bytes: int = 1_048_576
    """Largest body accepted, in bytes (Kafka's default broker limit is about 1 MiB); keep it
    some kilobytes below the ``max.message.bytes`` of the topics sent to."""
    linger_ms: int = 5
    """How long the client waits to fill a batch, in ms (Kafka's ``linger.ms``). A
    ``TransactionMQProducer`` sends with none (each send waits for its half message anyway); a
    push consumer's retry and quarantine copies wait at least 50 ms, since only the held
    message waits on them."""
    request_timeout_ms: int = 10_000
    """Bound on admin and metadata calls, in ms; the command line reports Kafka unreachable
    (exit status 3) when no broker answers within it."""
    # --- delay policy (kept flat, before ``kafka``: the constructor's order is public) -------
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    """RocketMQ's ``messageDelayLevel``: the delay of each level, e.g. ``"1s 5s 10s 30s 1m"``
    (:attr:`delay_partitions_per_level` SCHEDULE partitions per level)."""
    timer_precision_ms: int = 1000
    """RocketMQ 5's ``timerPrecisionMs`` (100, 200, 500 or 1000): the shortest
    tier's wait, ms."""
    timer_max_delay_ms: int = 3 * 86_400_000
    """RocketMQ 5's ``timerMaxDelaySec`` in ms (3 days; up to 400 days): a longer timer is
    refused at send time. Producers pick a timer's tier with this and ``timer_precision_ms``,
    so every producer and coordinator of a namespace should use the same two values. A
    producer with more tiers than the timer topic has partitions for refuses to send with
    ``TopicProvisioningError``; a coordinator with more adds the partitions. A timer waiting
    past lane 0 carries the tier count it was routed with, and a coordinator with another count
    moves it on by its own time at once (never early); a producer with another precision and
    the same count makes its timers late."""
    # --- connection, continued ------------------------------------------------------------
    kafka: Mapping[str, Any] = field(default_factory=dict)
    """Extra librdkafka properties (security, tuning); they win over the defaults, except the
    :data:`PROTECTED_KAFKA_PROPERTIES`, which are refused. Values are text, or callables
    for librdkafka's callbacks (``error_cb``, ``oauth_cb``, ...) as confluent-kafka takes
    them; a whole confluent-kafka config dict goes through ``kafka_config=`` instead
    (:mod:`bridge.kafka_config`)."""
    # --- compatibility (after ``kafka``: the fields before it keep their positions) -----------
    delay_record_format: str = "headers"
    """How producers, push consumers' send-backs and the coordinator's back-off copies write
    delayed and timer records to SCHEDULE and the timer topic (one of
    :data:`DELAY_RECORD_FORMATS`): ``"headers"`` (the body as the Kafka value, the routing in
    headers) or ``"envelope"`` (an Avro ``MessageEnvelope``, as releases before the header
    format wrote them, which their coordinators read). Kafka's ``log.message.format.version``
    for a rolling upgrade: clients and coordinators keep ``"envelope"`` until every coordinator
    of the namespace reads the header format. Records of either format are always read;
    another value is an ``InvalidArgumentError`` naming the setting."""
    delay_partitions_per_level: int = DEFAULT_LANES
    """SCHEDULE partitions per delay level (1 to 64): the coordinator processes (members of
    the schedule service's group) share one level's load over them; SCHEDULE gets
    levels x this many partitions. Producers send to the first this many of each level, so
    the topic must have them (a coordinator adds missing ones at start); coordinators read
    every partition whatever this says. 1 (the default) is the layout of releases before it,
    which every coordinator reads; raise it to (a multiple of) the number of coordinator
    processes once every coordinator of the namespace runs a release that reads the spread
    layout (an older one would take the added partitions for other levels)."""
    timer_partitions_per_tier: int = DEFAULT_LANES
    """Timer topic partitions per tier (1 to 64): the coordinator processes (members of the
    timer service's group) share the timers due in one second over them; the timer topic
    gets tiers x this many partitions. A coordinator's hops and back-off copies keep the
    message's partition among its tier's. As :attr:`delay_partitions_per_level` otherwise."""
    delay_spread_by: str = "id"
    """What picks a delayed or timer message's partition among its level's or tier's:
    ``"id"`` (its message id: an even spread) or ``"key"`` (its keys when it has any, else
    its id: the messages of one key wait in one partition, in send order)."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not all(
            part.strip() for part in self.bootstrap_servers.split(",")
        ):
            raise InvalidArgumentError(
                "bootstrap_servers must be host:port[,host:port...], "
                f"got {self.bootstrap_servers!r}"
            )
        validate_namespace(self.namespace)
        require_int("send_msg_timeout_ms", self.send_msg_timeout_ms)
        require_int("max_message_bytes", self.max_message_bytes)
        require_int("linger_ms", self.linger_ms, minimum=0)
        require_int("request_timeout_ms", self.request_timeout_ms)
        if self.delay_record_format not in DELAY_RECORD_FORMATS:
            raise InvalidArgumentError(
                f"delay_record_format ({ENV_PREFIX}DELAY_RECORD_FORMAT) must be one of "
                f"{', '.join(repr(f) for f in DELAY_RECORD_FORMATS)}, "
                f"got {self.delay_record_format!r}"
            )
        if self.delay_spread_by not in SPREAD_BY:
            raise InvalidArgumentError(
                f"delay_spread_by ({ENV_PREFIX}DELAY_SPREAD_BY) must be one of "
                f"{', '.join(repr(s) for s in SPREAD_BY)}, got {self.delay_spread_by!r}"
            )
        for name in ("delay_partitions_per_level", "timer_partitions_per_tier"):
            require_lanes(f"{name} ({ENV_PREFIX}{name.upper()})", getattr(self, name))
        _refuse_protected(self.kafka)
        object.__setattr__(self, "kafka", MappingProxyType(dict(self.kafka)))
        policy = self.delay_policy  # validates the delay settings
        # The topic sizes they give, checked here rather than at the first delayed send or at
        # a coordinator's start (where the catalog is built).
        for name, slots, kind in (
            ("delay_partitions_per_level", policy.level_count, "delay levels"),
            ("timer_partitions_per_tier", policy.tier_count, "timer tiers"),
        ):
            lanes = getattr(self, name)
            if slots * lanes > TOPIC_PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"{name} ({ENV_PREFIX}{name.upper()}) of {lanes} with {slots} {kind} "
                    f"gives a topic of {slots * lanes} partitions, more than "
                    f"{TOPIC_PARTITIONS_MAX}"
                )

    def __repr__(self) -> str:
        # The dataclass repr would print ``kafka`` as given: sasl.password and the like end up
        # in logs and tracebacks. Secret properties show as "***".
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "kafka"
        )
        kafka = {name: "***" if is_secret_property(name) else v for name, v in self.kafka.items()}
        return f"{type(self).__name__}({fields}, kafka={kafka!r})"

    def catalog(self, transaction_partitions: int = DEFAULT_TRANSACTION_PARTITIONS) -> TopicCatalog:
        """The topic catalog of this namespace: :attr:`delay_partitions_per_level` SCHEDULE
        partitions per delay level and :attr:`timer_partitions_per_tier` timer partitions per
        tier of the delay settings."""
        policy = self.delay_policy
        return TopicCatalog(
            namespace=self.namespace,
            transaction_partitions=transaction_partitions,
            delay_level_count=policy.level_count,
            timer_partitions=policy.tier_count,
            schedule_max_delay_ms=max(policy.level_delays_ms),
            timer_max_delay_ms=policy.timer_max_delay_ms,
            level_partitions=policy.level_partitions,
            tier_partitions=policy.tier_partitions,
        )

    @property
    def delay_policy(self) -> DelayPolicy:
        """The delay level table and timer settings."""
        return _delay_policy(
            self.message_delay_level,
            self.timer_precision_ms,
            self.timer_max_delay_ms,
            self.delay_partitions_per_level,
            self.timer_partitions_per_tier,
            self.delay_spread_by,
        )

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Build from environment variables (see the module docstring), defaults elsewhere."""
        env = os.environ if environ is None else environ
        values = env_values(
            cls,
            env,
            lambda name: (
                ENV_BOOTSTRAP_SERVERS if name == "bootstrap_servers" else ENV_PREFIX + name.upper()
            ),
            skip=("kafka",),
        )
        return cls(**values, kafka=kafka_env_properties(env))  # type: ignore[arg-type]


ALLOW_ALL: Final = "*"
"""The pattern that matches every name (the default of every name limit)."""
_GLOB_CHARS: Final = frozenset("*?[]!")
_NAME_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_NAME_RULES: Final = {
    "topic": (
        _NAME_CHARS,
        "patterns take Kafka topic names (letters, digits, '.', '_', '-'), e.g. "
        "<namespace>.RETRY.<group> (rmq.RETRY.<group> in the default namespace) for a retry "
        "topic, not %RETRY%<group>; `bridge topics map NAME` prints a name's Kafka name",
    ),
    "producer group": (
        _NAME_CHARS | frozenset("%|"),
        "patterns take producer group names (letters, digits, '.', '_', '-', '%', '|')",
    ),
}
"""What a pattern of each kind of name may hold, besides the glob characters, and the hint
an error gives."""


@dataclass(frozen=True, slots=True)
class NamePatterns:
    """The names (Kafka topics, producer groups) a setting allows: glob patterns as
    :func:`fnmatch.fnmatchcase` reads them (``*``, ``?``, ``[...]``), matched case-sensitively
    against the whole name. Built from the setting's comma-separated text with :meth:`parse`;
    ``("*",)`` allows every name."""

    setting: str
    """Where the patterns come from, e.g. ``allowed_topics (BRIDGE_ALLOWED_TOPICS)``: every
    refusal names it."""
    patterns: tuple[str, ...] = (ALLOW_ALL,)
    kind: str = "topic"
    """The names matched: ``topic`` (Kafka topic names) or ``producer group``."""

    def __post_init__(self) -> None:
        if not self.patterns:
            raise InvalidArgumentError(f"{self.setting} must name at least one pattern")
        if self.kind not in _NAME_RULES:
            raise InvalidArgumentError(
                f"{self.setting}: patterns of {self.kind!r} names; expected one of "
                f"{sorted(_NAME_RULES)}"
            )
        legal, hint = _NAME_RULES[self.kind]
        for pattern in self.patterns:
            if (
                not isinstance(pattern, str)
                or not pattern
                or "," in pattern
                or any(c.isspace() or not c.isprintable() for c in pattern)
            ):
                raise InvalidArgumentError(
                    f"{self.setting}: {pattern!r} is not a pattern (a non-empty glob without "
                    "spaces, control characters or commas)"
                )
            stray = sorted({c for c in pattern if c not in legal and c not in _GLOB_CHARS})
            if stray:
                # It could never match: no name holds these (a RocketMQ name, e.g. %RETRY%g).
                raise InvalidArgumentError(
                    f"{self.setting}: {pattern!r} can never match: no {self.kind} name holds "
                    f"{''.join(stray)!r}; {hint} (glob characters: * ? [ ] !)"
                )

    @classmethod
    def parse(cls, setting: str, text: str, kind: str = "topic") -> NamePatterns:
        """From comma-separated ``text`` (spaces around each pattern are ignored) of
        ``kind`` names (``topic`` or ``producer group``). Raises
        :class:`InvalidArgumentError` naming ``setting`` when a pattern is empty or holds a
        space, a control character or a character no such name has, or when there is none."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"{setting} must be a string of patterns, got {text!r}")
        parts = [part.strip() for part in text.split(",")]
        if any(not part for part in parts):
            raise InvalidArgumentError(
                f"{setting} must be comma-separated patterns without empty ones, got {text!r}"
            )
        return cls(setting, tuple(parts), kind)

    @property
    def allows_all(self) -> bool:
        """True when every name is allowed (the pattern ``*``)."""
        return ALLOW_ALL in self.patterns

    def allows(self, name: str) -> bool:
        """True when ``name`` matches a pattern."""
        return self.allows_all or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def refusal(self, what: str, name: str) -> str | None:
        """None when ``name`` is allowed, else why not: ``what`` (e.g. ``topic``) and the name,
        and the setting with its patterns."""
        if self.allows(name):
            return None
        return f"{what} {name!r} is not allowed by {self.setting}={','.join(self.patterns)}"

    def __str__(self) -> str:
        return ",".join(self.patterns)


ALLOWED_TOPICS_SETTING: Final = "allowed_topics (BRIDGE_ALLOWED_TOPICS)"
ALLOWED_PRODUCER_GROUPS_SETTING: Final = "allowed_producer_groups (BRIDGE_ALLOWED_PRODUCER_GROUPS)"


@dataclass(frozen=True, slots=True)
class TrustLimits:
    """What the coordinator may do on behalf of the records it reads (see
    ``docs/trust-model.md``): the real topics it writes (commits and delayed deliveries) and
    the producer groups whose half messages it checks and commits. The defaults allow all."""

    topics: NamePatterns = NamePatterns(ALLOWED_TOPICS_SETTING)
    """Kafka names of the real topics (retry topics ``<ns>.RETRY.<group>`` included) the
    coordinator may write."""
    producer_groups: NamePatterns = NamePatterns(
        ALLOWED_PRODUCER_GROUPS_SETTING, kind="producer group"
    )
    """Producer groups whose half messages are checked (their check topic created) and
    committed."""

    @classmethod
    def parse(cls, topics: str = ALLOW_ALL, producer_groups: str = ALLOW_ALL) -> TrustLimits:
        """From the settings' comma-separated texts."""
        return cls(
            NamePatterns.parse(ALLOWED_TOPICS_SETTING, topics),
            NamePatterns.parse(ALLOWED_PRODUCER_GROUPS_SETTING, producer_groups, "producer group"),
        )


@lru_cache(maxsize=16)
def _delay_policy(  # noqa: PLR0917 - the cache key is every delay setting
    levels: str,
    precision_ms: int,
    max_delay_ms: int,
    level_partitions: int,
    tier_partitions: int,
    spread_by: str,
) -> DelayPolicy:
    return DelayPolicy(
        levels, precision_ms, max_delay_ms, level_partitions, tier_partitions, spread_by
    )
