"""The Spark ingest of a run (G7): the project's ingest job over the workload's topics, in a
child process (``python -m chaos spark-ingest``) so that the run itself never loads PySpark,
and the workload id of every row it wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from bridge import BridgeError
from chaos.history import ID_PROPERTY

SPARK_TIMEOUT_S: Final = 240


def run_spark_ingest(bootstrap: str, topics: list[str], work_dir: Path,
                     timeout_s: float = SPARK_TIMEOUT_S) -> tuple[list[str], str]:  # fmt: skip
    """Run the project's ingest job (``available-now``, read_committed) over ``topics`` in a
    child process and read back the workload id of every row it wrote; (ids, detail)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / "spark-ids.json"
    cmd = [
        sys.executable, "-m", "chaos", "spark-ingest", "--bootstrap-servers", bootstrap,
        "--topics", ",".join(topics), "--work-dir", str(work_dir), "--out", str(out),
    ]  # fmt: skip
    log = (work_dir / "spark.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise BridgeError(f"the Spark ingest did not finish within {timeout_s:.0f} s") from None
    if code != 0 or not out.is_file():
        tail = (work_dir / "spark.log").read_text(errors="replace").splitlines()[-20:]
        raise BridgeError(f"the Spark ingest failed (exit {code}): " + "\n".join(tail))
    ids = json.loads(out.read_text())
    return ids, f"{len(ids)} rows in {time.monotonic() - started:.0f} s"


def spark_ingest_main(bootstrap: str, topics: list[str], work_dir: Path, out: Path) -> None:
    """In the child process: run the ingest job into ``work_dir`` and write the workload ids
    of its rows (a JSON list, repeats kept) to ``out``."""
    # Only in the Spark child: the run itself never loads PySpark.
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    from spark_jobs.common import spark_session  # noqa: PLC0415
    from spark_jobs.ingest import IngestConfig, start_ingest  # noqa: PLC0415

    spark = spark_session("chaos-ingest", master="local[2]")
    try:
        config = IngestConfig(
            bootstrap_servers=bootstrap,
            output=str(work_dir / "table"),
            checkpoint=str(work_dir / "checkpoint"),
            topics=tuple(topics),
        )
        start_ingest(spark, config).awaitTermination()
        rows = (
            spark.read.parquet(config.output)
            .select(F.col("properties").getItem(ID_PROPERTY).alias("id"))
            .collect()
        )
        ids = [row["id"] for row in rows if row["id"] is not None]
        out.write_text(json.dumps(ids))
    finally:
        spark.stop()
