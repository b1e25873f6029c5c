"""JSON-lines logs: tailing growing input files, quarantining bad records, writing rolled output files.

Input contract (DESIGN §3): one JSON object per line, terminated by ``\\n``; files only grow and new files
appear; a last line without ``\\n`` is not written yet and is not read. Offsets are byte positions of the
next unread byte, i.e. just past the last consumed ``\\n``: resuming at an offset never re-reads a consumed
line and never skips an unconsumed one.
"""
from __future__ import annotations

import fcntl
import fnmatch
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add
from pathlib import Path
from typing import Iterable, Mapping

import orjson

INPROGRESS = ".inprogress"

log = logging.getLogger("photon.logs")


@dataclass(slots=True)
class LogChunk:
    """Complete lines read from one file: ``lines[i]`` (without ``\\n``) starts at ``offsets[i]``;
    ``end`` is the offset just past the last line's ``\\n``. ``data``, when the reader kept it: the bytes the
    lines were split from, starting with them, each followed by its ``\\n`` (bytes after ``end`` may follow):
    what keeps the lines as they were read needs not join them again (the event store's cache cuts its
    blocks from it). The tailer keeps it only when every line of the chunk is valid UTF-8 (it checked the
    bytes whole), so a reader of a chunk with ``data`` needs not check that again."""
    file: str
    offsets: list[int]
    lines: list[bytes]
    end: int
    data: bytes | None = field(default=None, compare=False, repr=False)


def line_offsets(start: int, lines: list[bytes]) -> list[int]:
    """Where each of ``lines`` (consecutive, each without its ``\\n``) starts, the first at ``start``."""
    offsets = list(accumulate(map(add, map(len, lines), repeat(1)), initial=start))   # in C: no Python step per line
    offsets.pop()
    return offsets


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder by path: a file's dirty pages (also those written through a shared mmap),
    or a folder's entries (what makes a create or rename in it survive a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FolderNotDurable(OSError):
    """:func:`write_atomic` replaced the file, but the fsync of its folder failed: readers see the new file,
    and a power loss may bring the old one back."""


def folder_unmade(folder: str | Path) -> str | None:
    """Make ``folder`` and its parents: None when it is there, else why it cannot be (a file in its place or
    in one of its parents' places, or the error's reason), for a message that names the setting it came from."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return None
    except OSError as e:
        in_way = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        return f"{in_way} is a file, not a folder" if in_way else f"cannot make folder {folder}: {e.strerror or e}"


class _Alongside:
    """Two helper threads per process that run a call while the caller goes on (``run`` returns its future):
    the fsync that must precede a rename, run while the renamed file's own bytes are written and fsynced. Made
    on first use; a forked child drops its parent's pool (``os.register_at_fork``) and makes its own. While the
    interpreter shuts down (no new work is taken by such a pool then), the call runs at once on the caller's
    thread instead."""

    _pool = None
    _lock = threading.Lock()

    @classmethod
    def _forget(cls) -> None:
        cls._pool, cls._lock = None, threading.Lock()

    @classmethod
    def run(cls, fn):
        from concurrent.futures import Future, ThreadPoolExecutor
        with cls._lock:
            if cls._pool is None:
                cls._pool = ThreadPoolExecutor(2, thread_name_prefix="photon-alongside")
            try:
                return cls._pool.submit(fn)
            except RuntimeError:          # shutting down: run it here, before the caller's own write
                pass
        done = Future()
        try:
            done.set_result(fn())
        except BaseException as e:        # handed to the caller through the future, as from the pool
            done.set_exception(e)
        return done


os.register_at_fork(after_in_child=_Alongside._forget)


def write_atomic(path: str | Path, data: bytes, *, durable: bool = False, alongside=None) -> None:
    """Replace ``path`` with ``data`` so readers see the old file or the new one, never a torn one
    (temp file + rename; a failure before the rename leaves the old file and no temp file). ``durable``:
    also fsync the file and its folder, so it survives a power loss; a failing fsync of the folder after
    the rename raises :class:`FolderNotDurable` (the new file is in place).

    ``alongside``: a call that must have returned before the new file may replace the old one (an fsync of
    the data the new file vouches for). It runs on a helper thread while the temp file is written and
    fsynced, so the two fsyncs overlap (a file system commits both in one journal commit where it can); the
    rename waits for both. If it raises, the temp file is removed and its exception raised: the old file
    stands."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pending = _Alongside.run(alongside) if alongside is not None else None
    try:
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
        finally:
            if pending is not None:
                pending.result()         # raises what the call raised (after the temp file's own outcome)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    if durable:
        try:
            fsync_path(path.parent)
        except OSError as e:
            raise FolderNotDurable(e.errno, f"{path} replaced, but the fsync of {path.parent} failed: "
                                            f"{e.strerror}") from e


