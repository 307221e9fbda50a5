"""``bridge dlq``: consumer groups' dead-letter queues, their letters, and their replay to the
origin topic (or the group's retry topic)."""

from __future__ import annotations

from typing import Any

import click

from bridge.cli.common import bootstrap_option, console
from bridge.cli.operators.common import read_config, target_problem
from bridge.cli.output import NotFoundError, emit_json, json_option, message_json, progress, shown
from bridge.config import ClientConfig
from bridge.consumer.admin import (
    DeadLetterReplayError,
    ReplayFailure,
    dlq_groups,
    dlq_summary,
    prepare_replay,
    read_dead_letters,
    replay_dead_letters,
    write_back,
)
from bridge.consumer.send_back import ReplayTarget
from bridge.errors import ReplayTargetError
from bridge.message import MessageConst, MessageExt, property_text


@click.group()
def dlq() -> None:
    """Inspect consumer groups' dead-letter queues and replay dead letters."""


@dlq.command("status")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", default=None, help="One consumer group (default: every group).")
@json_option
@click.pass_context
def dlq_status(
    ctx: click.Context, bootstrap_servers: str | None, group: str | None, as_json: bool
) -> None:
    """Dead letters per group: count, origin topics and reconsume depth (exit status 4 for a
    --group without a dead-letter queue)."""
    config = read_config(ctx, bootstrap_servers)
    if group is not None:
        _require_dlq(config, group)
    summaries = dlq_summary(config, group)
    for s in summaries:
        if as_json:
            emit_json(s)
            continue
        origins = ", ".join(f"{shown(t)}={n}" for t, n in sorted(s.origin_topics.items()))
        depth = ", ".join(f"{d}x={n}" for d, n in s.reconsume_depth.items())
        console.print(
            f"{s.group}: {s.count} dead letters; from {origins or '-'}; depth {depth or '-'}"
        )
    if not summaries and not as_json:
        console.print("no dead-letter queues")


def _require_dlq(config: ClientConfig, group: str) -> None:
    """Exit status 4 unless ``group`` has a dead-letter topic."""
    if group not in dlq_groups(config):
        raise NotFoundError(f"consumer group {group!r} has no dead-letter queue")


def failure_fields(msg: MessageExt) -> dict[str, str | None]:
    """The dead-letter metadata of ``msg`` (``docs/tracing.md``), as text."""
    out: dict[str, str | None] = {}
    for name in (
        MessageConst.CONSUMER_GROUP,
        MessageConst.CONSUME_FAILURE,
        MessageConst.CONSUME_EXCEPTION_CLASS,
        MessageConst.CONSUME_EXCEPTION_MESSAGE,
        MessageConst.ORIGIN_KAFKA_TOPIC,
        MessageConst.ORIGIN_QUEUE_ID,
        MessageConst.ORIGIN_QUEUE_OFFSET,
        MessageConst.ORIGIN_TIMESTAMP,
        MessageConst.TRACE_PARENT,
    ):
        value = msg.properties.get(name)
        out[name] = None if value is None else property_text(value)
    return out


@dlq.command("list")
@bootstrap_option("Kafka to inspect.")
@click.option("--group", required=True, help="The consumer group.")
@json_option
@click.pass_context
def dlq_list(ctx: click.Context, bootstrap_servers: str | None, group: str, as_json: bool) -> None:
    """Every dead letter of a group: id, origin topic, failures, keys, tags, body size, how
    the listener failed it (exception class and message, or the status it returned) and
    where it was first read (topic[partition]@offset). Exit status 4 for a group without a
    dead-letter queue."""
    config = read_config(ctx, bootstrap_servers)
    _require_dlq(config, group)
    letters = read_dead_letters(config, group)
    for m in letters:
        failure = failure_fields(m)
        if as_json:
            emit_json(
                {
                    "msg_id": m.msg_id,
                    "origin_topic": m.get_property(MessageConst.RETRY_TOPIC),
                    "origin_message_id": m.get_property(MessageConst.ORIGIN_MESSAGE_ID),
                    "failures": m.reconsume_times,
                    "failure": failure,
                    "message": message_json(m),
                }
            )
            continue
        why = failure[MessageConst.CONSUME_FAILURE] or "-"
        if failure[MessageConst.CONSUME_EXCEPTION_CLASS]:
            why = (
                f"{failure[MessageConst.CONSUME_EXCEPTION_CLASS]}: "
                f"{failure[MessageConst.CONSUME_EXCEPTION_MESSAGE] or ''}"
            )
        where = (
            f"{failure[MessageConst.ORIGIN_KAFKA_TOPIC]}[{failure[MessageConst.ORIGIN_QUEUE_ID]}]"
            f"@{failure[MessageConst.ORIGIN_QUEUE_OFFSET]}"
            if failure[MessageConst.ORIGIN_KAFKA_TOPIC]
            else "-"
        )
        console.print(
            f"{shown(m.msg_id)} from={shown(m.get_property(MessageConst.RETRY_TOPIC))} "
            f"failures={m.reconsume_times} keys={shown(' '.join(m.keys))} "
            f"tags={shown(m.tags or '')} "
            f"body={len(m.body)} bytes first-read={shown(where)} "
            f"at={shown(failure[MessageConst.ORIGIN_TIMESTAMP] or '-')} failed-with={why!r}",
            markup=False,
        )
    if not as_json:
        console.print(f"{len(letters)} dead letters")


