"""The dispatcher's files under ``<region.state_dir>/dispatcher/``: checkpoint, journal, status, process lock.

The checkpoint is ``checkpoint.json`` (a full snapshot, written atomically and durably: temp file, fsync,
rename, fsync of the folder) plus its journal ``checkpoint.<n>.log`` (``n`` named in the snapshot's
``"journal"``): one JSON delta per line, each appended and fdatasynced before the next command runs. A
full snapshot names a new journal number, so the journal of the previous one is never read again (it is
removed afterwards). A crash during an append leaves a last line without its ``\n``: that delta never
counted, and loading ignores it; every process start writes a full snapshot first, so nothing is ever
appended after a torn line. ``status.json`` is written atomically (temp file, rename) but without fsync:
it is a view, rewritten every ~100 ms.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson

from photon import DISPATCHER_DIR, DISPATCHER_STATUS_FILE, LockHeld, fsync_path, hold_lock, write_atomic

from dispatcher._state import apply_delta, snapshot_as_rows

CHECKPOINT_FILE = "checkpoint.json"
JOURNAL_PATTERN = "checkpoint.{}.log"
STATUS_FILE = DISPATCHER_STATUS_FILE      # readers outside this room find it through photon.joined_horizon_us
LOCK_FILE = "dispatcher.lock"


class DispatcherLocked(RuntimeError):
    """Another live dispatcher process already owns this state folder."""


def dispatcher_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / DISPATCHER_DIR


def load_checkpoint(directory: Path) -> dict | None:
    """The last checkpoint (the snapshot with its journal's complete lines applied), or None when there is
    none yet. Its events are rows (format 1, see :func:`snapshot_as_rows`) whatever format the snapshot file
    holds: the deltas are applied to rows, each without converting the whole snapshot. A corrupt snapshot or a
    corrupt complete journal line raises (neither can be torn), because resuming without them would re-read
    or lose events; so does a snapshot of an unknown format."""
    try:
        snapshot = snapshot_as_rows(orjson.loads((directory / CHECKPOINT_FILE).read_bytes()))
    except FileNotFoundError:
        return None
    try:
        data = (directory / JOURNAL_PATTERN.format(int(snapshot.get("journal", 0)))).read_bytes()
    except FileNotFoundError:
        return snapshot
    end = data.rfind(b"\n") + 1          # past the last complete line: a torn append never counted
    for line in data[:end].splitlines():
        apply_delta(snapshot, orjson.loads(line))
    return snapshot


class CheckpointFiles:
    """Writes the checkpoint: :meth:`save_snapshot` for a full one, :meth:`append_delta` for a journal line.
    ``journal`` is the number the loaded snapshot named (0 when none). Both raise OSError on failure and may
    be called again with the same argument (an append first cuts what a failed one left)."""

    def __init__(self, directory: Path, journal: int = 0) -> None:
        self.directory = directory
        self.journal = journal
        self._fd: int | None = None
        self._size = 0            # bytes of complete, synced lines in the open journal

    def save_snapshot(self, snapshot: dict) -> None:
        number = self.journal + 1
        write_atomic(self.directory / CHECKPOINT_FILE, orjson.dumps({**snapshot, "journal": number}),
                     durable=True)
        self.close()
        self.journal = number
        for old in self.directory.glob(JOURNAL_PATTERN.format("*")):
            if old.name != JOURNAL_PATTERN.format(number):
                old.unlink(missing_ok=True)

    def append_delta(self, delta: dict) -> None:
        if self._fd is None:
            path = self.directory / JOURNAL_PATTERN.format(self.journal)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                fsync_path(self.directory)     # the new journal's name survives a power loss
            except OSError:
                os.close(fd)
                raise
            self._fd, self._size = fd, 0
        data = orjson.dumps(delta) + b"\n"
        os.ftruncate(self._fd, self._size)   # drop what a failed append may have left
        if os.pwrite(self._fd, data, self._size) != len(data):
            raise OSError(errno.ENOSPC, f"short write to the dispatcher's checkpoint journal in {self.directory}")
        os.fdatasync(self._fd)
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_status(directory: Path, stats) -> None:
    # orjson serializes the frozen dataclass as it stands (no deep copy through dataclasses.asdict)
    write_atomic(directory / STATUS_FILE, orjson.dumps(stats), durable=False)


def read_status(state_dir: str | Path) -> dict | None:
    """The region dispatcher's latest ``status.json`` as a dict, or None if it has not written one."""
    try:
        return orjson.loads((dispatcher_dir(state_dir) / STATUS_FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


class ProcessLock:
    """An exclusive lock on ``dispatcher.lock`` (:func:`photon.hold_lock`): one dispatcher per region state
    folder. The kernel releases it when the process dies, however it dies."""

    def __init__(self, directory: Path) -> None:
        try:
            self._file = hold_lock(directory / LOCK_FILE, "dispatcher")
        except LockHeld as e:
            raise DispatcherLocked(f"another dispatcher is running on {directory} ({e.describe()})") from None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
