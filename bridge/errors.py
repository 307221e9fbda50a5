"""The project's error hierarchy: one root, :class:`BridgeError`, with a branch per concern.

::

    BridgeError                                  retriable: False unless marked [r]
    +-- InvalidArgumentError (also ValueError)   bad argument or configuration value
    |   +-- InvalidTopicNameError                topic, group or namespace name
    |   +-- ClientPropertyError                  a client property or JAAS setting
    |   +-- TopicNotFoundError                   a topic a Spark job was told to read
    |   +-- InvalidMessageError                  message content
    |   |   +-- MessageTooLargeError             body larger than max_message_bytes
    |   |   +-- InvalidDelayError                delay level or timer value not honoured
    |   |   +-- SerializationError               a key or value serializer failed
    |   +-- InvalidPropertyError                 a user property uses a reserved name
    |   +-- FilterExpressionError                an SQL92 filter expression is invalid
    |   +-- InvalidReceiptHandleError            ack of a message not (or no longer) held
    |   +-- KafkaConfigError                     a Kafka config setting the bridge owns
    +-- WireFormatError                          undecodable record (quarantined)
    |   +-- UnknownSchemaError                   written with a schema not known here
    |   +-- MalformedRecordError                 bytes not in the expected encoding
    +-- DeserializationError [r]                 a key or value deserializer failed
    +-- RecallTooLateError                       a timer message is delivered or being
    |                                                delivered: recall_message came too late
    +-- IllegalStateError                        illegal lifecycle or state transition
    |   +-- EventLoopClosedError                 an asyncio client's event loop has ended
    +-- KafkaClientError [k]                     the Kafka client or broker failed a call
    |   +-- BrokerUnreachableError [r]           no broker answered within the timeout
    |   +-- AuthorizationError                   the principal lacks a Kafka ACL
    |   +-- SendError [k]                        a message was not stored
    |   |   +-- SendTimeoutError [r]             ... within send_msg_timeout_ms
    |   |   +-- SendAuthorizationError           ... the principal may not write it
    |   |   |                                        (also an AuthorizationError)
    |   |   +-- ReplayTargetError                a replay's target topic cannot take it
    |   |   +-- ParkedReplayError                a parked half message stays parked
    |   |   +-- DeadLetterReplayError            some dead letters were not replayed
    |   |                                            (in bridge.consumer.admin)
    |   +-- TopicProvisioningError [k]           creating or checking topics failed
    +-- QuarantineReplayError                    a quarantined record was not replayed
    |   +-- QuarantineReplayKafkaError [k]       ... Kafka failed (also a KafkaClientError)
    |   +-- NotReplayableError                   ... nothing deliverable there (also an
    |   |                                            InvalidArgumentError)
    |   +-- AlreadyReplayedError                 ... it was replayed before
    |   +-- ReplayConflictError                  ... another replay of it won
    +-- FatalServiceError                        a coordinator service must not go on
    |   +-- DuplicateCoordinatorError            another coordinator runs with this id
    |   +-- MembershipLostError [r]              its consumer lost its group membership
    +-- RuntimeSetupError                        the local runtime cannot be set up
        +-- MissingToolError                     java or mvn is not installed
        +-- ArtifactFetchError                   Maven could not fetch the jars
        +-- BrokerStartError                     the local broker did not come up
        |   +-- ClusterUnhealthyError            the local cluster did not become healthy
        +-- ConsoleUnavailableError              the console extra is not installed

Every error has a bool :attr:`~BridgeError.retriable`: whether the same call, made again
unchanged, may succeed. ``[r]`` marks the classes where it is True. ``[k]``: an error of that
class (or of a subclass not marked otherwise) carrying librdkafka's error (``kafka_error``)
takes its own value from it (:meth:`KafkaClientError.retriable_kafka_error`): a partition
without a leader yet, a timed-out request or what librdkafka calls retriable is worth
retrying; for a :class:`SendError`, whatever Kafka did not refuse the record itself for (its
size, its topic, the topic's ACL) is. The consumers' send-back and quarantine copies, the
coordinator services' delivery rule, recovery and renewal read it.

The errors of ``topics`` (the root, the argument, name, client-property, Spark topic and wire
format errors) are defined there, below the bridge, and re-exported here.
``DeadLetterReplayError`` lives beside the dead-letter views it reports on (its
attributes hold their messages), in ``bridge.consumer.admin``. Apart from this tree, the
command line's own ``click`` exceptions carry its exit statuses, and the SQL92 evaluator has an
internal signal for a value that is unknown (never raised to a caller).
"""

from __future__ import annotations

from typing import ClassVar, Final

