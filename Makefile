# Quick start: `make up` (bring the stack up and show a message round trip), `make test`.
.PHONY: up test bench lint bootstrap clean

up:
	@BRIDGE_EXTRAS=test,dev ./scripts/bootstrap.sh
	.venv/bin/bridge -v up

test: bootstrap
	.venv/bin/python -m pytest

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
