"""Transactional (half) messages: the producer, the listener interface and the coordinator's
end-transaction and check-back service."""

from bridge.transaction.model import (
    LocalTransactionState,
    TransactionListener,
    TransactionStatus,
)
from bridge.transaction.producer import HalfMessage, TransactionMQProducer, TransactionSendResult

__all__ = [
    "HalfMessage",
    "LocalTransactionState",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "TransactionStatus",
]
