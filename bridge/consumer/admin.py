"""Operator views of dead letters, and their replay.

``dlq_summary`` counts each group's dead letters by origin topic and by how many times they
were consumed; ``read_dead_letters`` lists them; ``replay_dead_letters`` writes chosen ones
back to their origin topic (or the group's retry topic), under their own message id. A letter
that cannot be written back (its origin, a header another Kafka client wrote, is no topic
name, say) never holds up the others: it is reported in
:attr:`DeadLetterReplayError.failed` and stays in the DLQ.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final

from bridge.client.reader import read_to_end
from bridge.client.sender import RecordSender
from bridge.codec import PreparedRecord, message_from_record
from bridge.config import ClientConfig
from bridge.consumer.send_back import ReplayTarget, origin_topic, replay_record
from bridge.errors import BridgeError, KafkaClientError, SendError
from bridge.kafka.admin import TopicAdmin
from bridge.message import MessageConst, MessageExt
from topics.catalog import TopicCatalog
from topics.naming import TopicKind

logger = logging.getLogger(__name__)

REPLAY_CHUNK: Final = 500
"""Dead letters :func:`replay_dead_letters` writes per round trip."""


@dataclass(frozen=True, slots=True)
class ReplayFailure:
    """A dead letter that was not (or cannot be) written back, and why. It stays in the DLQ."""

    letter: MessageExt
    reason: str


class DeadLetterReplayError(SendError):
    """Some chosen dead letters were not written back; every other one was. ``failed`` names
    each letter not written and why (its record cannot be built, e.g. an origin topic name
    Kafka cannot take, or Kafka refused its write); ``replayed`` holds those written (with
    ``dry_run``, those that would be). The letters not written stay in the DLQ."""

    def __init__(
        self,
        group: str,
        replayed: list[MessageExt],
        failed: list[ReplayFailure],
        *,
        dry_run: bool = False,
    ) -> None:
        total = len(replayed) + len(failed)
        if dry_run:
            text = f"cannot be replayed (dry run, nothing written): {describe_failures(failed)}"
        else:
            text = f"not replayed (they stay in the DLQ): {describe_failures(failed)}"
        super().__init__(f"{len(failed)} of {total} dead letters of {group} {text}")
        self.group = group
        self.replayed = replayed
        self.failed = failed


def describe_failures(failed: Sequence[ReplayFailure]) -> str:
    """``failed`` as ``<msg id> (<reason>)``, separated by ``; ``."""
    return "; ".join(f"{f.letter.msg_id} ({f.reason})" for f in failed)


@dataclass(frozen=True, slots=True)
class DeadLetterSummary:
    """One consumer group's dead-letter queue."""

    group: str
    count: int
    origin_topics: dict[str, int]
    """Origin topic -> dead letters from it."""
    reconsume_depth: dict[int, int]
    """``RECONSUME_TIME`` (times consumed and failed) -> dead letters."""
    oldest_born_ms: int | None
    newest_born_ms: int | None


def dlq_groups(config: ClientConfig) -> list[str]:
    """The consumer groups that have a dead-letter topic in ``config.namespace``."""
    catalog = TopicCatalog(namespace=config.namespace)
    groups = []
    for name in TopicAdmin(config).list_topics():
        try:
            parsed = catalog.parse(name)
        except Exception:
            continue
        if parsed.kind is TopicKind.DLQ and parsed.group is not None:
            groups.append(parsed.group)
    return sorted(groups)


def read_dead_letters(
    config: ClientConfig, group: str, *, timeout_ms: int = 10_000
) -> list[MessageExt]:
    """Every dead letter of ``group``, oldest first per partition. ``topic`` is
    ``%DLQ%<group>``; the origin topic is the ``RETRY_TOPIC`` property."""
    catalog = TopicCatalog(namespace=config.namespace)
    return [
        message_from_record(record, catalog)
        for record in read_to_end(config, catalog.dlq_topic(group), timeout_ms)
    ]


def summarise(group: str, letters: list[MessageExt]) -> DeadLetterSummary:
    """Count ``letters`` by origin topic and reconsume depth."""
    born = [m.born_timestamp_ms for m in letters if m.born_timestamp_ms]
    return DeadLetterSummary(
        group=group,
        count=len(letters),
        origin_topics=dict(Counter(origin_topic(m) for m in letters)),
        reconsume_depth=dict(sorted(Counter(m.reconsume_times for m in letters).items())),
        oldest_born_ms=min(born) if born else None,
        newest_born_ms=max(born) if born else None,
    )


