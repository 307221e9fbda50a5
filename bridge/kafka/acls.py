"""Create the trust model's ACLs (:mod:`topics.acls`) through Kafka's Admin API."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Final

from confluent_kafka import KafkaException
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
    broker answering shows them all (:func:`await_acls_shown`, at most ``request_timeout_ms``
    more), so that a client started right after is not refused by a broker that has not
    applied them yet. The principal of ``config`` needs ALTER on the cluster. A refusal raises
    :class:`~bridge.errors.AuthorizationError` (or another
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
    """Wait until the broker the confluent-kafka ``admin`` asks shows every one of
    ``bindings`` (ALLOW or DENY), at most ``timeout_ms``; True once it does. The controller
    accepts ACLs before the brokers apply them, so a client started as soon as Kafka's
    ``create_acls`` answered may still be authorized (or denied) by the ACLs before; on a
    cluster, the brokers other than the one answering may apply them a moment later still.

    False, with a warning naming an ACL not shown, when they are not shown in time or cannot be
    read back: reading them needs DESCRIBE on the cluster (which ALTER implies), and a broker
    that refuses it answers with no ACLs. They were created all the same."""
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
        try:
            for acl_filter in filters:
                shown = admin.describe_acls(acl_filter, request_timeout=left)
                missing.difference_update(shown.result(timeout=left))
        except TimeoutError:
            break
        except KafkaException as exc:
            logger.warning(
                "%d ACLs created, but they cannot be read back to see the broker apply them "
                "(%s): a client started now may be refused for a moment",
                len(missing),
                exc,
            )
            return False
        if missing:
            time.sleep(min(_SHOWN_POLL_S, max(deadline - time.monotonic(), 0.0)))
    if not missing:
        return True
    logger.warning(
        "%d ACLs created, but the broker did not show them within %d ms, such as %s (reading "
        "them needs DESCRIBE on the cluster): a client started now may be refused for a moment",
        len(missing),
        timeout_ms,
        next(iter(missing)),
    )
    return False
