"""Repository hygiene the quick start depends on."""

from __future__ import annotations

import subprocess

from tests.conftest import REPO_ROOT


def test_no_jar_or_archive_is_tracked() -> None:
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [f for f in files if f.endswith((".jar", ".tgz", ".tar.gz", ".whl"))]


def test_every_example_is_listed_in_getting_started() -> None:
    readme = (REPO_ROOT / "docs" / "getting-started.md").read_text()
    for example in sorted((REPO_ROOT / "examples").glob("*.py")):
        if example.name != "__init__.py":
            assert f"examples/{example.name}" in readme, example.name


def test_ci_runs_the_readmes_test_command() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in readme
    assert "make test" in ci
