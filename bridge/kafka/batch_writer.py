"""The one transactional batch writer: begin, produce, send offsets, commit, abort, used by
the transaction service, the delay services and the operators' replays.

A :class:`TransactionBatch` holds the :class:`~bridge.codec.PreparedRecord` s of one Kafka
transaction and, as delivery reports arrive, what became of each. :func:`write_batch` writes
it: ``begin_transaction``, ``produce`` of every record (a record the producer refuses before
sending may be replaced by another form of it, see ``on_refused``), the caller's check after
producing, the input offsets (``send_offsets_to_transaction``), the caller's check before
committing, ``commit_transaction``. Any failure on the way is handed to ``on_failure`` (abort,
or replace a fenced or wedged producer; the caller then re-reads its inputs) and noted in the
batch: :attr:`TransactionBatch.error` and :attr:`TransactionBatch.in_doubt`. Which record made
a transaction fail is the caller's to find (poison isolation) from the reports
(:attr:`TransactionBatch.reports`, :meth:`TransactionBatch.unacknowledged`) with
:func:`~bridge.kafka.transactional.is_permanent_delivery_error`.

The producer is a :class:`~bridge.kafka.transactional.BoundedTransactions` made by
:func:`~bridge.kafka.transactional.transactional_producer`, so that no transaction call blocks
past its timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from bridge.codec import PreparedRecord

Delivered = Callable[[KafkaError | None, Any], None]
"""A delivery callback: ``(error or None, confluent_kafka.Message)``."""
Refused = Callable[[int, PreparedRecord, KafkaException], PreparedRecord | None]
"""Called when ``produce`` refuses record ``index`` before sending it: another form of the
record to produce in its place (the transaction stays intact), or None to fail the
transaction with the refusal."""
Check = Callable[["TransactionBatch"], None]
"""A step of the caller's inside the transaction; it raises ``KafkaException`` to fail it."""

TRANSACTION_FAILURES: Final = (KafkaException, SystemError, BufferError)
"""What a failed transaction raises: confluent-kafka's errors, ``SystemError`` (a fatal
producer error met while a delivery callback ran) and ``BufferError`` (the local queue is full)."""
MAX_FORMS: Final = 4
"""Forms of one record tried when ``produce`` refuses them (the record, then smaller ones)."""
_PURGED: Final = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def as_kafka_exception(exc: BaseException) -> KafkaException:
    """One of :data:`TRANSACTION_FAILURES` as a ``KafkaException``: a ``SystemError`` counts as
    fatal (the producer is replaced), a ``BufferError`` as ``_QUEUE_FULL``."""
    if isinstance(exc, KafkaException):
        return exc
    if isinstance(exc, BufferError):
        return KafkaException(KafkaError(KafkaError._QUEUE_FULL, str(exc)))
    return KafkaException(KafkaError(KafkaError._FATAL, f"client failed: {exc}", fatal=True))


