"""Create the trust model's ACLs (:mod:`topics.acls`) through Kafka's Admin API."""

from __future__ import annotations

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

# None matches any name, principal and host (confluent-kafka's stubs say str only).
_EVERY_ACL: Final = AclBindingFilter(
    KafkaResourceType.ANY,
    None,  # type: ignore[arg-type]
    ResourcePatternType.ANY,
    None,  # type: ignore[arg-type]
    None,  # type: ignore[arg-type]
    AclOperation.ANY,
    AclPermissionType.ANY,
)
_SHOWN_POLL_S: Final = 0.05
"""How often :func:`create_acls` asks whether the broker shows the new ACLs, s."""


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
    broker answering shows them all, so that a client started right after is authorized (the
    controller accepts ACLs before the brokers apply them). The principal of ``config`` needs
    ALTER on the cluster. A refusal raises :class:`~bridge.errors.AuthorizationError` (or
    another :class:`~bridge.errors.KafkaClientError`) naming the first ACL that failed; ACLs
    created but not shown within ``request_timeout_ms`` raise
    :class:`~bridge.errors.KafkaClientError` naming one of them (:func:`await_acls_shown`)."""
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


def await_acls_shown(admin: Any, bindings: Iterable[AclBinding], timeout_ms: int) -> None:
    """Wait until the broker the confluent-kafka ``admin`` asks shows every one of
    ``bindings`` (ALLOW or DENY), at most ``timeout_ms``: the controller accepts ACLs before
    the brokers apply them, so a client started as soon as ``create_acls`` answered may be
    authorized (or denied) by the ACLs before. Raises :class:`KafkaClientError` naming one not
    shown in time."""
    deadline = time.monotonic() + timeout_ms / 1000
    missing = set(bindings)
    while True:
        left = max(deadline - time.monotonic(), 0.001)
        try:
            shown = admin.describe_acls(_EVERY_ACL, request_timeout=left).result(timeout=left)
        except (KafkaException, TimeoutError) as exc:
            what = "reading the ACLs back"
            raise translate_error(exc, what, default=KafkaClientError) from exc
        missing.difference_update(shown)
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise KafkaClientError(
                f"{len(missing)} ACLs created but not shown by the broker within {timeout_ms} "
                f"ms, such as {next(iter(missing))}"
            )
        time.sleep(_SHOWN_POLL_S)
