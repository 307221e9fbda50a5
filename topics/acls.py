"""The least-privilege ACLs of the trust model: which Kafka permission each principal of a
bridge deployment needs, for one namespace, its producer and consumer groups and its real
topics. Pure rules; ``bridge acls print|apply`` shows and creates them.

Roles (each a principal of its own, ``User:<name>``):

* **producer**: sends plain, delayed and timer messages to the real topics;
* **transactional producer of a group**: a producer that also writes half messages and END
  records, and reads its group's check requests;
* **coordinator**: runs the transaction, schedule and timer services (reads the system
  topics, writes decisions, deliveries and check requests, creates the system and check
  topics);
* **consumer of a group**: reads the real topics and its retry topic, sends failed messages
  back (through the delay levels) and dead letters to its DLQ;
* **Spark job**: reads the real topics (ingest) and the system, retry and DLQ topics (reports);
* **operator**: provisions topics and runs the operators' commands (inspect and replay parked
  transactions, dead letters and quarantined records).

Topics are provisioned by the operator (``bridge topics create --system``) or the coordinator;
the producers and consumers only create the topics of their own group (check, retry, DLQ). No
role may delete or alter topics, and none is a super user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from topics.catalog import SystemTopic, TopicCatalog
from topics.errors import InvalidArgumentError
from topics.naming import (
    check_topic,
    coordinator_group,
    dlq_topic,
    retry_topic,
    transaction_check_group,
    validate_group,
    validate_namespace,
)

CLUSTER_NAME = "kafka-cluster"
"""The one cluster resource's name."""
READER_GROUP_PREFIX = "bridge-"
"""Throw-away consumer groups of the bridge's readers (``bridge-reader-<token>``,
``bridge-admin-<token>``, ...): they commit nothing."""
RECOVERY_GROUP_PREFIX = "bridge-recovery-"
"""The coordinator's transaction recovery readers."""
RECALL_GROUP_PREFIX = "bridge-recall-"
"""The timer services' readers of the recall topic (they commit nothing; librdkafka still
looks up their group's coordinator)."""
SPARK_GROUP_PREFIX = "bridge-spark"
"""Spark's Kafka source groups (``groupIdPrefix`` of :mod:`spark_jobs.common`)."""


class Role(Enum):
    """Who needs permissions."""

    PRODUCER = "producer"
    TRANSACTIONAL_PRODUCER = "transactional-producer"
    COORDINATOR = "coordinator"
    CONSUMER = "consumer"
    SPARK = "spark"
    OPERATOR = "operator"


class ResourceType(Enum):
    """Kafka ACL resource types (``confluent_kafka.admin.ResourceType`` names; the cluster is
    ``BROKER`` there)."""

    TOPIC = "TOPIC"
    GROUP = "GROUP"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"
    CLUSTER = "CLUSTER"


class PatternType(Enum):
    """How an ACL's resource name matches."""

    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(Enum):
    """Kafka ACL operations used here (READ, WRITE and the others imply DESCRIBE)."""

    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DESCRIBE = "DESCRIBE"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"


@dataclass(frozen=True, slots=True)
class Acl:
    """One ALLOW ACL (any host) a principal needs, and why."""

    principal: str
    role: str
    """The role and, for a group's role, the group (``consumer orders_cg``)."""
    resource_type: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    reason: str = field(compare=False)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """(principal, resource type, name, pattern type, operation): what Kafka stores."""
        return (
            self.principal,
            self.resource_type.value,
            self.name,
            self.pattern.value,
            self.operation.value,
        )

    def as_dict(self) -> dict[str, str]:
        """The ACL as JSON-ready strings."""
        return {
            "principal": self.principal,
            "role": self.role,
            "resource_type": self.resource_type.value,
            "name": self.name,
            "pattern_type": self.pattern.value,
            "operation": self.operation.value,
            "permission": "ALLOW",
            "host": "*",
            "reason": self.reason,
        }


