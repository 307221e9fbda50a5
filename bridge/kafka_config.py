"""A confluent-kafka config dict, as a Kafka application already has it, read into the
bridge's settings (``kafka_config=`` on the producers and consumers; ``docs/serialization.md``).

Every setting the bridge does not own passes through to librdkafka as it is (security, SASL
callbacks, compression, tuning). The settings the bridge owns are taken where they have a
field of their own (``bootstrap.servers``, ``linger.ms``, ``message.timeout.ms``, the group
and where a new group starts), accepted where the value is the one the bridge uses anyway
(``enable.idempotence: True``, ``acks: "all"``, ``isolation.level: "read_committed"``,
``enable.auto.commit: False``, ...), and otherwise refused with a :class:`KafkaConfigError`
naming the setting and the reason: :data:`REFUSED_SETTINGS` always, the others only with a
value that would break a guarantee (:data:`REQUIRED_VALUES`).

``key.serializer``/``value.serializer`` and ``key.deserializer``/``value.deserializer``
(confluent-kafka's ``SerializingProducer``/``DeserializingConsumer`` keys) are the
serializer hooks, unless the keyword arguments name other ones (then refused as a conflict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from bridge.config import ClientConfig
from bridge.errors import KafkaConfigError

__all__ = [
    "REFUSED_SETTINGS",
    "REQUIRED_VALUES",
    "KafkaConfigParts",
    "apply_kafka_config",
    "pick_hook",
    "read_kafka_config",
    "split_kafka_config",
]

_SENT_ONCE = "the bridge always sends idempotently with acks=all (no loss, no duplicates)"
_COMMITS = "the bridge commits offsets itself, after a message is processed"

REFUSED_SETTINGS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "transactional.id": (
            "the coordinator derives one transactional id per service (coordinator_id); a "
            "shared one would fence the others"
        ),
        "transaction.timeout.ms": (
            "only the coordinator's Kafka transactions have a timeout: "
            "CoordinatorConfig.kafka_transaction_timeout_ms"
        ),
        "group.instance.id": (
            "every consumer built from this config would share it and fence the others"
        ),
        "message.max.bytes": (
            "the record limit is derived from max_message_bytes (the body limit); set that"
        ),
    }
)
"""Settings refused whatever their value: name -> why."""

REQUIRED_VALUES: Final[Mapping[str, tuple[frozenset[str], str]]] = MappingProxyType(
    {
        "enable.idempotence": (frozenset({"true"}), _SENT_ONCE),
        "acks": (frozenset({"all", "-1"}), _SENT_ONCE),
        "request.required.acks": (frozenset({"all", "-1"}), _SENT_ONCE),
        "isolation.level": (
            frozenset({"read_committed"}),
            "only committed records may be read (no aborted or undecided transaction)",
        ),
        "enable.auto.commit": (frozenset({"false"}), _COMMITS),
        "auto.commit.enable": (frozenset({"false"}), _COMMITS),
        "enable.partition.eof": (
            frozenset({"false"}),
            "the bridge turns it on per consumer where it scans to a partition's end",
        ),
        "delivery.report.only.error": (
            frozenset({"false"}),
            "a send waits for its delivery report, successes included",
        ),
        "partitioner": (
            frozenset({"murmur2_random", "murmur2"}),
            "keyed messages must land on the partition the Java client picks (murmur2)",
        ),
        "group.protocol": (
            frozenset({"classic"}),
            "the bridge's rebalance callbacks need the classic, eager protocol",
        ),
        "partition.assignment.strategy": (
            frozenset({"range", "roundrobin", "range,roundrobin", "roundrobin,range"}),
            "the bridge's rebalance callbacks need an eager strategy (whole assignments)",
        ),
    }
)
"""Settings accepted only with the value the bridge uses anyway: name -> (the values
accepted, written as librdkafka reads them, lower case; why)."""

_FIELDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "bootstrap.servers": "bootstrap_servers",
        "metadata.broker.list": "bootstrap_servers",
        "linger.ms": "linger_ms",
        "queue.buffering.max.ms": "linger_ms",
        "message.timeout.ms": "send_msg_timeout_ms",
        "delivery.timeout.ms": "send_msg_timeout_ms",
    }
)
"""Settings that are a ``ClientConfig`` field: name -> field."""
_INT_FIELDS: Final = frozenset({"linger_ms", "send_msg_timeout_ms"})

_OFFSET_RESET: Final[Mapping[str, bool]] = MappingProxyType(
    {
        "smallest": True,
        "earliest": True,
        "beginning": True,
        "largest": False,
        "latest": False,
        "end": False,
    }
)
"""``auto.offset.reset`` values: True for the first offset, False for the last."""

_HOOKS: Final = frozenset(
    {"key.serializer", "value.serializer", "key.deserializer", "value.deserializer"}
)


@dataclass(frozen=True, slots=True)
class KafkaConfigParts:
    """What :func:`split_kafka_config` made of a confluent-kafka config dict."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    """``ClientConfig`` fields the dict sets (``bootstrap_servers``, ``linger_ms``,
    ``send_msg_timeout_ms``)."""
    kafka: Mapping[str, Any] = field(default_factory=dict)
    """What passes through to librdkafka (``ClientConfig.kafka``)."""
    group_id: str | None = None
    """``group.id``: a consumer's group must be this one."""
    from_first_offset: bool | None = None
    """``auto.offset.reset``: True for earliest, False for latest, None when absent."""
    hooks: Mapping[str, Any] = field(default_factory=dict)
    """The serializer hooks it names: ``key.serializer`` -> the serializer, ..."""


