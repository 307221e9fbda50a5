"""RocketMQ 5's ``Producer``: ``send``, ``send_async`` and transactions, over the project's
:class:`bridge.Producer` and :class:`bridge.TransactionMQProducer`.

A v5 producer has no producer group. Plain sends go through one :class:`bridge.Producer`
(named after RocketMQ's default group, ``DEFAULT_PRODUCER``). Transactions follow RocketMQ 5's
proxy, which checks a transactional message back with the producers that declared its
topic: the producer group of a transaction is its topic's name, so a producer made with a
``checker`` runs one :class:`bridge.TransactionMQProducer` per topic of ``topics`` (a check
consumer and a Kafka producer each), and any producer declaring the topic answers a
transaction another one left open, a restarted one included.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Final

from bridge.client import Producer as _Producer
from bridge.client import SendResult
from bridge.client.send_checks import kafka_topic_for
from bridge.client_configuration import ClientConfiguration, as_client_config
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, InvalidArgumentError, InvalidMessageError
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.transaction import TransactionMQProducer
from bridge.v5.message import Message, SendReceipt, as_message
from bridge.v5.transaction import Transaction, TransactionChecker, checker_listener

__all__ = ["DEFAULT_PRODUCER_GROUP", "Producer"]

logger = logging.getLogger(__name__)

DEFAULT_PRODUCER_GROUP: Final = "DEFAULT_PRODUCER"
"""The group (Kafka client id) of a v5 producer's plain sends: RocketMQ's default producer
group name."""


def _topic_names(topics: Iterable[str] | str | None) -> tuple[str, ...]:
    """``topics`` as a tuple without repeats: None is none, a string is one topic."""
    if topics is None:
        return ()
    if isinstance(topics, str):
        return (topics,)
    if not isinstance(topics, Iterable):
        raise InvalidArgumentError(
            f"topics must be an iterable of topic names, got {type(topics).__name__}"
        )
    names: list[str] = []
    for topic in topics:
        if not isinstance(topic, str):
            raise InvalidArgumentError(f"a topic must be a string, got {type(topic).__name__}")
        if topic not in names:
            names.append(topic)
    return tuple(names)


class Producer(Startable):
    """RocketMQ 5's ``Producer(client_configuration, topics, checker)``.

    ``client_configuration`` is a :class:`ClientConfiguration` (or a
    :class:`~bridge.ClientConfig`); ``topics`` the topics it sends to (checked now; a
    transactional message's topic must be one of them); ``checker`` a
    :class:`TransactionChecker`, needed for transactions. :meth:`startup` (or ``with``)
    before sending, :meth:`shutdown` after.

    :meth:`send` waits for Kafka's acknowledgement (at most ``request_timeout``) and returns
    a :class:`SendReceipt`; :meth:`send_async` returns a :class:`concurrent.futures.Future`
    of it. :meth:`begin_transaction` starts a :class:`Transaction`: ``send(message,
    transaction)`` stores its half message, ``transaction.commit()`` or ``rollback()`` decides
    it, and the ``checker`` answers the coordinator's check-back of one left undecided (a
    coordinator must run, as for every transaction). Errors are typed (``bridge.errors``);
    those of a send are :class:`bridge.Producer`'s.
    """

    def __init__(
        self,
        client_configuration: ClientConfiguration | ClientConfig,
        topics: Iterable[str] | str | None = (),
        checker: TransactionChecker | None = None,
    ) -> None:
        config = as_client_config(client_configuration, "client_configuration")
        if config is None:
            raise InvalidArgumentError("a Producer needs a client_configuration")
        self.config = config
        """The :class:`~bridge.ClientConfig` it connects with."""
        self.topics = _topic_names(topics)
        """The topics it declared."""
        for topic in self.topics:
            kafka_topic_for(topic, config.namespace)  # InvalidTopicNameError naming it
        self._producer = _Producer(DEFAULT_PRODUCER_GROUP, config=config)
        self._checker = checker
        self._transactional: dict[str, TransactionMQProducer] = {}
        """Topic -> the transactional producer of its producer group (with a checker)."""
        if checker is not None:
            listener = checker_listener(checker)
            for topic in self.topics:
                self._transactional[topic] = TransactionMQProducer(topic, listener, config=config)
        self._transactions: weakref.WeakSet[Transaction] = weakref.WeakSet()
        """The transactions it began and someone still holds."""
        self._lifecycle = Lifecycle("v5 producer")

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between :meth:`startup` and :meth:`shutdown`."""
        return self._lifecycle.state is ServiceState.RUNNING

    def startup(self) -> None:
        """Start sending and, with a checker, answering check-backs of the declared topics'
        transactions. May be called once."""
        self._lifecycle.start_with(self._start, self._close)

    def start(self) -> None:
        """:meth:`startup` (the ``start()/stop()`` lifecycle)."""
        self.startup()

    def _start(self) -> None:
        self._producer.start()
        for producer in self._transactional.values():
            producer.start()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) for sends in flight and
        check-backs being answered, then stop. Idempotent. A transaction left undecided is
        decided by the checker of a producer declaring its topic, once one runs."""
        if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
            return
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        self._close(timeout_ms)

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def _close(self, timeout_ms: int | None = None) -> None:
        for producer in self._transactional.values():
            producer.shutdown(timeout_ms)
        self._producer.shutdown(timeout_ms)

    def _require_running(self) -> None:
        if self._lifecycle.state is not ServiceState.RUNNING:
            raise IllegalStateError(
                f"the producer is {self._lifecycle.state.value}, not RUNNING: call startup() "
                "first (a producer shut down does not start again)"
            )

    # --- sending -------------------------------------------------------------------------
    def send(self, message: Message, transaction: Transaction | None = None) -> SendReceipt:
        """Send ``message`` and wait for Kafka's acknowledgement; with ``transaction`` (from
        :meth:`begin_transaction`), store it as the transaction's half message instead,
        delivered once the transaction commits. Sets ``message.message_id``.

        Raises :class:`~bridge.errors.InvalidMessageError` (and its kinds) for a message that
        cannot be sent, or a transactional one with a ``message_group`` or a
        ``delivery_timestamp`` (RocketMQ 5 refuses them too);
        :class:`~bridge.errors.InvalidArgumentError` for a transaction of another producer,
        one that holds a message already, or a topic not in ``topics``;
        :class:`~bridge.errors.SendError` when Kafka did not store it;
        :class:`~bridge.errors.IllegalStateError` unless running."""
        msg = as_message(message)
        self._require_running()
        if transaction is None:
            result = self._producer.send_sync(msg)
            message.message_id = result.msg_id
            return SendReceipt(result.msg_id, result.topic, result.queue_id, result.offset)
        producer = self._transactional_producer(message, transaction)
        half = transaction.send(producer, msg)
        message.message_id = half.transaction_id
        return SendReceipt(
            half.transaction_id,
            half.topic,
            half.half_partition,
            half.half_offset,
            transaction_id=half.transaction_id,
        )

    def _transactional_producer(
        self, message: Message, transaction: Transaction
    ) -> TransactionMQProducer:
        if not isinstance(transaction, Transaction) or transaction not in self._transactions:
            raise InvalidArgumentError(
                f"send(message, transaction): {transaction!r} is not a transaction of this "
                "producer (begin_transaction())"
            )
        if message.message_group is not None or message.delivery_timestamp is not None:
            raise InvalidMessageError(
                "a transactional message cannot have a message_group or a delivery_timestamp"
            )
        producer = self._transactional.get(message.topic or "")
        if producer is None:
            raise InvalidArgumentError(
                f"topic {message.topic!r} is not among this producer's topics "
                f"{list(self.topics)}: a transaction's check-backs go to the producers that "
                "declare its topic; give it in Producer(configuration, topics, checker)"
            )
        return producer

    def send_async(self, message: Message) -> Future[SendReceipt]:
        """Send ``message`` without waiting: a :class:`concurrent.futures.Future` of its
        :class:`SendReceipt`, or of the :class:`~bridge.errors.SendError` that failed it.
        ``message.message_id`` is set at once. The future completes on the producer's
        delivery thread: callbacks added to it must be short and must not send with this
        producer and wait. A message that cannot be sent raises here, as :meth:`send`."""
        msg = as_message(message)
        self._require_running()
        future: Future[SendReceipt] = Future()
        future.set_running_or_notify_cancel()  # no cancel once sending: it cannot be undone

        def sent(result: SendResult) -> None:
            future.set_result(
                SendReceipt(result.msg_id, result.topic, result.queue_id, result.offset)
            )

        message.message_id = self._producer.send_async(msg, sent, future.set_exception)
        return future

    # --- transactions --------------------------------------------------------------------
    def begin_transaction(self) -> Transaction:
        """A new :class:`Transaction`. Raises :class:`~bridge.errors.IllegalStateError`
        without a ``checker`` (as RocketMQ 5 does: every transaction may need one) or unless
        running."""
        self._require_running()
        if self._checker is None:
            raise IllegalStateError(
                "begin_transaction() needs a TransactionChecker: "
                "Producer(configuration, topics, checker=...)"
            )
        transaction = Transaction(self._require_running)
        self._transactions.add(transaction)
        return transaction

    def __repr__(self) -> str:
        return f"Producer(topics={list(self.topics)}, {self._lifecycle.state.value})"