def kafka_error(exc: KafkaException) -> KafkaError | None:
    """The ``KafkaError`` a ``KafkaException`` carries, if any."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def is_purge(err: KafkaError) -> bool:
    """A record purged because its transaction failed or was aborted (not its own fault)."""
    return err.code() in _PURGED


class TransactionBatch:
    """The records of one Kafka transaction and what became of each.

    :attr:`reports` fills as delivery reports arrive (served by ``flush``/``poll``, so some
    arrive after :func:`write_batch` returned: the purges of an aborted transaction).
    """

    __slots__ = ("_callbacks", "error", "failure", "in_doubt", "records", "reports")

    def __init__(self) -> None:
        self.records: list[PreparedRecord] = []
        self._callbacks: list[Delivered | None] = []
        self.reports: dict[int, tuple[KafkaError | None, int]] = {}
        """Record index -> (its delivery error or None when stored, the partition it went to
        or -1)."""
        self.failure: KafkaException | None = None
        """What made the transaction fail (None: it did not)."""
        self.error: KafkaError | None = None
        """Why the transaction failed, as the producer said (None: it did not, or no
        ``KafkaError`` says)."""
        self.in_doubt = False
        """The transaction failed at or after its commit in a way that does not say whether it
        committed (a timeout, a fatal error): only Kafka knows."""

    def add(self, record: PreparedRecord, on_delivery: Delivered | None = None) -> int:
        """Add ``record`` (``on_delivery`` gets its delivery report); return its index."""
        self.records.append(record)
        self._callbacks.append(on_delivery)
        return len(self.records) - 1

    def __len__(self) -> int:
        return len(self.records)

    def unacknowledged(self) -> set[int]:
        """Records reported failed (purged included), by index."""
        return {index for index, (err, _) in self.reports.items() if err is not None}

    def _reporter(self, index: int) -> Delivered:
        then = self._callbacks[index]
        reports = self.reports

        def report(err: KafkaError | None, kmsg: Any) -> None:
            partition = kmsg.partition()
            reports[index] = (err, -1 if partition is None else partition)
            if then is not None:
                then(err, kmsg)

        return report


def _produce(producer: Any, batch: TransactionBatch, on_refused: Refused | None) -> None:
    """Produce every record of ``batch``; a refused one is replaced while ``on_refused`` gives
    another form of it, at most :data:`MAX_FORMS` tries."""
    records = batch.records
    produce = producer.produce  # looked up once: a BoundedTransactions forwards it
    for index in range(len(records)):
        for _ in range(MAX_FORMS):
            record = records[index]
            try:
                produce(
                    record.kafka_topic,
                    record.value,
                    record.key,
                    partition=record.partition,
                    headers=record.headers,
                    timestamp=record.born_timestamp_ms,
                    on_delivery=batch._reporter(index),
                )
                break
            except KafkaException as exc:
                replacement = None if on_refused is None else on_refused(index, record, exc)
                if replacement is None:
                    raise
                records[index] = replacement
        else:
            raise KafkaException(
                KafkaError(KafkaError._STATE, "no form of the record was accepted")
            )


def write_batch(
    producer: Any,
    batch: TransactionBatch,
    *,
    timeout_s: float,
    on_failure: Callable[[KafkaException], None],
    offsets: Callable[[], list[TopicPartition]] | None = None,
    group_metadata: Callable[[], Any] | None = None,
    after_produce: Check | None = None,
    before_commit: Check | None = None,
    on_refused: Refused | None = None,
    failures: tuple[type[BaseException], ...] = TRANSACTION_FAILURES,
) -> bool:
    """Write ``batch`` in one Kafka transaction of ``producer``; True once committed.

    In order: begin, produce (``on_refused``: see :data:`Refused`), ``after_produce``, the
    input ``offsets`` (asked for only then, so they may depend on the reports served so far;
    none or an empty list: no offsets) with ``group_metadata``, ``before_commit``, commit.
    ``timeout_s`` bounds each transaction call, seconds.

    On any of ``failures`` the batch notes :attr:`~TransactionBatch.error` and
    :attr:`~TransactionBatch.in_doubt`, ``on_failure`` gets the error as a
    ``KafkaException`` (it aborts or replaces the producer; what it raises passes) and this
    returns False.
    """
    committing = False
    try:
        producer.begin_transaction()
        _produce(producer, batch, on_refused)
        if after_produce is not None:
            after_produce(batch)
        if offsets is not None:
            positions = offsets()
            if positions:
                assert group_metadata is not None
                producer.send_offsets_to_transaction(positions, group_metadata(), timeout_s)
        if before_commit is not None:
            before_commit(batch)
        committing = True
        producer.commit_transaction(timeout_s)
    except failures as exc:
        failure = batch.failure = as_kafka_exception(exc)
        batch.error = kafka_error(failure)
        # An error that requires an abort says the commit did not happen; a timeout or a fatal
        # error does not (EndTxn may have been prepared, and a new producer's
        # init_transactions then completes it).
        batch.in_doubt = committing and (
            batch.error is None or not batch.error.txn_requires_abort()
        )
        on_failure(failure)
        return False
    return True


def abort_quietly(producer: Any, timeout_s: float, log: Callable[[str], None]) -> None:
    """Abort ``producer``'s transaction; a failure (fenced, fatal) is only passed to ``log``:
    the broker aborts the transaction at its timeout instead."""
    try:
        producer.abort_transaction(timeout_s)
    except KafkaException as exc:
        log(f"abort failed (the transaction times out instead): {exc}")