from confluent_kafka import KafkaError

from topics.errors import (
    BridgeError,
    ClientPropertyError,
    InvalidArgumentError,
    InvalidTopicNameError,
    MalformedRecordError,
    TopicNotFoundError,
    UnknownSchemaError,
    WireFormatError,
)

__all__ = [
    "AlreadyReplayedError",
    "ArtifactFetchError",
    "AuthorizationError",
    "BridgeError",
    "BrokerStartError",
    "BrokerUnreachableError",
    "ClientPropertyError",
    "ClusterUnhealthyError",
    "ConsoleUnavailableError",
    "DeserializationError",
    "DuplicateCoordinatorError",
    "EventLoopClosedError",
    "FatalServiceError",
    "FilterExpressionError",
    "IllegalStateError",
    "InvalidArgumentError",
    "InvalidDelayError",
    "InvalidMessageError",
    "InvalidPropertyError",
    "InvalidReceiptHandleError",
    "InvalidTopicNameError",
    "KafkaClientError",
    "KafkaConfigError",
    "MalformedRecordError",
    "MembershipLostError",
    "MessageTooLargeError",
    "MissingToolError",
    "NotReplayableError",
    "ParkedReplayError",
    "QuarantineReplayError",
    "QuarantineReplayKafkaError",
    "RecallTooLateError",
    "ReplayConflictError",
    "ReplayTargetError",
    "RuntimeSetupError",
    "SendAuthorizationError",
    "SendError",
    "SendTimeoutError",
    "SerializationError",
    "TopicNotFoundError",
    "TopicProvisioningError",
    "UnknownSchemaError",
    "WireFormatError",
]


class InvalidMessageError(InvalidArgumentError):
    """A message cannot be sent as it is (wrong body type, empty topic, ...)."""


class MessageTooLargeError(InvalidMessageError):
    """A message's body, or its properties, keys and tags, are larger than allowed."""

    def __init__(self, size_bytes: int, max_bytes: int, what: str | None = None) -> None:
        super().__init__(
            what or f"message body is {size_bytes} bytes, more than max_message_bytes={max_bytes}"
        )
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class InvalidDelayError(InvalidMessageError):
    """A delay level or timer value cannot be honoured (beyond the maximum, malformed)."""


class SerializationError(InvalidMessageError):
    """A producer's ``key_serializer`` or ``value_serializer`` raised, or returned what cannot
    travel. ``topic`` is the message's topic and ``field`` ``"key"`` or ``"value"``; the
    serializer's exception is the ``__cause__``. Nothing was sent. Not worth retrying as it is:
    the object or the schema must change."""

    def __init__(self, message: str, topic: str, field: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.field = field


class DeserializationError(BridgeError):
    """A consumer's ``key_deserializer`` or ``value_deserializer`` raised on a consumed
    record, raised where the listener first reads :attr:`~bridge.Message.value` or
    :attr:`~bridge.Message.key` (the deserializer's exception is the ``__cause__``).
    ``topic`` is the topic the message was first sent to and ``field`` ``"key"`` or
    ``"value"``.

    Worth retrying: the consumer counts it as the listener's failure, so the message is
    retried through ``%RETRY%<group>`` (a Schema Registry that was down answers later) and,
    after ``max_reconsume_times``, dead-lettered with its bytes intact, from where
    ``bridge dlq replay`` brings it back once the cause is fixed. It is not a
    :class:`WireFormatError`: the record is never quarantined for it."""

    retriable = True

    def __init__(self, message: str, topic: str, field: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.field = field


class KafkaConfigError(InvalidArgumentError):
    """A confluent-kafka config setting (``kafka_config=``) the bridge must own, with a value
    that would break a guarantee. ``setting`` is its name and ``reason`` why it is refused.
    Not worth retrying: the setting must go."""

    def __init__(self, setting: str, reason: str) -> None:
        super().__init__(f"kafka_config[{setting!r}] is refused: {reason}")
        self.setting = setting
        self.reason = reason


class InvalidPropertyError(InvalidArgumentError):
    """A user property uses a name reserved for the system, or is not a string."""


class FilterExpressionError(InvalidArgumentError):
    """An SQL92 filter expression cannot be used: it does not follow RocketMQ's grammar, or
    RocketMQ's parser would refuse it (a comparison that can never be evaluated, a float
    literal of zero, ...). ``position`` is the character offset of the problem in
    ``expression`` (0-based), ``found`` the text there (empty at the end), ``expected`` what
    would have been accepted there. Not worth retrying: the expression must change."""

    def __init__(self, expression: str, position: int, found: str, expected: str) -> None:
        where = f"{found!r}" if found else "the end"
        super().__init__(
            f"invalid SQL92 expression {expression!r} at offset {position} ({where}): "
            f"expected {expected}"
        )
        self.expression = expression
        self.position = position
        self.found = found
        self.expected = expected


class InvalidReceiptHandleError(InvalidArgumentError):
    """A :class:`~bridge.SimpleConsumer` cannot ``ack`` or ``change_invisible_duration`` a
    message with this receipt handle (RocketMQ's ``INVALID_RECEIPT_HANDLE``): the message was
    not received by this consumer, or its handle is stale (already acked, redelivered after
    its invisible duration passed, replaced by a ``change_invisible_duration``, or its
    partition moved to another consumer of the group, which delivers it again). ``reason``
    says which. Not worth retrying with the same handle."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RecallTooLateError(BridgeError):
    """``recall_message`` came too late: the broker stored the recall at ``append_ms`` (epoch
    ms), less than the recall margin before the message's time ``due_ms``, so the coordinator
    delivers the message (exactly once) or has delivered it, unless a recall of it from
    another producer applied (a producer remembers its own). Not worth retrying: a later
    recall is later still."""

    def __init__(self, message: str, *, message_id: str, due_ms: int, append_ms: int) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.due_ms = due_ms
        self.append_ms = append_ms


class IllegalStateError(BridgeError):
    """An operation is not allowed in the object's current state."""


class EventLoopClosedError(IllegalStateError):
    """An asyncio client's listener cannot run: the event loop it runs on has ended (closed
    without the client's ``shutdown()``). The client shuts itself down; the call that found
    it did not run (or its result is lost) and counts as nothing: a push consumer leaves its
    messages uncommitted for the group's other members (no failure, no retry copy), a
    transaction producer sends no check answer."""


_TRANSIENT_CODES: Final = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
    }
)
"""Errors of a call to a partition whose leader is not known yet or is moving (a topic created
a moment ago, a broker restarting), or that timed out: librdkafka's ``KafkaError.retriable()``
is False on the errors of plain calls such as ``get_watermark_offsets``, so it cannot tell
them."""

