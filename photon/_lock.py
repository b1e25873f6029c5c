"""Exclusive locks on files that say who holds them: a launcher's state dirs, a registry replica's data dir.

:func:`hold_lock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a file and writes the holder's description
into it (``"<pid> <what>"``). The lock lives as long as the returned file stays open, and the kernel
releases it when the holding process dies however it dies (SIGKILL included), so a stale file never
blocks anyone: only a live holder does. The file is opened close-on-exec, so children never inherit it.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` is what it wrote (``"<pid> <what>"``), ``pid`` its
    pid (0 when the file names none)."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = Path(path)
        self.holder = holder or "unknown"
        first = self.holder.split(" ", 1)[0]
        self.pid = int(first) if first.isdigit() else 0
        super().__init__(f"{self.path} is locked by {self.describe()}")

    def describe(self) -> str:
        """``"photon verify (pid 123)"``, or ``"pid 123"`` for a holder that named only its pid."""
        parts = self.holder.split(" ", 1)
        if self.pid and len(parts) == 2 and parts[1].strip():
            return f"{parts[1].strip()} (pid {self.pid})"
        return f"pid {self.pid}" if self.pid else self.holder


def hold_lock(path: str | Path, what: str = ""):
    """Lock ``path`` (created with its folder if needed) for this process and record ``"<pid> <what>"`` in
    it; returns the open file, which holds the lock until closed. Raises :class:`LockHeld` when another
    live process (or another open file of this one) holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise LockHeld(path, holder) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {what}".strip())
    f.flush()
    return f


def lock_holder(path: str | Path) -> LockHeld | None:
    """Who holds the lock on ``path`` now (None when nobody does, or the file does not exist); takes and
    drops the lock to find out, so it never blocks."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        f = open(path, "a+")
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            return LockHeld(path, f.read().strip())
        fcntl.flock(f, fcntl.LOCK_UN)
        return None
