"""Create the trust model's ACLs (:mod:`topics.acls`) through Kafka's Admin API."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as KafkaResourceType

from bridge.config import ClientConfig
from bridge.errors import KafkaClientError
from bridge.kafka.clients import new_admin, translate_error
from topics.acls import Acl, ResourceType


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
    """Create ``acls`` (creating an existing ACL again changes nothing); return them. The
    principal of ``config`` needs ALTER on the cluster. A refusal raises
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
    return wanted
