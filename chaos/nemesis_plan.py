"""The nemesis schedule: :func:`plan` draws the faults of a run from ``random.Random(seed)``
alone, each a :class:`Fault` with its quiet time before, its length and its parameters (which
coordinator, which partition's leader, what latency). :mod:`chaos.nemesis` runs them and
re-exports every public name.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from chaos.history import NEMESES

TELLING: Final = (
    "coordinator_kill",
    "coordinator_pause",
    "leader_kill",
    "net_partition",
    "net_latency",
    "net_drop",
    "poison",
    "db_outage",
)
"""The kinds a short run (``make chaos``) gets one of each, when available."""

NETWORK: Final = frozenset({"net_latency", "net_drop", "net_partition"})
BROKER: Final = frozenset({"leader_kill", "rolling_restart", "disk_full"})

WARM_UP_S: Final = 8.0
"""Load before the first fault, s."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: ``quiet_s`` of quiet before it, then ``name`` for ``length_s`` (what
    that means depends on the kind: down time, pause, partition, latency), with ``params``."""

    name: str
    quiet_s: float
    length_s: float
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the plan printed at the start of a run."""
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"+{self.quiet_s:4.1f}s quiet, {self.name} {self.length_s:.1f}s {extra}".rstrip()


_ESTIMATE_S: Final = {
    "coordinator_kill": 4.0,
    "coordinator_pause": 2.0,
    "leader_kill": 20.0,
    "rolling_restart": 75.0,
    "net_latency": 0.0,
    "net_drop": 1.0,
    "net_partition": 0.0,
    "disk_full": 25.0,
    "poison": 2.0,
    "db_outage": 4.0,
}
"""Time a fault takes besides its length (restarts, health waits), s: only to plan a short
run's schedule so that it fits."""


def _draw(name: str, rng: random.Random, session_timeout_s: float, nodes: int) -> Fault:
    quiet = rng.uniform(5.0, 9.0)
    params: dict[str, Any] = {}
    if name == "coordinator_kill":
        length = rng.uniform(1.0, 4.0)
        params = {"coordinator": rng.randint(1, 2), "new_id": rng.random() < 0.5}
    elif name == "coordinator_pause":
        length = session_timeout_s + rng.uniform(3.0, 6.0)
        params = {"coordinator": rng.randint(1, 2)}
    elif name == "leader_kill":
        length = rng.uniform(4.0, 10.0)
        params = {"partition_of": rng.choice(("workload", "half", "schedule", "timer")),
                  "partition": rng.randint(0, 2)}  # fmt: skip
    elif name == "rolling_restart":
        length = 0.0
        order = list(range(1, nodes + 1))
        rng.shuffle(order)
        params = {"order": order}
    elif name == "net_latency":
        length = rng.uniform(6.0, 10.0)
        params = {"latency_ms": rng.choice((100, 200, 400))}
    elif name == "net_drop":
        length = 0.0
    elif name in ("net_partition", "disk_full"):
        length = rng.uniform(5.0, 10.0)
    elif name == "poison":
        length = 0.0
        params = {"count": rng.randint(4, 8)}
    elif name == "db_outage":
        # Shorter than transaction_check_max (15) checks at the run's interval (3 s): its
        # transactions must be committed once the database is back, none parked.
        length = rng.uniform(6.0, 12.0)
        params = {"storm": rng.choice((1000, 1500, 2000))}
    else:
        raise ValueError(f"unknown nemesis {name!r}; known: {', '.join(NEMESES)}")
    return Fault(name, quiet, length, params)


def plan(
    seed: int,
    duration_s: float,
    *,
    soak: bool,
    available: Sequence[str],
    session_timeout_s: float = 10.0,
    nodes: int = 3,
) -> list[Fault]:
    """The faults of a run of ``duration_s`` seconds of load, drawn from ``seed`` alone.

    Short run: one of each :data:`TELLING` kind that is ``available``, in a seeded order, as
    many as fit. Soak: rounds of every ``available`` kind, each round in a fresh order, until
    the estimated time passes ``duration_s``.
    """
    unknown = sorted(set(available) - set(NEMESES))
    if unknown:
        raise ValueError(f"unknown nemeses {unknown}; known: {', '.join(NEMESES)}")
    rng = random.Random(seed)
    faults: list[Fault] = []
    budget = duration_s - WARM_UP_S
    used = 0.0
    if not soak:
        kinds = [k for k in TELLING if k in available]
        rng.shuffle(kinds)
        for kind in kinds:
            fault = _draw(kind, rng, session_timeout_s, nodes)
            cost = fault.quiet_s + fault.length_s + _ESTIMATE_S[kind]
            if used + cost > budget:
                continue  # the next kinds may still fit
            faults.append(fault)
            used += cost
        return faults
    kinds = [k for k in NEMESES if k in available]
    while kinds and used < budget:
        round_ = list(kinds)
        rng.shuffle(round_)
        for kind in round_:
            fault = _draw(kind, rng, session_timeout_s, nodes)
            faults.append(fault)
            used += fault.quiet_s + fault.length_s + _ESTIMATE_S[kind]
            if used >= budget:
                break
    return faults
