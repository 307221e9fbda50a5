"""The command line's names: ``rmq-bridge`` (no common Linux package owns it), ``bridge``
(Debian's iproute2 owns ``/usr/sbin/bridge``, so only an alias) and ``python -m bridge``."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.conftest import REPO_ROOT


def test_the_command_is_installed_as_rmq_bridge_and_bridge() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["rmq-bridge"] == scripts["bridge"] == "bridge.cli:main"


def test_python_dash_m_bridge_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "send", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "--deliver-at-ms" in done.stdout
