"""``TransactionMQProducer``: half messages tied to a local transaction, with check-back.

``send_message_in_transaction`` stores a half message in the HALF topic (never visible on its
real topic), runs ``execute_local_transaction`` and writes the decision after the half
message; the coordinator applies it. Its two halves are public too, for RocketMQ 5's model
(``bridge.v5``: begin a transaction, send, commit or roll back later): ``send_half_message``
and ``end_transaction``. Undecided transactions are checked: the coordinator writes a check
request to the producer group's check topic, which the producer's
:class:`~bridge.transaction.check_responder.CheckResponder` answers with the listener's
``check_local_transaction``.

The producer's collaborators: a :class:`~bridge.client.records.RecordBuilder` checks each
message and builds its record as :meth:`bridge.Producer.prepare` does (an explicit partition
against the sender's metadata), the :class:`~bridge.transaction.sender.HalfSender` writes the
half messages and the decisions, the ``CheckResponder`` answers the checks.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from bridge.client.records import RecordBuilder, producer_settings
from bridge.client.send_results import SendStatus
from bridge.codec import PreparedRecord, decode_envelope, encode_envelope
from bridge.config import ClientConfig
from bridge.errors import (
    IllegalStateError,
    InvalidArgumentError,
    KafkaClientError,
)
from bridge.kafka.admin import TopicAdmin
from bridge.lifecycle import Lifecycle, ServiceState, Startable
from bridge.message import Message, MessageConst, MessageExt, local_ipv4
from bridge.serialization import Serializer
from bridge.transaction.check_responder import CheckResponder, run_listener
from bridge.transaction.model import (
    EndTransaction,
    TransactionListener,
    TransactionStatus,
)
from bridge.transaction.sender import HalfSender
from topics.catalog import SystemTopic, TopicCatalog
from topics.naming import validate_user_group

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


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """A half message stored and not decided yet (:meth:`TransactionMQProducer.send_half_message`),
    what :meth:`TransactionMQProducer.end_transaction` decides."""

    transaction_id: str
    """The transaction's id, also the message's id."""
    topic: str
    """The real topic the message goes to once committed."""
    half_partition: int
    """Where the half message waits: its HALF partition and offset."""
    half_offset: int
    message: MessageExt
    """The message as stored (as the listener and the check-back see it)."""


class TransactionMQProducer(Startable):
    """RocketMQ's transactional producer.

    ``TransactionMQProducer("group", listener, bootstrap_servers=...)``; ``start()``, then
    ``send_message_in_transaction(msg, arg)``; ``shutdown()`` (or use ``with``).
    ``kafka_config``, ``key_serializer`` and ``value_serializer`` as for
    :class:`bridge.Producer`: a message given ``value=`` is serialized (with its real topic)
    before its half message is stored, so the commit delivers those bytes and no
    coordinator needs the serializer.
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
        check_timeout_ms: int = 30_000,
        kafka_config: Mapping[str, Any] | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ) -> None:
        if isinstance(check_timeout_ms, bool) or not isinstance(check_timeout_ms, int):
            raise InvalidArgumentError(f"check_timeout_ms must be an int, got {check_timeout_ms!r}")
        if check_timeout_ms < 1:
            raise InvalidArgumentError(f"check_timeout_ms must be positive, got {check_timeout_ms}")
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
        self.config, serializers = producer_settings(
            bootstrap_servers=bootstrap_servers,
            namespace=namespace,
            send_msg_timeout_ms=None,
            config=config,
            kafka_config=kafka_config,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
        )
        # The check consumers' group is <namespace>.transaction-check.<group>: the group name
        # must not be one of the bridge's own.
        validate_user_group(group, self.config.namespace)
        self._sender = HalfSender(self.config, group)
        # Checks and builds each message (an explicit partition against the sender's
        # metadata); the half messages and end requests go through the sender.
        self._builder = RecordBuilder(self.config, serializers, self._sender.metadata)
        self.catalog = TopicCatalog(namespace=self.config.namespace)
        self.producer_id = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._check_partitions = check_topic_partitions
        self._lifecycle = Lifecycle(f"transaction producer {group}")
        self._responder = CheckResponder(
            self.config,
            group,
            listener=self._require_listener,
            end=self._end_from_check,
            pool_size=check_thread_pool_size,
            hold_max=check_request_hold_max,
            timeout_ms=check_timeout_ms,
            session_timeout_ms=session_timeout_ms,
        )
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
    @property
    def state(self) -> ServiceState:
        """The producer's lifecycle state."""
        return self._lifecycle.state

    def start(self) -> None:
        """Start sending and answering checks. Raises without a listener."""
        self._require_listener()
        self._lifecycle.transition(ServiceState.RUNNING)
        try:
            admin = TopicAdmin(self.config)
            admin.ensure_topics([self.catalog.check_topic_spec(self.group, self._check_partitions)])
            # Any HALF partition count works for writing; the coordinator owns that choice.
            admin.ensure_topics(
                [self.catalog.spec(SystemTopic.HALF), self.catalog.spec(SystemTopic.OP)],
                strict=False,
            )
            self._sender.start()
        except BaseException:
            self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            raise
        self._responder.start()

    def shutdown(self, timeout_ms: int | None = None) -> None:
        """Stop taking check requests, wait at most ``timeout_ms`` (default
        ``send_msg_timeout_ms``) for the checks already taken to be answered, then at most as
        long again for pending sends, and stop. Idempotent.

        Checks still running or queued at the deadline are abandoned and logged (a hung
        ``check_local_transaction`` keeps its thread, a daemon, but no longer the caller); an
        answer that comes later is not sent. Nothing is lost: the coordinator asks an
        undecided transaction again at its next check interval, another producer of the group
        (or this one, restarted) answers.
        """
        if self._lifecycle.state is not ServiceState.RUNNING:
            if self._lifecycle.state is ServiceState.CREATE_JUST:
                self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)
            return
        timeout = self.config.send_msg_timeout_ms if timeout_ms is None else timeout_ms
        if timeout < 0:
            raise InvalidArgumentError(f"timeout_ms must not be negative, got {timeout}")
        self._responder.stop(time.monotonic() + timeout / 1000, timeout)
        self._sender.shutdown(timeout)
        self._lifecycle.transition(ServiceState.SHUTDOWN_ALREADY)

    def stop(self) -> None:
        """:meth:`shutdown` with the default timeout."""
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
        half = self.send_half_message(msg, partition=partition)
        tid = half.transaction_id
        state = run_listener(
            "execute_local_transaction",
            lambda: listener.execute_local_transaction(half.message, arg),
            tid,
        )
        self._end(tid, half.half_partition, state, from_check=False)
        return TransactionSendResult(
            SendStatus.SEND_OK, tid, tid, half.topic, half.half_partition, half.half_offset, state
        )

    def send_half_message(self, msg: Message, *, partition: int = -1) -> HalfMessage:
        """Store ``msg`` as a half message and return it, undecided: the first half of
        :meth:`send_message_in_transaction`, without the local transaction. Its transaction
        ends with :meth:`end_transaction`, or else through the coordinator's check-back, which
        this producer group's listener answers (RocketMQ 5's ``send`` within a transaction).

        A delay level on ``msg`` is cleared; ``partition`` picks the real partition (-1: the
        key decides at commit). Raises typed errors for bad messages (nothing stored), and
        :class:`~bridge.errors.SendError` when the half message was not stored
        (:class:`~bridge.errors.SendTimeoutError`: perhaps stored, then checked back).
        """
        self._lifecycle.require_running()
        given = msg
        # A value= object becomes its bytes (SerializationError: nothing stored, no
        # transaction begun); the half message and the listener's message carry them.
        msg = self._builder.serialized(msg)
        # Validates topic, body, size and the partition's range; assigns the id.
        prepared = self._builder.prepare(msg, partition)
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
        half_partition, half_offset = self._sender.send_sync(half, half.partition)
        logger.debug("transaction %s: half stored at %d@%d", tid, half_partition, half_offset)

        ext = decode_envelope(envelope, msg.topic)
        if given is not msg:  # the listener sees the objects it was given too
            ext._value, ext._key = given.value, given.key
        return HalfMessage(tid, msg.topic, half_partition, half_offset, ext)

    def end_transaction(self, half: HalfMessage, status: TransactionStatus) -> None:
        """Decide the transaction of ``half`` (from :meth:`send_half_message`): write the
        decision after the half message and wait until Kafka stored it (at most
        ``send_msg_timeout_ms``); the coordinator then applies it. A decision on a transaction
        decided already changes nothing (the first one the coordinator reads stands), and
        UNKNOWN leaves it to the check-back.

        Raises :class:`InvalidArgumentError` for a status that is not a
        :class:`TransactionStatus` and for a half message of another producer group (the
        coordinator takes a decision only from the group that sent the half message),
        :class:`IllegalStateError` unless running, and :class:`~bridge.errors.SendError`
        when the decision was not stored: the check-back decides then (or call again; after a
        :class:`~bridge.errors.SendTimeoutError` it may have been stored, so decide the same
        way again)."""
        if not isinstance(status, TransactionStatus):
            raise InvalidArgumentError(
                f"end_transaction takes a TransactionStatus, got {type(status).__name__}"
            )
        if not isinstance(half, HalfMessage):
            raise InvalidArgumentError(
                f"end_transaction takes the HalfMessage send_half_message returned, got "
                f"{type(half).__name__}"
            )
        sender_group = half.message.get_property(MessageConst.PRODUCER_GROUP)
        if sender_group and sender_group != self.group:
            raise InvalidArgumentError(
                f"end_transaction: transaction {half.transaction_id} was sent by producer group "
                f"{sender_group!r}, and this producer's group is {self.group!r}: the "
                "coordinator takes a decision only from the group that sent the half message, "
                "so decide it with a producer of that group"
            )
        self._lifecycle.require_running()
        record = self._end_record(half.transaction_id, status, from_check=False, check_times=0)
        self._sender.send_sync(record, half.half_partition)

    def _end_record(
        self, tid: str, status: TransactionStatus, *, from_check: bool, check_times: int
    ) -> PreparedRecord:
        """The HALF-topic record of a decision on transaction ``tid``."""
        end = EndTransaction(
            transaction_id=tid,
            msg_id=tid,
            producer_group=self.group,
            status=status,
            from_transaction_check=from_check,
            producer_id=self.producer_id,
            requested_at_ms=time.time_ns() // 1_000_000,
            check_times=check_times,
        )
        return PreparedRecord(
            self._half_topic, tid.encode(), end.encode(), [], tid, end.requested_at_ms
        )

    def _end_from_check(
        self, tid: str, half_partition: int, status: TransactionStatus, check_times: int
    ) -> None:
        """:meth:`_end` of a check's answer."""
        self._end(tid, half_partition, status, from_check=True, check_times=check_times)

    def _end(
        self,
        tid: str,
        half_partition: int,
        status: TransactionStatus,
        *,
        from_check: bool,
        check_times: int = 0,
    ) -> None:
        record = self._end_record(tid, status, from_check=from_check, check_times=check_times)

        def delivered(err: KafkaError | None, kmsg: Any) -> None:
            if err is not None:
                # Not lost: the coordinator checks the transaction back.
                logger.warning("transaction %s: end request not stored (%s)", tid, err.str())

        try:
            self._sender.send_async(record, half_partition, delivered)
        except (IllegalStateError, KafkaClientError) as exc:
            # A shutdown or a full queue after the local transaction ended: its outcome stands
            # and is not the caller's error (a retry would send a second message); the
            # coordinator checks the transaction back, as for an end request not stored.
            logger.warning("transaction %s: end request not sent (%s)", tid, exc)