def list_log_files(root: Path) -> list[str]:
    """Every file below ``root`` (any depth), as paths relative to ``root``, sorted; in-progress files of
    a writer that publishes by renaming are skipped."""
    out: list[str] = []
    if not root.is_dir():
        return out
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except FileNotFoundError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(Path(e.path))
            elif e.is_file() and not e.name.endswith(INPROGRESS) and not e.name.startswith("."):
                out.append(os.path.relpath(e.path, root))
    out.sort()
    return out


class Quarantine:
    """Bad records: counted and appended to ``<dir>/<name>.jsonl``, one JSON object per record with the
    file, byte offset, reason and the raw line. Never raises on a bad record; the good ones go on. A failed
    write (disk full) raises OSError and leaves nothing of that entry behind, so the caller may try again.

    ``shared``: several readers, in this process or others on this machine, may report the same input line
    (an input moved to a new owner while its old owner still reads, or read again after a restart): each
    entry is written once per (file, offset). Every :meth:`add` then holds an exclusive ``flock`` on the file,
    takes in the entries appended since its last look (by anyone), and skips one already there."""

    def __init__(self, directory: str | Path, name: str, publisher=None, *, shared: bool = False) -> None:
        self.path = Path(directory) / f"{name}.jsonl"
        self.publisher = publisher
        """Given (an :class:`photon.S3Publisher`), the file is uploaded whole by :meth:`sync` and on close."""
        self.shared = shared
        self._synced = -1
        self.count = 0
        self.repeats_skipped = 0
        self._known: set[tuple[str, int]] = set()
        self._present: set[tuple[str, int]] = set()   # shared: every entry in the file up to ``_seen``
        self._seen = 0
        self._f = None
        self._lock = threading.Lock()

    def skip_known(self, resume_offsets: Mapping[str, int] | None = None) -> int:
        """Call before a restarted reader reads again from ``resume_offsets`` (file -> byte offset; a file
        not named is read from 0): the entries this quarantine already holds at or past those offsets will
        be reported again, and :meth:`add` skips them (once each) instead of writing them twice.
        Returns how many entries are remembered."""
        resume = resume_offsets or {}
        known: set[tuple[str, int]] = set()
        if self.path.exists():
            with open(self.path, "r+b") as f:
                data = f.read()
                if data and not data.endswith(b"\n"):   # a crash tore the last entry: cut it off
                    f.truncate(data.rfind(b"\n") + 1)
            for line in data[: data.rfind(b"\n") + 1].splitlines():
                try:
                    entry = orjson.loads(line)
                    key = (entry["file"], int(entry["offset"]))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue   # not an entry this class wrote: leave it be
                if key[1] >= resume.get(key[0], 0):
                    known.add(key)
        with self._lock:
            self._known = known
        return len(known)

    def add(self, file: str, offset: int, reason: str, raw: bytes) -> None:
        entry = {"file": file, "offset": offset, "reason": reason,
                 "raw": raw.decode("utf-8", errors="replace"), "at_us": time.time_ns() // 1000}
        with self._lock:
            if self._known and (file, offset) in self._known:
                self._known.discard((file, offset))
                self.repeats_skipped += 1
                return
            if self._f is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._f = open(self.path, "a+b", buffering=0)
            if not self.shared:
                self._append(orjson.dumps(entry) + b"\n")
                return
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX)
            try:
                self._take_in_appended()
                if (file, offset) in self._present:
                    self.repeats_skipped += 1
                    return
                self._append(orjson.dumps(entry) + b"\n")
                self._present.add((file, offset))
                self._seen = os.fstat(self._f.fileno()).st_size
            finally:
                fcntl.flock(self._f.fileno(), fcntl.LOCK_UN)

    def _append(self, data: bytes) -> None:
        size = os.fstat(self._f.fileno()).st_size
        try:                                  # all or nothing: a failed write (disk full) is cut off
            done = 0
            while done < len(data):
                done += self._f.write(data[done:])
        except OSError:
            os.ftruncate(self._f.fileno(), size)
            raise
        self.count += 1

    def _take_in_appended(self) -> None:
        """Shared: add the (file, offset) of every whole entry appended since the last look to ``_present``.
        A torn last entry (a writer killed mid-write) is cut off: nobody writes without the lock held."""
        fd = self._f.fileno()
        size = os.fstat(fd).st_size
        if size < self._seen:                 # cut short by someone else's failed write: read it all again
            self._present.clear()
            self._seen = 0
        if size == self._seen:
            return
        data = os.pread(fd, size - self._seen, self._seen)
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            os.ftruncate(fd, self._seen + whole)
        for line in data[:whole].splitlines():
            try:
                entry = orjson.loads(line)
                self._present.add((entry["file"], int(entry["offset"])))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue   # not an entry this class wrote: leave it be
        self._seen += whole

    def sync(self) -> None:
        """Upload the quarantine file if it has entries not uploaded yet (no-op without a publisher)."""
        if self.publisher is None:
            return
        with self._lock:
            if self.count == self._synced or not self.path.exists():
                return
            count = self.count
        if self.publisher.upload(self.path):
            self._synced = count

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None
        self.sync()