def principal(name: str, role: str = "") -> str:
    """``User:<name>`` (a name given with a type, ``User:alice``, is kept). Inner blanks are
    allowed (an mTLS principal is a DN: ``User:CN=svc,O=Acme Inc``); an empty name, leading or
    trailing blanks, and any ``*`` (Kafka's wildcard principal: every user) are refused with an
    :class:`InvalidArgumentError` naming ``role`` when given."""
    for_role = f" for the {role} role" if role else ""
    kind, sep, bare = name.partition(":")
    if not sep:
        kind, bare = "User", name
    if "*" in name:
        raise InvalidArgumentError(
            f"invalid principal {name!r}{for_role}: '*' would grant the role's ACLs to every "
            "user; name one principal"
        )
    if (
        not bare
        or not kind
        or bare != bare.strip()
        or kind != kind.strip()
        or any(c in "\r\n\t\f\v" for c in name)
    ):
        raise InvalidArgumentError(
            f"invalid principal {name!r}{for_role}: expected User:<name> or <name> (not empty, "
            "no leading or trailing blanks)"
        )
    return f"{kind}:{bare}"


def topic_resource(topic: str) -> tuple[str, PatternType]:
    """A real topic as a resource: ``orders`` literal, ``orders-*`` the prefix ``orders-``,
    ``*`` every topic."""
    if not topic:
        raise InvalidArgumentError("a topic must not be empty")
    if topic != "*" and topic.endswith("*"):
        if "*" in topic[:-1] or len(topic) == 1:
            raise InvalidArgumentError(f"invalid topic pattern {topic!r}: one trailing '*'")
        return topic[:-1], PatternType.PREFIXED
    if "*" in topic[:-1]:
        raise InvalidArgumentError(f"invalid topic pattern {topic!r}: one trailing '*'")
    return topic, PatternType.LITERAL


@dataclass(frozen=True, slots=True)
class Deployment:
    """What to grant ACLs for: a namespace, its real topics, and the principals of each role
    (None: that role is left out)."""

    namespace: str
    topics: tuple[str, ...] = ()
    """Real topics (``orders``, a prefix ``orders-*``, or ``*``)."""
    producer: str | None = None
    transactional_producers: Mapping[str, str] = field(default_factory=dict)
    """Producer group -> principal."""
    coordinator: str | None = None
    consumers: Mapping[str, str] = field(default_factory=dict)
    """Consumer group -> principal."""
    spark: str | None = None
    operator: str | None = None

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        for topic in self.topics:
            topic_resource(topic)
        for group in (*self.transactional_producers, *self.consumers):
            validate_group(group)
        for role, name in self._principals():
            principal(name, role)

    def _principals(self) -> Iterable[tuple[str, str]]:
        roles = {
            "producer": self.producer,
            "coordinator": self.coordinator,
            "spark": self.spark,
            "operator": self.operator,
        }
        yield from ((role, p) for role, p in roles.items() if p)
        for group, p in self.transactional_producers.items():
            yield f"transactional producer of {group}", p
        for group, p in self.consumers.items():
            yield f"consumer of {group}", p


class _Grants:
    """Collects ACLs for one principal and role."""

    def __init__(self, who: str, role: str, out: list[Acl]) -> None:
        self.who, self.role, self.out = principal(who, role), role, out

    def topic(
        self, name: str, ops: Iterable[Operation], reason: str, prefixed: bool = False
    ) -> None:
        pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
        for op in ops:
            self.out.append(Acl(self.who, self.role, ResourceType.TOPIC, name, pattern, op, reason))

    def topics(self, names: Iterable[str], ops: Iterable[Operation], reason: str) -> None:
        for topic in names:
            name, pattern = topic_resource(topic)
            self.topic(name, ops, reason, prefixed=pattern is PatternType.PREFIXED)

    def group(self, name: str, op: Operation, reason: str, prefixed: bool = False) -> None:
        pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
        self.out.append(Acl(self.who, self.role, ResourceType.GROUP, name, pattern, op, reason))

    def transactional_id(self, prefix: str, reason: str) -> None:
        self.out.append(
            Acl(
                self.who, self.role, ResourceType.TRANSACTIONAL_ID, prefix, PatternType.PREFIXED,
                Operation.WRITE, reason,
            )
        )  # fmt: skip

    def cluster(self, op: Operation, reason: str) -> None:
        self.out.append(
            Acl(
                self.who,
                self.role,
                ResourceType.CLUSTER,
                CLUSTER_NAME,
                PatternType.LITERAL,
                op,
                reason,
            )
        )


