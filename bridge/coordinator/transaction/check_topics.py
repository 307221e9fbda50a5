"""The check topics of the producer groups, created when a group's first check is sent."""

from __future__ import annotations

from bridge.coordinator.transaction.targets import MISSING_CACHE_MS
from bridge.errors import BridgeError
from bridge.kafka.admin import TopicAdmin
from topics.catalog import TopicCatalog


class CheckTopics:
    """The check topic of each producer group, created (with ``partitions`` partitions) if
    missing; what could not be had is remembered :data:`MISSING_CACHE_MS` ms."""

    def __init__(self, catalog: TopicCatalog, partitions: int) -> None:
        self._catalog = catalog
        self._partitions = partitions
        self._admin: TopicAdmin | None = None
        self._known_check_topics: set[str] = set()
        self._check_topic_errors: dict[str, tuple[str, int]] = {}
        """Check topic -> (why it could not be had, when that was found, ms)."""

    def start(self, admin: TopicAdmin) -> None:
        """Use ``admin`` to create check topics."""
        self._admin = admin

    def forget_known(self) -> None:
        """Ask again whether each check topic exists (one may have been deleted meanwhile)."""
        self._known_check_topics.clear()

    def ensure(self, group: str, now: int) -> str:
        """The check topic of producer ``group``, created if missing. Any partition count
        will do (a producer may have created it with its own ``check_topic_partitions``: a
        consumer group reads them all). Raises :class:`BridgeError` when it cannot be had;
        that answer is kept :data:`MISSING_CACHE_MS` ms (many checks, one question)."""
        topic = self._catalog.check_topic(group)
        if topic in self._known_check_topics:
            return topic
        failed = self._check_topic_errors.get(topic)
        if failed is not None and now - failed[1] < MISSING_CACHE_MS:
            raise BridgeError(failed[0])
        try:
            self._admin_client().ensure_topics(
                [self._catalog.check_topic_spec(group, self._partitions)],
                strict=False,
            )
        except BridgeError as exc:
            self._check_topic_errors[topic] = (str(exc), now)
            raise
        self._check_topic_errors.pop(topic, None)
        self._known_check_topics.add(topic)
        return topic

    def _admin_client(self) -> TopicAdmin:
        """The admin client, given in :meth:`start`."""
        if self._admin is None:
            raise BridgeError("transaction service used before it started")
        return self._admin
