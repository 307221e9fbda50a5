"""Create the trust model's ACLs (:mod:`topics.acls`) through Kafka's Admin API."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import wait as futures_wait
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as KafkaResourceType

from bridge.config import ClientConfig
from bridge.errors import KafkaClientError
from bridge.kafka.clients import new_admin, translate_error
from topics.acls import Acl, ResourceType

logger = logging.getLogger(__name__)

_SHOWN_POLL_S: Final = 0.05
"""How often :func:`await_acls_shown` asks whether the broker shows the ACLs, s."""
_ASK_AGAIN: Final = frozenset(
    {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
)
"""Errors of a describe asked again within the deadline even if librdkafka does not flag them
retriable: the request, not the question, failed."""


def acl_binding(acl: Acl) -> AclBinding:
    """The ALLOW binding (any host) of ``acl``."""
    kind = "BROKER" if acl.resource_type is ResourceType.CLUSTER else acl.resource_type.value
    return AclBinding(
        KafkaResourceType[kind],
        acl.name,
        ResourcePatternType[acl.pattern.value],
        acl.principal,
        "*",
        AclOperation[acl.operation.value],
        AclPermissionType.ALLOW,
    )


def create_acls(config: ClientConfig, acls: Iterable[Acl]) -> list[Acl]:
    """Create ``acls`` (creating an existing ACL again changes nothing); return them once the
    brokers asked show them all (:func:`await_acls_shown`: about ``request_timeout_ms`` more
    at most, then a warning), so that a client started right after is not refused by a broker
    that has not applied them yet. The principal of ``config`` needs ALTER on the cluster. A
    refusal raises :class:`~bridge.errors.AuthorizationError` (or another
    :class:`~bridge.errors.KafkaClientError`) naming the first ACL that failed."""
    wanted = list(acls)
    if not wanted:
        return []
    admin = new_admin(config, "bridge-acls")
    timeout_s = config.request_timeout_ms / 1000
    bindings = {acl_binding(acl): acl for acl in wanted}
    futures = admin.create_acls(list(bindings), request_timeout=timeout_s)
    for binding, future in futures.items():
        acl = bindings[binding]
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            what = (
                f"creating the ACL {acl.principal} {acl.operation.value} on "
                f"{acl.resource_type.value} {acl.name} ({acl.pattern.value})"
            )
            raise translate_error(exc, what, default=KafkaClientError) from exc
        except TimeoutError as exc:
            raise KafkaClientError(
                f"creating ACLs timed out after {config.request_timeout_ms} ms"
            ) from exc
    await_acls_shown(admin, bindings, config.request_timeout_ms)
    return wanted


def await_acls_shown(admin: Any, bindings: Iterable[AclBinding], timeout_ms: int) -> bool:
    """Wait until the brokers the confluent-kafka ``admin`` asks show every one of
    ``bindings`` (ALLOW or DENY), at most about ``timeout_ms``; True once they do. The
    controller accepts ACLs before the brokers apply them, so a client started as soon as
    Kafka's ``create_acls`` answered may still be authorized (or denied) by the ACLs before.
    Each round asks one broker per principal (librdkafka picks it), so on a cluster another
    broker may apply them a moment later still.

    False, with a warning naming an ACL not shown, when they are not shown in time or cannot be
    read back (an error Kafka does not deem retriable; reading them needs DESCRIBE on the
    cluster, which ALTER implies, and a broker refusing it answers with no ACLs). Errors worth
    retrying (a timed-out or lost request) are asked again until the time is up. They were
    created all the same."""
    missing = set(bindings)
    filters = [
        # None matches any name and host (confluent-kafka's stubs say str only).
        AclBindingFilter(
            KafkaResourceType.ANY,
            None,  # type: ignore[arg-type]
            ResourcePatternType.ANY,
            principal,
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        for principal in sorted({binding.principal for binding in missing})
    ]
    deadline = time.monotonic() + timeout_ms / 1000
    while missing:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        # Every principal asked at once, all answers awaited within what is left.
        asked = [
            admin.describe_acls(acl_filter, request_timeout=max(left, 0.001))
            for acl_filter in filters
        ]
        done, _ = futures_wait(asked, timeout=left)
        for answer in done:
            error = answer.exception()
            if error is None:
                missing.difference_update(answer.result())
                continue
            kafka_error = error.args[0] if error.args else None
            if not isinstance(kafka_error, KafkaError) or not (
                kafka_error.retriable() or kafka_error.code() in _ASK_AGAIN
            ):
                logger.warning(
                    "%d ACLs created, but they cannot be read back to see the brokers apply "
                    "them (%s): a client started now may be refused for a moment",
                    len(missing),
                    error,
                )
                return False
        if missing:
            time.sleep(min(_SHOWN_POLL_S, max(deadline - time.monotonic(), 0.0)))
    if not missing:
        return True
    logger.warning(
        "%d ACLs created, but the brokers did not show them within %d ms, such as %s (reading "
        "them needs DESCRIBE on the cluster): a client started now may be refused for a moment",
        len(missing),
        timeout_ms,
        next(iter(missing)),
    )
    return False
