"""``bridge topics``, ``bridge send`` and ``bridge consume``: topics and the messages on them."""

from __future__ import annotations

from typing import BinaryIO

import click
from rich.table import Table

from bridge.cli.common import bootstrap_option, client_config, console
from bridge.cli.output import (
    NotFoundError,
    emit_json,
    json_option,
    message_json,
    require_broker,
    shown,
)
from bridge.client.producer import Producer
from bridge.client.reader import read_messages
from bridge.config import ClientConfig
from bridge.errors import BridgeError
from bridge.kafka.admin import TopicAdmin
from bridge.message import Message
from topics.catalog import TopicCatalog, TopicSpec
from topics.naming import to_kafka_topic


@click.group()
def topics() -> None:
    """List, create and map topics."""


@topics.command("list")
@bootstrap_option("Kafka to inspect.")
@click.option("--all", "show_all", is_flag=True, help="Include Kafka's internal topics.")
@json_option
@click.pass_context
def topics_list(
    ctx: click.Context, bootstrap_servers: str | None, show_all: bool, as_json: bool
) -> None:
    """List topics with their kind and RocketMQ name (--json: kafka_topic, partitions, kind,
    rocketmq_name)."""
    config = client_config(ctx, bootstrap_servers)
    catalog = TopicCatalog(namespace=config.namespace)
    found = TopicAdmin(config).list_topics(include_internal=show_all)
    rows = []
    for name in sorted(found):
        try:
            parsed = catalog.parse(name)
            kind, rmq = parsed.kind.value, parsed.rocketmq_name
        except BridgeError:
            kind, rmq = "unknown", ""
        rows.append((name, str(found[name]), kind, rmq))
    if as_json:
        for name, partitions, kind, rmq in rows:
            emit_json(
                {
                    "kafka_topic": name,
                    "partitions": int(partitions),
                    "kind": kind,
                    "rocketmq_name": rmq or None,
                }
            )
    elif console.is_terminal:
        table = Table("Kafka topic", "partitions", "kind", "RocketMQ name")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:  # scripts get one tab-separated line per topic
        for row in rows:
            click.echo("\t".join(row))


@topics.command("create")
@bootstrap_option("Kafka to provision.")
@click.option("--system", is_flag=True, help="Create every system topic of the catalog.")
@click.option(
    "--group", "groups", multiple=True, help="Create this consumer group's retry and DLQ topics."
)
@click.option("--topic", "names", multiple=True, help="Create this real topic (RocketMQ name).")
@click.option(
    "--partitions",
    # Kafka takes -1 for "the broker's default" and refuses 0 only once asked: neither is a
    # partition count an operator means.
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="For --topic.",
)
@click.pass_context
def topics_create(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    system: bool,
    groups: tuple[str, ...],
    names: tuple[str, ...],
    partitions: int,
) -> None:
    """Create topics idempotently (existing ones are left as they are, but for the partitions
    SCHEDULE and the timer topic lack for the partitions per level and tier, which are
    added). A pre-created system topic whose settings the guarantees cannot rely on is
    refused, and the error prints the fix."""
    config = client_config(ctx, bootstrap_servers)
    # The partition counts of the delay settings (BRIDGE_DELAY_PARTITIONS_PER_LEVEL, ...).
    catalog = config.catalog()
    specs: list[TopicSpec] = list(catalog.system_specs()) if system else []
    for group in groups:
        specs.extend(catalog.group_specs(group))
    specs.extend(TopicSpec(to_kafka_topic(n, config.namespace), partitions) for n in names)
    if not specs:
        raise click.UsageError("nothing to create: give --system, --group or --topic")
    # SCHEDULE and the timer topic get the partitions the delay settings add (existing ones
    # keep their levels and tiers).
    created = TopicAdmin(config).ensure_topics(specs, expand=True)
    for spec in specs:
        console.print(f"{'created' if spec.kafka_name in created else 'exists '} {spec.kafka_name}")


@topics.command("map")
@click.argument("names", nargs=-1, required=True)
@json_option
@click.pass_context
def topics_map(ctx: click.Context, names: tuple[str, ...], as_json: bool) -> None:
    """Show the Kafka topic name of RocketMQ topic names, and back (a name in the namespace,
    e.g. rmq.DLQ.my__group, is read back). A name with no mapping is an error on stderr with
    its reason; the exit status is then 1, after the other names."""
    namespace = ctx.obj.get("namespace") or ClientConfig.from_env().namespace
    catalog = TopicCatalog(namespace=namespace)
    failed = False
    for name in names:
        try:
            if name.startswith(namespace + "."):
                rmq = catalog.parse(name).rocketmq_name
                if as_json:
                    emit_json({"name": name, "kafka_topic": name, "rocketmq_name": rmq})
                else:
                    console.print(f"{name} <- {rmq}")
            else:
                kafka = to_kafka_topic(name, namespace)
                if as_json:
                    emit_json({"name": name, "kafka_topic": kafka, "rocketmq_name": name})
                else:
                    console.print(f"{name} -> {kafka}")
        except BridgeError as exc:
            failed = True
            click.echo(f"Error: {type(exc).__name__}: {exc}", err=True)
    if failed:
        raise click.exceptions.Exit(1)


