"""A short fault-injection run, as ``make chaos`` runs it but smaller: one broker behind the
fault proxy, two coordinators, 60 s of load (the database-backed orders included) and one of
each cheap nemesis. The checker must find nothing, and the history must hold every event type
the run produces."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from chaos.history import ROLES, read_history
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.broker, pytest.mark.slow]

NEMESES = ("coordinator_kill", "net_drop", "net_latency", "poison")


def test_a_short_run_with_cheap_faults_breaks_no_guarantee(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, "-m", "chaos", "run", "--seed", "3", "--duration", "60",
            "--nodes", "1", "--nemeses", ",".join(NEMESES), "--drain-timeout", "40", "--no-spark",
            "--database", "--out", str(out),
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    table = (out / "table.txt").read_text() if (out / "table.txt").is_file() else ""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    )
    assert "\nOK; drained;" in table, table
    # No broker JVM (its data lives under out) is left running.
    assert not _processes_mentioning(str(out)), _processes_mentioning(str(out))

    events = list(read_history(out / "history.jsonl"))
    types = Counter(e["type"] for e in events)
    assert {"send", "ack", "decide", "recv", "nemesis", "phase", "database"} <= set(types), types
    kinds = Counter(e["kind"] for e in events if e["type"] == "send")
    assert set(kinds) == {"tx", "delay", "timer", "consume", "orderly", "broadcast", "poison", "db"}
    # The orders application committed orders and refused some; the inventory applied them
    # (the checker holds each to one copy and one effect).
    (database,) = [e for e in events if e["type"] == "database"]
    refused = {e["id"] for e in events if e["type"] == "send" and e.get("intent") == "rollback"}
    placed = {e["id"] for e in events if e["type"] == "send" and e["kind"] == "db"} - refused
    assert database["orders"] and set(database["orders"]) <= placed, database
    assert set(database["effects"]) == set(database["orders"]), database
    roles = Counter(e["role"] for e in events if e["type"] == "recv")
    # Nothing is parked in the check-max topic without a db_outage: its reader sees nothing.
    assert set(roles) == set(ROLES) - {"parked_reader"}, roles
    decisions = {(e["status"], e["via"]) for e in events if e["type"] == "decide"}
    assert {("COMMIT", "execute"), ("ROLLBACK", "execute"), ("UNKNOWN", "execute"),
            ("COMMIT", "check"), ("ROLLBACK", "check")} <= decisions, decisions  # fmt: skip
    faults = Counter((e["name"], e["phase"]) for e in events if e["type"] == "nemesis")
    assert faults == Counter({(n, p): 1 for n in NEMESES for p in ("start", "end")}), faults
    phases = [e["name"] for e in events if e["type"] == "phase"]
    assert phases == ["start", "load_end", "drained", "end"], phases
    end = next(e for e in events if e["type"] == "phase" and e["name"] == "end")
    assert end["detail"] == "clean", end
    # Every poison record was set aside in QUARANTINE.
    poison = {e["id"] for e in events if e["type"] == "send" and e["kind"] == "poison"}
    quarantined = {e["id"] for e in events if e.get("role") == "quarantine_reader"}
    assert poison and poison <= quarantined, sorted(poison - quarantined)
    # The saved history checks the same again.
    again = subprocess.run(
        [sys.executable, "-m", "chaos", "check", str(out / "history.jsonl")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and again.stdout == table, again.stdout + again.stderr
    assert json.loads((out / "history.jsonl").read_text().splitlines()[0])["name"] == "start"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args[:200])
    return found
