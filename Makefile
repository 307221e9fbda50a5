# Quick start: `make up` (bring the stack up and show a message round trip), `make test`.
.PHONY: up test bench lint bootstrap clean chaos soak differential

up:
	@BRIDGE_EXTRAS=test,dev ./scripts/bootstrap.sh
	.venv/bin/bridge -v up

test: bootstrap
	.venv/bin/python -m pytest

# Fault injection on a three-broker cluster (fixed seed, a few minutes; fails on a violation).
SEED ?= 1
chaos: bootstrap
	.venv/bin/python -m chaos run --seed $(SEED) --duration 150

# The same with every nemesis for as long as DURATION says (seconds), e.g. make soak DURATION=1800.
DURATION ?= 1800
soak: bootstrap
	.venv/bin/python -m chaos run --seed $(SEED) --duration $(DURATION) --soak

# The same workloads against Apache RocketMQ 5 (from Maven jars) and against the bridge.
differential: bootstrap
	.venv/bin/python -m pytest tests/differential

bench: bootstrap
	.venv/bin/python -m bench

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

bootstrap:
	@./scripts/bootstrap.sh

clean:
	rm -rf .venv .cache .pytest_cache .mypy_cache .ruff_cache
