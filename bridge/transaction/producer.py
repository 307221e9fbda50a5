"""``TransactionMQProducer``: half messages tied to a local transaction, with check-back.

``send_message_in_transaction`` stores a half message in the HALF topic (never visible on its
real topic), runs ``execute_local_transaction`` and writes the decision after the half
message; the coordinator applies it. Undecided transactions are checked: the coordinator
writes a check request to the producer group's check topic, which every producer of the
group consumes as one Kafka consumer group, so each request reaches exactly one live member
(and a dead member's requests move to the others). Checks are answered on a named thread
pool (RocketMQ's defaults: 1 thread, 2000 requests held).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from bridge.client.producer import Producer, SendStatus
from bridge.codec import PreparedRecord, decode_envelope, encode_envelope
from bridge.config import ClientConfig
from bridge.errors import IllegalStateError, InvalidArgumentError, WireFormatError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.clients import new_consumer
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageConst, local_ipv4
from bridge.transaction.model import (
    CheckRequest,
    EndTransaction,
    TransactionListener,
    TransactionStatus,
)
from topics.catalog import SystemTopic, TopicCatalog

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The outcome of ``send_message_in_transaction``.

    ``queue_id`` and ``offset`` locate the half message in the HALF topic (the real message's
    place is known once the coordinator commits it); ``local_transaction_state`` is what
    ``execute_local_transaction`` returned.
    """

    status: SendStatus
    msg_id: str
    transaction_id: str
    topic: str
    queue_id: int
    offset: int
    local_transaction_state: TransactionStatus


def _run_listener(what: str, call: Any, transaction_id: str) -> TransactionStatus:
    try:
        status = call()
    except Exception:
        logger.exception("transaction %s: %s raised; state is UNKNOWN", transaction_id, what)
        return TransactionStatus.UNKNOWN
    if not isinstance(status, TransactionStatus):
        logger.error(
            "transaction %s: %s returned %r, not a TransactionStatus; state is UNKNOWN",
            transaction_id, what, status,
        )  # fmt: skip
        return TransactionStatus.UNKNOWN
    return status


