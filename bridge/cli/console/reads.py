"""What the console reads from Kafka beyond the operator views it shares with the ``bridge``
commands: a dead-letter queue page by page (never a whole DLQ in memory), single letters by
position, and consumer group lag for the health page."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition

from bridge.cli.console.paging import SCAN_BUDGET, Cursor, LetterFilter
from bridge.codec import message_from_record
from bridge.config import ClientConfig
from bridge.errors import KafkaClientError
from bridge.kafka.clients import (
    BOUNDED_READER_BUFFER_KB,
    new_admin,
    new_reader,
    read_record_at,
    translate_error,
)
from bridge.message import MessageExt
from topics.catalog import TopicCatalog
from topics.naming import reader_group


@dataclass(frozen=True, slots=True)
class Letter:
    """A dead letter and where it sits in the DLQ topic."""

    partition: int
    offset: int
    message: MessageExt

    @property
    def ref(self) -> str:
        """``partition@offset``: how a form names this letter."""
        return f"{self.partition}@{self.offset}"


@dataclass(frozen=True, slots=True)
class Page:
    """One page of letters; ``next`` is None after the last one."""

    letters: list[Letter]
    next: Cursor | None
    scanned: int
    """Records read to fill the page (more than its letters when a filter skipped some)."""
    total: int
    """Records in the topic's retained range (all partitions), a count from offsets."""


def _reader(config: ClientConfig) -> Any:
    return new_reader(
        config,
        reader_group("console", uuid.uuid4().hex[:12]),
        "bridge-console",
        queued_max_messages_kbytes=BOUNDED_READER_BUFFER_KB,
    )


def _ranges(reader: Any, topic: str, timeout_s: float) -> dict[int, tuple[int, int]]:
    """Partition -> (low, high) watermarks of ``topic``; empty if it does not exist."""
    info = reader.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if info is None or info.error is not None:
        return {}
    return {
        p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        for p in sorted(info.partitions)
    }


