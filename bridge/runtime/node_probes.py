"""Readiness probes of a local Kafka node: it answers metadata requests, and its group and
transaction coordinators serve every partition of ``__consumer_offsets`` and
``__transaction_state``.

A coordinator partition is probed with a group id or transactional id that Kafka places in it,
computed as Kafka does (Java's ``String.hashCode()``), so one probe per partition suffices.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from bridge.errors import BrokerStartError

probe_logger = logging.getLogger("bridge.kafka.rdkafka.probe")
"""librdkafka complains loudly while the broker is still starting; its lines go here, apart."""


def probe_admin(bootstrap_servers: str, settings: Mapping[str, Any]) -> AdminClient:
    """An admin client for this runtime's own checks (librdkafka's log to
    :data:`probe_logger`)."""
    admin_config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": probe_logger,
        **settings,
    }
    return AdminClient(admin_config)


def wait_for_metadata(
    admin: AdminClient,
    poll: Callable[[], int | None],
    deadline: float,
    timeout_ms: int,
    log_tail: Callable[[], str],
) -> None:
    """Poll ``admin`` until its metadata lists a broker, at most until ``deadline``
    (``time.monotonic()``, s). Raises :class:`BrokerStartError` with ``log_tail()`` if the
    process exits first (``poll()`` returns its exit code) or nothing answers in time (the
    message names ``timeout_ms``, ms)."""
    while True:
        code = poll()
        if code is not None:
            raise BrokerStartError(
                f"the local broker exited with code {code} while starting; log tail:\n{log_tail()}"
            )
        try:
            metadata = admin.list_topics(timeout=1.0)
            if metadata.brokers:
                return
        except KafkaException:
            pass
        if time.monotonic() > deadline:
            raise BrokerStartError(
                f"the local broker did not answer within {timeout_ms} ms; log tail:\n{log_tail()}"
            )
        time.sleep(0.2)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` of ``text`` (over its UTF-16 code units), a signed 32-bit
    int."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition Kafka's coordinators place a group id or transactional id
    in: ``Utils.abs(key.hashCode()) % partitions`` (``Utils.abs(MIN_VALUE)`` is 0)."""
    hashed = java_string_hash(key)
    return (0 if hashed == -(2**31) else abs(hashed)) % partitions


def probe_keys(prefix: str, partitions: int) -> dict[int, str]:
    """One key per partition: ``<prefix>-<n>`` for the smallest ``n`` landing in it."""
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < partitions:
        key = f"{prefix}-{n}"
        keys.setdefault(coordinator_partition(key, partitions), key)
        n += 1
    return keys


# Errors a coordinator answers while it is not (yet) serving a partition.
_COORDINATOR_ERRORS = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)

GROUP_PROBE_PREFIX = "bridge-local-ready"
"""Group ids and transactional ids of the readiness probes start with this."""


def wait_for_coordinators(
    bootstrap_servers: str,
    offsets_partitions: int,
    transaction_partitions: int,
    deadline: float,
    settings: Mapping[str, Any] | None = None,
) -> None:
    """Wait until every partition of ``__consumer_offsets`` and ``__transaction_state`` is
    served, so the first consumer group join and the first ``init_transactions`` find a
    coordinator at once (on a fresh broker the first ``JoinGroup`` otherwise gets "Not
    coordinator" and librdkafka backs off about 3 s). For every partition, one group id that
    Kafka places there is described (which finds its coordinator and
    creates ``__consumer_offsets`` if needed; no group is created), and one transactional
    producer whose id lands there initialises (creating ``__transaction_state``). Polls until
    ``deadline`` (``time.monotonic()``); raises :class:`BrokerStartError` naming the
    partitions that did not answer and the last error."""
    base: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "logger": probe_logger,
        **(settings or {}),
    }
    admin = AdminClient(dict(base))
    waiting = probe_keys(GROUP_PROBE_PREFIX, offsets_partitions)
    last_error = ""
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerStartError(
                f"the group coordinator did not serve __consumer_offsets partitions "
                f"{sorted(waiting)} in time (last error: {last_error or 'none'})"
            )
        # Describing a group that does not exist creates nothing; it answers (state DEAD)
        # once the partition holding it is loaded. (Asking for its committed offsets instead
        # made confluent-kafka 2.16 crash with SIGSEGV on a fresh broker.)
        futures = admin.describe_consumer_groups(
            list(waiting.values()), request_timeout=max(0.5, min(5.0, remaining))
        )
        for partition, group in list(waiting.items()):
            try:
                futures[group].result()
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() not in _COORDINATOR_ERRORS:
                    raise BrokerStartError(
                        f"the group coordinator refused a probe of __consumer_offsets "
                        f"partition {partition}: {error}"
                    ) from exc
                last_error = str(error)
                continue
            del waiting[partition]
        if waiting:
            time.sleep(0.1)
    transactional = probe_keys(GROUP_PROBE_PREFIX, transaction_partitions)
    # One producer per partition, all at once: each init is mostly waiting.
    with ThreadPoolExecutor(max_workers=min(len(transactional), 16)) as pool:
        results = list(
            pool.map(
                lambda item: _init_transactions_probe(base, item[0], item[1], deadline),
                sorted(transactional.items()),
            )
        )
    failed = [result for result in results if result is not None]
    if failed:
        raise BrokerStartError("; ".join(failed))


def _init_transactions_probe(
    base: Mapping[str, Any], partition: int, transactional_id: str, deadline: float
) -> str | None:
    """Initialise a transactional producer with ``transactional_id`` (in ``__transaction_state``
    partition ``partition``) until it succeeds or ``deadline``; None, or what went wrong."""
    producer = Producer({**base, "transactional.id": transactional_id})
    last_error = ""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return (
                    f"the transaction coordinator did not serve __transaction_state partition "
                    f"{partition} in time (last error: {last_error or 'none'})"
                )
            try:
                producer.init_transactions(max(0.5, remaining))
                return None
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and not (
                    error.code() in _COORDINATOR_ERRORS or error.retriable()
                ):
                    return (
                        f"the transaction coordinator refused a probe of __transaction_state "
                        f"partition {partition}: {error}"
                    )
                last_error = str(error)
                time.sleep(0.1)
    finally:
        producer.flush(0)
