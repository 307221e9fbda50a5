"""Is a coordinator running? Each of its services is a member of a Kafka consumer group;
the stack is healthy when every group has a member and is not rebalancing."""

from __future__ import annotations

from dataclasses import dataclass

from bridge.config import ClientConfig
from bridge.errors import BrokerUnreachableError
from bridge.kafka.clients import new_admin
from topics.naming import COORDINATOR_SERVICE_KINDS, coordinator_group

SERVICE_KINDS = COORDINATOR_SERVICE_KINDS


@dataclass(frozen=True, slots=True)
class ServiceHealth:
    """One coordinator service's consumer group."""

    kind: str
    group: str
    state: str
    """Kafka's group state (``STABLE``, ``EMPTY``, ``PREPARING_REBALANCE``, ...)."""
    members: int

    @property
    def healthy(self) -> bool:
        """At least one member and a stable group."""
        return self.members > 0 and self.state == "STABLE"


def coordinator_health(config: ClientConfig) -> list[ServiceHealth]:
    """The group of every coordinator service of ``config.namespace``. Raises
    :class:`BrokerUnreachableError` if Kafka does not answer within ``request_timeout_ms``."""
    groups = {kind: coordinator_group(config.namespace, kind) for kind in SERVICE_KINDS}
    timeout_s = config.request_timeout_ms / 1000
    admin = new_admin(config, "bridge-health")
    try:
        admin.list_topics(timeout=timeout_s)
    except Exception as exc:
        raise BrokerUnreachableError(f"Kafka at {config.bootstrap_servers}: {exc}") from exc
    futures = admin.describe_consumer_groups(list(groups.values()), request_timeout=timeout_s)
    out = []
    for kind, group in groups.items():
        try:
            described = futures[group].result(timeout=timeout_s)
        except Exception as exc:  # a group that never existed cannot be described
            out.append(ServiceHealth(kind, group, f"UNKNOWN ({exc})", 0))
            continue
        state = getattr(described.state, "name", str(described.state))
        out.append(ServiceHealth(kind, group, state, len(described.members)))
    return out
