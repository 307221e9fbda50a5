"""Transactional messages: statuses, the listener interface, and the records exchanged with
the coordinator (end-transaction requests, check requests, OP entries)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from bridge.codec import PreparedRecord, real_record
from bridge.message import MessageConst, MessageExt
from topics.avro import default_registry


class TransactionStatus(Enum):
    """A local transaction's outcome (RocketMQ's ``LocalTransactionState``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


LocalTransactionState = TransactionStatus
"""RocketMQ's Java name for :class:`TransactionStatus`."""


class TransactionListener(abc.ABC):
    """Ties a half message to a local transaction.

    ``execute_local_transaction`` runs right after the half message is stored;
    ``check_local_transaction`` answers the coordinator's check-back for an undecided one.
    Both return a :class:`TransactionStatus`; an exception counts as ``UNKNOWN``.
    """

    @abc.abstractmethod
    def execute_local_transaction(self, msg: MessageExt, arg: Any) -> TransactionStatus:
        """Run the local transaction for ``msg`` and report its outcome."""

    @abc.abstractmethod
    def check_local_transaction(self, msg: MessageExt) -> TransactionStatus:
        """Report the outcome of ``msg``'s local transaction, as far as it is known."""


class OpAction(Enum):
    """Why a half message is never to be checked again (the OP record's action)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    DISCARD = "DISCARD"
    """Parked in the check-max topic after ``transaction_check_max`` checks or the retention."""


REMOVED_ON_COMMIT: Final = frozenset(
    {
        MessageConst.TRANSACTION_PREPARED,
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QUEUE_ID,
        MessageConst.TRANSACTION_CHECK_TIMES,
        MessageConst.DELAY_TIME_LEVEL,
        MessageConst.DELIVERY_ATTEMPTS,
        MessageConst.DELIVERY_ERROR,
    }
)
"""Properties a committed message loses on its way to the real topic (the delivery-failure
bookkeeping included). Every other property, text or bytes, is written byte for byte."""


def committed_record(msg: MessageExt, namespace: str) -> PreparedRecord:
    """The real-topic record of a half message being committed (see :func:`real_record`)."""
    return real_record(msg, namespace, REMOVED_ON_COMMIT)


END_TRANSACTION_SCHEMA: Final = "EndTransactionRequest"
CHECK_REQUEST_SCHEMA: Final = "CheckRequest"
OP_SCHEMA: Final = "OpRecord"


@dataclass(frozen=True, slots=True)
class EndTransaction:
    """A producer's decision on a transaction, written after its half message."""

    transaction_id: str
    msg_id: str
    producer_group: str
    status: TransactionStatus
    from_transaction_check: bool
    producer_id: str
    requested_at_ms: int
    check_times: int = 0
    """The check it answers (the request's ``check_times``); 0 when it answers none (the end
    request of ``send_message_in_transaction``, or a producer that does not say)."""

    def encode(self) -> bytes:
        """Avro single-object bytes."""
        return default_registry().encode(
            END_TRANSACTION_SCHEMA,
            {
                "transaction_id": self.transaction_id,
                "msg_id": self.msg_id,
                "producer_group": self.producer_group,
                "status": self.status.value,
                "from_transaction_check": self.from_transaction_check,
                "producer_id": self.producer_id,
                "requested_at_ms": self.requested_at_ms,
                "check_times": self.check_times,
            },
        )

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> EndTransaction:
        """From a decoded ``EndTransactionRequest`` record."""
        return cls(
            transaction_id=record["transaction_id"],
            msg_id=record["msg_id"],
            producer_group=record["producer_group"],
            status=TransactionStatus(record["status"]),
            from_transaction_check=record["from_transaction_check"],
            producer_id=record["producer_id"],
            requested_at_ms=record["requested_at_ms"],
            check_times=record.get("check_times", 0),
        )


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """The coordinator asks a producer group for a transaction's state."""

    transaction_id: str
    msg_id: str
    half_partition: int
    half_offset: int
    check_times: int
    message: bytes
    """The half message as a ``MessageEnvelope`` record."""

    def encode(self) -> bytes:
        """Avro single-object bytes."""
        return default_registry().encode(
            CHECK_REQUEST_SCHEMA,
            {
                "transaction_id": self.transaction_id,
                "msg_id": self.msg_id,
                "half_partition": self.half_partition,
                "half_offset": self.half_offset,
                "check_times": self.check_times,
                "message": self.message,
            },
        )

    @classmethod
    def decode(cls, data: bytes | None) -> CheckRequest:
        """From Avro bytes; raises a ``WireFormatError`` subclass on bad bytes."""
        record = default_registry().decode(CHECK_REQUEST_SCHEMA, data)
        return cls(**record)


@dataclass(frozen=True, slots=True)
class OpEntry:
    """An OP record: the half message at (half_partition, half_offset) is decided."""

    half_partition: int
    half_offset: int
    transaction_id: str
    msg_id: str
    producer_group: str
    action: OpAction
    decided_at_ms: int

    def encode(self) -> bytes:
        """Avro single-object bytes."""
        return default_registry().encode(
            OP_SCHEMA,
            {
                "half_partition": self.half_partition,
                "half_offset": self.half_offset,
                "transaction_id": self.transaction_id,
                "msg_id": self.msg_id,
                "producer_group": self.producer_group,
                "action": self.action.value,
                "decided_at_ms": self.decided_at_ms,
            },
        )

    @classmethod
    def decode(cls, data: bytes | None) -> OpEntry:
        """From Avro bytes; raises a ``WireFormatError`` subclass on bad bytes."""
        record = default_registry().decode(OP_SCHEMA, data)
        return cls(**{**record, "action": OpAction(record["action"])})
