"""The root of the project's error hierarchy and the errors of the bottom layer.

Every error the project raises derives from :class:`BridgeError`; ``bridge.errors`` re-exports
these and adds the client and service branches (its docstring shows the whole tree). The errors
here need nothing above ``topics``, so the Spark jobs raise them without the bridge.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Root of every error raised by this project.

    :attr:`retriable` says whether the same call, made again unchanged, may succeed (a broker
    that was unreachable, a send that timed out, a partition without a leader yet): False
    here and on most errors, which a retry would only repeat (a bad argument, a malformed
    record, a refusal for good); True on the classes where trying again can help. It is a
    class attribute, except that a Kafka client error carrying librdkafka's error sets its
    own from that error (see ``bridge.errors.KafkaClientError``). The project's retry paths
    read it; so may an application's."""

    retriable: bool = False
    """Whether trying the same call again, unchanged, may succeed."""


class InvalidArgumentError(BridgeError, ValueError):
    """An argument or configuration value is invalid; the message names it."""


class InvalidTopicNameError(InvalidArgumentError):
    """A topic, group or namespace name cannot be used or mapped to a Kafka topic name."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class ClientPropertyError(InvalidArgumentError):
    """A client property (a Java client's properties or JAAS file, a librdkafka security
    setting) cannot be used or mapped; ``property`` names it. The message never holds the
    property's value."""

    def __init__(self, name: str, reason: str, source: str = "", *, shown: str = "") -> None:
        where = f" ({source})" if source else ""
        what = shown or f"client property {name!r}"
        super().__init__(f"{what}{where}: {reason}")
        self.property = name
        self.reason = reason
        self.shown = shown


class TopicNotFoundError(InvalidArgumentError):
    """A topic a Spark job was told to read does not exist."""


class WireFormatError(BridgeError):
    """A record's bytes cannot be decoded; such records are quarantined, never dropped."""


class UnknownSchemaError(WireFormatError):
    """A record was written with a schema this process does not know."""


class MalformedRecordError(WireFormatError):
    """A record's bytes do not follow the expected encoding."""
