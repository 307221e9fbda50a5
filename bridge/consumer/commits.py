"""A push consumer's offset commits: :class:`OffsetCommits`, the fetcher's collaborator that
commits each held partition's smallest offset not done, with the strategy's metadata, and
commits again what failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from bridge.consumer.consumption import Strategy
from bridge.consumer.intake import Key
from bridge.consumer.process_queue import ProcessQueue

# A part of the fetcher: its records go where the fetcher's go.
logger = logging.getLogger("bridge.consumer.fetcher")


class OffsetCommits:
    """Commits the offsets of ``queues`` (the partitions consumer group ``group`` holds, shared
    with the fetcher) with ``consumption``'s metadata, through :attr:`kafka`."""

    def __init__(self, group: str, queues: dict[Key, ProcessQueue], consumption: Strategy) -> None:
        self._group = group
        self._queues = queues
        self._consumption = consumption
        self.kafka: Any = None
        """The Kafka consumer, set by the fetcher once it exists."""
        self.last_commit = 0.0
        """When the last commit was made, ``time.monotonic()`` s."""

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The result of an asynchronous commit (on the poll thread): a failed one's offsets
        and metadata are committed again at the next commit."""
        failed = [tp for tp in partitions if error is not None or tp.error is not None]
        if failed:
            self._failed(failed, error or failed[0].error)

    def commit(self, keys: Iterable[Key], *, asynchronous: bool) -> bool:
        """Commit the partitions ``keys`` names (those still held) whose offset or metadata
        changed since their last commit; False if the commit failed (logged)."""
        # On the poll thread only: commits leave in the order they are made, each with the
        # metadata read when it was made.
        self.last_commit = time.monotonic()
        offsets = []
        for key in keys:
            pq = self._queues.get(key)
            if pq is None:
                continue
            offset = pq.commit_offset()
            if offset is None:
                continue
            metadata = self._consumption.commit_metadata(pq, offset)
            if offset != pq.last_committed or metadata != pq.last_metadata:
                offsets.append(
                    TopicPartition(key[0], key[1], offset, metadata=metadata)
                    if metadata
                    else TopicPartition(key[0], key[1], offset)
                )
                pq.last_committed, pq.last_metadata = offset, metadata
        if not offsets:
            return True
        try:
            self.kafka.commit(offsets=offsets, asynchronous=asynchronous)
        except Exception as exc:
            self._failed(offsets, exc)
            return False
        return True

    def _failed(self, partitions: Iterable[TopicPartition], error: object) -> None:
        """Log a failed commit and have the next commit send ``partitions``' offsets and
        metadata again."""
        logger.warning("push consumer %s: offset commit failed: %s", self._group, error)
        for tp in partitions:
            pq = self._queues.get((tp.topic, tp.partition))
            if pq is not None:
                pq.last_committed = -1