def dlq_summary(
    config: ClientConfig, group: str | None = None, *, timeout_ms: int = 10_000
) -> list[DeadLetterSummary]:
    """A summary of ``group``'s dead letters, or of every group's."""
    groups = [group] if group is not None else dlq_groups(config)
    return [summarise(g, read_dead_letters(config, g, timeout_ms=timeout_ms)) for g in groups]


def _chosen(
    msg: MessageExt, keys: Collection[str], tags: Collection[str], msg_ids: Collection[str]
) -> bool:
    if keys and not set(msg.keys) & set(keys):
        return False
    if tags and msg.tags not in tags:
        return False
    ids = {msg.msg_id, msg.get_property(MessageConst.ORIGIN_MESSAGE_ID)}
    return not msg_ids or bool(ids & set(msg_ids))


def replay_dead_letters(
    config: ClientConfig,
    group: str,
    *,
    keys: Collection[str] = (),
    tags: Collection[str] = (),
    msg_ids: Collection[str] = (),
    target: ReplayTarget = ReplayTarget.ORIGIN,
    dry_run: bool = False,
) -> list[MessageExt]:
    """Write ``group``'s dead letters back and return them. Filters narrow the choice: a
    letter must match one of ``keys``, one of ``tags`` and one of ``msg_ids`` (its id or
    origin id) for each filter given. Replaying twice writes twice.

    ``ReplayTarget.ORIGIN`` sends each to its origin topic without the retry properties
    (every group subscribed there sees it again); ``ReplayTarget.RETRY`` to the group's retry
    topic with its failures reset, so only that group consumes it again. A letter that
    cannot be written back does not stop the others: once every other one is written,
    :class:`DeadLetterReplayError` names each letter not written and why. ``dry_run`` writes
    nothing (:func:`prepare_replay` tells which letters could not be written).
    """
    letters = [m for m in read_dead_letters(config, group) if _chosen(m, keys, tags, msg_ids)]
    if not dry_run:
        write_back(config, group, letters, target)
    return letters


def prepare_replay(
    letters: Sequence[MessageExt], group: str, target: ReplayTarget, *, namespace: str
) -> tuple[list[tuple[MessageExt, PreparedRecord]], list[ReplayFailure]]:
    """The record replaying each of ``letters`` to ``target``, and the letters whose record
    cannot be built, with why. Each record is built on its own: a dead letter's origin comes
    from a header another Kafka client may have written (``RETRY_TOPIC: not a topic!``), and
    one such letter must not stop the replay of the others."""
    built: list[tuple[MessageExt, PreparedRecord]] = []
    failed: list[ReplayFailure] = []
    for m in letters:
        try:
            built.append((m, replay_record(m, group, target, namespace=namespace)))
        except BridgeError as exc:
            failed.append(ReplayFailure(m, f"{type(exc).__name__}: {exc}"))
    return built, failed


def write_back(
    config: ClientConfig,
    group: str,
    letters: Sequence[MessageExt],
    target: ReplayTarget,
    on_progress: Callable[[int], None] | None = None,
) -> list[MessageExt]:
    """Write dead ``letters`` of ``group`` back to ``target`` (see
    :func:`replay_dead_letters`), :data:`REPLAY_CHUNK` at a time, and return them;
    ``on_progress`` gets the count of each chunk done. A letter that cannot be written does
    not stop the others: :class:`DeadLetterReplayError` names each one not written and why,
    once all the others are written."""
    if not letters:
        return []
    replayed: list[MessageExt] = []
    failed: list[ReplayFailure] = []
    with RecordSender(config, "bridge-dlq-replay") as sender:
        for start in range(0, len(letters), REPLAY_CHUNK):
            chunk = letters[start : start + REPLAY_CHUNK]
            built, unbuilt = prepare_replay(chunk, group, target, namespace=config.namespace)
            failed.extend(unbuilt)
            results = sender.send_records_sync([r for _, r in built]) if built else []
            for (m, _), r in zip(built, results, strict=True):
                if isinstance(r, KafkaClientError):
                    failed.append(ReplayFailure(m, f"{type(r).__name__}: {r}"))
                else:
                    replayed.append(m)
                    logger.info(
                        "replayed dead letter %s of %s to %s", m.msg_id, group, target.value
                    )
            if on_progress is not None:
                on_progress(len(chunk))
    if failed:
        raise DeadLetterReplayError(group, replayed, failed)
    return replayed
