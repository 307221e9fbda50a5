"""``bridge transactions``: undecided and parked transactions; replay or drop a parked one."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from bridge.cli.admin.transactions import list_undecided, read_parked, resolve_parked
from bridge.cli.common import bootstrap_option, console
from bridge.cli.operators.common import read_config
from bridge.cli.output import NotFoundError, emit_json, json_option, message_json, shown
from bridge.config import ClientConfig
from bridge.coordinator.coordinator import CoordinatorConfig, check_policy
from bridge.message import MessageConst, MessageExt
from bridge.transaction.model import OpAction


@click.group()
def transactions() -> None:
    """Inspect undecided and parked transactions; replay or drop parked ones."""


@transactions.command("list")
@bootstrap_option("Kafka to inspect.")
@json_option
@click.pass_context
def transactions_list(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """Undecided transactions, oldest first: age, check count, next check, group, real topic.

    The next check is the checker's own schedule, worked out from the half message's copies
    and the last check request in its group's check topic with the coordinators' check
    settings (BRIDGE_TRANSACTION_TIMEOUT_MS, BRIDGE_CHECK_INTERVAL_MS, as the coordinator
    reads them); "due" when it is past."""
    config = read_config(ctx, bootstrap_servers)
    policy = check_policy(CoordinatorConfig.from_env())
    undecided = list_undecided(config, policy=policy)
    now = time.time_ns() // 1_000_000
    for t in undecided:
        if as_json:
            emit_json(t)
            continue
        console.print(
            f"{shown(t.transaction_id)} group={shown(t.producer_group)} "
            f"topic={shown(t.real_topic)} "
            f"age={t.age_ms / 1000:.1f}s checks={t.check_times} "
            f"next_check={_next_check(t.next_check_ms, now)} "
            f"half={t.half_partition}@{t.half_offset}"
        )
    if not as_json:
        console.print(f"{len(undecided)} undecided")


def _next_check(next_check_ms: int | None, now_ms: int) -> str:
    """``in 12.3s``, ``due`` when past, ``?`` when unknown."""
    if next_check_ms is None:
        return "?"
    if next_check_ms <= now_ms:
        return "due"
    return f"in {(next_check_ms - now_ms) / 1000:.1f}s"


@transactions.command("show")
@bootstrap_option("Kafka to inspect.")
@click.argument("transaction_id")
@json_option
@click.pass_context
def transactions_show(
    ctx: click.Context, bootstrap_servers: str | None, transaction_id: str, as_json: bool
) -> None:
    """One transaction: undecided (with its checks and next check, as in list) or parked;
    exit status 4 when it is neither (decided, or never seen). --json: one object with
    ``state``."""
    config = read_config(ctx, bootstrap_servers)
    policy = check_policy(CoordinatorConfig.from_env())
    for t in list_undecided(config, policy=policy):
        if t.transaction_id == transaction_id:
            if as_json:
                emit_json({"state": "undecided", **dataclasses.asdict(t)})
                return
            console.print(
                f"undecided: group={shown(t.producer_group)} topic={shown(t.real_topic)} "
                f"age={t.age_ms / 1000:.1f}s checks={t.check_times} "
                f"next_check={_next_check(t.next_check_ms, time.time_ns() // 1_000_000)}"
            )
            return
    for msg in read_parked(config, include_resolved=True):
        if (msg.transaction_id or msg.msg_id) == transaction_id:
            if as_json:
                emit_json({"state": "parked", "transaction_id": transaction_id, **_parked(msg)})
                return
            console.print(
                f"parked at check-max offset {msg.queue_offset} after "
                f"{msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} checks"
                f"{_delivery_failure(msg)}: {msg!r}",
                markup=False,
            )
            return
    raise NotFoundError(
        f"transaction {transaction_id}: not undecided nor parked (decided, or not found)"
    )


def _delivery_failure(msg: MessageExt) -> str:
    """`` delivery failed N times: reason`` for a message parked because its real topic refused
    it, else empty."""
    error = msg.get_property(MessageConst.DELIVERY_ERROR)
    if not error:
        return ""
    attempts = msg.get_property(MessageConst.DELIVERY_ATTEMPTS) or "?"
    return f" delivery failed {shown(attempts)} times: {shown(error)}"


def _parked(msg: MessageExt) -> dict[str, Any]:
    """A parked message as JSON: the message, its producer group, real topic, checks and
    delivery failures."""
    return {
        "producer_group": msg.get_property(MessageConst.PRODUCER_GROUP),
        "real_topic": msg.get_property(MessageConst.REAL_TOPIC),
        "check_times": msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES),
        "delivery_attempts": msg.get_property(MessageConst.DELIVERY_ATTEMPTS),
        "delivery_error": msg.get_property(MessageConst.DELIVERY_ERROR),
        "message": message_json(msg),
    }


@transactions.command("parked")
@bootstrap_option("Kafka to inspect.")
@json_option
@click.pass_context
def transactions_parked(ctx: click.Context, bootstrap_servers: str | None, as_json: bool) -> None:
    """Messages parked in the check-max topic and not yet replayed or dropped, with why
    their delivery failed if it did."""
    config = read_config(ctx, bootstrap_servers)
    parked = read_parked(config)
    for msg in parked:
        if as_json:
            emit_json({"msg_id": msg.msg_id, **_parked(msg)})
            continue
        console.print(
            f"{shown(msg.msg_id)} group={shown(msg.get_property(MessageConst.PRODUCER_GROUP))} "
            f"topic={shown(msg.get_property(MessageConst.REAL_TOPIC))} "
            f"checks={msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} "
            f"body={len(msg.body)} bytes" + _delivery_failure(msg),
            markup=False,
        )
    if not as_json:
        console.print(f"{len(parked)} parked")


def _require_parked(config: ClientConfig, msg_id: str) -> None:
    """Exit status 4 unless a parked, unresolved message has id ``msg_id``. Asked before
    :func:`resolve_parked`, whose :class:`~bridge.errors.InvalidArgumentError` for a missing
    message cannot be told from a refused setting."""
    if not any(m.msg_id == msg_id for m in read_parked(config)):
        raise NotFoundError(
            f"no parked, unresolved message with id {msg_id!r} "
            "(replayed or dropped already, or never parked)"
        )


@transactions.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_replay(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Commit a parked message: deliver it to its real topic, once. Exit status 4 when no
    parked, unresolved message has MSG_ID."""
    config = read_config(ctx, bootstrap_servers)
    _require_parked(config, msg_id)
    msg = resolve_parked(config, msg_id, OpAction.COMMIT)
    console.print(
        f"replayed {shown(msg.msg_id)} to {shown(msg.get_property(MessageConst.REAL_TOPIC))}"
    )


@transactions.command("drop")
@bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_drop(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Roll back a parked message for good. Exit status 4 when no parked, unresolved message
    has MSG_ID."""
    config = read_config(ctx, bootstrap_servers)
    _require_parked(config, msg_id)
    msg = resolve_parked(config, msg_id, OpAction.ROLLBACK)
    console.print(f"dropped {shown(msg.msg_id)}")
