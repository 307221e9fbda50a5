"""Client configuration: frozen dataclasses validated on construction.

Nothing is read from the environment at import time; :meth:`ClientConfig.from_env` reads it
when an entry point asks. Environment names: ``KAFKA_BOOTSTRAP_SERVERS`` (Kafka's usual
name), ``BRIDGE_<FIELD>`` for every other field (e.g. ``BRIDGE_NAMESPACE``,
``BRIDGE_SEND_MSG_TIMEOUT_MS``), and ``BRIDGE_KAFKA_<PROPERTY>`` for any librdkafka property,
dots written as underscores (``BRIDGE_KAFKA_SECURITY_PROTOCOL=SASL_SSL``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Self

from bridge.delay.model import DEFAULT_MESSAGE_DELAY_LEVEL, DelayPolicy
from bridge.errors import InvalidArgumentError
from topics.catalog import DEFAULT_TRANSACTION_PARTITIONS, TopicCatalog
from topics.naming import DEFAULT_NAMESPACE, validate_namespace

DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
ENV_BOOTSTRAP_SERVERS = "KAFKA_BOOTSTRAP_SERVERS"
ENV_PREFIX = "BRIDGE_"
ENV_KAFKA_PREFIX = "BRIDGE_KAFKA_"

# librdkafka properties the client sets itself; overriding them would break a guarantee.
_MANAGED_KAFKA_PROPERTIES = frozenset(
    {"enable.idempotence", "transactional.id", "isolation.level", "enable.auto.commit"}
)


def _positive(name: str, value: int, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidArgumentError(
            f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}"
        )


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings shared by producers, consumers and services."""

    bootstrap_servers: str = DEFAULT_BOOTSTRAP_SERVERS
    """Kafka's ``bootstrap.servers``: comma-separated ``host:port`` pairs."""
    namespace: str = DEFAULT_NAMESPACE
    """Prefix of system, retry and DLQ topics."""
    send_msg_timeout_ms: int = 3000
    """RocketMQ's ``sendMsgTimeout``: how long a send may take before it fails, in ms."""
    max_message_bytes: int = 1_048_576
    """Largest body accepted, in bytes (Kafka's default broker limit is about 1 MiB)."""
    linger_ms: int = 5
    """How long the client waits to fill a batch, in ms (Kafka's ``linger.ms``)."""
    request_timeout_ms: int = 10_000
    """Bound on admin and metadata calls, in ms."""
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    """RocketMQ's ``messageDelayLevel``: the delay of each level, e.g. ``"1s 5s 10s 30s 1m"``."""
    timer_precision_ms: int = 1000
    """RocketMQ 5's ``timerPrecisionMs`` (100, 200, 500 or 1000): timers are late by less."""
    timer_max_delay_ms: int = 3 * 86_400_000
    """RocketMQ 5's ``timerMaxDelaySec`` in ms (3 days; up to 400 days): longer is an error."""
    kafka: Mapping[str, str] = field(default_factory=dict)
    """Extra librdkafka properties (security, tuning); they win over the defaults."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers or not all(
            part.strip() for part in self.bootstrap_servers.split(",")
        ):
            raise InvalidArgumentError(
                "bootstrap_servers must be host:port[,host:port...], "
                f"got {self.bootstrap_servers!r}"
            )
        validate_namespace(self.namespace)
        _positive("send_msg_timeout_ms", self.send_msg_timeout_ms)
        _positive("max_message_bytes", self.max_message_bytes)
        _positive("linger_ms", self.linger_ms, allow_zero=True)
        _positive("request_timeout_ms", self.request_timeout_ms)
        managed = _MANAGED_KAFKA_PROPERTIES & set(self.kafka)
        if managed:
            raise InvalidArgumentError(
                f"kafka properties {sorted(managed)} are set by the client itself"
            )
        object.__setattr__(self, "kafka", MappingProxyType(dict(self.kafka)))
        self.delay_policy  # noqa: B018 - validates the delay settings

    def catalog(self, transaction_partitions: int = DEFAULT_TRANSACTION_PARTITIONS) -> TopicCatalog:
        """The topic catalog of this namespace: one SCHEDULE partition per delay level and one
        timer partition per tier of the delay settings."""
        policy = self.delay_policy
        return TopicCatalog(
            namespace=self.namespace,
            transaction_partitions=transaction_partitions,
            delay_level_count=policy.level_count,
            timer_partitions=policy.tier_count,
            schedule_max_delay_ms=max(policy.level_delays_ms),
            timer_max_delay_ms=policy.timer_max_delay_ms,
        )

    @property
    def delay_policy(self) -> DelayPolicy:
        """The delay level table and timer settings."""
        return _delay_policy(
            self.message_delay_level, self.timer_precision_ms, self.timer_max_delay_ms
        )

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Build from environment variables (see the module docstring), defaults elsewhere."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        kafka: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            if f.name == "kafka":
                continue
            key = (
                ENV_BOOTSTRAP_SERVERS
                if f.name == "bootstrap_servers"
                else (ENV_PREFIX + f.name.upper())
            )
            raw = env.get(key)
            if raw is None or raw == "":
                continue
            if f.type in ("int", int):
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise InvalidArgumentError(f"{key} must be an integer, got {raw!r}") from None
            else:
                values[f.name] = raw
        for key, raw in env.items():
            if key.startswith(ENV_KAFKA_PREFIX):
                kafka[key[len(ENV_KAFKA_PREFIX) :].lower().replace("_", ".")] = raw
        return cls(**values, kafka=kafka)


@lru_cache(maxsize=16)
def _delay_policy(levels: str, precision_ms: int, max_delay_ms: int) -> DelayPolicy:
    return DelayPolicy(levels, precision_ms, max_delay_ms)


def bootstrap_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The explicitly configured bootstrap servers, or None when none are configured."""
    env = os.environ if environ is None else environ
    return env.get(ENV_BOOTSTRAP_SERVERS) or None
