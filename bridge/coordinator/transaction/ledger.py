"""What the transaction service lends its collaborators
(:mod:`~bridge.coordinator.transaction.decisions`, :mod:`~bridge.coordinator.transaction.checks`,
:mod:`~bridge.coordinator.transaction.parking`, :mod:`~bridge.coordinator.transaction.recovery`):
its settings, the ledger of the HALF partitions it owns and the writer of its Kafka transactions. A
collaborator changes the partitions only through the ledger's operations and writes only through the
writer; none of them holds the service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from bridge.config import TrustLimits
from bridge.coordinator.transaction.half_batch import HalfBatch
from bridge.coordinator.transaction.state import CheckPolicy, HalfPartition, PendingHalf
from bridge.kafka.batch_writer import TransactionBatch
from bridge.kafka.service import ServiceConfig
from bridge.message import now_ms
from bridge.observability.metrics import BridgeMetrics
from bridge.transaction.model import OpAction, OpEntry
from topics.catalog import TopicCatalog


@dataclass(frozen=True, slots=True)
class HalfSettings:
    """The transaction service's settings, as its collaborators read them."""

    name: str
    """The service's name (in log lines)."""
    config: ServiceConfig
    policy: CheckPolicy
    limits: TrustLimits
    """The real topics it writes and the producer groups it acts for (G12)."""
    half_topic: str
    op_topic: str

    @property
    def catalog(self) -> TopicCatalog:
        """The system topics' names."""
        return self.config.catalog


class HalfLedger:
    """The HALF partitions this coordinator owns: the state of each one recovered, those whose
    state is to be rebuilt from Kafka first, and whether a commit applied on its own moved a
    checkpoint since the last offsets were committed."""

    def __init__(self) -> None:
        self._states: dict[int, HalfPartition] = {}
        """The state of each owned HALF partition that is recovered."""
        self._to_recover: set[int] = set()
        """Owned HALF partitions whose state is to be rebuilt from Kafka first."""
        self._moved = False

    # --- reading ----------------------------------------------------------------------------
    def get(self, partition: int) -> HalfPartition | None:
        """The state of ``partition``, if it has one (to be rebuilt or not)."""
        return self._states.get(partition)

    def values(self) -> list[HalfPartition]:
        """Every partition's state (a copy: the ledger may change while it is gone through)."""
        return list(self._states.values())

    def __iter__(self) -> Iterator[int]:
        """The partitions that have a state."""
        return iter(list(self._states))

    def current(self, partition: int) -> HalfPartition | None:
        """The state of ``partition`` unless it is to be rebuilt (its records are then read
        again once it is)."""
        if partition in self._to_recover:
            return None
        return self._states.get(partition)

    def to_recover(self) -> list[int]:
        """The partitions whose state is to be rebuilt, in order."""
        return sorted(self._to_recover)

    def checkpoints(self, topic: str) -> list[TopicPartition]:
        """Where a restart must read each owned, recovered partition of ``topic`` again."""
        return [
            TopicPartition(topic, p, state.checkpoint())
            for p, state in self._states.items()
            if p not in self._to_recover
        ]

    # --- changing ---------------------------------------------------------------------------
    def assigned(self, partition: int) -> None:
        """``partition`` is owned now: its state is to be built from Kafka."""
        self._to_recover.add(partition)

    def revoked(self, partition: int) -> None:
        """``partition`` is no longer owned: its state is forgotten."""
        self._states.pop(partition, None)
        self._to_recover.discard(partition)

    def recovered(self, partition: int, state: HalfPartition | None) -> None:
        """The rebuild of ``partition`` is over: ``state`` (None: it was not assigned any
        more, so it has none)."""
        if state is not None:
            self._states[partition] = state
        self._to_recover.discard(partition)

    def rebuild(self, partition: int) -> None:
        """Drop the state of ``partition`` (changed optimistically, or in doubt) and rebuild it
        from what Kafka holds before anything of it goes on."""
        self._states.pop(partition, None)
        self._to_recover.add(partition)

    def rebuild_all(self) -> None:
        """:meth:`rebuild` every partition (after a failed Kafka transaction)."""
        self._to_recover.update(self._states)
        self._states.clear()

    @property
    def moved(self) -> bool:
        """A commit applied on its own moved a checkpoint: the next batch commits offsets."""
        return self._moved

    def checkpoint_moved(self) -> None:
        """A commit applied on its own (or a check on its own) moved a checkpoint."""
        self._moved = True

    def offsets_written(self) -> None:
        """The checkpoints were written (or found unchanged): nothing moved since."""
        self._moved = False


@dataclass(frozen=True, slots=True)
class HalfWriter:
    """The Kafka transactions of the transaction service, as its collaborators write them."""

    op_topic: str
    """The OP topic: a decision's record goes to the partition of its HALF partition."""
    commit: Callable[[HalfBatch], bool]
    """Write a batch and every owned partition's checkpoint in one Kafka transaction; False
    when it failed (the state is then rebuilt)."""
    commit_alone: Callable[[HalfBatch], bool]
    """Write a batch in a Kafka transaction of its own (no offsets); False when it failed."""
    count: Callable[[TransactionBatch, Callable[[BridgeMetrics], object]], None]
    """Count in the metrics once a batch commits (see
    :meth:`~bridge.kafka.service.TransactionalService.count`)."""

    def write_op(
        self, state: HalfPartition, pending: PendingHalf, action: OpAction, batch: HalfBatch
    ) -> None:
        """Add the OP record that decides ``pending`` (``action``) to ``batch``."""
        entry = OpEntry(
            half_partition=state.partition,
            # The newest copy, read back or not: a restart that reads it knows it is decided.
            half_offset=pending.latest_offset,
            transaction_id=pending.transaction_id,
            msg_id=pending.message.msg_id,
            producer_group=pending.producer_group,
            action=action,
            decided_at_ms=now_ms(),
        )
        batch.put(
            self.op_topic,
            entry.encode(),
            partition=state.partition,
            key=pending.transaction_id.encode(),
        )
