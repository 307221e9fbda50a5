"""The parallel run keeps an ``xdist_group`` on one worker (``make test``, ``make check``):
the suite's module fixtures (a broker, a coordinator, a Spark session) are built once only
if it does. A pytest or pytest-xdist upgrade that breaks it fails here, not as a slower run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("n", range(4))
def test_worker(n: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.getbasetemp().parent.parent / f"ran-{n}"
    out.write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    base = tmp_path / "base"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", f"--basetemp={base}", "--rootdir", str(tmp_path),
         "-c", "/dev/null", str(tmp_path / "test_grouped.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {p.read_text() for p in tmp_path.glob("ran-*")}
    assert len(list(tmp_path.glob("ran-*"))) == 4
    assert len(workers) == 1, f"one group ran on {sorted(workers)}"