class DlqPager:
    """Reads one group's dead-letter topic a page at a time with one reader, partition by
    partition from a :class:`~bridge.cli.console.paging.Cursor`; a page holds at most its size in
    letters, whatever the DLQ holds. ``ends`` (partition -> offset), when given, stops the
    reading there (a replay reads what the DLQ held when it started, not letters that arrive
    while it runs)."""

    def __init__(self, config: ClientConfig, group: str) -> None:
        self._config = config
        self._catalog = TopicCatalog(namespace=config.namespace)
        self.topic = self._catalog.dlq_topic(group)
        self._timeout_s = config.request_timeout_ms / 1000
        self._reader = _reader(config)
        try:
            self.ranges = _ranges(self._reader, self.topic, self._timeout_s)
        except Exception as exc:
            self._reader.close()
            raise translate_error(exc, f"reading {self.topic}", KafkaClientError) from exc

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> DlqPager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def total(self) -> int:
        return sum(high - low for low, high in self.ranges.values())

    def page(
        self,
        cursor: Cursor,
        size: int,
        letter_filter: LetterFilter | None = None,
        *,
        scan_budget: int = SCAN_BUDGET,
        ends: dict[int, int] | None = None,
    ) -> Page:
        """Up to ``size`` letters from ``cursor`` that ``letter_filter`` chooses, reading at
        most ``scan_budget`` records; the cursor to read on from, None at the end."""
        positions = {p: cursor.start(p, low) for p, (low, _) in self.ranges.items()}
        letters: list[Letter] = []
        scanned = 0
        for partition, (_, high) in self.ranges.items():
            end = min(high, (ends or {}).get(partition, high))
            while positions[partition] < end and len(letters) < size and scanned < scan_budget:
                for record in self._read(partition, positions[partition], end):
                    positions[partition] = record.offset() + 1
                    scanned += 1
                    msg = message_from_record(record, self._catalog)
                    if letter_filter is None or letter_filter.matches(msg):
                        letters.append(Letter(partition, record.offset(), msg))
                    if len(letters) >= size or scanned >= scan_budget:
                        break
                else:
                    positions[partition] = end  # only transaction markers were left
            if len(letters) >= size or scanned >= scan_budget:
                break
        done = all(
            positions[p] >= min(high, (ends or {}).get(p, high))
            for p, (_, high) in self.ranges.items()
        )
        return Page(letters, None if done else Cursor(positions), scanned, self.total)

    def scan(
        self, letter_filter: LetterFilter | None, chunk: int, ends: dict[int, int]
    ) -> Iterator[list[Letter]]:
        """Every chosen letter up to ``ends``, ``chunk`` at a time."""
        cursor: Cursor | None = Cursor({})
        while cursor is not None:
            page = self.page(
                cursor, chunk, letter_filter, scan_budget=max(chunk, 10_000), ends=ends
            )
            if page.letters:
                yield page.letters
            cursor = page.next

    def _read(self, partition: int, start: int, end: int) -> Iterator[Any]:
        """The records of ``partition`` from ``start`` until ``end`` (or the partition's end);
        stops by the consumer's own end-of-partition report too."""
        self._reader.assign([TopicPartition(self.topic, partition, start)])
        deadline = time.monotonic() + self._timeout_s
        try:
            while time.monotonic() < deadline:
                record = self._reader.poll(0.2)
                if record is None:
                    continue
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    raise translate_error(
                        error, f"reading {self.topic}[{partition}]", default=KafkaClientError
                    )
                if record.offset() >= end:
                    return
                deadline = time.monotonic() + self._timeout_s
                yield record
                if record.offset() + 1 >= end:
                    return
            raise KafkaClientError(
                f"reading {self.topic}[{partition}]@{start}: nothing within {self._timeout_s} s"
            )
        finally:
            self._reader.unassign()

    def letters_at(self, refs: list[tuple[int, int]]) -> list[Letter]:
        """The letters at ``refs`` (partition, offset), in order; one not found is left out."""
        out = []
        for partition, offset in refs:
            if partition not in self.ranges:
                continue
            record = read_record_at(
                self._reader, TopicPartition(self.topic, partition, offset), self._timeout_s
            )
            if record is not None and record.offset() == offset:
                out.append(Letter(partition, offset, message_from_record(record, self._catalog)))
        return out


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A consumer group's committed position against the end of each partition it reads."""

    group: str
    state: str
    lag: int
    partitions: list[tuple[str, int, int, int]]
    """(topic, partition, committed offset, lag), sorted."""


def consumer_lag(config: ClientConfig, max_groups: int = 100) -> list[GroupLag]:
    """Lag of the consumer groups of the cluster that committed offsets (of the first
    ``max_groups`` by name): each committed offset against its partition's end. Raises
    :class:`KafkaClientError` (e.g. unreachable) when Kafka does not answer within
    ``request_timeout_ms``."""

    timeout_s = config.request_timeout_ms / 1000
    admin = new_admin(config, "bridge-console")
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout_s).result(timeout=timeout_s)
    except Exception as exc:
        raise translate_error(exc, "listing consumer groups", KafkaClientError) from exc
    groups = sorted(listed.valid, key=lambda g: g.group_id)[:max_groups]
    reader = _reader(config)
    out = []
    try:
        for g in groups:
            future = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(g.group_id)], request_timeout=timeout_s
            )[g.group_id]
            try:
                committed = future.result(timeout=timeout_s).topic_partitions or []
            except Exception:
                continue  # not ours to read (an ACL): left out, as Kafka's tools do
            rows = []
            for tp in committed:
                if tp.offset < 0:
                    continue
                _, high = reader.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=timeout_s
                )
                rows.append((tp.topic, tp.partition, tp.offset, max(high - tp.offset, 0)))
            if not rows:
                continue  # nothing committed (a reader's throw-away group): no lag to show
            state = getattr(g.state, "name", str(g.state))
            rows.sort()
            out.append(GroupLag(g.group_id, state, sum(r[3] for r in rows), rows))
    finally:
        reader.close()
    return out