_CHECKED_BEFORE_DELAYS = "checked to exist with the right settings before the first delayed send"
"""Why the producers and the consumers describe the HALF and OP topics."""

R, W, C = Operation.READ, Operation.WRITE, Operation.CREATE
D, DC = Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS


def _producer(g: _Grants, catalog: TopicCatalog, topics: Iterable[str]) -> None:
    t = catalog.topic
    g.topics(topics, (W,), "send to the real topics")
    for system in (SystemTopic.SCHEDULE, SystemTopic.TIMER):
        g.topic(t(system), (W, DC), "delayed and timer messages wait here (settings checked)")
    g.topic(t(SystemTopic.RECALL), (W, DC), "recall markers of timer messages (recall_message)")
    for system in (SystemTopic.HALF, SystemTopic.OP):
        g.topic(t(system), (D, DC), _CHECKED_BEFORE_DELAYS)


def _transactional(g: _Grants, catalog: TopicCatalog, group: str, topics: Iterable[str]) -> None:
    _producer(g, catalog, topics)
    ns = catalog.namespace
    # Half messages and END records (and check answers); replaces the DESCRIBE above.
    g.topic(catalog.topic(SystemTopic.HALF), (W,), "half messages, END records and check answers")
    g.topic(check_topic(group, ns), (R, C), "this group's check requests (created at start)")
    g.group(transaction_check_group(ns, group), R, "the check-request consumers' group")


def _coordinator(g: _Grants, catalog: TopicCatalog, topics: Iterable[str]) -> None:
    ns = catalog.namespace
    for system in SystemTopic:
        ops = [C, DC, W]
        if system is not SystemTopic.QUARANTINE:
            ops.append(R)
        g.topic(catalog.topic(system), ops, "the system topics: created at start, read, written")
    g.topic(f"{ns}.CHECK.", (C, W), "check requests to every producer group", prefixed=True)
    g.topic(f"{ns}.RETRY.", (W,), "delayed retries are delivered to retry topics", prefixed=True)
    g.topics(topics, (W, DC), "committed transactional and due delayed messages")
    for kind in ("transaction", "schedule", "timer"):
        g.group(coordinator_group(ns, kind), R, f"the {kind} service's group")
    g.group(RECOVERY_GROUP_PREFIX, R, "transaction recovery readers", prefixed=True)
    g.group(RECALL_GROUP_PREFIX, R, "the timer services' recall readers", prefixed=True)
    g.group(
        f"{ns}.transaction-check.",
        D,
        "whether a producer group has a live producer (a member of its check consumers); "
        "without it a check unanswered for a check interval counts, as in RocketMQ",
        prefixed=True,
    )
    g.transactional_id(f"{ns}.coordinator.", "each service writes in Kafka transactions")
    g.cluster(DC, "whether the broker creates topics on first write")


