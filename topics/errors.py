"""The root of the project's error hierarchy and the errors of the bottom layer.

Every error the project raises derives from :class:`BridgeError`; ``bridge.errors`` re-exports
these and adds the client and service branches.
"""

from __future__ import annotations


class BridgeError(Exception):
    """Root of every error raised by this project."""


class InvalidArgumentError(BridgeError, ValueError):
    """An argument or configuration value is invalid; the message names it."""


class InvalidTopicNameError(InvalidArgumentError):
    """A topic, group or namespace name cannot be used or mapped to a Kafka topic name."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid name {name!r}: {reason}")
        self.name = name
        self.reason = reason


class WireFormatError(BridgeError):
    """A record's bytes cannot be decoded; such records are quarantined, never dropped."""


class UnknownSchemaError(WireFormatError):
    """A record was written with a schema this process does not know."""


class MalformedRecordError(WireFormatError):
    """A record's bytes do not follow the expected encoding."""
