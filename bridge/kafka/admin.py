"""Topic provisioning: create the catalog's topics idempotently and check what exists."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from bridge.config import ClientConfig
from bridge.errors import BrokerUnreachableError, KafkaClientError, TopicProvisioningError
from bridge.kafka.clients import new_admin, translate_error
from topics.catalog import SystemTopic, TopicCatalog, TopicSpec

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

    def ensure_topics(self, specs: Iterable[TopicSpec], *, strict: bool = True) -> list[str]:
        """Create the topics that do not exist yet; return the names created.

        A topic that exists with fewer partitions than its spec raises
        :class:`TopicProvisioningError` (a SCHEDULE topic with too few partitions would lose
        delay levels), unless ``strict`` is False; more partitions are accepted.
        """
        wanted = list(specs)
        existing = self.list_topics(include_internal=True)
        missing = [s for s in wanted if s.kafka_name not in existing]
        created = self._create(missing) if missing else []
        # Check what is there once metadata shows every topic (a topic created a moment ago,
        # by us or by another process, may not be visible yet).
        counts = self.wait_for_topics(s.kafka_name for s in wanted)
        for spec in wanted:
            if strict and counts[spec.kafka_name] < spec.partitions:
                raise TopicProvisioningError(
                    f"topic {spec.kafka_name} has {counts[spec.kafka_name]} partitions, "
                    f"{spec.partitions} needed"
                )
        return created

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
        created = self.ensure_topics(catalog.system_specs())
        counts = self.list_topics(include_internal=True)
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
