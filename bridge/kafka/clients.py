"""confluent-kafka client construction with the project's defaults, and error translation.

librdkafka's own log lines go to the ``bridge.kafka.rdkafka`` logger instead of stderr.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bridge.config import ClientConfig, kafka_env_name
from bridge.errors import (
    AuthorizationError,
    BrokerUnreachableError,
    InvalidArgumentError,
    KafkaClientError,
    SendAuthorizationError,
    SendError,
    SendTimeoutError,
)
from bridge.observability.metrics import active_metrics
from bridge.observability.rdkafka_stats import STATISTICS_INTERVAL_MS, stats_callback

if TYPE_CHECKING:
    from bridge.codec import PreparedRecord

rdkafka_logger = logging.getLogger("bridge.kafka.rdkafka")

# Headroom above the body limit for key, headers and record overhead, in bytes.
RECORD_OVERHEAD_BYTES = 64 * 1024

_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})

_CONSUMER_ONLY_PREFIXES = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "auto.offset.reset",
    "group.",
    "fetch.",
    "partition.assignment.strategy",
    "queued.",
    "auto.commit.",
)
_PRODUCER_ONLY_PREFIXES = (
    "acks",
    "linger.ms",
    "batch.",
    "compression.",
    "retries",
    "retry.backoff",
    "queue.buffering.",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "partitioner",
)


def _extras(config: ClientConfig, other_side: tuple[str, ...]) -> dict[str, str]:
    """``config.kafka`` without the properties only the other kind of client takes (one
    setting list serves producers and consumers without librdkafka warnings)."""
    return {k: v for k, v in config.kafka.items() if not k.startswith(other_side)}


def _common(config: ClientConfig, client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": client_id,
        "logger": rdkafka_logger,
    }


def producer_config(config: ClientConfig, client_id: str, **overrides: Any) -> dict[str, Any]:
    """An idempotent, ``acks=all`` producer config bounded by ``send_msg_timeout_ms``.

    ``overrides`` use librdkafka names with ``_`` for ``.`` (``transactional_id=...``).
    """
    conf = _common(config, client_id)
    conf.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            # The Java client's partitioner, so keyed records land where Kafka's tools expect.
            "partitioner": "murmur2_random",
            "linger.ms": config.linger_ms,
            "message.timeout.ms": config.send_msg_timeout_ms,
            "message.max.bytes": config.max_message_bytes + RECORD_OVERHEAD_BYTES,
            "socket.connection.setup.timeout.ms": min(config.send_msg_timeout_ms, 30_000),
        }
    )
    conf.update(_extras(config, _CONSUMER_ONLY_PREFIXES))
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return conf


CONSUMER_METADATA_REFRESH_MS: Final = 30_000
"""How often a consumer looks up its topics (ms): a topic created after a subscription to it is
consumed within this, as with RocketMQ's route polling."""


def consumer_config(
    config: ClientConfig, group_id: str, client_id: str, **overrides: Any
) -> dict[str, Any]:
    """A ``read_committed`` consumer config with manual offset commits."""
    conf = _common(config, client_id)
    conf.update(
        {
            "group.id": group_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # RocketMQ's clients look up routes every 30 s (pollNameServerInterval);
            # librdkafka's 5 minutes left a subscription to a topic created after it idle.
            "topic.metadata.refresh.interval.ms": CONSUMER_METADATA_REFRESH_MS,
        }
    )
    conf.update(_extras(config, _PRODUCER_ONLY_PREFIXES))
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return conf


_Client = TypeVar("_Client")
# librdkafka quotes the property it refuses: "name" or `name`.
_QUOTED_PROPERTY = re.compile(r'"([a-zA-Z0-9._-]+)"|`([a-zA-Z0-9._-]+)`')


