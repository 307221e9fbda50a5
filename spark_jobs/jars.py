"""Print the cached jars Spark's Kafka source needs, comma-separated, for ``spark-submit``::

spark-submit --jars "$(python -m spark_jobs.jars)" spark_jobs/ingest.py ...
spark-submit --jars "$(python -m spark_jobs.jars --delta)" spark_jobs/ingest.py --format delta ...
"""

from __future__ import annotations

import sys

from spark_jobs.common import kafka_jars


def main() -> None:
    """Command-line entry point."""
    print(",".join(str(p) for p in kafka_jars(delta="--delta" in sys.argv[1:])))


if __name__ == "__main__":
    main()
