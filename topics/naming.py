"""Reversible mapping between RocketMQ topic names and Kafka topic names.

RocketMQ names its retry and dead-letter topics ``%RETRY%<group>`` and ``%DLQ%<group>``
and accepts ``%`` and ``|`` in names; Kafka only accepts ``[a-zA-Z0-9._-]`` (at most 249
characters) and, in addition, refuses to create two topics whose names differ only by
``.`` versus ``_`` (they would collide in its metric names).

The mapping, documented in the README:

* a name that is already a legal Kafka name and does not start with ``%`` is used as it is,
  so Kafka users' topics keep their names and their tools keep working;
* ``%RETRY%<group>`` becomes ``<namespace>.RETRY.<escaped group>`` and ``%DLQ%<group>``
  becomes ``<namespace>.DLQ.<escaped group>``;
* system topics (HALF, OP, SCHEDULE, ...) become ``<namespace>.<RocketMQ system name>``;
* each producer group's check-request topic is ``<namespace>.CHECK.<escaped group>``.

The Kafka consumer groups and transactional ids the project uses itself are built here too
(:func:`coordinator_group`, :func:`transaction_check_group`, :func:`broadcast_group`, ...), so
that :func:`validate_user_group` can refuse every user group name that would join one of them.

The group is escaped with ``_`` as the escape character: ``_`` is written ``__`` and every
character outside ``[a-zA-Z0-9-]`` is written ``_`` followed by two upper-case hex digits
(``.`` -> ``_2E``, ``%`` -> ``_25``, ``|`` -> ``_7C``). An escaped group therefore never
contains ``.``, so no two mapped names can collide even under Kafka's ``.``/``_`` rule, and
decoding is unambiguous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from topics.errors import InvalidArgumentError, InvalidTopicNameError

KAFKA_TOPIC_MAX_LENGTH = 249
"""Kafka's limit on a topic name's length, in characters."""

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
"""RocketMQ's ``MixAll.RETRY_GROUP_TOPIC_PREFIX``."""

DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
"""RocketMQ's ``MixAll.DLQ_GROUP_TOPIC_PREFIX``."""

DEFAULT_NAMESPACE = "rmq"

# Used with fullmatch: a "$" with re.match also matches before a final newline.
_KAFKA_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")
_NAMESPACE_LEGAL = re.compile(r"[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*")
# RocketMQ's TopicValidator accepts ^[%|a-zA-Z0-9_-]+$; Kafka users also use '.'.
_GROUP_LEGAL = re.compile(r"[%|a-zA-Z0-9._-]+")
_GROUP_MAX_LENGTH = 200
_ESCAPE_PLAIN = re.compile(r"[a-zA-Z0-9-]")
_ESCAPED_TOKEN = re.compile(r"__|_([0-9A-F]{2})|[a-zA-Z0-9-]")


