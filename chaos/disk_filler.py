"""The ``disk_full`` nemesis's instrument: a small tmpfs mounted as one broker's log
directory, filled up and freed. :mod:`chaos.nemesis` re-exports it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Final


class DiskFiller:
    """A small tmpfs mounted as one broker's log directory for the run, which the
    ``disk_full`` nemesis fills and frees. Needs root (``mount``); :meth:`available` says
    whether it works here. Nothing outside the tmpfs is ever written."""

    FILLER: Final = ".chaos-filler"

    def __init__(self, mount_point: Path, size_mb: int = 512) -> None:
        self.mount_point = Path(mount_point)
        self.size_mb = size_mb
        self.mounted = False

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") if a tmpfs can be mounted here, else (False, why)."""
        if os.geteuid() != 0:
            return False, "mounting a tmpfs needs root"
        if shutil.which("mount") is None or shutil.which("umount") is None:
            return False, "mount/umount not found"
        return True, ""

    def mount(self) -> None:
        """Mount the tmpfs (an empty directory is made first)."""
        self.mount_point.mkdir(parents=True, exist_ok=True)
        if any(self.mount_point.iterdir()):
            raise RuntimeError(f"{self.mount_point} is not empty; not mounting over it")
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs",
             str(self.mount_point)],
            check=True, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        self.mounted = True

    def fill(self, leave_bytes: int = 16 * 1024) -> int:
        """Fill the tmpfs up to ``leave_bytes`` of free space; the bytes written."""
        stat = os.statvfs(self.mount_point)
        free = stat.f_bavail * stat.f_frsize
        size = max(0, free - leave_bytes)
        chunk = b"\0" * (1 << 20)
        written = 0
        try:
            with (self.mount_point / self.FILLER).open("wb") as out:
                while written < size:
                    n = min(len(chunk), size - written)
                    out.write(chunk[:n])
                    written += n
        except OSError:  # full before the estimate: that is the point
            pass
        return written

    def free(self) -> None:
        """Remove the filler."""
        (self.mount_point / self.FILLER).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily if busy); idempotent."""
        if not self.mounted:
            return
        self.free()
        point = str(self.mount_point)
        done = subprocess.run(["umount", point], check=False, capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)
        self.mounted = False
