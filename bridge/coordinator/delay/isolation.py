"""Isolation in the delay services: a message that cannot be delivered for a reason that will
not go away by itself (internal, missing or deleted topic, partition out of range, record too
large for the topic, authorization) does not hold the others back.

Cheap checks against topic metadata catch most before the transaction; otherwise the failed
transaction's delivery reports name the record. It then goes to the timer topic to be tried
again after a back-off (``DELIVERY_ATTEMPTS`` and ``DELIVERY_ERROR`` record why), and after
``delivery_attempts`` tries to QUARANTINE with the reason. Transient failures (broker
unreachable, timeouts) are retried as they are; a delivery that times out while the rest of its
transaction went through is sent back for a back-off.

A message for a real topic outside ``allowed_topics`` (G12) is never written there: it goes to
QUARANTINE at once with the reason (``bridge quarantine replay`` delivers it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ResourceType

from bridge.codec import PreparedRecord
from bridge.coordinator.delay.held import RECORD_ERRORS, DelaySettings, Held, Key
from bridge.coordinator.delay.records import backoff_copy, backoff_source
from bridge.delay.routing import slots_header
from bridge.delay_policy import DELIVERY_BACKOFF_MAX_MS
from bridge.kafka.batch_writer import TransactionBatch
from bridge.kafka.clients import new_admin
from bridge.kafka.quarantine import QUARANTINE_OMITTED_BYTES, quarantine_copy
from bridge.kafka.transactional import is_permanent_delivery_error
from topics.catalog import SystemTopic
from topics.naming import is_kafka_internal

logger = logging.getLogger(__name__)

_METADATA_MAX_AGE_S = 1.0
"""How old the partition count of a target topic may be before it is asked again, s."""
_METADATA_RECHECK_S = 0.2
"""A target that looks missing or too small is asked again if its answer is older, s."""
_MISSING: Final = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
_NOT_RECORD_ERRORS: Final = frozenset(
    {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._FENCED}
)
"""Report errors that say what happened to the transaction, not to the record."""
_UNKNOWN_TARGET: Final = (1 << 31, None)
"""What :meth:`Isolation._target` says when it cannot tell: try to deliver."""


@dataclass(slots=True)
class Unit:
    """A due record and what it becomes in the Kafka transaction."""

    held: Held
    record: PreparedRecord | None
    """What it is written as (None for a duplicate)."""
    real: bool = False
    """``record`` is the delivery to the message's real topic (which may refuse it)."""
    suspect: bool = False
    """Its delivery failed in a transaction with other failures: it goes alone next time."""
    aside: bool = False
    duplicate: bool = False
    """A second copy of a record delivered already: consumed, nothing written."""
    recalled: bool = False
    """A timer recalled in time (``recall_message``): consumed, nothing written."""


def located(topic: str, partition: int) -> str:
    """``topic[partition]``, or ``topic`` when the partition is not known (-1)."""
    return f"{topic}[{partition}]" if partition >= 0 else topic


