"""``python -m chaos``: run the fault-injection suite, or check a saved history.

``python -m chaos run --seed N --duration S [--soak] [--out DIR]`` runs the cluster, the fault
proxy, two coordinators, the workload and the seeded nemeses for S seconds of load, drains,
stops everything and prints the checker's table (exit 1 on a violation, 0 otherwise).
``python -m chaos check HISTORY`` prints the table of a saved history (same exit status).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from chaos.history import NEMESES
from chaos.runner import RunConfig, check_saved, run
from chaos.workload import spark_ingest_main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run_p = commands.add_parser("run", help="one fault-injection run, then the checker")
    run_p.add_argument("--seed", type=int, default=1, help="draws the workload and the schedule")
    run_p.add_argument("--duration", type=float, default=150.0, help="seconds of load")
    run_p.add_argument("--soak", action="store_true", help="cycle through every nemesis")
    run_p.add_argument("--out", type=Path, default=None, help="default .chaos/<utc-stamp>/")
    run_p.add_argument("--nodes", type=int, default=3, help="brokers (1: one, no proxy)")
    run_p.add_argument(
        "--nemeses", default=None, help=f"comma-separated subset of: {', '.join(NEMESES)}"
    )
    run_p.add_argument("--drain-timeout", type=float, default=60.0, help="seconds")
    run_p.add_argument("--rate-scale", type=float, default=1.0, help="multiplies every rate")
    spark = run_p.add_mutually_exclusive_group()
    spark.add_argument("--spark", dest="spark", action="store_true", default=True,
                       help="run the Spark ingest at the end (the default)")  # fmt: skip
    spark.add_argument("--no-spark", dest="spark", action="store_false")
    disk = run_p.add_mutually_exclusive_group()
    disk.add_argument("--disk-full", dest="disk_full", action="store_true", default=None,
                      help="inject disk_full (tmpfs, needs root; default: on --soak)")  # fmt: skip
    disk.add_argument("--no-disk-full", dest="disk_full", action="store_false")
    run_p.add_argument("--keep-data", action="store_true", help="keep the brokers' data")
    run_p.add_argument(
        "--database", action="store_true",
        help="add the db kind: orders and their effects in two SQLite databases",
    )  # fmt: skip

    check_p = commands.add_parser("check", help="the checker's table of a saved history")
    check_p.add_argument("history", type=Path)

    spark_p = commands.add_parser("spark-ingest", help=argparse.SUPPRESS)
    spark_p.add_argument("--bootstrap-servers", required=True)
    spark_p.add_argument("--topics", required=True)
    spark_p.add_argument("--work-dir", type=Path, required=True)
    spark_p.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "check":
        return check_saved(args.history)
    if args.command == "spark-ingest":
        spark_ingest_main(args.bootstrap_servers, args.topics.split(","), args.work_dir, args.out)
        return 0
    nemeses = None
    if args.nemeses:
        nemeses = tuple(n.strip() for n in args.nemeses.split(",") if n.strip())
        unknown = sorted(set(nemeses) - set(NEMESES))
        if unknown:
            _parser().error(f"unknown nemeses {unknown}; known: {', '.join(NEMESES)}")
    config = RunConfig(
        seed=args.seed,
        duration_s=args.duration,
        soak=args.soak,
        out_dir=args.out,
        nodes=args.nodes,
        nemeses=nemeses,
        drain_timeout_s=args.drain_timeout,
        rate_scale=args.rate_scale,
        spark=args.spark,
        disk_full=args.disk_full,
        keep_data=args.keep_data,
        database=args.database,
    )
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
