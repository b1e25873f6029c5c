"""The lost-ids ledger: ids a joiner registered (OK commit) but could not write to its output.

File: ``<region.state_dir>/lost/<joiner-name>.jsonl``, one per joiner process name, only ever appended.
One JSON object per line::

    {"id": "<click id>", "token": "<registry token>", "at_us": <int µs>, "reason": "<text>",
     "region": "<region>", "joiner": "<joiner name>"}

An append is fsynced (the file; the folder too when the file is created) before the joiner answers for the
batch it belongs to, so an id the registry holds and the output lacks is either written or in a ledger.
Recovery reads the ledgers (:func:`read_lost`) and never edits them; the verification job treats ledger ids
as candidates and confirms them against the registry export and the joined output.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson

from photon import fsync_path

LOST_DIR = "lost"


def lost_path(state_dir: str | Path, joiner_name: str) -> Path:
    return Path(state_dir) / LOST_DIR / f"{joiner_name}.jsonl"


class LostLedger:
    """Appends entries to one joiner's ledger file; thread-safe. :meth:`append` raises OSError when the entries
    could not be made durable (then nothing of them may be relied on: the caller tries again)."""

    def __init__(self, state_dir: str | Path, region: str, joiner_name: str) -> None:
        self.path = lost_path(state_dir, joiner_name)
        self.region, self.joiner = region, joiner_name
        self._lock = threading.Lock()
        self.appended = 0

    def append(self, ids: list[str], token: str, at_us: int, reason: str) -> None:
        if not ids:
            return
        data = b"".join(orjson.dumps({"id": i, "token": token, "at_us": at_us, "reason": reason,
                                      "region": self.region, "joiner": self.joiner}) + b"\n" for i in ids)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            # read-write: the torn-append check reads the last byte (pread on a write-only fd is EBADF)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                if size and _last_byte(fd, size) != b"\n":
                    data = b"\n" + data       # an earlier append was torn: start on a line of its own
                try:
                    view, done = memoryview(data), 0
                    while done < len(data):
                        done += os.write(fd, view[done:])
                    os.fsync(fd)
                except OSError:
                    os.ftruncate(fd, size)    # leave no torn entry behind (best effort; readers skip one anyway)
                    raise
            finally:
                os.close(fd)
            if created:
                fsync_path(self.path.parent)
                fsync_path(self.path.parent.parent)
            self.appended += len(ids)


def _last_byte(fd: int, size: int) -> bytes:
    return os.pread(fd, 1, size - 1)


def read_lost(state_dir: str | Path) -> list[dict]:
    """Every entry of every joiner's lost-ids ledger of a region (file by file, in order). Lines that are
    not whole JSON objects (a torn last line of a crashed append) are skipped."""
    out: list[dict] = []
    folder = Path(state_dir) / LOST_DIR
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.jsonl")):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(entry) is dict and isinstance(entry.get("id"), str):
                out.append(entry)
    return out