def _construct(
    factory: Callable[[dict[str, Any]], _Client],
    conf: dict[str, Any],
    config: ClientConfig,
    what: str,
) -> _Client:
    """``factory(conf)``, with librdkafka's refusal of a property (unknown name, bad value,
    conflicting settings) raised as :class:`InvalidArgumentError` naming the property and,
    when the user set it, its ``BRIDGE_KAFKA_*`` variable."""
    try:
        return factory(conf)
    except (KafkaException, TypeError, ValueError) as exc:
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
        text = error.str() if isinstance(error, KafkaError) else str(error)
        found = _QUOTED_PROPERTY.search(text)
        name = (found.group(1) or found.group(2)) if found else None
        # The user's own spelling when theirs (librdkafka may say "max.in.flight" for
        # "max.in.flight.requests.per.connection").
        theirs = [
            k for k in config.kafka if name is not None and (k == name or k.startswith(name + "."))
        ]
        if theirs:
            subject = f"kafka property {theirs[0]!r} ({kafka_env_name(theirs[0])})"
        elif name is not None:
            subject = f"kafka property {name!r}"
        else:
            subject = "the kafka properties"
        raise InvalidArgumentError(
            f"{subject} refused when making the Kafka {what}: {text}"
        ) from exc


def _with_statistics(conf: dict[str, Any], group: str | None, namespace: str) -> dict[str, Any]:
    """``conf`` with librdkafka's statistics feeding the active metrics
    (:func:`~bridge.observability.metrics.enable_metrics`), if any; a consumer's lag is
    labelled with ``group``. A ``statistics.interval.ms`` the user set is kept."""
    metrics = active_metrics()
    if metrics is None:
        return conf
    conf.setdefault("statistics.interval.ms", STATISTICS_INTERVAL_MS)
    conf["stats_cb"] = stats_callback(metrics, group, namespace)
    return conf


def new_producer(config: ClientConfig, client_id: str, **overrides: Any) -> Producer:
    """A confluent-kafka ``Producer`` with :func:`producer_config`. Raises
    :class:`InvalidArgumentError` if librdkafka refuses a property.

    While metrics are on, its librdkafka statistics (broker round trip, local queue) are
    recorded under ``client_id``."""
    conf = _with_statistics(producer_config(config, client_id, **overrides), None, config.namespace)
    return _construct(Producer, conf, config, "producer")


def new_consumer(
    config: ClientConfig,
    group_id: str,
    client_id: str,
    *,
    statistics: bool = False,
    on_commit: Callable[[KafkaError | None, list[Any]], None] | None = None,
    **overrides: Any,
) -> Consumer:
    """A confluent-kafka ``Consumer`` with :func:`consumer_config`. Raises
    :class:`InvalidArgumentError` if librdkafka refuses a property.

    ``statistics=True`` records its librdkafka statistics (lag per topic, labelled with
    ``group_id``) while metrics are on; left off for short-lived readers, whose random
    groups would only add series. ``on_commit``: called with the result of each asynchronous
    offset commit (error or None, the partitions), on the thread that polls."""
    conf = consumer_config(config, group_id, client_id, **overrides)
    if statistics:
        conf = _with_statistics(conf, group_id, config.namespace)
    if on_commit is not None:
        conf["on_commit"] = on_commit
    return _construct(Consumer, conf, config, "consumer")


READER_FETCH_WAIT_MS: Final = 10
"""How long a reader's fetch waits at the broker for records (librdkafka's default: 500 ms).
The broker answers one request of a connection at a time, so a long-polling fetch held back
every lookup sent after it (an offset by time, a watermark, the next partition's fetch):
recovering a HALF partition took a second, ``delay_status`` of 16 waiting queues 7.7 s."""


BOUNDED_READER_BUFFER_KB: Final = 1024
"""librdkafka's prefetch queue, KiB per partition, of a reader that streams through a topic that
may be large (an operator's view of a DLQ or of the delayed records): its default, 64 MiB,
would otherwise be the process's largest memory use."""


def new_reader(config: ClientConfig, group_id: str, client_id: str, **overrides: Any) -> Consumer:
    """A consumer that reads to a position and stops (:func:`read_record_at`, scans to a
    partition's end): partition ends reported, fetches that do not wait at the broker."""
    return new_consumer(
        config,
        group_id,
        client_id,
        enable_partition_eof=True,
        fetch_wait_max_ms=READER_FETCH_WAIT_MS,
        **overrides,
    )


