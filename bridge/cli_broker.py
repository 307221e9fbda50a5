"""``bridge broker``: the local Kafka broker, or a cluster of them, in the foreground."""

from __future__ import annotations

from pathlib import Path

import click

from bridge.cli_common import console, stop_on_signals
from bridge.runtime.cluster import LocalClusterConfig, LocalKafkaCluster
from bridge.runtime.jars import cache_dir
from bridge.runtime.local_kafka import LocalKafka, LocalKafkaConfig

DEFAULT_LOCAL_PORT = 9092


def local_broker(data_dir: Path | None, port: int) -> LocalKafka:
    """The single-node local broker (``bridge up`` and ``bridge broker``)."""
    return LocalKafka(LocalKafkaConfig(data_dir=data_dir or cache_dir() / "broker", port=port))


@click.command()
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
        kafka = local_broker(data_dir, port)
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
    with stop_on_signals() as stop:
        kafka.start()
        try:
            console.print(
                f"Kafka {kafka.bootstrap_servers} (data in {kafka.data_dir}); Ctrl-C stops"
            )
            stop.wait()
        finally:
            kafka.stop()