def _consumer(g: _Grants, catalog: TopicCatalog, group: str, topics: Iterable[str]) -> None:
    ns = catalog.namespace
    g.topics(topics, (R,), "consume the real topics")
    g.group(group, R, "the consumer group (clustering)")
    g.group(f"{group}.broadcast.", R, "broadcasting instances' groups", prefixed=True)
    g.topic(retry_topic(group, ns), (R, C), "its retry topic (created at start)")
    g.topic(dlq_topic(group, ns), (W, C), "dead letters (created at start)")
    quarantine = catalog.topic(SystemTopic.QUARANTINE)
    g.topic(quarantine, (W, DC), "records that cannot be decoded are kept there")
    t = catalog.topic
    for system in (SystemTopic.SCHEDULE, SystemTopic.TIMER):
        g.topic(t(system), (W, DC), "failed messages go back through the delay levels")
    for system in (SystemTopic.HALF, SystemTopic.OP):
        g.topic(t(system), (D, DC), _CHECKED_BEFORE_DELAYS)


def _spark(g: _Grants, catalog: TopicCatalog, topics: Iterable[str]) -> None:
    ns = catalog.namespace
    g.topics(topics, (R,), "ingest reads the real topics")
    for system in (SystemTopic.HALF, SystemTopic.OP, SystemTopic.CHECK_MAX):
        g.topic(catalog.topic(system), (R,), "the transaction audit")
    for kind in ("RETRY", "DLQ"):
        g.topic(f"{ns}.{kind}.", (R,), "the retry and DLQ report", prefixed=True)
    g.group(SPARK_GROUP_PREFIX, R, "Spark's Kafka source groups", prefixed=True)


def _operator(g: _Grants, catalog: TopicCatalog, topics: Iterable[str]) -> None:
    ns = catalog.namespace
    g.topic(
        f"{ns}.",
        (C, R, W, DC),
        "provision the namespace's topics (topics create), read them (the views), replay to them",
        prefixed=True,
    )
    g.topics(topics, (C, R, W, DC), "create real topics, replay to them, read them")
    g.group(
        f"{ns}.coordinator.",
        D,
        "committed offsets of the delay services (health, delays status)",
        prefixed=True,
    )
    g.group(
        READER_GROUP_PREFIX,
        R,
        "the operator commands' throw-away readers (they commit nothing)",
        prefixed=True,
    )
    g.transactional_id(f"{ns}.operator.", "replaying or dropping a parked transaction")
    g.transactional_id(f"{ns}.quarantine.replay.", "replaying a quarantined message")


def acls_for(deployment: Deployment) -> list[Acl]:
    """Every ACL the deployment's principals need, sorted, without duplicates (a DESCRIBE
    that a READ or WRITE of the same principal and resource implies is left out)."""
    catalog = TopicCatalog(namespace=deployment.namespace)
    topics = deployment.topics
    out: list[Acl] = []
    if deployment.producer:
        _producer(_Grants(deployment.producer, Role.PRODUCER.value, out), catalog, topics)
    for group, who in sorted(deployment.transactional_producers.items()):
        role = f"{Role.TRANSACTIONAL_PRODUCER.value} {group}"
        _transactional(_Grants(who, role, out), catalog, group, topics)
    if deployment.coordinator:
        _coordinator(_Grants(deployment.coordinator, Role.COORDINATOR.value, out), catalog, topics)
    for group, who in sorted(deployment.consumers.items()):
        _consumer(_Grants(who, f"{Role.CONSUMER.value} {group}", out), catalog, group, topics)
    if deployment.spark:
        _spark(_Grants(deployment.spark, Role.SPARK.value, out), catalog, topics)
    if deployment.operator:
        _operator(_Grants(deployment.operator, Role.OPERATOR.value, out), catalog, topics)
    return _without_implied(out)


def _without_implied(acls: list[Acl]) -> list[Acl]:
    keys = {a.key for a in acls}
    seen: set[tuple[str, ...]] = set()
    kept: list[Acl] = []
    for acl in sorted(acls, key=lambda a: (a.principal, a.role, a.key)):
        if acl.key in seen:
            continue
        if acl.operation is Operation.DESCRIBE and any(
            (*acl.key[:4], op.value) in keys for op in (Operation.READ, Operation.WRITE)
        ):
            continue
        seen.add(acl.key)
        kept.append(acl)
    return kept
