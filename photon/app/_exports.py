"""The registry exports ``photon verify`` and ``photon recover`` take under ``[verify].out_dir``: which stay
and which go.

Every run takes its export into a new folder ``<out_dir>/export-<random>/`` and holds a shared lock on the
folder's ``.in-use`` file from before the export's first byte to its end (:func:`using`; ``flock``, which
the kernel releases however the run ends, SIGKILL included). A run given ``--export DIR`` of such a folder
holds the same lock on it. Once the run has its report, it writes ``_report.json`` into its export (the
report's counts and when it finished: what the export was compared against; :func:`mark_finished`), then
prunes the folder (:func:`prune`):

* the exports of the newest ``[verify].keep_exports`` finished runs stay (default 1: the one the last
  report's ``export_dir`` names; 0 keeps every one), the one this run used among them;
* an older finished run's export is removed, under an exclusive lock taken without waiting: one that
  another run holds (a ``--export`` run reading it) is left for a later prune. A run that opens it while
  it is being removed finds it gone and says so (:class:`ExportGone`), never half a folder;
* an export without ``_report.json`` is never removed: its run is still going (it holds the lock) or ended
  without a report (crashed, killed, interrupted, or failed on its input), and whoever looks into that
  may want it. Every later run names such folders and their size (:attr:`Pruned.unfinished`), so they do
  not pile up unseen.

Folders under ``out_dir`` not named ``export-*`` (``recoverable/``, ``job-registry/``, intent files) are
never touched.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from photon import write_atomic

PREFIX = "export-"
IN_USE = ".in-use"
REPORT = "_report.json"


class ExportGone(OSError):
    """The export folder was removed (by another run's prune) before this run could hold it."""


@dataclass(frozen=True)
class Pruned:
    """What :func:`prune` did: the folders it removed, the finished ones it kept (this run's first), those a
    run holds now (running, or a finished one being read), and the exports no run holds that no finished
    run's report names (their runs ended without one), with their bytes."""
    removed: tuple = ()
    kept: tuple = ()
    in_use: tuple = ()
    unfinished: tuple = ()
    unfinished_bytes: int = 0
    errors: tuple = ()


def is_own(export_dir: Path, out_dir: Path) -> bool:
    """True when ``export_dir`` is one of the run exports under ``out_dir`` (the only ones pruned)."""
    export_dir, out_dir = Path(export_dir).absolute(), Path(out_dir).absolute()
    return export_dir.parent == out_dir and export_dir.name.startswith(PREFIX)


@contextmanager
def using(export_dir: Path):
    """Hold ``export_dir``'s shared in-use lock for the body (waits while a prune removes it; then raises
    :class:`ExportGone`)."""
    try:
        f = open(Path(export_dir) / IN_USE, "a")
    except FileNotFoundError:
        raise ExportGone(f"{export_dir}: no such registry export (a finished run's export is removed by a "
                         f"later run once [verify].keep_exports newer ones are kept)") from None
    try:
        fcntl.flock(f, fcntl.LOCK_SH)
        if not Path(export_dir).is_dir():
            raise ExportGone(f"{export_dir}: the registry export was removed by another run while this one "
                             f"waited for it")
        yield
    finally:
        f.close()


def mark_finished(export_dir: Path, report: dict) -> None:
    """Record in ``export_dir`` that a run finished comparing against it, with its report (durably)."""
    body = {"finished_at_us": time.time_ns() // 1000, "pid": os.getpid(), "report": report}
    write_atomic(Path(export_dir) / REPORT, json.dumps(body, indent=1, sort_keys=True).encode(), durable=True)


def _finished_at(folder: Path) -> int | None:
    try:
        return int(json.loads((folder / REPORT).read_text())["finished_at_us"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def folder_bytes(folder: str | Path) -> int:
    """The bytes of every file under ``folder`` (files that vanish meanwhile count nothing)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


@contextmanager
def _unused(folder: Path):
    """Try ``folder``'s in-use lock without waiting: yields True holding it (no run holds the export), False when
    a run holds it, None when the folder (or its lock file) cannot be opened, e.g. gone meanwhile."""
    try:
        f = open(folder / IN_USE, "a")
    except OSError:
        yield None
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _remove_if_unused(folder: Path) -> bool | None:
    """Remove ``folder`` under its exclusive in-use lock: True removed, False held by a run, None gone."""
    with _unused(folder) as free:
        if free:
            shutil.rmtree(folder)
        return free


def _held(folder: Path) -> bool:
    """True while a run holds ``folder``'s in-use lock (taken and dropped at once to find out)."""
    with _unused(folder) as free:
        return free is False


def prune(out_dir: Path, keep: int, current: Path | None = None) -> Pruned:
    """Remove the exports under ``out_dir`` of finished runs older than the newest ``keep`` (0: none is
    removed); ``current`` (this run's export) always stays. See the module docstring."""
    out_dir = Path(out_dir)
    current = Path(current).absolute() if current is not None else None
    finished, unfinished, running = [], [], []
    for folder in sorted(out_dir.glob(PREFIX + "*")) if out_dir.is_dir() else []:
        if not folder.is_dir() or folder.absolute() == current:
            continue
        at = _finished_at(folder)
        if at is not None:
            finished.append((at, folder))
        elif _held(folder):
            running.append(folder)
        else:
            unfinished.append(folder)
    finished.sort(key=lambda x: x[0], reverse=True)
    newest = len(finished) if keep == 0 else max(0, keep - (current is not None and _finished_at(current) is not None))
    kept = [f for _, f in finished[:newest]]
    removed, in_use, errors = [], running, []
    for _, folder in finished[newest:]:
        try:
            done = _remove_if_unused(folder)
        except OSError as e:
            errors.append(f"{folder}: {e.strerror or e}")
            continue
        if done:
            removed.append(folder)
        elif done is False:
            in_use.append(folder)
    if current is not None:
        kept.insert(0, current)
    return Pruned(removed=tuple(map(str, removed)), kept=tuple(map(str, kept)), in_use=tuple(map(str, in_use)),
                  unfinished=tuple(map(str, unfinished)), unfinished_bytes=sum(map(folder_bytes, unfinished)),
                  errors=tuple(errors))
