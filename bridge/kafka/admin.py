"""Topic provisioning: create the catalog's topics idempotently and check what exists."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic, ResourceType

from bridge.config import ClientConfig
from bridge.errors import BrokerUnreachableError, KafkaClientError, TopicProvisioningError
from bridge.kafka.clients import new_admin, translate_error
from topics.catalog import ConfigMismatch, SystemTopic, TopicCatalog, TopicSpec

logger = logging.getLogger(__name__)


class TopicAdmin:
    """Lists and creates topics; every call is bounded by ``request_timeout_ms``."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._admin = new_admin(config)
        self._timeout_s = config.request_timeout_ms / 1000

    def list_topics(self, include_internal: bool = False) -> dict[str, int]:
        """Topic name -> partition count. Raises :class:`BrokerUnreachableError` on timeout."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)
        except KafkaException as exc:
            raise translate_error(
                exc,
                f"listing topics at {self._config.bootstrap_servers}",
                default=BrokerUnreachableError,
            ) from exc
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if include_internal or not name.startswith("__")
        }

    def ensure_topics(
        self, specs: Iterable[TopicSpec], *, strict: bool = True, expand: bool = False
    ) -> list[str]:
        """Create the topics that do not exist yet; return the names created.

        A topic that exists with fewer partitions than its spec raises
        :class:`TopicProvisioningError` (a SCHEDULE topic with too few partitions would lose
        delay levels), unless ``strict`` is False, or ``expand`` is True and the spec is
        :attr:`TopicSpec.expandable` (SCHEDULE and the timer topic): then the missing
        partitions are added (Kafka's CreatePartitions, which needs ALTER on the topic; the
        records of the existing ones stay where they are and keep their level or tier). More
        partitions are accepted, except for a spec with :attr:`TopicSpec.exact_partitions`
        (the parked and quarantine topics), which raises for any other count whatever
        ``strict`` says.

        A system topic that already existed is also checked for the settings the guarantees
        rely on (:meth:`TopicSpec.config_mismatches`: timestamp type, no compaction,
        retention); any difference raises :class:`TopicProvisioningError` naming the topic,
        the setting, its value, the value required and the ``kafka-configs.sh`` command that
        fixes it, whatever ``strict`` says.
        """
        created, _ = self._ensure(list(specs), strict=strict, expand=expand)
        return created

    def _ensure(
        self, wanted: list[TopicSpec], *, strict: bool, expand: bool = False
    ) -> tuple[list[str], dict[str, int]]:
        """:meth:`ensure_topics`; also the partition counts it checked, from the one metadata
        answer that showed every topic of ``wanted`` (in a cluster the next answer may come from
        a node that has not heard of a topic created a moment ago)."""
        existing = self.list_topics(include_internal=True)
        missing = [s for s in wanted if s.kafka_name not in existing]
        created = self._create(missing) if missing else []
        # Check what is there once metadata shows every topic (a topic created a moment ago,
        # by us or by another process, may not be visible yet).
        counts = self.wait_for_topics(s.kafka_name for s in wanted)
        for spec in wanted:
            count = counts[spec.kafka_name]
            if spec.exact_partitions and count != spec.partitions:
                raise TopicProvisioningError(
                    f"topic {spec.kafka_name} has {count} partitions, exactly "
                    f"{spec.partitions} required: its readers (replay, the parked and "
                    "quarantine views) look at partition 0 only, so records in the others "
                    "would never be seen; fix: copy out what it holds, then "
                    f"kafka-topics.sh --bootstrap-server {self._config.bootstrap_servers} "
                    f"--delete --topic {spec.kafka_name} and start again (it is recreated "
                    f"with {spec.partitions})"
                )
            if strict and count < spec.partitions and spec.expandable and expand:
                self._add_partitions(spec, count)
                counts[spec.kafka_name] = spec.partitions
            elif strict and count < spec.partitions and spec.expandable:
                raise TopicProvisioningError(
                    f"topic {spec.kafka_name} has {count} partitions, {spec.partitions} needed "
                    "(delay_partitions_per_level or timer_partitions_per_tier times the levels "
                    "or tiers); fix: start a coordinator of this release or run `bridge topics "
                    "create --system`, which add the missing partitions (the existing ones "
                    "keep their records, levels and tiers), or set "
                    "BRIDGE_DELAY_PARTITIONS_PER_LEVEL / BRIDGE_TIMER_PARTITIONS_PER_TIER to "
                    "what the topic has"
                )
            elif strict and count < spec.partitions:
                raise TopicProvisioningError(
                    f"topic {spec.kafka_name} has {count} partitions, {spec.partitions} needed"
                )
        self._check_settings(
            [s for s in wanted if s.system is not None and s.kafka_name not in created]
        )
        return created, counts

    def _add_partitions(self, spec: TopicSpec, count: int) -> None:
        """Raise ``spec``'s topic from ``count`` to :attr:`TopicSpec.partitions` partitions
        (another process doing the same meanwhile is fine)."""
        futures = self._admin.create_partitions(
            [NewPartitions(spec.kafka_name, spec.partitions)], request_timeout=self._timeout_s
        )
        shown = False  # metadata already showed them (added by another process)
        for future in futures.values():
            try:
                future.result(timeout=self._timeout_s)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if (
                    isinstance(err, KafkaError)
                    and err.code() == KafkaError.INVALID_PARTITIONS
                    and self._has_partitions(spec)
                ):
                    shown = True  # raised meanwhile by another process
                    continue
                raise TopicProvisioningError(
                    f"topic {spec.kafka_name} has {count} partitions, {spec.partitions} "
                    f"needed, and adding them failed: {exc.args[0] if exc.args else exc} "
                    "(it needs ALTER on the topic); fix: kafka-topics.sh --bootstrap-server "
                    f"{self._config.bootstrap_servers} --alter --topic {spec.kafka_name} "
                    f"--partitions {spec.partitions} (the existing partitions keep their "
                    "records, levels and tiers)"
                ) from exc
            except TimeoutError as exc:
                raise TopicProvisioningError(
                    f"adding partitions to topic {spec.kafka_name} timed out"
                ) from exc
        # The controller answers before every broker has applied the change: a client started
        # right after (a producer checking the topic) could still be told the old count.
        if not shown and not self._has_partitions(spec):
            raise TopicProvisioningError(
                f"topic {spec.kafka_name}: partitions were added ({spec.partitions} now), but "
                f"metadata did not show them within {self._config.request_timeout_ms} ms"
            )
        logger.warning(
            "topic %s: %d partitions added (%d now)%s: the delay settings ask for more "
            "partitions per level or tier; the existing ones keep their records",
            spec.kafka_name,
            spec.partitions - count,
            spec.partitions,
            " by another process meanwhile" if shown else "",
        )

    def _has_partitions(self, spec: TopicSpec) -> bool:
        """Whether metadata shows ``spec``'s topic with its partitions within
        ``request_timeout_ms`` (partitions another process added a moment ago may not be in
        the answer of every broker yet)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            if self.list_topics(include_internal=True).get(spec.kafka_name, 0) >= spec.partitions:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _check_settings(self, specs: list[TopicSpec]) -> None:
        """Raise if an existing topic of ``specs`` has a setting a guarantee cannot live with
        (one round trip for all of them)."""
        if not specs:
            return
        described = self.describe_configs([s.kafka_name for s in specs])
        problems = [
            (spec.kafka_name, spec.config_mismatches(described[spec.kafka_name])) for spec in specs
        ]
        problems = [(name, found) for name, found in problems if found]
        if problems:
            raise TopicProvisioningError(
                "; ".join(self._explain(name, found) for name, found in problems)
            )

    def _explain(self, topic: str, found: list[ConfigMismatch]) -> str:
        settings = ", ".join(
            f"{topic} has {m.setting}={m.actual}, {m.required} required ({m.reason})" for m in found
        )
        fix = ",".join(f"{m.setting}={m.fix}" for m in found)
        return (
            f"{settings}; fix: kafka-configs.sh --bootstrap-server "
            f"{self._config.bootstrap_servers} --alter --entity-type topics "
            f"--entity-name {topic} --add-config {fix}"
        )

    def describe_configs(self, names: Iterable[str]) -> dict[str, dict[str, str | None]]:
        """Topic name -> its configuration (setting -> value, as the broker reports it).
        Bounded by ``request_timeout_ms``."""
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
        futures = self._admin.describe_configs(resources, request_timeout=self._timeout_s)
        out: dict[str, dict[str, str | None]] = {}
        for resource, future in futures.items():
            try:
                entries = future.result(timeout=self._timeout_s)
            except KafkaException as exc:
                raise translate_error(
                    exc, f"describing topic {resource.name}", default=TopicProvisioningError
                ) from exc
            except TimeoutError as exc:
                raise TopicProvisioningError(
                    f"describing topic {resource.name} timed out after "
                    f"{self._config.request_timeout_ms} ms"
                ) from exc
            out[resource.name] = {key: entry.value for key, entry in entries.items()}
        return out

    def _create(self, missing: list[TopicSpec]) -> list[str]:
        futures = self._admin.create_topics(
            [
                NewTopic(
                    s.kafka_name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication_factor,
                    config=dict(s.configs),
                )
                for s in missing
            ],
            request_timeout=self._timeout_s,
        )
        created = []
        for name, future in futures.items():
            try:
                future.result(timeout=self._timeout_s)
                created.append(name)
                logger.info("created topic %s", name)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # created concurrently by another process: fine
                raise translate_error(
                    exc, f"creating topic {name}", default=TopicProvisioningError
                ) from exc
            except TimeoutError as exc:
                raise TopicProvisioningError(f"creating topic {name} timed out") from exc
        return created

    def wait_for_topics(self, names: Iterable[str]) -> dict[str, int]:
        """Poll metadata until every topic of ``names`` is visible (a just-created topic may
        not be yet); return their partition counts. Bounded by ``request_timeout_ms``."""
        wanted = set(names)
        deadline = time.monotonic() + self._timeout_s
        while True:
            counts = self.list_topics(include_internal=True)
            if wanted <= counts.keys():
                return {name: counts[name] for name in wanted}
            if time.monotonic() > deadline:
                raise TopicProvisioningError(
                    f"topics {sorted(wanted - counts.keys())} not visible in metadata "
                    f"within {self._config.request_timeout_ms} ms"
                )
            time.sleep(0.1)

    def ensure_system_topics(self, catalog: TopicCatalog) -> list[str]:
        """Create every system topic of ``catalog``, wait until all are visible, and check
        that HALF and OP are co-partitioned."""
        created, counts = self._ensure(list(catalog.system_specs()), strict=True, expand=True)
        half = counts[catalog.topic(SystemTopic.HALF)]
        op = counts[catalog.topic(SystemTopic.OP)]
        if half != op:
            raise TopicProvisioningError(
                f"{catalog.topic(SystemTopic.HALF)} has {half} partitions but "
                f"{catalog.topic(SystemTopic.OP)} has {op}: they must be equal"
            )
        return created

    def delete_topics(self, names: Iterable[str]) -> None:
        """Delete topics (used by tests and operators)."""
        futures = self._admin.delete_topics(list(names), request_timeout=self._timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=self._timeout_s)
            except KafkaException as exc:
                raise translate_error(
                    exc, f"deleting topic {name}", default=KafkaClientError
                ) from exc
