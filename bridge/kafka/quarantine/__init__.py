"""Quarantine: where a record that cannot be decoded or delivered goes, byte for byte, with its
reason; and how an operator re-drives a quarantined delayed message.

A service that meets a malformed record in a system or retry topic, or a delayed message whose
delivery keeps failing for a permanent reason, writes :func:`quarantine_copy` (in the Kafka
transaction of the batch the record belonged to, where it has one) and moves on: the record
is neither dropped nor retried forever. The copy keeps value, key, timestamp and headers, and
adds headers naming the reason and the origin. :func:`replay_quarantined` delivers a
quarantined delayed message to its real topic once the cause is fixed, exactly once.

Guarantees kept here (see ``docs/guarantees.md``): G8, G9.
"""

from bridge.errors import (
    AlreadyReplayedError,
    NotReplayableError,
    QuarantineReplayError,
    QuarantineReplayKafkaError,
    ReplayConflictError,
)
from bridge.kafka.quarantine.copy import (
    ORIGINAL_HEADER_PREFIX,
    QUARANTINE_OMITTED_BYTES,
    QUARANTINE_REASON,
    QUARANTINE_RESOLVED_OFFSET,
    QUARANTINE_SOURCE_OFFSET,
    QUARANTINE_SOURCE_PARTITION,
    QUARANTINE_SOURCE_TOPIC,
    QUARANTINED_AT_MS,
    QUARANTINED_BY,
    is_replay_marker,
    quarantine_copy,
    read_headers,
)
from bridge.kafka.quarantine.reader import QuarantinedRecord, read_quarantine
from bridge.kafka.quarantine.replay import (
    ReplayedMessage,
    quarantined_delivery,
    read_quarantined,
    replay_quarantined,
)

__all__ = [
    "ORIGINAL_HEADER_PREFIX",
    "QUARANTINED_AT_MS",
    "QUARANTINED_BY",
    "QUARANTINE_OMITTED_BYTES",
    "QUARANTINE_REASON",
    "QUARANTINE_RESOLVED_OFFSET",
    "QUARANTINE_SOURCE_OFFSET",
    "QUARANTINE_SOURCE_PARTITION",
    "QUARANTINE_SOURCE_TOPIC",
    "AlreadyReplayedError",
    "NotReplayableError",
    "QuarantineReplayError",
    "QuarantineReplayKafkaError",
    "QuarantinedRecord",
    "ReplayConflictError",
    "ReplayedMessage",
    "is_replay_marker",
    "quarantine_copy",
    "quarantined_delivery",
    "read_headers",
    "read_quarantine",
    "read_quarantined",
    "replay_quarantined",
]
