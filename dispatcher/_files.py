"""The dispatcher's files under ``<region.state_dir>/dispatcher/``: checkpoint, status, process lock.

``checkpoint.json`` is written atomically and durably (temp file, fsync, rename, fsync of the folder);
``status.json`` atomically (temp file, rename) but without fsync: it is a view, rewritten every ~100 ms.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from photon import DISPATCHER_DIR, DISPATCHER_STATUS_FILE, LockHeld, hold_lock, write_atomic

CHECKPOINT_FILE = "checkpoint.json"
STATUS_FILE = DISPATCHER_STATUS_FILE      # readers outside this room find it through photon.joined_horizon_us
LOCK_FILE = "dispatcher.lock"


class DispatcherLocked(RuntimeError):
    """Another live dispatcher process already owns this state folder."""


def dispatcher_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / DISPATCHER_DIR


def save_checkpoint(directory: Path, snapshot: dict) -> None:
    write_atomic(directory / CHECKPOINT_FILE, orjson.dumps(snapshot), durable=True)


def load_checkpoint(directory: Path) -> dict | None:
    """The last checkpoint, or None when there is none yet. A corrupt file raises (it cannot be torn: it
    is only ever replaced by rename), because resuming without it would re-read or lose events."""
    try:
        data = (directory / CHECKPOINT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    return orjson.loads(data)


def write_status(directory: Path, stats) -> None:
    write_atomic(directory / STATUS_FILE, orjson.dumps(dataclasses.asdict(stats)), durable=False)


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
