"""``bridge acls``: the Kafka ACLs each part of the bridge needs (the trust model's table).

``bridge acls print`` shows them for a namespace, its real topics and a principal per role;
``bridge acls apply`` creates them through the Admin API. The rules are
:func:`topics.acls.acls_for`; docs/security.md has the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from bridge.cli.common import bootstrap_option, client_config, console
from bridge.cli.output import emit_json, json_option
from bridge.config import ClientConfig
from bridge.errors import InvalidArgumentError
from bridge.kafka.acls import create_acls
from topics.acls import Acl, Deployment, acls_for

F = TypeVar("F", bound=Callable[..., Any])


def _group_principals(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        group, sep, who = pair.partition("=")
        if not sep or not group or not who:
            raise click.BadParameter(f"expected GROUP=PRINCIPAL, got {pair!r}", param_hint=option)
        out[group] = who
    return out


def _deployment_options(func: F) -> F:
    options = [
        click.option(
            "--topic",
            "topics_",
            multiple=True,
            help="A real topic the principals use (repeatable): NAME, a prefix NAME*, or '*'.",
        ),
        click.option("--producer", default=None, help="Principal of the plain producers."),
        click.option(
            "--transactional",
            multiple=True,
            metavar="GROUP=PRINCIPAL",
            help="A transactional producer group and its principal (repeatable).",
        ),
        click.option("--coordinator", default=None, help="Principal of the coordinators."),
        click.option(
            "--consumer",
            multiple=True,
            metavar="GROUP=PRINCIPAL",
            help="A consumer group and its principal (repeatable).",
        ),
        click.option("--spark", default=None, help="Principal of the Spark jobs."),
        click.option("--operator", default=None, help="Principal of the operators."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _deployment(ctx: click.Context, params: dict[str, Any]) -> Deployment:
    namespace = (ctx.obj or {}).get("namespace") or ClientConfig.from_env().namespace
    deployment = Deployment(
        namespace=namespace,
        topics=tuple(params["topics_"]),
        producer=params["producer"],
        transactional_producers=_group_principals(params["transactional"], "--transactional"),
        coordinator=params["coordinator"],
        consumers=_group_principals(params["consumer"], "--consumer"),
        spark=params["spark"],
        operator=params["operator"],
    )
    if not any(
        (
            deployment.producer,
            deployment.transactional_producers,
            deployment.coordinator,
            deployment.consumers,
            deployment.spark,
            deployment.operator,
        )
    ):
        raise InvalidArgumentError(
            "no principal given: name at least one of --producer, --transactional, "
            "--coordinator, --consumer, --spark, --operator"
        )
    return deployment


def _show(acls: list[Acl], as_json: bool, verb: str) -> None:
    for acl in acls:
        if as_json:
            emit_json(acl.as_dict())
        else:
            console.print(
                f"{acl.principal:<24} {acl.role:<32} {acl.resource_type.value:<16} "
                f"{acl.pattern.value:<8} {acl.operation.value:<16} {acl.name}",
                markup=False,
            )
    if not as_json:
        console.print(f"{len(acls)} ACLs {verb}")


@click.group()
def acls() -> None:
    """Print or apply the Kafka ACLs the bridge's principals need."""


@acls.command("print")
@_deployment_options
@json_option
@click.pass_context
def acls_print(ctx: click.Context, /, as_json: bool, **params: Any) -> None:
    """The ACLs (ALLOW, any host) each principal needs for the namespace, least privilege:
    principal, role, resource type, pattern type, operation, resource name."""
    _show(acls_for(_deployment(ctx, params)), as_json, "needed")


@acls.command("apply")
@bootstrap_option("Kafka to create the ACLs on (as a principal allowed to: ALTER on the cluster).")
@_deployment_options
@json_option
@click.pass_context
def acls_apply(
    ctx: click.Context, /, bootstrap_servers: str | None, as_json: bool, **params: Any
) -> None:
    """Create the ACLs ``print`` shows through Kafka's Admin API (existing ones are left as
    they are)."""
    wanted = acls_for(_deployment(ctx, params))
    created = create_acls(client_config(ctx, bootstrap_servers), wanted)
    _show(created, as_json, "applied")
