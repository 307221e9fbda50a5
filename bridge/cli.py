"""The ``bridge`` command line: bring the stack up, manage topics, send and consume.

Every option that has an environment variable says so in ``--help``; they are the same names
``ClientConfig.from_env`` and ``CoordinatorConfig.from_env`` read.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from bridge.client.producer import Producer
from bridge.client.reader import read_message_at, read_messages
from bridge.config import ClientConfig
from bridge.consumer.admin import dlq_summary, read_dead_letters, replay_dead_letters
from bridge.consumer.send_back import ReplayTarget
from bridge.coordinator import Coordinator, CoordinatorConfig
from bridge.coordinator.health import coordinator_health
from bridge.delay.admin import delay_status
from bridge.errors import BridgeError
from bridge.kafka.admin import TopicAdmin
from bridge.kafka.quarantine import read_quarantine, replay_quarantined
from bridge.message import Message, MessageConst, MessageExt
from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from bridge.runtime.jars import ARTIFACT_SETS, cache_dir, ensure_jars
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig
from bridge.transaction.admin import list_undecided, read_parked, resolve_parked
from bridge.transaction.model import OpAction
from topics.catalog import TopicCatalog, TopicSpec
from topics.naming import to_kafka_topic

console = Console(highlight=False, soft_wrap=True)
logger = logging.getLogger("bridge.cli")

F = TypeVar("F", bound=Callable[..., Any])

SELF_CHECK_TOPIC = "bridge-self-check"
DEFAULT_LOCAL_PORT = 9092


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"
    )
    if verbose == 0:
        # librdkafka logs every retriable hiccup (a coordinator still loading, each refused
        # connection while a broker is down); a failed command says why in its one error line,
        # and -v shows these logs.
        logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.CRITICAL)


def _client_config(ctx: click.Context, bootstrap_servers: str | None = None) -> ClientConfig:
    base = ClientConfig.from_env()
    return base.replace(
        bootstrap_servers=bootstrap_servers, namespace=ctx.obj.get("namespace") or None
    )


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while the block runs."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class _BridgeGroup(click.Group):
    """Turns the project's errors into one ``Error: <type>: <message>`` line on stderr and exit
    status 1 (the type is the documented error class, e.g. ``BrokerUnreachableError``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BridgeError as exc:
            message = " ".join(str(exc).split("\n")) or type(exc).__name__
            raise click.ClickException(f"{type(exc).__name__}: {message}") from exc


@click.group(cls=_BridgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--namespace",
    envvar="BRIDGE_NAMESPACE",
    default=None,
    help="Prefix of system, retry and DLQ topics [env BRIDGE_NAMESPACE; default rmq].",
)
@click.option(
    "-v", "--verbose", count=True, help="-v for info logs (and the Kafka client's), -vv for debug."
)
@click.pass_context
def cli(ctx: click.Context, namespace: str | None, verbose: int) -> None:
    """RocketMQ's reliable-messaging semantics on Apache Kafka."""
    _configure_logging(verbose)
    ctx.obj = {"namespace": namespace, "verbose": verbose}


def _bootstrap_option(help_text: str) -> Callable[[F], F]:
    return click.option(
        "-b",
        "--bootstrap-servers",
        envvar="KAFKA_BOOTSTRAP_SERVERS",
        default=None,
        help=help_text + " [env KAFKA_BOOTSTRAP_SERVERS]",
    )


def _local_broker(data_dir: Path | None, port: int) -> LocalKafka:
    return LocalKafka(LocalKafkaConfig(data_dir=data_dir or cache_dir() / "broker", port=port))


def _self_check(config: ClientConfig) -> None:
    """Send one message and read it back, printing both."""
    started = time.monotonic()
    with Producer("bridge-self-check", config=config) as producer:
        result = producer.send_sync(
            Message(SELF_CHECK_TOPIC, b"hello from the bridge", keys="self-check", tags="SelfCheck")
        )
    console.print(f"sent     {result.msg_id} to {result.topic}[{result.queue_id}]@{result.offset}")
    received = read_message_at(config, SELF_CHECK_TOPIC, result.queue_id, result.offset)
    elapsed_ms = (time.monotonic() - started) * 1000
    if received.msg_id != result.msg_id:
        raise click.ClickException(f"self-check read {received.msg_id}, expected {result.msg_id}")
    console.print(
        f"received {received.msg_id}: {received.body.decode()!r} tags={received.tags} "
        f"keys={received.keys} ({elapsed_ms:.0f} ms round trip)"
    )


@cli.command()
@_bootstrap_option("Use this Kafka instead of starting the local broker.")
@click.option("--data-dir", type=click.Path(path_type=Path), help="Local broker data directory.")
@click.option(
    "--port",
    type=int,
    default=DEFAULT_LOCAL_PORT,
    show_default=True,
    help="Local broker port (0: any free).",
)
@click.option(
    "--self-check/--no-self-check",
    default=None,
    help="Send and receive one message after start (default: on with the local broker).",
)
@click.option("--once", is_flag=True, help="Stop right after start-up (and the self-check).")
@click.pass_context
def up(
    ctx: click.Context,
    bootstrap_servers: str | None,
    data_dir: Path | None,
    port: int,
    self_check: bool | None,
    once: bool,
) -> None:
    """Start the stack in the foreground: the local Kafka broker (unless bootstrap servers
    are configured) and the coordinator. Ctrl-C stops both cleanly."""
    broker: LocalKafka | None = None
    coordinator: Coordinator | None = None
    with _stop_on_signals() as stop:
        try:
            if bootstrap_servers is None:
                broker = _local_broker(data_dir, port)
                console.print("starting the local Kafka broker (first run fetches its jars)...")
                broker.start()
                bootstrap_servers = broker.bootstrap_servers
                console.print(f"Kafka     {bootstrap_servers} (data in {broker.data_dir})")
            config = _client_config(ctx, bootstrap_servers)
            coordinator = Coordinator(CoordinatorConfig.from_env().with_client(config))
            coordinator.start()
            console.print(
                f"coordinator {coordinator.config.coordinator_id} running "
                f"(namespace {config.namespace}, {len(coordinator.services)} services)"
            )
            if self_check if self_check is not None else broker is not None:
                _self_check(config)
            if not once:
                console.print("up; press Ctrl-C to stop")
                # Returns on Ctrl-C; raises if a service failed for good (another coordinator
                # with this id, say), so the command exits non-zero.
                coordinator.run_until(stop)
                console.print("stopping...")
        finally:
            if coordinator is not None:
                coordinator.stop()
            if broker is not None:
                broker.stop()
    console.print("stopped")


@cli.command()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    help="Data directory [default: broker/, with --nodes N cluster-N/, in the cache directory: "
    "BRIDGE_CACHE_DIR or .cache/].",
)
@click.option(
    "--port",
    type=int,
    default=DEFAULT_LOCAL_PORT,
    show_default=True,
    help="Client port (0: any free); with --nodes N, nodes use PORT..PORT+N-1.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Nodes, each a broker and a KRaft controller; with more than one the defaults (for "
    "internal topics too) are replication factor min(3, N), min.insync.replicas min(2, N-1).",
)
def broker(data_dir: Path | None, port: int, nodes: int) -> None:
    """Run only the local Kafka broker (or a cluster of them) in the foreground."""
    kafka: LocalKafka | LocalKafkaCluster
    if nodes == 1:
        kafka = _local_broker(data_dir, port)
    else:
        replication = min(3, nodes)
        kafka = LocalKafkaCluster(
            LocalClusterConfig(
                data_dir=data_dir or cache_dir() / f"cluster-{nodes}",
                nodes=nodes,
                replication_factor=replication,
                min_insync_replicas=min(2, replication - 1),
                base_port=port,
            )
        )
        console.print(f"starting a local Kafka cluster of {nodes} nodes...")
    with _stop_on_signals() as stop:
        kafka.start()
        try:
            console.print(
                f"Kafka {kafka.bootstrap_servers} (data in {kafka.data_dir}); Ctrl-C stops"
            )
            stop.wait()
        finally:
            kafka.stop()


