"""How one fault-injection run goes (:class:`RunConfig`: seed, load time, brokers, faults and
the bridge settings scaled down for the run) and where the checkout is. :mod:`chaos.runner`
re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class RunConfig:
    """How one run goes. Times in seconds unless named otherwise."""

    seed: int
    duration_s: float
    soak: bool = False
    out_dir: Path | None = None
    """None: ``.chaos/<utc-stamp>/`` in the checkout."""
    nodes: int = 3
    heap_mb: int = 384
    """Of each broker JVM, MiB."""
    drain_timeout_s: float = 60.0
    settle_s: float = 3.0
    """Readers keep reading this long after the drain (a late duplicate still shows)."""
    spark: bool = True
    """Run the Spark ingest of the tx topic at the end (about 45 s)."""
    disk_full: bool | None = None
    """Mount a tmpfs log dir for one broker and fill it; None: on a soak, where root can."""
    nemeses: tuple[str, ...] | None = None
    """Only these kinds (None: every kind the run can inject)."""
    keep_data: bool = False
    namespace: str = "rmq"
    message_delay_level: str = "1s 2s 3s"
    timer_precision_ms: int = 500
    transaction_timeout_ms: int = 3000
    check_interval_ms: int = 3000
    session_timeout_ms: int = 10_000
    kafka_transaction_timeout_ms: int = 10_000
    max_reconsume_times: int = 2
    rate_scale: float = 1.0
    """Multiplies every operation rate of the workload."""
    database: bool = False
    """Add the ``db`` kind (its two applications run in the workload's process: on 2 cores
    they slow the check-back of a ``db_outage`` storm past the drain timeout)."""
