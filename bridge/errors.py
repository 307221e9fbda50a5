"""The project's error hierarchy: one root, :class:`BridgeError`, with a branch per concern.

::

    BridgeError
    +-- InvalidArgumentError (also ValueError)   bad argument or configuration value
    |   +-- InvalidTopicNameError                topic, group or namespace name
    |   +-- InvalidMessageError                  message content
    |   |   +-- MessageTooLargeError             body larger than max_message_bytes
    |   |   +-- InvalidDelayError                delay level or timer value not honoured
    |   |   +-- SerializationError               a key or value serializer failed
    |   +-- InvalidPropertyError                 a user property uses a reserved name
    |   +-- FilterExpressionError                an SQL92 filter expression is invalid
    |   +-- InvalidReceiptHandleError            ack of a message not (or no longer) held
    |   +-- KafkaConfigError                     a Kafka config setting the bridge owns
    +-- WireFormatError                          undecodable record (quarantined)
    |   +-- UnknownSchemaError, MalformedRecordError
    +-- DeserializationError                     a key or value deserializer failed (retried)
    +-- IllegalStateError                        illegal lifecycle or state transition
    |   +-- EventLoopClosedError                 an asyncio client's event loop has ended
    +-- KafkaClientError                         the Kafka client or broker failed a call
    |   +-- BrokerUnreachableError               no broker answered within the timeout
    |   +-- SendError                            a message was not stored
    |       +-- SendTimeoutError                 ... within send_msg_timeout_ms
    |   +-- TopicProvisioningError               creating or checking topics failed
    +-- RuntimeSetupError                        the local runtime cannot be set up
        +-- MissingToolError                     java or mvn is not installed
        +-- ArtifactFetchError                   Maven could not fetch the jars
        +-- BrokerStartError                     the local broker did not come up
"""

from __future__ import annotations

from topics.errors import (
    BridgeError,
    InvalidArgumentError,
    InvalidTopicNameError,
    MalformedRecordError,
    UnknownSchemaError,
    WireFormatError,
)

__all__ = [
    "ArtifactFetchError",
    "BridgeError",
    "BrokerStartError",
    "BrokerUnreachableError",
    "DeserializationError",
    "EventLoopClosedError",
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
    "MessageTooLargeError",
    "MissingToolError",
    "RuntimeSetupError",
    "SendError",
    "SendTimeoutError",
    "SerializationError",
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


class IllegalStateError(BridgeError):
    """An operation is not allowed in the object's current state."""


class EventLoopClosedError(IllegalStateError):
    """An asyncio client's listener cannot run: the event loop it runs on has ended (closed
    without the client's ``shutdown()``). The client shuts itself down; the call that found
    it did not run (or its result is lost) and counts as nothing: a push consumer leaves its
    messages uncommitted for the group's other members (no failure, no retry copy), a
    transaction producer sends no check answer."""


class KafkaClientError(BridgeError):
    """The Kafka client or broker failed a call; ``kafka_error`` holds librdkafka's error."""

    def __init__(self, message: str, kafka_error: object | None = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error


class BrokerUnreachableError(KafkaClientError):
    """No broker answered within the timeout."""


class SendError(KafkaClientError):
    """A message was not stored by the broker."""


class SendTimeoutError(SendError):
    """A message was not acknowledged within ``send_msg_timeout_ms``."""


class AuthorizationError(KafkaClientError):
    """The broker refused this client's principal an operation (Kafka ACLs); the message names
    the resource and the permission it lacks."""


class SendAuthorizationError(SendError, AuthorizationError):
    """A message was not stored: the principal may not write it (or use the transactional id
    or cluster permission the write needs)."""


class TopicProvisioningError(KafkaClientError):
    """Creating or checking topics failed."""


class RuntimeSetupError(BridgeError):
    """The local runtime (Java, Maven, jars, broker process) cannot be set up."""


class MissingToolError(RuntimeSetupError):
    """A required program is not installed; the message names what to install."""


class ArtifactFetchError(RuntimeSetupError):
    """Maven could not fetch the jars into the cache."""


class BrokerStartError(RuntimeSetupError):
    """The local Kafka broker did not become ready; the message carries its log's tail."""