def _ids(letters: list[MessageExt]) -> set[str]:
    """The ids ``--id`` chooses ``letters`` by: each one's id and its origin message id."""
    out = {m.msg_id for m in letters}
    out.update(o for m in letters if (o := m.get_property(MessageConst.ORIGIN_MESSAGE_ID)))
    return out


def require_replay_targets(
    config: ClientConfig, group: str, letters: list[MessageExt], target: ReplayTarget
) -> None:
    """:class:`ReplayTargetError` naming each topic that cannot take the letters bound for it
    (e.g. an origin topic that is one of Kafka's internal topics, which a send only calls an
    "Invalid topic"), before any letter is written. A letter whose record cannot be built (no
    topic at all) is left to :func:`write_back`, which reports it and replays the others."""
    bound: dict[str, list[str]] = {}
    for m, record in prepare_replay(letters, group, target, namespace=config.namespace)[0]:
        bound.setdefault(record.kafka_topic, []).append(m.msg_id)
    problems = [
        f"{problem} (dead letters {', '.join(ids)})"
        for topic, ids in bound.items()
        if (problem := target_problem(config, topic, -1)) is not None
    ]
    if problems:
        raise ReplayTargetError(
            f"replaying dead letters of {group}: {'; '.join(problems)}; nothing replayed"
        )


@dlq.command("replay")
@bootstrap_option("Kafka to write to.")
@click.option("--group", required=True, help="The consumer group.")
@click.option("--key", "keys", multiple=True, help="Only letters with this key (repeatable).")
@click.option("--tag", "tags", multiple=True, help="Only letters with this tag (repeatable).")
@click.option("--id", "msg_ids", multiple=True, help="Only this message id (repeatable).")
@click.option(
    "--to",
    "target",
    type=click.Choice([t.value for t in ReplayTarget]),
    default=ReplayTarget.ORIGIN.value,
    show_default=True,
    help="origin: the topic each was first sent to (every group sees it); "
    "retry: the group's retry topic (only this group does).",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be replayed.")
@json_option
@click.pass_context
def dlq_replay(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    group: str,
    keys: tuple[str, ...],
    tags: tuple[str, ...],
    msg_ids: tuple[str, ...],
    target: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Write dead letters back (all, or those the filters choose), with a progress bar on
    stderr when it is a terminal. Replaying twice writes twice. Exit status 4 for a group
    without a dead-letter queue, and for an --id that none of its dead letters has; a topic
    that cannot take the letters bound for it (e.g. a Kafka internal topic) is named before
    anything is written (ReplayTargetError). Either way nothing is replayed. A letter that
    cannot be replayed (its origin is no topic name, say, as another Kafka client may write)
    does not stop the others: each is listed with why ("error" with --json), it stays in the
    DLQ, and the exit status is 1, naming them (DeadLetterReplayError; --dry-run lists them
    too, and exits 1)."""
    config = read_config(ctx, bootstrap_servers)
    _require_dlq(config, group)
    chosen = ReplayTarget(target)
    letters = replay_dead_letters(
        config, group, keys=keys, tags=tags, msg_ids=msg_ids, target=chosen, dry_run=True
    )
    if set(msg_ids) - _ids(letters):
        # Not chosen: filtered out by --key/--tag, or not a dead letter of the group at all.
        missing = set(msg_ids) - _ids(
            replay_dead_letters(config, group, msg_ids=msg_ids, dry_run=True)
        )
        if missing:
            raise NotFoundError(
                f"consumer group {group!r} has no dead letter with id "
                f"{', '.join(sorted(missing))}; nothing replayed"
            )
    failed: list[ReplayFailure] = []
    error: DeadLetterReplayError | None = None
    if dry_run:
        failed = prepare_replay(letters, group, chosen, namespace=config.namespace)[1]
    elif letters:
        require_replay_targets(config, group, letters, chosen)
        with progress(f"replaying {len(letters)} dead letters", len(letters)) as bar:
            try:
                write_back(config, group, letters, chosen, on_progress=bar.advance)
            except DeadLetterReplayError as exc:
                failed, error = exc.failed, exc
    # Keyed by the letter itself: one message id may be dead-lettered more than once.
    why = {id(f.letter): f.reason for f in failed}
    for m in letters:
        reason = why.get(id(m))
        origin = m.get_property(MessageConst.RETRY_TOPIC)
        if as_json:
            line: dict[str, Any] = {
                "msg_id": m.msg_id,
                "origin_topic": origin,
                "target": chosen.value,
                "replayed": not dry_run and reason is None,
            }
            if reason is not None:
                line["error"] = reason
            emit_json(line)
        elif reason is None:
            console.print(f"{shown(m.msg_id)} -> {shown(origin)}", markup=False)
        else:
            not_done = "cannot be replayed" if dry_run else "NOT replayed"
            console.print(
                f"{shown(m.msg_id)} -> {shown(origin)} {not_done}: {shown(reason)}", markup=False
            )
    if not as_json:
        done = len(letters) - len(failed)
        summary = f"would replay {done}" if dry_run else f"replayed {done}"
        if failed:
            summary += f", {'cannot replay' if dry_run else 'not replayed'} {len(failed)}"
        console.print(summary)
    if error is None and failed:
        replayable = [m for m in letters if id(m) not in why]
        error = DeadLetterReplayError(group, replayable, failed, dry_run=True)
    if error is not None:
        raise error
