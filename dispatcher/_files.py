"""The dispatcher's files under ``<region.state_dir>/dispatcher/``: checkpoint, journal, status, process lock.

The checkpoint is ``checkpoint.json`` (a full snapshot, written atomically and durably: temp file, fsync,
rename, fsync of the folder) plus its journal ``checkpoint.<n>.log`` (``n`` named in the snapshot's
``"journal"``): one record per delta, each appended and fdatasynced before the next one is written: the delta
as one JSON line, followed, when it holds its events' raw lines as bytes (format 3, :func:`encode_delta`), by
those lines as they are (``"added"``'s ``"raws"`` in the JSON line is then their byte count) and a ``\n``. A
full snapshot names a new journal number, so the journal of the previous one is never read again (it is
removed afterwards). A crash during an append leaves a last record without its final ``\n`` (or shorter than
its byte count says): that delta never counted, and loading ignores it; every process start writes a full
snapshot first, so nothing is ever appended after a torn record. ``status.json`` is written atomically (temp
file, rename) but without fsync: it is a view, rewritten every ~100 ms.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson

from photon import DISPATCHER_DIR, DISPATCHER_STATUS_FILE, LockHeld, fsync_path, hold_lock, write_atomic


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
    # (the core imported here, not with this module: reading a status, as the launcher does while the services
    # start, needs none of it)
    from dispatcher._state import apply_delta, snapshot_as_rows
    try:
        snapshot = snapshot_as_rows(orjson.loads((directory / CHECKPOINT_FILE).read_bytes()))
    except FileNotFoundError:
        return None
    try:
        data = (directory / JOURNAL_PATTERN.format(int(snapshot.get("journal", 0)))).read_bytes()
    except FileNotFoundError:
        return snapshot
    for delta in decode_journal(data):
        apply_delta(snapshot, delta)
    return snapshot


def encode_delta(delta: dict) -> bytes:
    """The journal record of ``delta``: its JSON line, and when its events' raw lines are bytes (format 3),
    those bytes as they are after it, with their byte count in the JSON line's place for them, and a ``\n``.
    The lines are neither decoded nor escaped as a JSON string (``orjson`` escaping every quote of a JSON line
    cost more than the rest of the delta together)."""
    added = delta.get("added")
    raws = added.get("raws") if added is not None else None
    if type(raws) is not bytes:
        return orjson.dumps(delta) + b"\n"
    return b"".join((orjson.dumps({**delta, "added": {**added, "raws": len(raws)}}), b"\n", raws, b"\n"))


def decode_journal(data: bytes) -> list[dict]:
    """The deltas of a journal's complete records, in order (see :func:`encode_delta`; lines of formats 1 and
    2 are JSON lines alone). A torn last record (a JSON line without its ``\n``, or raw lines shorter than
    their byte count or without their ``\n``) never counted and is left out; a complete record that does not
    parse raises."""
    deltas = []
    at, size = 0, len(data)
    while (end := data.find(b"\n", at)) >= 0:
        delta = orjson.loads(data[at:end])
        at = end + 1
        added = delta.get("added")
        if added is not None and type(raws := added.get("raws")) is int:
            if at + raws >= size:                 # torn: the lines or their \n not all written
                break
            if data[at + raws] != 0x0A:
                raise ValueError(f"a dispatcher journal record's raw lines do not end where its byte count says "
                                 f"(at byte {at + raws})")
            added["raws"] = data[at:at + raws]
            at += raws + 1
        deltas.append(delta)
    return deltas


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
        data = encode_delta(delta)
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