def read_record_at(reader: Consumer, tp: TopicPartition, timeout_s: float = 10.0) -> Any:
    """The first record at or after ``tp``'s offset, read with ``reader`` (from
    :func:`new_reader`); None if the partition ends before one.

    Raises :class:`KafkaClientError` when neither comes within ``timeout_s`` (or the read
    fails): callers must not take a slow broker for an empty partition.
    """
    reader.assign([tp])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = reader.poll(0.2)
        if record is None:
            continue
        error = record.error()
        if error is None:
            return record
        if error.code() == KafkaError._PARTITION_EOF:
            return None
        raise translate_error(
            error, f"reading {tp.topic}[{tp.partition}]@{tp.offset}", default=KafkaClientError
        )
    raise KafkaClientError(
        f"reading {tp.topic}[{tp.partition}]@{tp.offset}: nothing within {timeout_s:.1f} s"
    )


def new_admin(config: ClientConfig, client_id: str = "bridge-admin") -> AdminClient:
    """A confluent-kafka ``AdminClient``. Raises :class:`InvalidArgumentError` if librdkafka
    refuses a property."""
    conf = _common(config, client_id)
    conf.update(_extras(config, _CONSUMER_ONLY_PREFIXES + _PRODUCER_ONLY_PREFIXES))
    return _construct(AdminClient, conf, config, "admin client")


_AUTHORIZATION: Final = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "the ACL for this operation on the topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "READ on the consumer group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "WRITE on the transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the cluster permission (IDEMPOTENT_WRITE or CREATE)",
}
"""Authorization refusals, with the permission each one means is missing."""


def translate_error(
    error: KafkaError | KafkaException | BaseException,
    context: str,
    default: type[KafkaClientError] = SendError,
) -> KafkaClientError:
    """A typed project error for a librdkafka error, with ``context`` in its message.

    Timeouts of a send become :class:`SendTimeoutError`, transport failures
    :class:`BrokerUnreachableError`, anything else ``default``.
    """
    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if not isinstance(kafka_error, KafkaError):
        return KafkaClientError(f"{context}: {error}", error)
    code = kafka_error.code()
    text = f"{context}: {kafka_error.str()} ({kafka_error.name()})"
    if code == KafkaError._MSG_TIMED_OUT:
        return SendTimeoutError(text, kafka_error)
    if code in _UNREACHABLE:
        return BrokerUnreachableError(text, kafka_error)
    lacking = _AUTHORIZATION.get(code)
    if lacking is not None:
        text = f"{text}: the principal lacks {lacking}"
        if issubclass(default, SendError):
            return SendAuthorizationError(text, kafka_error)
        if default is KafkaClientError:
            return AuthorizationError(text, kafka_error)
    return default(text, kafka_error)


def produce_record(
    kafka: Any,
    record: PreparedRecord,
    partition: int,
    callback: Any,
    *,
    timeout_ms: int,
    wait_full: Callable[[], object],
) -> None:
    """Hand ``record`` to ``kafka`` (a confluent-kafka ``Producer``; ``partition`` -1: its key
    decides). While the local queue is full, call ``wait_full`` (which lets deliveries drain)
    and try again, for at most ``timeout_ms`` (ms); then raise :class:`SendTimeoutError`. Any
    other refusal (unknown partition, bad config) is raised as :func:`translate_error` types
    it."""
    deadline = 0.0
    while True:
        try:
            kafka.produce(
                record.kafka_topic,
                record.value,
                record.key,
                partition=partition,
                on_delivery=callback,
                timestamp=record.born_timestamp_ms,
                headers=record.headers,
            )
            return
        except BufferError:
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout_ms / 1000
            elif now >= deadline:
                raise SendTimeoutError(
                    f"send of {record.msg_id} to {record.kafka_topic}: local queue full for "
                    f"{timeout_ms} ms"
                ) from None
            wait_full()
        except Exception as exc:  # KafkaException: unknown partition, bad config, ...
            raise translate_error(exc, f"send of {record.msg_id} to {record.kafka_topic}") from exc