class Isolation:
    """The records of a delay service that failed a transaction or will, and what they become
    instead (back-off copies in the timer topic, quarantine copies, deliveries on their own).
    ``process`` says what a due record becomes (and whether that is its delivery to a real
    topic); ``producer`` gives the service's producer, whose metadata says which targets
    exist."""

    def __init__(
        self,
        settings: DelaySettings,
        *,
        process: Callable[[Held, int], tuple[PreparedRecord, bool]],
        producer: Callable[[], Any],
    ) -> None:
        self._name = settings.name
        self._topic = settings.topic
        self._timer_topic = settings.timer_topic
        self._config = settings.config
        self._client = settings.config.client
        self._timeout_s = settings.timeout_s
        self._policy = settings.policy
        self._kind = settings.kind
        self._allowed_topics = settings.allowed_topics
        self._process = process
        self._producer = producer
        self._culprits: dict[Key, str] = {}
        """(partition, offset) -> why its delivery failed: moved aside on the next pass."""
        self._suspects: set[Key] = set()
        """Records tried in a transaction of their own on the next pass."""
        self._slow: dict[Key, str] = {}
        """Records whose delivery timed out (a transient reason): sent back for a back-off
        on the next pass, without holding the others."""
        self._timeouts: dict[Key, int] = {}
        """Failed transactions in which a record timed out with nothing to compare it to."""
        self._shrink: dict[Key, tuple[int, str]] = {}
        """Records whose bridge-made copy (back-off or quarantine) the broker refused for good:
        (1: quarantine it; 2: quarantine it without its value and headers, why)."""
        self._topics: dict[str, tuple[int | None, str | None, float]] = {}
        """Target topic -> (partition count or None if missing, why it cannot be written,
        when asked in monotonic s)."""
        self._auto_create = True

    def revoke(self, revoked: set[int]) -> None:
        """Forget what was noted about records of the partitions ``revoked``."""
        self._culprits = {k: v for k, v in self._culprits.items() if k[0] not in revoked}
        self._suspects = {k for k in self._suspects if k[0] not in revoked}
        self._slow = {k: v for k, v in self._slow.items() if k[0] not in revoked}
        self._timeouts = {k: v for k, v in self._timeouts.items() if k[0] not in revoked}
        self._shrink = {k: v for k, v in self._shrink.items() if k[0] not in revoked}

    def settled(self, key: Key) -> None:
        """The record at ``key`` committed: forget what was noted about it."""
        for pending in (self._culprits, self._slow, self._shrink, self._timeouts):
            pending.pop(key, None)
        self._suspects.discard(key)

    def slow(self, key: Key, why: str) -> None:
        """The delivery of the record at ``key`` was not acknowledged in time (``why``): it is
        sent back for a back-off on the next pass."""
        self._slow[key] = why

    def start(self) -> None:
        """Find out whether producing to a missing topic creates it (the broker's
        ``auto.create.topics.enable`` and the client's ``allow.auto.create.topics``)."""
        if str(self._client.kafka.get("allow.auto.create.topics", "true")).lower() == "false":
            self._auto_create = False
            return
        try:
            admin = new_admin(self._client, f"{self._name}-config")
            brokers = admin.list_topics(timeout=self._timeout_s).brokers
            resource = ConfigResource(ResourceType.BROKER, str(next(iter(brokers))))
            entries = admin.describe_configs([resource], request_timeout=self._timeout_s)
            config = entries[resource].result(timeout=self._timeout_s)
            entry = config.get("auto.create.topics.enable")
            self._auto_create = entry is None or str(entry.value).lower() == "true"
        except Exception as exc:  # unknown: let the producer find out
            logger.info("%s: broker's auto.create.topics.enable unknown: %s", self._name, exc)
            self._auto_create = True

    def unit(self, held: Held, now: int) -> Unit:
        """What the due ``held`` becomes: its back-off or quarantine copy when it was set
        aside before, else what the service makes of it (quarantined if malformed, set aside
        if its target is known to refuse it)."""
        key = (held.partition, held.offset)
        shrink = self._shrink.get(key)
        if shrink is not None:
            stage, why = shrink
            return Unit(held, self._quarantined(held, why, keep_value=stage < 2), aside=True)
        problem = self._culprits.get(key)
        if problem is not None:
            return Unit(held, self._aside(held, problem, now), aside=True)
        problem = self._slow.get(key)
        if problem is not None:
            return Unit(held, self._aside(held, problem, now, transient=True), aside=True)
        try:
            record, real = self._process(held, now)
        except RECORD_ERRORS as exc:
            return Unit(held, self._quarantined(held, str(exc) or type(exc).__name__))
        if real:
            return self._delivery(held, record, now)
        return Unit(held, record, real, suspect=key in self._suspects)

    def _delivery(self, held: Held, out: PreparedRecord, now: int) -> Unit:
        """What the due ``held``, whose delivery to its real topic is ``out``, becomes: its
        quarantine copy when the topic is outside the service's ``allowed_topics`` (G12: no
        back-off makes it allowed; an operator replays it with ``bridge quarantine replay``),
        its back-off copy when the topic is known to refuse it, else ``out``."""
        refusal = self._allowed_topics.refusal("topic", out.kafka_topic)
        if refusal is not None:
            logger.warning(
                "%s: %s[%d]@%d not delivered: %s",
                self._name,
                self._topic,
                held.partition,
                held.offset,
                refusal,
            )
            return Unit(held, self._quarantined(held, f"not delivered: {refusal}"), aside=True)
        problem = self._target_problem(out)
        if problem is not None:
            return Unit(held, self._aside(held, problem, now), aside=True)
        key = (held.partition, held.offset)
        return Unit(held, out, True, suspect=key in self._suspects)

    def _quarantined(self, held: Held, reason: str, *, keep_value: bool = True) -> PreparedRecord:
        if held.header_error is not None:
            reason += f"; copied without its headers, which could not be read ({held.header_error})"
        return quarantine_copy(
            self._config.catalog,
            held.record,
            reason,
            self._name,
            headers=held.headers,
            keep_value=keep_value,
        )

    def _aside(
        self, held: Held, problem: str, now: int, *, transient: bool = False
    ) -> PreparedRecord:
        """Where a message whose delivery failed for ``problem`` goes: back to wait in the
        timer topic for a back-off, or QUARANTINE once it failed ``delivery_attempts`` times
        for a permanent reason. A ``transient`` failure (a timeout) counts in
        ``DELIVERY_ATTEMPTS`` (its back-off doubles, up to
        :data:`~bridge.delay_policy.DELIVERY_BACKOFF_MAX_MS`) but never quarantines the
        message by itself. The back-off copy is in the format of the
        coordinator's ``delay_record_format``, whichever format ``held`` was in (see
        :func:`~bridge.codec.is_header_format`): the header format, or with ``"envelope"`` the
        record releases before it wrote (an envelope with ``TIMER_DELIVER_MS`` as its one
        header), which their coordinators read during a rolling upgrade."""
        try:
            previous, msg_id, msg = backoff_source(held, self._config.catalog.namespace)
            attempts = previous + 1
            if not transient and attempts >= self._config.delivery_attempts:
                logger.warning("%s: delivery failed %d times: %s", self._name, attempts, problem)
                return self._quarantined(held, f"delivery failed {attempts} times: {problem}")
            backoff_ms = min(
                self._config.delivery_backoff_ms * 2 ** min(attempts - 1, 30),
                DELIVERY_BACKOFF_MAX_MS,
            )
            deliver_ms = now + backoff_ms
            value, headers = backoff_copy(
                held,
                msg,
                attempts,
                problem,
                deliver_ms,
                envelope=self._client.delay_record_format == "envelope",
            )
        except RECORD_ERRORS as exc:
            return self._quarantined(held, f"{problem}; then {exc}")
        logger.warning(
            "%s: delivery of %s failed (%s); attempt %d%s in %d ms",
            self._name,
            msg_id,
            problem,
            attempts + 1,
            "" if transient else f" of {self._config.delivery_attempts}",
            backoff_ms,
        )
        policy = self._policy
        tier = policy.route(deliver_ms, now, policy.tier_count) or 0
        # In the lane of the partition it was read from (see DelayPolicy.hop_partition).
        slots = policy.level_count if self._kind == "schedule" else policy.tier_count
        partition = policy.hop_partition(tier, held.partition, slots)
        headers = [*slots_header(partition, policy.tier_count), *headers]
        return PreparedRecord(
            self._timer_topic, held.record.key(), value, headers, msg_id, 0, partition
        )

    def _target_problem(self, out: PreparedRecord) -> str | None:
        """Why ``out`` cannot be delivered, from (cached) metadata, or None if it may be."""
        topic, partition = out.kafka_topic, out.partition
        if is_kafka_internal(topic):
            return f"{topic} is an internal topic of Kafka"
        count, problem = self._target(topic, partition)
        if problem is not None:
            return problem
        if count is None:
            return None if self._auto_create else f"topic {topic} does not exist"
        if partition >= count:
            return f"partition {partition} of {topic} is out of range: it has {count}"
        return None

    def _target(
        self, topic: str, partition: int, *, fresh: bool = False
    ) -> tuple[int | None, str | None]:
        """(partitions of ``topic`` or None if it does not exist, why it cannot be written
        or None), asked at most every :data:`_METADATA_MAX_AGE_S` and again sooner when it
        looks missing or too small. When metadata cannot be had, the producer finds out."""
        count, problem, asked = self._topics.get(topic, (None, None, -1e9))
        age = time.monotonic() - asked
        looks_wrong = count is None or partition >= count or problem is not None
        if fresh or age > _METADATA_MAX_AGE_S or (looks_wrong and age > _METADATA_RECHECK_S):
            try:
                meta = (
                    self._producer().list_topics(topic, timeout=self._timeout_s).topics.get(topic)
                )
            except KafkaException as exc:
                logger.info("%s: no metadata for %s: %s", self._name, topic, exc)
                return _UNKNOWN_TARGET
            error = None if meta is None else meta.error
            if meta is None or (error is not None and error.code() in _MISSING):
                count, problem = None, None
            elif error is None:
                count, problem = len(meta.partitions), None
            elif error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                count, problem = None, f"topic {topic}: {error.str()}"
            else:  # e.g. a leader being elected: not this message's fault
                return _UNKNOWN_TARGET
            self._topics[topic] = (count, problem, time.monotonic())
        return count, problem

    def replace_refused(
        self, unit: Unit, failed: PreparedRecord, exc: KafkaException, now: int
    ) -> PreparedRecord | None:
        """Another form of ``unit``'s record, which the producer refused for good before
        sending it (e.g. a partition the client knows is out of range, or a record above the
        producer's ``message.max.bytes``), so that the transaction stays intact: a real
        delivery becomes its back-off copy, a bridge-made copy a smaller form. None when
        there is none (the transaction then fails)."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or not is_permanent_delivery_error(err):
            return None
        problem = f"{located(failed.kafka_topic, failed.partition)}: {err.str()} ({err.name()})"
        if unit.real:
            unit.record = self._aside(unit.held, problem, now)
            unit.real = False
        else:
            stage, why = self._escalate(unit, failed, problem)
            if stage > 2:
                return None
            unit.record = self._quarantined(unit.held, why, keep_value=stage < 2)
        unit.aside = True
        return unit.record

    def _escalate(self, unit: Unit, failed: PreparedRecord, problem: str) -> tuple[int, str]:
        """Record that ``unit``'s bridge-made output ``failed`` for good (``problem``) and
        return what replaces it: (1: quarantine, 2: quarantine without value and headers,
        3: nothing smaller exists; why)."""
        key = (unit.held.partition, unit.held.offset)
        quarantine_topic = self._config.catalog.topic(SystemTopic.QUARANTINE)
        if failed.kafka_topic != quarantine_topic:
            stage = 1
        else:
            smallest = any(k == QUARANTINE_OMITTED_BYTES for k, _ in failed.headers)
            stage = 3 if smallest else 2
        before = self._shrink.get(key, (0, ""))[1] or self._culprits.get(key) or self._slow.get(key)
        why = f"{before}; then " if before else ""
        why += f"its copy to {failed.kafka_topic} failed: {problem}"
        if stage > 2:
            logger.error(
                "%s: even the smallest quarantine copy of %s[%d]@%d is refused (%s): "
                "fix the %s topic",
                self._name,
                self._topic,
                key[0],
                key[1],
                problem,
                quarantine_topic,
            )
            return stage, why
        self._shrink[key] = (stage, why)
        logger.warning("%s: %s[%d]@%d: %s", self._name, self._topic, key[0], key[1], why)
        return stage, why

    def blame(
        self, units: list[Unit], batch: TransactionBatch, owners: list[int], exc: KafkaException
    ) -> None:
        """Find the deliveries that failed a transaction for a permanent reason. Alone on
        its target in the transaction, a record is the culprit; several on one target (a
        batch the broker refused as a whole) are suspects, each tried alone next time.

        A bridge-made output (back-off or quarantine copy) refused for good is replaced by a
        smaller form next time. A real delivery that timed out while other outputs of the
        transaction were acknowledged, or alone, goes back for a back-off (transient); one
        that timed out with all the others twice in a row is tried alone."""
        blamed: dict[int, str] = {}
        reports = batch.reports
        acknowledged = any(err is None for err, _ in reports.values())
        timed_out: set[int] = set()
        for at, (err, partition) in reports.items():
            index = owners[at]
            out = batch.records[at]
            if err is None:
                continue
            where = located(out.kafka_topic, partition if partition >= 0 else out.partition)
            problem = f"{where}: {err.str()} ({err.name()})"
            if not units[index].real:
                if is_permanent_delivery_error(err):
                    self._escalate(units[index], out, problem)
                continue
            if is_permanent_delivery_error(err):
                blamed[index] = problem
            elif (
                err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._UNKNOWN_TOPIC)
                and not self._auto_create
                and self._target(out.kafka_topic, out.partition, fresh=True) == (None, None)
            ):
                blamed[index] = f"topic {out.kafka_topic} does not exist"
            elif err.code() not in _NOT_RECORD_ERRORS:
                timed_out.add(index)
                key = (units[index].held.partition, units[index].held.offset)
                if acknowledged or len(units) == 1:
                    self._slow[key] = problem
                else:
                    self._timeouts[key] = self._timeouts.get(key, 0) + 1
                    if self._timeouts[key] >= 2:
                        self._suspects.add(key)
        if timed_out:
            logger.warning(
                "%s: deliveries timed out: %s",
                self._name,
                sorted(
                    f"{self._topic}[{units[i].held.partition}]@{units[i].held.offset}"
                    for i in timed_out
                ),
            )
        error = exc.args[0] if exc.args else None
        if not blamed and isinstance(error, KafkaError) and is_permanent_delivery_error(error):
            # The transaction failed for a record's reason (a partition it could not add,
            # e.g. not authorized) but the reports only say "purged", for the innocent
            # records added in the same request too: each unacknowledged one is a suspect.
            unacknowledged = {owners[at] for at in batch.unacknowledged()}
            for index, unit in enumerate(units):
                real = unit.record if unit.real else None
                if real is not None and index in unacknowledged:
                    key = (unit.held.partition, unit.held.offset)
                    where = located(real.kafka_topic, real.partition)
                    if len(units) == 1:
                        self._culprits[key] = f"{where}: {error.str()} ({error.name()})"
                    else:
                        self._suspects.add(key)
        targets: dict[str, list[int]] = {}
        for index in blamed:
            targets.setdefault(blamed[index].split(":", 1)[0], []).append(index)
        for indexes in targets.values():
            for index in indexes:
                key = (units[index].held.partition, units[index].held.offset)
                if len(indexes) == 1 or len(units) == 1:
                    self._culprits[key] = blamed[index]
                else:
                    self._suspects.add(key)
        if blamed:
            logger.warning("%s: failed deliveries: %s", self._name, sorted(set(blamed.values())))