class TransactionMQProducer(Startable):
    """RocketMQ's transactional producer.

    ``TransactionMQProducer("group", listener, bootstrap_servers=...)``; ``start()``, then
    ``send_message_in_transaction(msg, arg)``; ``shutdown()`` (or use ``with``).
    """

    def __init__(
        self,
        group: str,
        listener: TransactionListener | None,
        *,
        bootstrap_servers: str | None = None,
        namespace: str | None = None,
        config: ClientConfig | None = None,
        check_thread_pool_size: int = 1,
        check_request_hold_max: int = 2000,
        check_topic_partitions: int = 4,
        session_timeout_ms: int = 10_000,
    ) -> None:
        if check_thread_pool_size < 1 or check_request_hold_max < 1 or check_topic_partitions < 1:
            raise InvalidArgumentError(
                "check_thread_pool_size, check_request_hold_max and check_topic_partitions "
                "must be positive"
            )
        if session_timeout_ms < 6000:
            raise InvalidArgumentError(
                "session_timeout_ms must be at least 6000 (Kafka's minimum), "
                f"got {session_timeout_ms}"
            )
        self.group = group
        self.listener = listener
        self._producer = Producer(
            group, bootstrap_servers=bootstrap_servers, namespace=namespace, config=config
        )
        self.config = self._producer.config
        self.catalog = TopicCatalog(namespace=self.config.namespace)
        self.producer_id = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._check_pool_size = check_thread_pool_size
        self._check_hold = threading.BoundedSemaphore(check_request_hold_max)
        self._check_partitions = check_topic_partitions
        self._session_timeout_ms = session_timeout_ms
        self._lifecycle = Lifecycle(f"transaction producer {group}")
        self._stop = threading.Event()
        self._check_thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._half_topic = self.catalog.topic(SystemTopic.HALF)
        self._born_host = local_ipv4()

    def set_transaction_listener(self, listener: TransactionListener) -> None:
        """RocketMQ's ``setTransactionListener``; before ``start()``."""
        self.listener = listener

    def _require_listener(self) -> TransactionListener:
        listener = self.listener
        if listener is None or not (
            callable(getattr(listener, "execute_local_transaction", None))
            and callable(getattr(listener, "check_local_transaction", None))
        ):
            raise IllegalStateError(
                f"transaction producer {self.group} has no transaction listener "
                "(one with execute_local_transaction and check_local_transaction)"
            )
        return listener

    # --- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Start sending and answering checks. Raises without a listener."""
        self._require_listener()
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            TopicAdmin(self.config).ensure_topics(
                [self.catalog.check_topic_spec(self.group, self._check_partitions)]
            )
            self._producer.start()
        except BaseException:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        self._executor = ThreadPoolExecutor(
            self._check_pool_size, thread_name_prefix=f"bridge-txn-check-worker-{self.group}"
        )
        self._check_thread = threading.Thread(
            target=self._check_loop, name=f"bridge-txn-check-{self.group}", daemon=True
        )
        self._check_thread.start()

    def shutdown(self) -> None:
        """Stop answering checks, wait for pending sends, stop. Idempotent."""
        if self._lifecycle.state is not ServiceState.RUNNING:
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        self._stop.set()
        if self._check_thread is not None:
            self._check_thread.join()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._producer.shutdown()
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)

    def stop(self) -> None:
        """:meth:`shutdown`."""
        self.shutdown()

    # --- sending --------------------------------------------------------------------------
    def send_message_in_transaction(
        self, msg: Message, arg: Any = None, *, partition: int = -1
    ) -> TransactionSendResult:
        """Store ``msg`` as a half message, run the local transaction, send the decision.

        A delay level on ``msg`` is cleared (RocketMQ does not combine the two). ``partition``
        picks the real partition (-1: the key decides at commit). Raises
        :class:`IllegalStateError` without a listener, typed errors for bad messages.
        """
        listener = self._require_listener()
        self._lifecycle.require_running()
        prepared = self._producer.prepare(msg)  # validates topic, body, size; assigns the id
        tid = prepared.msg_id
        props = dict(msg.wire_properties())
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        props.update(
            {
                MessageConst.TRANSACTION_PREPARED: "true",
                MessageConst.PRODUCER_GROUP: self.group,
                MessageConst.REAL_TOPIC: msg.topic,
                MessageConst.REAL_QUEUE_ID: str(partition),
                MessageConst.TRANSACTION_ID: tid,
                MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: tid,
            }
        )
        envelope = encode_envelope(
            tid, msg.body, props, prepared.born_timestamp_ms, self._born_host
        )
        half = PreparedRecord(
            self._half_topic, tid.encode(), envelope, [], tid, prepared.born_timestamp_ms
        )
        half_partition, half_offset = self._producer.send_record_sync(half)
        logger.debug("transaction %s: half stored at %d@%d", tid, half_partition, half_offset)

        ext = decode_envelope(envelope, msg.topic)
        state = _run_listener(
            "execute_local_transaction", lambda: listener.execute_local_transaction(ext, arg), tid
        )
        self._end(tid, half_partition, state, from_check=False)
        return TransactionSendResult(
            SendStatus.SEND_OK, tid, tid, msg.topic, half_partition, half_offset, state
        )

    def _end(
        self, tid: str, half_partition: int, status: TransactionStatus, *, from_check: bool
    ) -> None:
        end = EndTransaction(
            transaction_id=tid,
            msg_id=tid,
            producer_group=self.group,
            status=status,
            from_transaction_check=from_check,
            producer_id=self.producer_id,
            requested_at_ms=time.time_ns() // 1_000_000,
        )
        record = PreparedRecord(
            self._half_topic, tid.encode(), end.encode(), [], tid, end.requested_at_ms
        )

        def delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is not None:
                # Not lost: the coordinator checks the transaction back.
                logger.warning("transaction %s: end request not stored (%s)", tid, err.str())

        self._producer.send_record_async(record, half_partition, delivered)

    # --- check-back ---------------------------------------------------------------------------
    def _check_loop(self) -> None:
        consumer = new_consumer(
            self.config,
            f"{self.config.namespace}.transaction-check.{self.group}",
            client_id=f"{self.group}-check",
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=max(self._session_timeout_ms // 6, 500),
        )
        consumer.subscribe([self.catalog.check_topic(self.group)])
        try:
            while not self._stop.is_set():
                record = consumer.poll(0.2)
                if record is None:
                    continue
                error = record.error()
                if error is not None:
                    if error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        logger.warning("check consumer: %s", error.str())
                    continue
                self._answer(record)
                consumer.commit(message=record, asynchronous=True)
        finally:
            consumer.close()

    def _answer(self, record: Any) -> None:
        try:
            request = CheckRequest.decode(record.value())
            msg = decode_envelope(request.message)
        except WireFormatError as exc:
            logger.error(
                "unreadable check request at %s@%d: %s", record.partition(), record.offset(), exc
            )
            return
        listener = self._require_listener()
        executor = self._executor
        if executor is None:
            return
        self._check_hold.acquire()  # RocketMQ's checkRequestHoldMax: wait when full

        def work() -> None:
            try:
                status = _run_listener(
                    "check_local_transaction",
                    lambda: listener.check_local_transaction(msg),
                    request.transaction_id,
                )
                logger.info(
                    "transaction %s: check %d answered %s",
                    request.transaction_id, request.check_times, status.value,
                )  # fmt: skip
                self._end(request.transaction_id, request.half_partition, status, from_check=True)
            finally:
                self._check_hold.release()

        executor.submit(work)