def _text(value: object) -> str:
    """A setting's value as librdkafka reads it: ``True`` as ``true``, numbers as digits."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def split_kafka_config(conf: Mapping[str, Any]) -> KafkaConfigParts:
    """Sort confluent-kafka config ``conf`` (see the module docstring). Raises
    :class:`KafkaConfigError` naming the first setting the bridge must own and cannot take
    as given, and why."""
    if not isinstance(conf, Mapping):
        raise KafkaConfigError("<config>", f"a mapping of settings is needed, got {conf!r}")
    fields: dict[str, Any] = {}
    kafka: dict[str, Any] = {}
    hooks: dict[str, Any] = {}
    group_id: str | None = None
    first: bool | None = None
    for name, value in conf.items():
        if not isinstance(name, str):
            raise KafkaConfigError(repr(name), "a setting's name must be a string")
        lowered = name.lower()
        if lowered in REFUSED_SETTINGS:
            raise KafkaConfigError(name, REFUSED_SETTINGS[lowered])
        required = REQUIRED_VALUES.get(lowered)
        if required is not None:
            accepted, why = required
            if _text(value).lower().replace(" ", "") not in accepted:
                raise KafkaConfigError(
                    name, f"{value!r}: {why} (accepted: {', '.join(sorted(accepted))})"
                )
            continue  # the bridge sets it so itself
        target = _FIELDS.get(lowered)
        if target is not None:
            if target in _INT_FIELDS:
                try:
                    fields[target] = int(_text(value))
                except ValueError:
                    raise KafkaConfigError(name, f"{value!r} is not a whole number") from None
            else:
                fields[target] = _text(value)
        elif lowered == "group.id":
            group_id = _text(value)
        elif lowered == "auto.offset.reset":
            where = _OFFSET_RESET.get(_text(value).lower())
            if where is None:
                raise KafkaConfigError(
                    name,
                    f"{value!r}: a new group starts at the first or the last offset "
                    f"(accepted: {', '.join(_OFFSET_RESET)})",
                )
            first = where
        elif lowered in _HOOKS:
            hooks[lowered] = value
        elif callable(value):
            kafka[name] = value  # error_cb, oauth_cb, throttle_cb, ...: as they are
        else:
            kafka[name] = _text(value)
    return KafkaConfigParts(fields, kafka, group_id, first, hooks)


def pick_hook(parts: KafkaConfigParts | None, setting: str, given: Any) -> Any:
    """The hook for ``setting`` (``value.serializer``, ...): ``given`` (the keyword
    argument) or the config's; :class:`KafkaConfigError` when both name different ones."""
    from_config = parts.hooks.get(setting) if parts is not None else None
    if given is not None and from_config is not None and given is not from_config:
        argument = setting.replace(".", "_")
        raise KafkaConfigError(
            setting, f"{argument}= names another one; give the hook in one place only"
        )
    return given if given is not None else from_config


def apply_kafka_config(config: ClientConfig, parts: KafkaConfigParts | None) -> ClientConfig:
    """``config`` with what ``parts`` sets: its fields, and its librdkafka settings over
    ``config.kafka``."""
    if parts is None:
        return config
    return config.replace(**parts.fields, kafka={**config.kafka, **parts.kafka})


def read_kafka_config(conf: Mapping[str, Any] | None) -> KafkaConfigParts | None:
    """:func:`split_kafka_config` of ``conf``; None for None."""
    return None if conf is None else split_kafka_config(conf)
