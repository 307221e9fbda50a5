"""Running a workload on both sides, and reading the events back as comparable facts."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, defaultdict
from typing import Any

from tests.differential import bridge_side
from tests.differential.bridge_side import Event
from tests.differential.lanes import Sides
from tests.differential.rocketmq_side import DriverRun, V5DriverRun

# Properties only RocketMQ shows, whatever the message (see docs/compatibility.md).
ROCKETMQ_BROKER = frozenset({"CLUSTER", "MSG_REGION", "TRACE_ON", "WAIT"})
"""Set by the RocketMQ broker or client on every message: cluster name, region and trace
switch of the broker, the producer's ``waitStoreMsgOK``. Kafka records have no such fields."""
ROCKETMQ_PULLED = frozenset({"MIN_OFFSET", "MAX_OFFSET"})
"""Set by RocketMQ's pull API on each message: the queue's offsets at the time."""
ROCKETMQ_PUSHED = ROCKETMQ_PULLED | {"CONSUME_START_TIME"}
"""Set by RocketMQ's push consumer on each message it hands to a listener."""
BRIDGE_ONLY = frozenset({"BORN_HOST"})
"""The producer's address: a field of RocketMQ's message, a header of the bridge's record."""
FAILURE_METADATA = frozenset(
    {
        "CONSUMER_GROUP",
        "CONSUME_FAILURE",
        "ORIGIN_KAFKA_TOPIC",
        "ORIGIN_QUEUE_ID",
        "ORIGIN_QUEUE_OFFSET",
        "ORIGIN_TIMESTAMP",
    }
)
"""The bridge's dead-letter metadata on a retry or DLQ copy of a message the listener failed by
returning a status (no exception, so no CONSUME_EXCEPTION_*): RocketMQ records none of it."""


def run_both(
    workload: str,
    sides: Sides,
    timeout_s: float = 240,
    rocketmq_only: dict[str, Any] | None = None,
    **args: Any,
) -> tuple[list[Event], list[Event]]:
    """Run ``workload`` against RocketMQ (its JVM in the background) and the bridge of ``sides``
    at the same time, with the same arguments and names; return (RocketMQ's events, the
    bridge's)."""
    suffix = uuid.uuid4().hex[:6]
    names = {
        "topic": f"diff-{workload}-{suffix}",
        "producer_group": f"diff_{workload}_p_{suffix}",
        "consumer_group": f"diff_{workload}_c_{suffix}",
    }
    run = DriverRun(
        workload, sides.rocketmq.namesrv_addr, sides.driver_home, timeout_s,
        **names, **args, **(rocketmq_only or {}),
    )  # fmt: skip
    try:
        bridge_events = getattr(bridge_side, workload)(sides.bridge_env, **names, **args)
        return run.events(), bridge_events
    finally:
        run.kill()


def of(events: list[Event], ev: str) -> list[Event]:
    """The events of one kind, in order."""
    return [e for e in events if e["ev"] == ev]


def one(events: list[Event], ev: str, key: str) -> Event:
    """The only event of kind ``ev`` for ``key``."""
    (found,) = [e for e in events if e["ev"] == ev and e["key"] == key]
    return found


def attempts(events: list[Event], instance: str | None = None) -> dict[str, list[Event]]:
    """Consume events by key, in order (of one broadcasting instance if given)."""
    out: dict[str, list[Event]] = defaultdict(list)
    for e in of(events, "consume"):
        if instance is None or e.get("instance") == instance:
            out[e["key"]].append(e)
    return dict(out)


def consumed_counts(events: list[Event]) -> Counter[str]:
    """How many times each key reached a listener."""
    return Counter(e["key"] for e in of(events, "consume"))


def gaps(times: list[int]) -> list[int]:
    """Differences between consecutive times."""
    return [b - a for a, b in itertools.pairwise(times)]


def prop_diff(rocketmq: Event, bridge: Event) -> tuple[set[str], set[str]]:
    """(property names only RocketMQ's message has, those only the bridge's has)."""
    r, b = set(rocketmq["props"]), set(bridge["props"])
    return r - b, b - r


def same_values(rocketmq: Event, bridge: Event, *names: str) -> dict[str, tuple[Any, Any]]:
    """The listed properties whose values differ between the two messages."""
    return {
        n: (rocketmq["props"].get(n), bridge["props"].get(n))
        for n in names
        if rocketmq["props"].get(n) != bridge["props"].get(n)
    }


def v5_names(workload: str) -> dict[str, str]:
    """A run's topic and group names (new ones each run)."""
    suffix = uuid.uuid4().hex[:6]
    return {
        "topic": f"diff-{workload}-{suffix}",
        "producer_group": f"diff_{workload}_p_{suffix}",
        "consumer_group": f"diff_{workload}_c_{suffix}",
    }


class RocketMQV5Run:
    """One of ``RocketMQV5Driver``'s workloads through RocketMQ 5's gRPC client and the proxy:
    ``RocketMQDriver``'s ``v5admin`` creates the topic and group with ``setup`` first, the
    workload runs in the background, and :meth:`events` waits for it and appends the messages
    of its group's DLQ, read afterwards (``dlq``)."""

    def __init__(
        self,
        workload: str,
        sides: Sides,
        names: dict[str, str],
        setup: dict[str, Any],
        timeout_s: float = 240,
        **args: Any,
    ) -> None:
        self.rocketmq, self.driver_home = sides.rocketmq, sides.driver_home
        self.admin = {
            "consumer_group": names["consumer_group"],
            "broker_addr": self.rocketmq.broker_addr,
        }
        DriverRun(
            "v5admin", self.rocketmq.namesrv_addr, self.driver_home, 120,
            action="setup", topic=names["topic"], **self.admin, **setup,
        ).events()  # fmt: skip
        self.run = V5DriverRun(
            workload, self.rocketmq.proxy_addr, self.driver_home, timeout_s, **names, **args
        )

    def kill(self) -> None:
        """Stop the workload if it is still going."""
        self.run.kill()

    def events(self) -> list[Event]:
        """The workload's events, then its DLQ's."""
        try:
            events = self.run.events()
        finally:
            self.run.kill()
        dlq = DriverRun(
            "v5admin", self.rocketmq.namesrv_addr, self.driver_home, 120, action="dlq", **self.admin
        )
        return events + of(dlq.events(), "dlq")


def run_both_v5(
    workload: str,
    sides: Sides,
    setup: dict[str, Any],
    timeout_s: float = 240,
    rocketmq_only: dict[str, Any] | None = None,
    **args: Any,
) -> tuple[list[Event], list[Event]]:
    """Run one of ``RocketMQV5Driver``'s workloads against RocketMQ (:class:`RocketMQV5Run`)
    and the bridge at the same time; return (RocketMQ's events, the bridge's)."""
    names = v5_names(workload)
    run = RocketMQV5Run(workload, sides, names, setup, timeout_s, **args, **(rocketmq_only or {}))
    try:
        bridge_events = getattr(bridge_side, workload)(sides.bridge_env, **names, **args)
    except BaseException:
        run.kill()
        raise
    return run.events(), bridge_events
