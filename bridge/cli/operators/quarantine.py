"""``bridge quarantine``: the quarantined records, and the replay of a quarantined delayed
message to its real topic (the replay module's own code reads and decodes it)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import click

from bridge.cli.common import bootstrap_option, console
from bridge.cli.operators.common import read_config, target_problem
from bridge.cli.output import NotFoundError, emit_json, json_option, shown
from bridge.codec import PreparedRecord
from bridge.config import ClientConfig
from bridge.errors import ReplayTargetError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.quarantine import (
    ReplayedMessage,
    read_quarantine,
    read_quarantined,
    replay_quarantined,
)
from topics.catalog import SystemTopic, TopicCatalog


@click.group("quarantine", invoke_without_command=True)
@bootstrap_option("Kafka to inspect.")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Show at most N records.")
@json_option
@click.pass_context
def quarantine_list(
    ctx: click.Context, bootstrap_servers: str | None, count: int | None, as_json: bool
) -> None:
    """Print the quarantined records: origin, reason and size (``replay OFFSET`` re-drives
    one). They are undecodable records, and delayed messages their topic refused
    delivery_attempts times; a record whose full copy did not fit is kept without its value
    and headers, the reason giving their size."""
    if ctx.invoked_subcommand is not None:
        ctx.ensure_object(dict)["quarantine_bootstrap"] = bootstrap_servers
        return
    config = read_config(ctx, bootstrap_servers)
    listed = 0
    for kept in read_quarantine(config, max_records=count):
        listed += 1
        if as_json:
            emit_json(_quarantined(kept))
            continue
        if kept.omitted_bytes:  # too large to keep whole: kept without its value
            size = f"{kept.omitted_bytes} bytes, value not kept"
        else:
            size = f"{len(kept.value) if kept.value is not None else 0} bytes"
        console.print(
            f"@{kept.offset} from {shown(kept.source_topic)}[{kept.source_partition}]@"
            f"{kept.source_offset} by {shown(kept.quarantined_by)} ({size}): "
            f"{shown(kept.reason)}",
            markup=False,
        )
    if not listed and not as_json:
        console.print("no quarantined records")


def _quarantined(kept: Any) -> dict[str, Any]:
    """A quarantined record as JSON (value and key in base64, binary headers too)."""
    out = dataclasses.asdict(kept)
    for name in ("value", "key"):
        raw = out.pop(name)
        out[f"{name}_base64"] = None if raw is None else base64.b64encode(raw).decode("ascii")
    headers = out.pop("headers")
    out["headers"] = {k: v for k, v in headers.items() if isinstance(v, str)}
    out["binary_headers"] = {
        k: base64.b64encode(v).decode("ascii") for k, v in headers.items() if isinstance(v, bytes)
    }
    return out


def _quarantined_record(config: ClientConfig, offset: int) -> Any:
    """The QUARANTINE record at ``offset``; :class:`NotFoundError` (exit status 4) when there
    is none (past the end, or the offset of a transaction's commit marker)."""
    topic = TopicCatalog(namespace=config.namespace).topic(SystemTopic.QUARANTINE)
    if topic not in TopicAdmin(config).list_topics():  # a reader would wait for it in vain
        raise NotFoundError(
            f"no quarantined record at offset {offset}: {topic} does not exist (nothing was "
            f"quarantined in namespace {config.namespace})"
        )
    record = read_quarantined(config, offset, timeout_ms=config.request_timeout_ms)
    if record is None:
        raise NotFoundError(f"no quarantined record at offset {offset} of {topic}")
    return record


def replay_quarantined_at(config: ClientConfig, offset: int) -> ReplayedMessage:
    """Deliver the delayed message quarantined at ``offset`` to its real topic, once (``bridge
    quarantine replay`` and the console's Quarantine page): :class:`NotFoundError` when no
    quarantined record is there, :class:`ReplayTargetError` naming a real topic that cannot
    take it before anything is written (the record stays quarantined)."""
    record = _quarantined_record(config, offset)

    def refuse_target(real: PreparedRecord) -> None:
        problem = target_problem(config, real.kafka_topic, real.partition)
        if problem is not None:
            raise ReplayTargetError(
                f"replaying QUARANTINE offset {offset}: {problem}; replay refuses it, "
                "it stays quarantined"
            )

    return replay_quarantined(config, offset, record=record, check=refuse_target)


@quarantine_list.command("replay")
@bootstrap_option("Kafka to write to.")
@click.argument("offset", type=click.IntRange(min=0))
@click.pass_context
def quarantine_replay(ctx: click.Context, bootstrap_servers: str | None, offset: int) -> None:
    """Deliver the delayed message quarantined at OFFSET to its real topic, exactly once
    (after the cause, e.g. a missing topic or an ACL, was fixed). Exit status 4 when OFFSET
    holds no quarantined record (or the namespace has no QUARANTINE topic); a real topic that
    cannot take it (a Kafka internal topic, a partition it does not have) is named before
    anything is written (ReplayTargetError), and the record stays quarantined."""
    given = bootstrap_servers or (ctx.obj or {}).get("quarantine_bootstrap")
    done = replay_quarantined_at(read_config(ctx, given), offset)
    console.print(
        f"replayed {shown(done.msg_id)} from quarantine offset {offset} to "
        f"{done.topic}[{done.partition}]@{done.offset}",
        markup=False,
    )