class TopicKind(Enum):
    """What a Kafka topic is for, as far as this project is concerned."""

    REAL = "real"
    RETRY = "retry"
    DLQ = "dlq"
    CHECK = "check"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class ParsedTopic:
    """A Kafka topic name read back into RocketMQ terms."""

    kind: TopicKind
    rocketmq_name: str
    group: str | None = None


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` if it can prefix system topics, else raise.

    A namespace is one or more dot-separated words of ``[a-zA-Z0-9-]`` (no ``_``, so it can
    never collide with another namespace under Kafka's ``.``/``_`` rule), at most 64
    characters.
    """
    if not namespace or len(namespace) > 64 or not _NAMESPACE_LEGAL.fullmatch(namespace):
        raise InvalidTopicNameError(
            namespace,
            "a namespace must be 1-64 characters of dot-separated words of [a-zA-Z0-9-]",
        )
    return namespace


def validate_group(group: str) -> str:
    """Return ``group`` if it is a usable producer or consumer group name, else raise."""
    if not group:
        raise InvalidTopicNameError(group, "a group name must not be empty")
    if len(group) > _GROUP_MAX_LENGTH:
        raise InvalidTopicNameError(
            group, f"a group name must be at most {_GROUP_MAX_LENGTH} characters"
        )
    if not _GROUP_LEGAL.fullmatch(group):
        bad = sorted({c for c in group if not _GROUP_LEGAL.fullmatch(c)})
        raise InvalidTopicNameError(
            group, f"a group name may only contain [%|a-zA-Z0-9._-], found {bad!r}"
        )
    return group


COORDINATOR_SERVICE_KINDS: tuple[str, ...] = ("transaction", "schedule", "timer")
"""The coordinator's services, each a Kafka consumer group of its own."""

_BROADCAST_INFIX = ".broadcast."
_CHECK_GROUP_INFIX = ".transaction-check."
# The shape of a coordinator group of any namespace (another deployment may share the cluster).
_COORDINATOR_GROUP = re.compile(
    r"^[a-zA-Z0-9-]+(\.[a-zA-Z0-9-]+)*\.coordinator\.(" + "|".join(COORDINATOR_SERVICE_KINDS) + ")$"
)


def validate_user_group(group: str, namespace: str) -> str:
    """Return ``group`` if a user's producer or consumer group may take it, else raise.

    On top of :func:`validate_group`, refuses every name that is, or could be, one of the
    project's own Kafka groups, which a user group of that name would join (taking its
    partitions, committing its offsets):

    * anything starting with ``<namespace>.`` (the coordinator's ``<namespace>.coordinator.<kind>``,
      the check consumers' ``<namespace>.transaction-check.<group>``, operator ids);
    * ``<any namespace>.coordinator.<kind>`` and names containing ``.transaction-check.``
      (the same groups of another namespace on the cluster);
    * names containing ``.broadcast.`` (a broadcasting consumer's ``<group>.broadcast.<instance>``).
    """
    validate_group(group)
    validate_namespace(namespace)
    if group.startswith(namespace + "."):
        raise InvalidTopicNameError(
            group,
            f"the namespace {namespace!r} is reserved for the bridge's own groups "
            f"({namespace}.coordinator.<kind>, {namespace}.transaction-check.<group>)",
        )
    if _COORDINATOR_GROUP.match(group) or _CHECK_GROUP_INFIX in group:
        raise InvalidTopicNameError(
            group,
            "'<namespace>.coordinator.<kind>' and '.transaction-check.' are reserved for the "
            "coordinator's and the check consumers' groups",
        )
    if _BROADCAST_INFIX in group:
        raise InvalidTopicNameError(
            group,
            "'.broadcast.' is reserved for broadcasting consumers' per-instance groups "
            "(<group>.broadcast.<instance>)",
        )
    return group


def coordinator_group(namespace: str, kind: str) -> str:
    """The consumer group of one coordinator service (every coordinator of the namespace joins
    it, so they share the service's partitions)."""
    if kind not in COORDINATOR_SERVICE_KINDS:
        raise InvalidArgumentError(
            f"unknown coordinator service kind {kind!r}; known: {COORDINATOR_SERVICE_KINDS}"
        )
    return f"{validate_namespace(namespace)}.coordinator.{kind}"


def coordinator_group_instance_id(coordinator_id: str, kind: str) -> str:
    """The static member id (``group.instance.id``) of one coordinator's service: a restarted
    coordinator with the same id takes its partitions back at once."""
    return f"{coordinator_id}-{kind}"


def coordinator_transactional_id(namespace: str, kind: str, coordinator_id: str) -> str:
    """The ``transactional.id`` of one coordinator's service: a restart with the same id fences
    its predecessor and aborts what it left open."""
    return f"{coordinator_group(namespace, kind)}.{coordinator_id}"


def transaction_check_group(namespace: str, producer_group: str) -> str:
    """The consumer group of a producer group's check-request consumers (one per producer)."""
    return f"{validate_namespace(namespace)}.transaction-check.{validate_group(producer_group)}"


def broadcast_group(group: str, instance: str) -> str:
    """The consumer group of one instance of a broadcasting consumer group: every instance
    reads every message and keeps its own offsets."""
    return f"{validate_group(group)}{_BROADCAST_INFIX}{instance}"


def operator_transactional_id(namespace: str, token: str) -> str:
    """The ``transactional.id`` of one operator action (replaying or dropping a parked
    message); ``token`` makes it unique."""
    return f"{validate_namespace(namespace)}.operator.{token}"


def reader_group(purpose: str, token: str) -> str:
    """A throw-away consumer group for a reader that commits nothing (``bridge-<purpose>-<token>``,
    ``token`` random so that no two readers share it)."""
    return f"bridge-{purpose}-{token}"


def escape_group(group: str) -> str:
    """Escape a group name into Kafka-legal characters without any ``.`` (see module doc)."""
    validate_group(group)
    out: list[str] = []
    for ch in group:
        if ch == "_":
            out.append("__")
        elif _ESCAPE_PLAIN.match(ch):
            out.append(ch)
        else:
            out.append(f"_{ord(ch):02X}")
    return "".join(out)


def unescape_group(escaped: str) -> str:
    """Invert :func:`escape_group`; raise if ``escaped`` is not an escaped group name."""
    out: list[str] = []
    pos = 0
    while pos < len(escaped):
        m = _ESCAPED_TOKEN.match(escaped, pos)
        if m is None:
            raise InvalidTopicNameError(escaped, f"not an escaped group name at index {pos}")
        token = m.group(0)
        if token == "__":
            out.append("_")
        elif m.group(1) is not None:
            out.append(chr(int(m.group(1), 16)))
        else:
            out.append(token)
        pos = m.end()
    group = "".join(out)
    if escape_group(group) != escaped:
        raise InvalidTopicNameError(escaped, "not the canonical escape of any group name")
    return group


_SYSTEM_TOPICS_KEPT = 256
"""Names :func:`system_topic` keeps, at most (system topics times namespaces in use)."""


def _check_kafka_name(name: str, original: str) -> str:
    if len(name) > KAFKA_TOPIC_MAX_LENGTH:
        raise InvalidTopicNameError(
            original,
            f"maps to a Kafka topic of {len(name)} characters, "
            f"more than Kafka's {KAFKA_TOPIC_MAX_LENGTH}",
        )
    if name in (".", ".."):
        raise InvalidTopicNameError(original, "'.' and '..' are not valid Kafka topic names")
    return name


def retry_topic(group: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Kafka name of RocketMQ's ``%RETRY%<group>``."""
    validate_namespace(namespace)
    return _check_kafka_name(
        f"{namespace}.RETRY.{escape_group(group)}", RETRY_GROUP_TOPIC_PREFIX + group
    )


def dlq_topic(group: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Kafka name of RocketMQ's ``%DLQ%<group>``."""
    validate_namespace(namespace)
    return _check_kafka_name(
        f"{namespace}.DLQ.{escape_group(group)}", DLQ_GROUP_TOPIC_PREFIX + group
    )


def check_topic(producer_group: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Kafka name of the topic that carries check requests to a producer group's live members
    (RocketMQ sends them over the producers' connections instead)."""
    validate_namespace(namespace)
    return _check_kafka_name(
        f"{namespace}.CHECK.{escape_group(producer_group)}", f"check topic of {producer_group}"
    )


def _system_topic(system_name: str, namespace: str) -> str:
    validate_namespace(namespace)
    return _check_kafka_name(f"{namespace}.{system_name}", system_name)


_kept_system_topic = lru_cache(maxsize=_SYSTEM_TOPICS_KEPT)(_system_topic)


def system_topic(system_name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Kafka name of a system topic such as ``RMQ_SYS_TRANS_HALF_TOPIC``. Checked once per
    name and namespace, then kept: a delayed send or retry copy names SCHEDULE or the timer
    topic once a record, with a frozen config's namespace. A refusal is never kept."""
    try:
        return _kept_system_topic(system_name, namespace)
    except TypeError:
        # A value the cache cannot key on (a list, ...): checked as it is, so that one
        # validate_namespace refuses gets its typed error.
        return _system_topic(system_name, namespace)


def to_kafka_topic(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Map a RocketMQ topic name (as a user writes it) to its Kafka topic name.

    Raises :class:`InvalidTopicNameError` naming the problem when no mapping exists.
    """
    if not name:
        raise InvalidTopicNameError(name, "a topic name must not be empty")
    if name.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return retry_topic(name[len(RETRY_GROUP_TOPIC_PREFIX) :], namespace)
    if name.startswith(DLQ_GROUP_TOPIC_PREFIX):
        return dlq_topic(name[len(DLQ_GROUP_TOPIC_PREFIX) :], namespace)
    if not _KAFKA_LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _KAFKA_LEGAL.fullmatch(c)})
        raise InvalidTopicNameError(
            name,
            f"Kafka topic names may only contain [a-zA-Z0-9._-], found {bad!r} "
            "(only %RETRY%<group> and %DLQ%<group> are mapped)",
        )
    validate_namespace(namespace)
    if kafka_collision_key(name).startswith(kafka_collision_key(namespace) + "_"):
        raise InvalidTopicNameError(
            name, f"the namespace {namespace!r} is reserved for system, retry and DLQ topics"
        )
    return _check_kafka_name(name, name)


def parse_kafka_topic(
    kafka_name: str, namespace: str = DEFAULT_NAMESPACE, system_names: frozenset[str] = frozenset()
) -> ParsedTopic:
    """Read a Kafka topic name back into RocketMQ terms (the inverse of :func:`to_kafka_topic`).

    ``system_names`` lists the known system topic names (without namespace); a namespaced
    name that is neither retry, DLQ nor a known system topic raises.
    """
    prefix = namespace + "."
    if not kafka_name.startswith(prefix):
        return ParsedTopic(TopicKind.REAL, kafka_name)
    rest = kafka_name[len(prefix) :]
    if rest.startswith("RETRY."):
        group = unescape_group(rest[len("RETRY.") :])
        return ParsedTopic(TopicKind.RETRY, RETRY_GROUP_TOPIC_PREFIX + group, group)
    if rest.startswith("DLQ."):
        group = unescape_group(rest[len("DLQ.") :])
        return ParsedTopic(TopicKind.DLQ, DLQ_GROUP_TOPIC_PREFIX + group, group)
    if rest.startswith("CHECK."):
        group = unescape_group(rest[len("CHECK.") :])
        return ParsedTopic(TopicKind.CHECK, f"check topic of {group}", group)
    if rest in system_names:
        return ParsedTopic(TopicKind.SYSTEM, rest)
    raise InvalidTopicNameError(kafka_name, f"unknown topic in namespace {namespace!r}")


def _pattern_literal(namespace: str) -> str:
    """``namespace`` inside a regular expression: it holds only ``[a-zA-Z0-9-]`` and dots."""
    return validate_namespace(namespace).replace(".", "\\.")


def real_topics_pattern(namespace: str = DEFAULT_NAMESPACE) -> str:
    """A regular expression (Java's and Python's alike, for a Kafka client's pattern
    subscription) matching every real topic: none of the namespace's topics (names that start
    with the namespace and ``.`` or ``_``, which Kafka treats alike) and none of Kafka's own
    (names starting with ``_``)."""
    return f"^(?!{_pattern_literal(namespace)}[._]|_).+"


def group_topics_pattern(namespace: str = DEFAULT_NAMESPACE) -> str:
    """A regular expression matching the namespace's retry and DLQ topics (those of
    :func:`retry_topic` and :func:`dlq_topic`)."""
    return f"^{_pattern_literal(namespace)}\\.(RETRY|DLQ)\\..+"


def kafka_collision_key(kafka_name: str) -> str:
    """The key under which Kafka considers two topic names to collide ('.' == '_')."""
    return kafka_name.replace(".", "_")


def is_kafka_internal(kafka_name: str) -> bool:
    """True for a name of Kafka's internal topics (``__consumer_offsets``,
    ``__transaction_state``, ...): only the broker writes to them. Kafka reserves every name
    starting with ``__``, and treats ``.`` and ``_`` alike, so ``._x`` counts too."""
    return kafka_collision_key(kafka_name).startswith("__")
