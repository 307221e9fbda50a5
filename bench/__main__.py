"""Run every benchmark: ``python -m bench`` (uses KAFKA_BOOTSTRAP_SERVERS or a local broker)."""

from __future__ import annotations

import logging

from bench import producer
from bench.harness import broker


def main() -> None:
    """Run the benchmarks one after another on one broker."""
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bridge.kafka.rdkafka").setLevel(logging.ERROR)
    with broker() as bootstrap:
        print(f"broker: {bootstrap}")
        producer.run(bootstrap)


if __name__ == "__main__":
    main()