def parse_record(raw: bytes, required: Iterable[str]) -> tuple[dict | None, str | None]:
    """``(event, None)`` for a JSON object with every required field as a string, else ``(None, reason)``."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return None, f"not valid JSON: {e}"
    if not isinstance(event, dict):
        return None, f"not a JSON object but {type(event).__name__}"
    for name in required:
        value = event.get(name)
        if value is None:
            return None, f"missing field {name!r}"
        if not isinstance(value, str):
            return None, f"field {name!r} is {type(value).__name__}, not a string"
    return event, None


COMMITS_DIR = "_committed"
"""Folder (under an output folder) of the writers' commit records: ``<prefix>.json`` each."""


def partition_of(time_us: int) -> str:
    """The output partition of a file opened at ``time_us`` (UTC): ``date=YYYY-MM-DD/hour=HH``."""
    return time.strftime("date=%Y-%m-%d/hour=%H", time.gmtime(time_us // 1_000_000))


def is_hidden(rel: str) -> bool:
    """A name or ``/``-separated path with a part starting with ``_`` or ``.``: commit records, compaction
    records, files in progress, staging. Readers of a folder (Spark included) skip these."""
    return any(part.startswith(("_", ".")) for part in rel.split("/"))


def inprogress_name(published_name: str) -> str:
    """The hidden name a file has while it is written: ``.<name>.inprogress``."""
    return f".{published_name}{INPROGRESS}"


def published_name(name: str) -> str:
    """The published name of an in-progress file (inverse of :func:`inprogress_name`; the older flat
    ``<name>.inprogress`` form is understood too)."""
    name = name[: -len(INPROGRESS)] if name.endswith(INPROGRESS) else name
    return name[1:] if name.startswith(".") else name


def visible_files(root: Path, pattern: str) -> list[Path]:
    """Files matching ``pattern`` below ``root`` whose path has no part starting with ``_`` or ``.`` (what a
    folder-listing reader such as Spark sees)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not is_hidden(d)]
        out += [Path(dirpath) / f for f in fnmatch.filter(filenames, pattern) if not is_hidden(f)]
    return sorted(out)


def wait_until(predicate, timeout: float, interval: float = 0.02, message="condition") -> None:
    """Poll ``predicate`` until it is true; raise ``TimeoutError`` naming ``message`` after ``timeout`` s
    (``message`` may be a callable, called then: what was last seen)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for "
                               f"{message() if callable(message) else message}")
        time.sleep(interval)