_REFUSED_RECORD: Final = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
        # Retriable for the broker, but in a delivery report librdkafka has already retried
        # for message.timeout.ms: the topic or partition is gone (deleted, never created).
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)
"""Errors of a record's delivery that sending it again will not change."""
_NOT_THE_RECORD: Final = frozenset(
    {
        # What happened to the transaction or the client, not to one record.
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.INVALID_TXN_STATE,
        KafkaError._STATE,
        KafkaError._FATAL,
        KafkaError._INCONSISTENT,
        KafkaError._DESTROY,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        # Time and transport: the broker may come back.
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
    }
)
"""Errors of a record's delivery that say nothing against the record: sent again (by a
producer that is not fenced, to a broker that is back), it may be stored."""


class KafkaClientError(BridgeError):
    """The Kafka client or broker failed a call; ``kafka_error`` holds librdkafka's error.

    :attr:`~BridgeError.retriable`: given, or taken from ``kafka_error`` when there is one
    (:meth:`retriable_kafka_error`), else the class's own (False here)."""

    by_kafka_error: ClassVar[bool] = True
    """Whether an error of this class takes :attr:`~BridgeError.retriable` from its
    ``kafka_error`` (False for the classes whose condition decides it, as a timeout or an ACL
    does)."""

    def __init__(
        self, message: str, kafka_error: object | None = None, *, retriable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error
        if retriable is None and self.by_kafka_error and isinstance(kafka_error, KafkaError):
            retriable = self.retriable_kafka_error(kafka_error)
        if retriable is not None:
            self.retriable = retriable

    @classmethod
    def retriable_kafka_error(cls, error: KafkaError) -> bool:
        """Whether a call that failed with librdkafka's ``error`` may succeed if made again:
        a partition without a leader yet or a timed-out request, or what librdkafka itself
        calls retriable; never a fatal error."""
        if error.fatal():
            return False
        return error.code() in _TRANSIENT_CODES or bool(error.retriable())


class BrokerUnreachableError(KafkaClientError):
    """No broker answered within the timeout."""

    retriable = True
    by_kafka_error = False


class SendError(KafkaClientError):
    """A message was not stored by the broker. One carrying the delivery report's error is
    :attr:`~BridgeError.retriable` unless Kafka refused the record itself (too large, unknown
    topic or partition, not authorized to write the topic, invalid): a timeout, a lost
    connection, a purged queue or a fenced producer say nothing against the record."""

    @classmethod
    def retriable_kafka_error(cls, error: KafkaError) -> bool:
        """Whether a record whose delivery (or ``produce()``) failed with ``error`` may be
        stored if sent again. A fatal error ends the producer, not the record: True."""
        code = error.code()
        if code in _REFUSED_RECORD:
            return False
        if code in _NOT_THE_RECORD or error.fatal() or error.retriable():
            return True
        return code < 0  # another broker error refuses the record; a local one is the client's


class SendTimeoutError(SendError):
    """A message was not acknowledged within ``send_msg_timeout_ms``."""

    retriable = True
    by_kafka_error = False


class AuthorizationError(KafkaClientError):
    """The broker refused this client's principal an operation (Kafka ACLs); the message names
    the resource and the permission it lacks."""

    by_kafka_error = False


class SendAuthorizationError(SendError, AuthorizationError):
    """A message was not stored: the principal may not write it (or use the transactional id
    or cluster permission the write needs). :attr:`~BridgeError.retriable` as for any
    :class:`SendError`: not for the topic's own ACL; for the transactional id's or the
    cluster's, which say nothing against the record (it goes through once the permission is
    granted)."""

    by_kafka_error = True


class ReplayTargetError(SendError):
    """The topic a quarantined message or a dead letter is replayed to cannot take it (a Kafka
    internal topic, a partition the topic does not have, a topic that does not exist): nothing
    was written, and it stays where it was. The message names the topic and what is wrong."""


class ParkedReplayError(SendError):
    """A parked message could not be replayed or dropped; it stays parked. The message names
    the cause (e.g. its real topic does not exist)."""


class TopicProvisioningError(KafkaClientError):
    """Creating or checking topics failed."""


class QuarantineReplayError(BridgeError):
    """A quarantined record could not be replayed."""


class QuarantineReplayKafkaError(QuarantineReplayError, KafkaClientError):
    """Kafka failed while a replay read the QUARANTINE topic (broker unreachable, ...)."""


class NotReplayableError(QuarantineReplayError, InvalidArgumentError):
    """The QUARANTINE offset holds no quarantined delayed message that can be delivered (no
    record, a marker, a record from another service, an undecodable or targetless one)."""


class AlreadyReplayedError(QuarantineReplayError):
    """The quarantined record was replayed before: it is not delivered again."""


class ReplayConflictError(QuarantineReplayError):
    """Another replay of the same QUARANTINE offset ran at the same time and won."""


class FatalServiceError(BridgeError):
    """Raised by a service (from ``on_start`` or ``run_once``) that must not go on: the
    service stops, keeps the error as :attr:`~bridge.lifecycle.ServiceThread.failure` and
    tells its failure listeners. A coordinator then stops as a whole, unless the error is
    :attr:`~BridgeError.retriable`: then it runs a fresh service in the failed one's place."""


class DuplicateCoordinatorError(FatalServiceError):
    """Another running coordinator uses this coordinator's id: Kafka fenced this one."""


class MembershipLostError(FatalServiceError):
    """This service's own consumer lost its static group membership and Kafka fenced its late
    requests: no other coordinator holds the membership. Seen after a broker restart or a
    stall longer than the session timeout: librdkafka clears the member id when its session
    times out and its next heartbeat or offset commit carries the stale one. The coordinator
    runs a fresh service in its place (``TransactionalService.renewed``)."""

    retriable = True


class RuntimeSetupError(BridgeError):
    """The local runtime (Java, Maven, jars, broker process) cannot be set up."""


class MissingToolError(RuntimeSetupError):
    """A required program is not installed; the message names what to install."""


class ArtifactFetchError(RuntimeSetupError):
    """Maven could not fetch the jars into the cache."""


class BrokerStartError(RuntimeSetupError):
    """The local Kafka broker did not become ready; the message carries its log's tail."""


class ConsoleUnavailableError(RuntimeSetupError):
    """``bridge console``'s web framework is not installed: ``pip install
    'rocketmq-kafka-bridge[console]'``."""


class ClusterUnhealthyError(BrokerStartError):
    """The cluster did not become healthy in time: the message names the nodes that are not
    registered and the partitions that are leaderless or under-replicated."""

    def __init__(
        self,
        message: str,
        missing_nodes: tuple[int, ...] = (),
        under_replicated: tuple[tuple[str, int], ...] = (),
        leaderless: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__(message)
        self.missing_nodes = missing_nodes
        """Node ids the metadata does not show as live brokers."""
        self.under_replicated = under_replicated
        """(topic, partition) whose ISR is smaller than its replica set."""
        self.leaderless = leaderless
        """(topic, partition) without a leader."""
