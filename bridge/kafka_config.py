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

Values reach librdkafka as text (bools as ``true``/``false``, numbers as digits) or, for its
callbacks (``error_cb``, ``oauth_cb``, ...), as the callables they are; ``None``, bytes, lists
and other objects are refused by name, and so is ``logger`` (the bridge routes librdkafka's
logs to the ``bridge.kafka.rdkafka`` logger). ``default.topic.config``'s entries are read as
top-level settings, under the same rules.
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


_CALLBACKS: Final = frozenset(
    {"error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "on_commit"}
)
"""Settings confluent-kafka takes a callable for: passed to it as they are."""

_NESTED: Final = "default.topic.config"
"""confluent-kafka's old dict of topic settings: its entries are read as top-level ones."""

_LOGGER_REASON: Final = (
    "the bridge routes librdkafka's logs to the 'bridge.kafka.rdkafka' logger "
    "(logging.getLogger('bridge.kafka.rdkafka')); configure that logger's level and "
    "handlers instead"
)


def _text(name: str, value: object) -> str:
    """A setting's value as librdkafka reads it: text as it is, ``True`` as ``true``, numbers
    as digits; :class:`KafkaConfigError` naming ``name`` for anything else (None, bytes, a
    list, an object), which would reach librdkafka as its Python ``repr``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        raise KafkaConfigError(name, "None is no value; leave the setting out for the default")
    if callable(value):
        raise KafkaConfigError(
            name,
            "a callable is taken only where librdkafka takes a callback "
            f"({', '.join(sorted(_CALLBACKS))})",
        )
    raise KafkaConfigError(
        name,
        f"a {type(value).__name__} value cannot reach librdkafka; give text, a number or a bool",
    )


def _entries(conf: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``conf``'s settings, with the entries of a ``default.topic.config`` dict in its place
    (each then taken, or refused, as the top-level setting of its name would be)."""
    out: list[tuple[str, Any]] = []
    for name, value in conf.items():
        if not isinstance(name, str):
            raise KafkaConfigError(repr(name), "a setting's name must be a string")
        if name.lower() != _NESTED:
            out.append((name, value))
            continue
        if not isinstance(value, Mapping):
            raise KafkaConfigError(
                name, f"a dict of topic settings is needed, got {type(value).__name__}"
            )
        for inner, given in value.items():
            if not isinstance(inner, str):
                raise KafkaConfigError(f"{name}[{inner!r}]", "a setting's name must be a string")
            out.append((inner, given))
    return out


def split_kafka_config(conf: Mapping[str, Any]) -> KafkaConfigParts:
    """Sort confluent-kafka config ``conf`` (see the module docstring). Values reach
    librdkafka as text (bools as ``true``/``false``, numbers as digits), callables only for
    its callbacks (:data:`_CALLBACKS`); ``default.topic.config`` is read as top-level
    settings. Raises :class:`KafkaConfigError` naming the first setting the bridge must own
    and cannot take as given, or whose value cannot reach librdkafka (None, bytes, a list,
    an object, ``logger``), and why."""
    if not isinstance(conf, Mapping):
        raise KafkaConfigError("<config>", f"a mapping of settings is needed, got {conf!r}")
    fields: dict[str, Any] = {}
    kafka: dict[str, Any] = {}
    hooks: dict[str, Any] = {}
    group_id: str | None = None
    first: bool | None = None
    for name, value in _entries(conf):
        lowered = name.lower()
        if lowered in REFUSED_SETTINGS:
            raise KafkaConfigError(name, REFUSED_SETTINGS[lowered])
        if lowered in _HOOKS:
            hooks[lowered] = value
            continue
        if lowered == "logger":
            raise KafkaConfigError(name, _LOGGER_REASON)
        if lowered in _CALLBACKS and callable(value):
            kafka[name] = value  # error_cb, oauth_cb, throttle_cb, ...: as they are
            continue
        text = _text(name, value)
        required = REQUIRED_VALUES.get(lowered)
        if required is not None:
            accepted, why = required
            if text.lower().replace(" ", "") not in accepted:
                raise KafkaConfigError(
                    name, f"{value!r}: {why} (accepted: {', '.join(sorted(accepted))})"
                )
            continue  # the bridge sets it so itself
        target = _FIELDS.get(lowered)
        if target is not None:
            if target in _INT_FIELDS:
                try:
                    fields[target] = int(text)
                except ValueError:
                    raise KafkaConfigError(name, f"{value!r} is not a whole number") from None
            else:
                fields[target] = text
        elif lowered == "group.id":
            group_id = text
        elif lowered == "auto.offset.reset":
            where = _OFFSET_RESET.get(text.lower())
            if where is None:
                raise KafkaConfigError(
                    name,
                    f"{value!r}: a new group starts at the first or the last offset "
                    f"(accepted: {', '.join(_OFFSET_RESET)})",
                )
            first = where
        else:
            kafka[name] = text
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
