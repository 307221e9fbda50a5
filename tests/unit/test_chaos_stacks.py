"""The fault runner's stack dump (:mod:`chaos.stacks`) in a process whose threads come and go,
as a coordinator's do: each signal writes a dump, and none crashes the process (the
``faulthandler`` dump it replaces crashed such a process within a few hundred signals)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, wait_until

SIGNALS = 1000

CHILD = """
import signal, threading, time
from chaos.stacks import dump_stacks_on
dump_stacks_on(signal.SIGUSR1)

def recurse(n):
    return 0 if n == 0 else recurse(n - 1) + 1

def short_lived():
    recurse(20)
    time.sleep(0.0005)
    recurse(20)

def spawner():
    while True:
        thread = threading.Thread(target=short_lived)
        thread.start()
        thread.join()

for i in range(4):
    threading.Thread(target=spawner, name=f"spawner-{i}", daemon=True).start()
print("ready", flush=True)
while True:  # in Python code, so that a signal's handler runs at once (the coordinator's main
    recurse(5)  # thread wakes every 0.2 s to run it)
"""


class _Dumps:
    """Counts the dumps written to a file so far, reading only what is new each time."""

    MARKER = b"Thread MainThread "

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.count = 0
        self.tail = b""

    def read(self) -> int:
        with self.path.open("rb") as file:
            file.seek(self.offset)
            new = file.read()
        self.offset += len(new)
        seen = self.tail + new
        self.count += seen.count(self.MARKER)
        self.tail = seen[-(len(self.MARKER) - 1) :]  # too short to hold a marker counted
        return self.count


def test_every_signal_dumps_every_thread_while_threads_start_and_end(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with err.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], cwd=REPO_ROOT,
            stdout=subprocess.PIPE, stderr=sink,
        )  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        dumps = _Dumps(err)
        for sent in range(1, SIGNALS + 1):
            child.send_signal(signal.SIGUSR1)
            # Until this signal's dump has begun: a signal sent before the handler of the one
            # before it ran would be merged with it (a pending signal is a flag, not a count).
            wait_until(
                lambda sent=sent: child.poll() is not None or dumps.read() >= sent,  # type: ignore[misc]
                timeout_s=10,
                interval_s=0.001,
            )
            assert child.poll() is None, f"signal {sent} ended the process: {child.returncode}"
        # Each signal's dump has every long-lived thread (the short-lived ones come and go),
        # once the last dump is written to its end.
        names = ("MainThread", "spawner-0", "spawner-1", "spawner-2", "spawner-3")
        wait_until(
            lambda: all(err.read_text().count(f"Thread {n} ") >= SIGNALS for n in names),
            timeout_s=10,
        )
        dump = err.read_text()
        for name in names:
            assert dump.count(f"Thread {name} ") == SIGNALS, name
        assert "in spawner" in dump and "in recurse" in dump
        assert "Fatal Python error" not in dump
    finally:
        child.kill()
        child.wait()