@cli.command()
@_bootstrap_option("Kafka to coordinate.")
@click.pass_context
def coordinator(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Run only the coordinator (against configured Kafka) in the foreground."""
    config = CoordinatorConfig.from_env().with_client(_client_config(ctx, bootstrap_servers))
    with _stop_on_signals() as stop, Coordinator(config) as running:
        console.print(f"coordinator {running.config.coordinator_id} running; Ctrl-C stops")
        running.run_until(stop)


@cli.group()
def topics() -> None:
    """List, create and map topics."""


@topics.command("list")
@_bootstrap_option("Kafka to inspect.")
@click.option("--all", "show_all", is_flag=True, help="Include Kafka's internal topics.")
@click.pass_context
def topics_list(ctx: click.Context, bootstrap_servers: str | None, show_all: bool) -> None:
    """List topics with their kind and RocketMQ name."""
    config = _client_config(ctx, bootstrap_servers)
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
    if console.is_terminal:
        table = Table("Kafka topic", "partitions", "kind", "RocketMQ name")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:  # scripts get one tab-separated line per topic
        for row in rows:
            click.echo("\t".join(row))


@topics.command("create")
@_bootstrap_option("Kafka to provision.")
@click.option("--system", is_flag=True, help="Create every system topic of the catalog.")
@click.option(
    "--group", "groups", multiple=True, help="Create this consumer group's retry and DLQ topics."
)
@click.option("--topic", "names", multiple=True, help="Create this real topic (RocketMQ name).")
@click.option("--partitions", type=int, default=4, show_default=True, help="For --topic.")
@click.pass_context
def topics_create(
    ctx: click.Context,
    bootstrap_servers: str | None,
    system: bool,
    groups: tuple[str, ...],
    names: tuple[str, ...],
    partitions: int,
) -> None:
    """Create topics idempotently (existing ones are left as they are)."""
    config = _client_config(ctx, bootstrap_servers)
    catalog = TopicCatalog(namespace=config.namespace)
    specs: list[TopicSpec] = list(catalog.system_specs()) if system else []
    for group in groups:
        specs.extend(catalog.group_specs(group))
    specs.extend(TopicSpec(to_kafka_topic(n, config.namespace), partitions) for n in names)
    if not specs:
        raise click.UsageError("nothing to create: give --system, --group or --topic")
    created = TopicAdmin(config).ensure_topics(specs)
    for spec in specs:
        console.print(f"{'created' if spec.kafka_name in created else 'exists '} {spec.kafka_name}")


@topics.command("map")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def topics_map(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Show the Kafka topic name of RocketMQ topic names, and back (a name in the namespace,
    e.g. rmq.DLQ.my__group, is read back). A name with no mapping is an error on stderr with
    its reason; the exit status is then 1, after the other names."""
    namespace = ctx.obj.get("namespace") or ClientConfig.from_env().namespace
    catalog = TopicCatalog(namespace=namespace)
    failed = False
    for name in names:
        try:
            if name.startswith(namespace + "."):
                console.print(f"{name} <- {catalog.parse(name).rocketmq_name}")
            else:
                console.print(f"{name} -> {to_kafka_topic(name, namespace)}")
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


@cli.command()
@_bootstrap_option("Kafka to send to.")
@click.argument("topic")
@click.argument("body")
@click.option("--keys", default=None, help="Space-separated business keys.")
@click.option("--tags", default=None, help="The message tag.")
@click.option("-p", "--property", "properties", multiple=True, help="NAME=VALUE user property.")
@click.option("--group", default="bridge-cli", show_default=True, help="Producer group.")
@click.option("--count", type=int, default=1, show_default=True, help="Send the message N times.")
@click.pass_context
def send(
    ctx: click.Context,
    bootstrap_servers: str | None,
    topic: str,
    body: str,
    keys: str | None,
    tags: str | None,
    properties: tuple[str, ...],
    group: str,
    count: int,
) -> None:
    """Send BODY to TOPIC and print where it was stored."""
    config = _client_config(ctx, bootstrap_servers)
    with Producer(group, config=config) as producer:
        for _ in range(count):
            msg = Message(
                topic, body, keys=keys, tags=tags, properties=_parse_properties(properties)
            )
            result = producer.send_sync(msg)
            console.print(
                f"{result.status.value} {result.msg_id} "
                f"{result.topic}[{result.queue_id}]@{result.offset}"
            )


@cli.command()
@_bootstrap_option("Kafka to read from.")
@click.argument("topics_", metavar="TOPIC...", nargs=-1, required=True)
@click.option(
    "--group", default=None, help="Consumer group (default: a throw-away one, from the start)."
)
@click.option("--count", type=int, default=None, help="Stop after N messages.")
@click.option(
    "--timeout-ms",
    type=int,
    default=5000,
    show_default=True,
    help="Stop after this long without a message.",
)
@click.pass_context
def consume(
    ctx: click.Context,
    bootstrap_servers: str | None,
    topics_: tuple[str, ...],
    group: str | None,
    count: int | None,
    timeout_ms: int,
) -> None:
    """Print committed messages of TOPIC... (RocketMQ names, e.g. %DLQ%my_group)."""
    config = _client_config(ctx, bootstrap_servers)
    for msg in read_messages(
        config, list(topics_), group=group, max_messages=count, timeout_ms=timeout_ms,
        commit=group is not None,
    ):  # fmt: skip
        console.print(
            f"{msg.topic}[{msg.queue_id}]@{msg.queue_offset} {msg.msg_id} tags={msg.tags} "
            f"keys={msg.keys} props={msg.user_properties} body={msg.body!r}"
        )


@cli.group()
def transactions() -> None:
    """Inspect undecided and parked transactions; replay or drop parked ones."""


@transactions.command("list")
@_bootstrap_option("Kafka to inspect.")
@click.pass_context
def transactions_list(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Undecided transactions, oldest first: age, check count, group, real topic."""
    config = _client_config(ctx, bootstrap_servers)
    undecided = list_undecided(config)
    for t in undecided:
        console.print(
            f"{t.transaction_id} group={t.producer_group} topic={t.real_topic} "
            f"age={t.age_ms / 1000:.1f}s checks={t.check_times} "
            f"half={t.half_partition}@{t.half_offset}"
        )
    console.print(f"{len(undecided)} undecided")


@transactions.command("show")
@_bootstrap_option("Kafka to inspect.")
@click.argument("transaction_id")
@click.pass_context
def transactions_show(
    ctx: click.Context, bootstrap_servers: str | None, transaction_id: str
) -> None:
    """One transaction: undecided (with its checks), parked, or decided."""
    config = _client_config(ctx, bootstrap_servers)
    for t in list_undecided(config):
        if t.transaction_id == transaction_id:
            console.print(
                f"undecided: group={t.producer_group} topic={t.real_topic} "
                f"age={t.age_ms / 1000:.1f}s checks={t.check_times}"
            )
            return
    for msg in read_parked(config, include_resolved=True):
        if (msg.transaction_id or msg.msg_id) == transaction_id:
            console.print(
                f"parked at check-max offset {msg.queue_offset} after "
                f"{msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} checks"
                f"{_delivery_failure(msg)}: {msg!r}",
                markup=False,
            )
            return
    console.print(f"{transaction_id}: decided, or not found")


def _delivery_failure(msg: MessageExt) -> str:
    """`` delivery failed N times: reason`` for a message parked because its real topic refused
    it, else empty."""
    error = msg.get_property(MessageConst.DELIVERY_ERROR)
    if not error:
        return ""
    attempts = msg.get_property(MessageConst.DELIVERY_ATTEMPTS) or "?"
    return f" delivery failed {attempts} times: {error}"


@transactions.command("parked")
@_bootstrap_option("Kafka to inspect.")
@click.pass_context
def transactions_parked(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Messages parked in the check-max topic and not yet replayed or dropped."""
    config = _client_config(ctx, bootstrap_servers)
    parked = read_parked(config)
    for msg in parked:
        console.print(
            f"{msg.msg_id} group={msg.get_property(MessageConst.PRODUCER_GROUP)} "
            f"topic={msg.get_property(MessageConst.REAL_TOPIC)} "
            f"checks={msg.get_property(MessageConst.TRANSACTION_CHECK_TIMES)} body={msg.body!r}"
            + _delivery_failure(msg),
            markup=False,
        )
    console.print(f"{len(parked)} parked")


@transactions.command("replay")
@_bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_replay(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Commit a parked message: deliver it to its real topic, once."""
    msg = resolve_parked(_client_config(ctx, bootstrap_servers), msg_id, OpAction.COMMIT)
    console.print(f"replayed {msg.msg_id} to {msg.get_property(MessageConst.REAL_TOPIC)}")


@transactions.command("drop")
@_bootstrap_option("Kafka to write to.")
@click.argument("msg_id")
@click.pass_context
def transactions_drop(ctx: click.Context, bootstrap_servers: str | None, msg_id: str) -> None:
    """Roll back a parked message for good."""
    msg = resolve_parked(_client_config(ctx, bootstrap_servers), msg_id, OpAction.ROLLBACK)
    console.print(f"dropped {msg.msg_id}")


@cli.group()
def delays() -> None:
    """Inspect delayed messages (delay levels and timers)."""


@delays.command("status")
@_bootstrap_option("Kafka to inspect.")
@click.pass_context
def delays_status(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """How many messages wait in each delay level and timer tier, with a histogram, and when
    the next of each is due."""
    config = _client_config(ctx, bootstrap_servers)
    queues = delay_status(config)
    widest = max((q.pending for q in queues), default=0) or 1
    now = time.time_ns() // 1_000_000
    for q in queues:
        if q.kind == "tier" and not q.pending:
            continue
        bar = "#" * max(round(30 * q.pending / widest), 1 if q.pending else 0)
        due = f"next in {(q.next_due_ms - now) / 1000:.1f}s" if q.next_due_ms else ""
        console.print(
            f"{q.kind} {q.index:>2} ({_human_ms(q.delay_ms):>6}) {q.pending:>9} {bar:<30} {due}"
        )
    console.print(f"{sum(q.pending for q in queues)} waiting")


def _human_ms(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:g}{unit}" if ms % size == 0 else f"{ms / size:.1f}{unit}"
    return f"{ms}ms"


@cli.command()
@_bootstrap_option("Kafka to ask.")
@click.pass_context
def health(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """Exit 0 if every coordinator service is running (a member of its consumer group)."""
    checks = coordinator_health(_client_config(ctx, bootstrap_servers))
    for c in checks:
        console.print(f"{c.kind:<12} {c.state:<20} members={c.members}  {c.group}")
    if not all(c.healthy for c in checks):
        raise click.exceptions.Exit(1)


@cli.group()
def dlq() -> None:
    """Inspect consumer groups' dead-letter queues and replay dead letters."""


@dlq.command("status")
@_bootstrap_option("Kafka to inspect.")
@click.option("--group", default=None, help="One consumer group (default: every group).")
@click.pass_context
def dlq_status(ctx: click.Context, bootstrap_servers: str | None, group: str | None) -> None:
    """Dead letters per group: count, origin topics and reconsume depth."""
    config = _client_config(ctx, bootstrap_servers)
    summaries = dlq_summary(config, group)
    for s in summaries:
        origins = ", ".join(f"{t}={n}" for t, n in sorted(s.origin_topics.items()))
        depth = ", ".join(f"{d}x={n}" for d, n in s.reconsume_depth.items())
        console.print(
            f"{s.group}: {s.count} dead letters; from {origins or '-'}; depth {depth or '-'}"
        )
    if not summaries:
        console.print("no dead-letter queues")


@dlq.command("list")
@_bootstrap_option("Kafka to inspect.")
@click.option("--group", required=True, help="The consumer group.")
@click.pass_context
def dlq_list(ctx: click.Context, bootstrap_servers: str | None, group: str) -> None:
    """Every dead letter of a group: id, origin topic, failures, keys, tags, body size."""
    config = _client_config(ctx, bootstrap_servers)
    letters = read_dead_letters(config, group)
    for m in letters:
        console.print(
            f"{m.msg_id} from={m.get_property(MessageConst.RETRY_TOPIC)} "
            f"failures={m.reconsume_times} keys={' '.join(m.keys)} tags={m.tags or ''} "
            f"body={len(m.body)} bytes"
        )
    console.print(f"{len(letters)} dead letters")


@dlq.command("replay")
@_bootstrap_option("Kafka to write to.")
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
@click.pass_context
def dlq_replay(
    ctx: click.Context,
    bootstrap_servers: str | None,
    group: str,
    keys: tuple[str, ...],
    tags: tuple[str, ...],
    msg_ids: tuple[str, ...],
    target: str,
    dry_run: bool,
) -> None:
    """Write dead letters back (all, or those the filters choose). Replaying twice writes
    twice."""
    config = _client_config(ctx, bootstrap_servers)
    letters = replay_dead_letters(
        config, group, keys=keys, tags=tags, msg_ids=msg_ids,
        target=ReplayTarget(target), dry_run=dry_run,
    )  # fmt: skip
    for m in letters:
        console.print(f"{m.msg_id} -> {m.get_property(MessageConst.RETRY_TOPIC)}")
    console.print(f"{'would replay' if dry_run else 'replayed'} {len(letters)}")


@cli.group("quarantine", invoke_without_command=True)
@_bootstrap_option("Kafka to inspect.")
@click.option("--count", type=int, default=None, help="Show at most N records.")
@click.pass_context
def quarantine_list(ctx: click.Context, bootstrap_servers: str | None, count: int | None) -> None:
    """Print the quarantined records: origin, reason and size (``replay OFFSET`` re-drives
    one)."""
    if ctx.invoked_subcommand is not None:
        ctx.ensure_object(dict)["quarantine_bootstrap"] = bootstrap_servers
        return
    config = _client_config(ctx, bootstrap_servers)
    shown = 0
    for kept in read_quarantine(config, max_records=count):
        shown += 1
        if kept.omitted_bytes:  # too large to keep whole: kept without its value
            size = f"{kept.omitted_bytes} bytes, value not kept"
        else:
            size = f"{len(kept.value) if kept.value is not None else 0} bytes"
        console.print(
            f"@{kept.offset} from {kept.source_topic}[{kept.source_partition}]@"
            f"{kept.source_offset} by {kept.quarantined_by} ({size}): {kept.reason}",
            markup=False,
        )
    if not shown:
        console.print("no quarantined records")


@quarantine_list.command("replay")
@_bootstrap_option("Kafka to write to.")
@click.argument("offset", type=int)
@click.pass_context
def quarantine_replay(ctx: click.Context, bootstrap_servers: str | None, offset: int) -> None:
    """Deliver the delayed message quarantined at OFFSET to its real topic, once (after the
    cause, e.g. a missing topic or an ACL, was fixed)."""
    given = bootstrap_servers or (ctx.obj or {}).get("quarantine_bootstrap")
    done = replay_quarantined(_client_config(ctx, given), offset)
    console.print(
        f"replayed {done.msg_id} from quarantine offset {offset} to "
        f"{done.topic}[{done.partition}]@{done.offset}",
        markup=False,
    )


@cli.command()
@click.argument("sets", nargs=-1, type=click.Choice(sorted(ARTIFACT_SETS)))
def fetch(sets: tuple[str, ...]) -> None:
    """Fetch the broker's (kafka) and Spark's Kafka source (spark) jars into the cache."""
    for name in sets or tuple(sorted(ARTIFACT_SETS)):
        libs = ensure_jars(name)
        console.print(f"{name}: {len(list(libs.glob('*.jar')))} jars in {libs}")


def main() -> None:
    """Console-script entry point."""
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
