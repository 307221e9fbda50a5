"""RocketMQ 5's ``Producer``: ``send``, ``send_async`` and transactions, over the project's
:class:`bridge.Producer` and :class:`bridge.TransactionMQProducer`.

A v5 producer has no producer group. Plain sends go through one :class:`bridge.Producer`
(named after RocketMQ's default group, ``DEFAULT_PRODUCER``). Transactions follow RocketMQ 5's
proxy, which checks a transactional message back with the producers that declared its
topic: the producer group of a transaction is its topic's name, so a producer made with a
``checker`` runs one :class:`bridge.TransactionMQProducer` per topic of ``topics`` (a check
consumer and a Kafka producer each), and any producer declaring the topic answers a
transaction another one left open, a restarted one included. Such a topic must make a valid
producer group name too (at most 200 characters, no ``.broadcast.`` or
``.transaction-check.``, not ``<namespace>.`` at its start).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from bridge.client import Producer as _Producer
from bridge.client import SendResult
from bridge.client.send_checks import kafka_topic_for
from bridge.client_configuration import ClientConfiguration, as_client_config, check_tls_enable
from bridge.config import ClientConfig
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidTopicNameError,
)
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.transaction import TransactionListener, TransactionMQProducer, TransactionStatus
from bridge.v5.message import Message, SendReceipt, as_message
from bridge.v5.transaction import (
    CHECK_TIMEOUT_MS,
    Transaction,
    TransactionChecker,
    checker_listener,
)

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


def _new_transactional_producer(
    topic: str, listener: TransactionListener, config: ClientConfig
) -> TransactionMQProducer:
    """The transactional producer of ``topic``'s transactions, whose producer group is the
    topic's name; :class:`InvalidTopicNameError` naming the topic when that name cannot be a
    producer group."""
    try:
        return TransactionMQProducer(
            topic,
            listener,
            config=config,
            check_timeout_ms=CHECK_TIMEOUT_MS,
        )
    except InvalidTopicNameError as exc:
        raise InvalidTopicNameError(
            topic,
            "with a checker, each topic is also the producer group of its transactions (their "
            "check-backs go to the producers declaring it, as RocketMQ 5's proxy sends them), "
            f"and as a group name it is refused: {exc.reason}",
        ) from exc


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
    coordinator must run, as for every transaction). The checker is called one check at a
    time. Errors are typed (``bridge.errors``); those of a send are :class:`bridge.Producer`'s.

    ``tls_enable`` is RocketMQ 5's argument: TLS is a setting of the Kafka connection here
    (``ClientConfiguration(..., kafka={"security.protocol": "SSL", ...})``), so True is
    accepted only when the configuration connects over TLS already
    (:class:`~bridge.errors.InvalidArgumentError` saying so otherwise).
    """

    def __init__(
        self,
        client_configuration: ClientConfiguration | ClientConfig,
        topics: Iterable[str] | str | None = (),
        checker: TransactionChecker | None = None,
        tls_enable: bool | None = None,
    ) -> None:
        config = as_client_config(client_configuration, "client_configuration")
        if config is None:
            raise InvalidArgumentError("a Producer needs a client_configuration")
        check_tls_enable(tls_enable, config, "Producer")
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
            listener = checker_listener(checker, self._check_answered)
            for topic in self.topics:
                self._transactional[topic] = _new_transactional_producer(topic, listener, config)
        self._transactions: weakref.WeakSet[Transaction] = weakref.WeakSet()
        """The transactions it began and someone still holds."""
        self._sent: weakref.WeakValueDictionary[str, Transaction] = weakref.WeakValueDictionary()
        """Transaction id -> the transaction, for those with a half message stored that someone
        still holds: what a check-back answered by this producer's checker is told about."""
        self._sent_lock = threading.Lock()
        self._lifecycle = Lifecycle("v5 producer")
        self._state_lock = threading.Lock()
        """Held by :meth:`startup` while the inner clients start, and by :meth:`shutdown` to
        decide which call shuts down."""

    # --- lifecycle -----------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between :meth:`startup` and :meth:`shutdown`."""
        return self._lifecycle.state is ServiceState.RUNNING

    def startup(self) -> None:
        """Start sending and, with a checker, answering check-backs of the declared topics'
        transactions. May be called once; the producer is running once it returns (a send
        meanwhile raises :class:`~bridge.errors.IllegalStateError`)."""
        with self._state_lock:
            if self._lifecycle.state is not ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.RUNNING)  # raises, saying why
            try:
                self._producer.start()
                for producer in self._transactional.values():
                    producer.start()
            except BaseException:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
                try:
                    self._close(None)  # what started stops again
                except Exception:
                    logger.exception("v5 producer: closing after a failed startup")
                raise
            self._lifecycle.transition(ServiceState.RUNNING)

    def start(self) -> None:
        """:meth:`startup` (the ``start()/stop()`` lifecycle)."""
        self.startup()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop: wait up to ``timeout_ms`` (default ``send_msg_timeout_ms``) for the sends in
        flight and the check-backs being answered, then as long again for the answers those
        checks gave to be written, and stop. Its inner clients (the plain sends' producer and
        one transactional producer per declared topic) shut down side by side, so this takes
        at most about twice ``timeout_ms``, whatever the number of topics. Idempotent, from
        any thread (a call during :meth:`startup` waits for it). A transaction left
        undecided is decided by the checker of a producer declaring its topic, once one
        runs."""
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0
        ):
            raise InvalidArgumentError(
                f"timeout_ms must be a non-negative int (ms) or None, got {timeout_ms!r}"
            )
        with self._state_lock:
            if self._lifecycle.state is ServiceState.SHUTDOWN_ALREADY:
                return
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
        self._close(timeout_ms)

    def stop(self) -> None:
        """:meth:`shutdown` (the ``start()/stop()`` lifecycle)."""
        self.shutdown()

    def _close(self, timeout_ms: int | None) -> None:
        """Shut the inner clients down side by side, each waiting at most its own bound from
        now; then raise the first error one of them raised. The plain producer's shutdown
        runs on the caller's thread (it refuses to wait inside its own delivery callback)."""
        transactional = list(self._transactional.values())
        errors: list[BaseException] = []
        with ThreadPoolExecutor(
            max(len(transactional), 1), thread_name_prefix="bridge-v5-shutdown"
        ) as pool:
            done = [pool.submit(producer.shutdown, timeout_ms) for producer in transactional]
            try:
                self._producer.shutdown(timeout_ms)
            except BaseException as exc:
                errors.append(exc)
        errors += [error for error in (future.exception() for future in done) if error]
        if errors:
            raise errors[0]

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
            return SendReceipt(
                result.msg_id,
                result.topic,
                result.queue_id,
                result.offset,
                recall_handle=result.recall_handle,
            )
        producer = self._transactional_producer(message, transaction)
        half = transaction._send(producer, msg)
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
                SendReceipt(
                    result.msg_id,
                    result.topic,
                    result.queue_id,
                    result.offset,
                    recall_handle=result.recall_handle,
                )
            )

        message.message_id = self._producer.send_async(msg, sent, future.set_exception)
        return future

    # --- recall --------------------------------------------------------------------------
    def recall_message(self, topic: str, recall_handle: str) -> str:
        """Recall the timed message sent to ``topic`` whose ``SendReceipt.recall_handle``
        is ``recall_handle`` (RocketMQ 5.3): its message id once it is certain never to be
        delivered (RocketMQ 5's Python client returns the id too). Raises
        :class:`~bridge.errors.RecallTooLateError` when it came too late (the message is
        delivered exactly once, or was), and
        :class:`~bridge.errors.InvalidArgumentError` naming the problem for a malformed
        handle or one of another topic; see :meth:`bridge.Producer.recall_message`."""
        self._require_running()
        return self._producer.recall_message(topic, recall_handle)

    def recall_message_async(self, topic: str, recall_handle: str) -> Future[str]:
        """:meth:`recall_message` without waiting: a :class:`concurrent.futures.Future` of
        the message id or of the error (run on a thread of its own)."""
        self._require_running()
        future: Future[str] = Future()
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                future.set_result(self.recall_message(topic, recall_handle))
            except BaseException as exc:  # handed to the future's owner
                future.set_exception(exc)

        threading.Thread(target=run, name="bridge-v5-recall", daemon=True).start()
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
        transaction = Transaction(self._require_running, self._stored)
        self._transactions.add(transaction)
        return transaction

    def _stored(self, transaction_id: str, transaction: Transaction) -> None:
        with self._sent_lock:
            self._sent[transaction_id] = transaction

    def _check_answered(self, transaction_id: str, status: TransactionStatus) -> TransactionStatus:
        """The answer a check-back of ``transaction_id`` gets when the checker answered
        ``status`` (on a check thread): the transaction's say when this producer sent it."""
        with self._sent_lock:
            transaction = self._sent.get(transaction_id)
        return status if transaction is None else transaction._check_answered(status)

    def __repr__(self) -> str:
        return f"Producer(topics={list(self.topics)}, {self._lifecycle.state.value})"
