"""Transactional (half) messages: the producer, the listener interface and the coordinator's
end-transaction and check-back service."""

from bridge.transaction.model import (
    LocalTransactionState,
    TransactionListener,
    TransactionStatus,
)
from bridge.transaction.producer import TransactionMQProducer, TransactionSendResult

__all__ = [
    "LocalTransactionState",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "TransactionStatus",
]
