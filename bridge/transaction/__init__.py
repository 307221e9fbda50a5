"""Transactional (half) messages, the client's half: the ``TransactionMQProducer``
(:mod:`~bridge.transaction.producer`), which answers the coordinator's check requests with its
:class:`~bridge.transaction.check_responder.CheckResponder` (over the check consumer of
:mod:`~bridge.transaction.check_consumer`) and writes half messages and decisions with its
:mod:`~bridge.transaction.sender`, and the listener interface (:mod:`~bridge.transaction.model`,
whose END, check and OP records the coordinator reads too). The coordinator's end-transaction
and check-back service is :mod:`bridge.coordinator.transaction`."""

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
