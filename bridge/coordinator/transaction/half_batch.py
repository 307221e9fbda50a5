"""What one Kafka transaction of the transaction service writes (:class:`HalfBatch`), and the
records it is made of: copies of half messages (:func:`envelope`), OP records."""

from __future__ import annotations

from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from bridge.codec import PreparedRecord, encode_envelope
from bridge.coordinator.transaction.state import PendingHalf
from bridge.kafka.batch_writer import Delivered, TransactionBatch, kafka_error
from bridge.message import MessageConst, PropertyValue

DELIVERY_ATTEMPTS: Final = MessageConst.DELIVERY_ATTEMPTS
"""Property of a parked message: how many times writing its real record failed."""
DELIVERY_ERROR: Final = MessageConst.DELIVERY_ERROR
"""Property of a parked message: why its real record could not be written."""
MAX_DELIVERY_ERROR_CHARS: Final = 500
"""``DELIVERY_ERROR`` is cut to this many characters."""
TRANSIENT_BACKOFF_MAX_MS: Final = 30_000
"""Longest wait between attempts of a commit (or a check) that fails on its own, ms."""


class HalfBatch(TransactionBatch):
    """What one Kafka transaction writes, and what the transaction service notes about it: the
    commits in it (their real records' reports) and the bridge-made outputs of each
    transaction (check copies, check requests, parked copies)."""

    def __init__(self, *, dirty: bool = False, current: str | None = None) -> None:
        super().__init__()
        self.dirty = dirty
        self.real: dict[str, tuple[int, PreparedRecord]] = {}
        """Transaction id -> (HALF partition, real record) of each commit in the batch."""
        self.outcome: dict[str, KafkaError | None] = {}
        """Transaction id -> what became of its real record (None: stored)."""
        self.current = current
        """While set, what :meth:`add` writes is a bridge-made output for this transaction."""
        self.about: dict[str, int] = {}
        """Transaction id -> HALF partition of each transaction with bridge-made outputs."""
        self.side: dict[str, KafkaError | None] = {}
        """Transaction id -> what became of its bridge-made outputs (the first failure, or
        None once one was stored and none failed)."""
        self._owner: dict[int, str] = {}
        """Record index -> the transaction whose real record it is."""
        self._about: dict[int, str] = {}
        """Record index -> the transaction a bridge-made output is for."""

    def add_record(self, record: PreparedRecord, on_delivery: Delivered | None = None) -> None:
        """Add ``record``; while :attr:`current` is set, as an output for that transaction."""
        about = self.current
        if about is not None:
            on_delivery = self._noting(about, on_delivery)
            self._about[len(self.records)] = about
        self.add(record, on_delivery)
        self.dirty = True

    def put(
        self,
        topic: str,
        value: bytes,
        *,
        partition: int = -1,
        key: bytes | None = None,
        on_delivery: Delivered | None = None,
    ) -> None:
        """Add a record of ``topic`` without headers (see :meth:`add_record`)."""
        self.add_record(
            PreparedRecord(topic, key, value, [], self.current or "", 0, partition), on_delivery
        )

    def _noting(self, about: str, then: Delivered | None) -> Delivered:
        """A delivery callback that notes the outcome of an output for ``about``."""

        def report(err: KafkaError | None, kmsg: Any) -> None:
            if err is not None:
                if self.side.get(about) is None:
                    self.side[about] = err
            else:
                self.side.setdefault(about, None)
            if then is not None:
                then(err, kmsg)

        return report

    def add_real(self, transaction_id: str, half_partition: int, real: PreparedRecord) -> None:
        """The real record of a commit, its delivery report noted in :attr:`outcome`."""

        def delivered(err: KafkaError | None, kmsg: Any) -> None:
            self.outcome[transaction_id] = err

        self.real[transaction_id] = (half_partition, real)
        self._owner[len(self.records)] = transaction_id
        self.add(real, delivered)
        self.dirty = True

    def refused(self, index: int, record: PreparedRecord, exc: KafkaException) -> None:
        """A record ``produce`` refused at once is noted as its commit's (or its output's)
        outcome; the transaction then fails with it."""
        err = kafka_error(exc)
        if err is not None:
            owner = self._owner.get(index)
            if owner is not None:
                self.outcome[owner] = err
            about = self._about.get(index)
            if about is not None:
                self.side[about] = err


def envelope(pending: PendingHalf, body: bytes | None = None, /, **changes: PropertyValue) -> bytes:
    """``pending``'s half message with properties ``changes`` set (and ``body`` instead
    of its own, if given)."""
    msg = pending.message
    props = msg.properties
    props.update(changes)
    return encode_envelope(
        msg.msg_id,
        msg.body if body is None else body,
        props,
        msg.born_timestamp_ms,
        msg.born_host,
    )


def with_check_times(pending: PendingHalf, check_times: int) -> bytes:
    """``pending``'s half message with ``TRANSACTION_CHECK_TIMES`` = ``check_times``."""
    return envelope(pending, **{MessageConst.TRANSACTION_CHECK_TIMES: str(check_times)})
