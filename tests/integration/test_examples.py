"""Every example in examples/ runs against the session broker and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.broker


def run_example(module: str, bootstrap: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", f"examples.{module}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_simple_producer_example(kafka_bootstrap: str) -> None:
    out = run_example("simple_producer", kafka_bootstrap)
    assert "SEND_OK" in out
    received = [line for line in out.splitlines() if line.startswith("received ")]
    assert [line.split("tags=")[1].split()[0] for line in received] == ["TagA", "TagB", "TagC"]
    assert "properties={'region': 'eu'}" in received[0]
