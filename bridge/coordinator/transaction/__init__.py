"""The coordinator's transaction service: :class:`~bridge.coordinator.transaction.service.
TransactionService` reads the HALF partitions it owns and applies the producers' decisions,
checks back undecided half messages, parks what stays undecided and recovers a partition's
state after a restart. Runs in the coordinator process only; the client half (the
``TransactionMQProducer``) is :mod:`bridge.transaction`."""