def _parse_properties(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--property")
        out[name] = value
    return out


def _body(body: str | None, body_file: BinaryIO | None) -> bytes:
    """The message body: BODY as UTF-8, or every byte of ``--file`` (``-``: standard input)."""
    if (body is None) == (body_file is None):
        raise click.UsageError("give the body as BODY or with --file (- for standard input)")
    return body_file.read() if body_file is not None else (body or "").encode()


def _delay(message: Message, level: int | None, delay_ms: int | None, at_ms: int | None) -> None:
    chosen = [name for name, v in (("--delay-level", level), ("--delay-ms", delay_ms),
                                   ("--deliver-at-ms", at_ms)) if v is not None]  # fmt: skip
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)}: choose one way to delay a message")
    if level is not None:
        message.set_delay_time_level(level)
    elif delay_ms is not None:
        message.set_delay_time_ms(delay_ms)
    elif at_ms is not None:
        message.set_deliver_time_ms(at_ms)


@click.command()
@bootstrap_option("Kafka to send to.")
@click.argument("topic")
@click.argument("body", required=False)
@click.option(
    "-f",
    "--file",
    "body_file",
    type=click.File("rb"),
    default=None,
    help="Send the bytes of this file as the body (- for standard input) instead of BODY.",
)
@click.option("--keys", default=None, help="Space-separated business keys.")
@click.option("--tags", default=None, help="The message tag.")
@click.option("-p", "--property", "properties", multiple=True, help="NAME=VALUE user property.")
@click.option(
    "--delay-level",
    type=click.IntRange(min=1),
    default=None,
    help="Deliver after this delay level (RocketMQ 4; level 1 is 1 s by default).",
)
@click.option(
    "--delay-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Deliver this many milliseconds after sending (a timer, RocketMQ 5).",
)
@click.option(
    "--deliver-at-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Deliver at this time, epoch milliseconds (a timer, RocketMQ 5).",
)
@click.option("--group", default="bridge-cli", show_default=True, help="Producer group.")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Send the message N times.",
)
@json_option
@click.pass_context
def send(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    topic: str,
    body: str | None,
    body_file: BinaryIO | None,
    keys: str | None,
    tags: str | None,
    properties: tuple[str, ...],
    delay_level: int | None,
    delay_ms: int | None,
    deliver_at_ms: int | None,
    group: str,
    count: int,
    as_json: bool,
) -> None:
    """Send BODY (as UTF-8; or any bytes of --file) to TOPIC and print where it was stored
    (--json: status, msg_id, topic, queue_id, offset). At most one of --delay-level,
    --delay-ms and --deliver-at-ms delays it. Kafka not reachable within the request timeout
    (BRIDGE_REQUEST_TIMEOUT_MS): BrokerUnreachableError, exit status 3, as for every
    command."""
    config = client_config(ctx, bootstrap_servers)
    payload = _body(body, body_file)
    user_properties = _parse_properties(properties)
    # Before sending: an unreachable broker is told apart from a send that timed out.
    require_broker(config)
    with Producer(group, config=config) as producer:
        for _ in range(count):
            msg = Message(topic, payload, keys=keys, tags=tags, properties=user_properties)
            _delay(msg, delay_level, delay_ms, deliver_at_ms)
            result = producer.send_sync(msg)
            if as_json:
                emit_json(
                    {
                        "status": result.status.value,
                        "msg_id": result.msg_id,
                        "topic": result.topic,
                        "queue_id": result.queue_id,
                        "offset": result.offset,
                    }
                )
                continue
            console.print(
                f"{result.status.value} {result.msg_id} "
                f"{result.topic}[{result.queue_id}]@{result.offset}"
            )


@click.command()
@bootstrap_option("Kafka to read from.")
@click.argument("topics_", metavar="TOPIC...", nargs=-1, required=True)
@click.option(
    "--group", default=None, help="Consumer group (default: a throw-away one, from the start)."
)
@click.option("--count", type=click.IntRange(min=1), default=None, help="Stop after N messages.")
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=5000,
    show_default=True,
    help="Stop after this long without a message.",
)
@json_option
@click.pass_context
def consume(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    bootstrap_servers: str | None,
    topics_: tuple[str, ...],
    group: str | None,
    count: int | None,
    timeout_ms: int,
    as_json: bool,
) -> None:
    """Print committed messages of TOPIC... (RocketMQ names, e.g. %DLQ%my_group); --json: one
    object per message with every property (binary ones in base64) and the body. A TOPIC
    that does not exist: exit status 4, naming it. Kafka not reachable within the request
    timeout (BRIDGE_REQUEST_TIMEOUT_MS): BrokerUnreachableError, exit status 3."""
    config = client_config(ctx, bootstrap_servers)
    existing = TopicAdmin(config).list_topics(include_internal=True)  # fails at once if down
    missing = [
        f"{name} (Kafka topic {kafka})" if kafka != name else name
        for name in topics_
        if (kafka := to_kafka_topic(name, config.namespace)) not in existing
    ]
    if missing:
        raise NotFoundError(f"no such topic: {', '.join(missing)}")
    for msg in read_messages(
        config,
        list(topics_),
        group=group,
        max_messages=count,
        timeout_ms=timeout_ms,
        commit=group is not None,
    ):
        if as_json:
            emit_json(message_json(msg))
            continue
        console.print(
            f"{msg.topic}[{msg.queue_id}]@{msg.queue_offset} {shown(msg.msg_id)} "
            f"tags={shown(msg.tags) if msg.tags is not None else None} "
            f"keys={msg.keys} props={msg.user_properties} body={msg.body!r}"
        )
