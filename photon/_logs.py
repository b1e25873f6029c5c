"""JSON-lines logs: tailing growing input files, quarantining bad records, writing rolled output files.

Input contract (DESIGN §3): one JSON object per line, terminated by ``\\n``; files only grow and new files
appear; a last line without ``\\n`` is not written yet and is not read. Offsets are byte positions of the
next unread byte, i.e. just past the last consumed ``\\n``: resuming at an offset never re-reads a consumed
line and never skips an unconsumed one.
"""
from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import orjson

INPROGRESS = ".inprogress"

log = logging.getLogger("photon.logs")


@dataclass(slots=True)
class LogChunk:
    """Complete lines read from one file: ``lines[i]`` (without ``\\n``) starts at ``offsets[i]``;
    ``end`` is the offset just past the last line's ``\\n``."""
    file: str
    offsets: list[int]
    lines: list[bytes]
    end: int


def line_offsets(start: int, lines: list[bytes]) -> list[int]:
    """Where each of ``lines`` (consecutive, each without its ``\\n``) starts, the first at ``start``."""
    offsets, pos = [], start
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    return offsets


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder by path: a file's dirty pages (also those written through a shared mmap),
    or a folder's entries (what makes a create or rename in it survive a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` so readers see the old file or the new one, never a torn one
    (temp file + rename). ``durable``: also fsync the file and its folder, so it survives a power loss."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_path(path.parent)


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
    write (disk full) raises OSError and leaves nothing of that entry behind, so the caller may try again."""

    def __init__(self, directory: str | Path, name: str, publisher=None) -> None:
        self.path = Path(directory) / f"{name}.jsonl"
        self.publisher = publisher
        """Given (an :class:`photon.S3Publisher`), the file is uploaded whole by :meth:`sync` and on close."""
        self._synced = -1
        self.count = 0
        self.repeats_skipped = 0
        self._known: set[tuple[str, int]] = set()
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
                self._f = open(self.path, "ab", buffering=0)
            data = orjson.dumps(entry) + b"\n"
            size = os.fstat(self._f.fileno()).st_size
            try:                                  # all or nothing: a failed write (disk full) is cut off
                done = 0
                while done < len(data):
                    done += self._f.write(data[done:])
            except OSError:
                os.ftruncate(self._f.fileno(), size)
                raise
            self.count += 1

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


@dataclass
class RollingWriterStatistics:
    files_rolled: int = 0
    lines_written: int = 0
    bytes_written: int = 0
    commit_records_written: int = 0
    commit_record_errors: int = 0


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


def _visible_files(root: Path, pattern: str) -> list[Path]:
    """Files matching ``pattern`` below ``root`` whose path has no part starting with ``_`` or ``.`` (what a
    folder-listing reader such as Spark sees)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not is_hidden(d)]
        out += [Path(dirpath) / f for f in fnmatch.filter(filenames, pattern) if not is_hidden(f)]
    return sorted(out)


class RollingWriter:
    """Writes Photon's output files following the output contract (README "Output contract").

    Lines are appended to the hidden file ``<dir>/date=YYYY-MM-DD/hour=HH/.<prefix>-<start_us>-<seq>.jsonl
    .inprogress`` (the partition is the UTC hour in which the file was opened, i.e. join time; a file never
    spans two hours). It is published by renaming it to ``<prefix>-<start_us>-<seq>.jsonl`` in the same
    folder when rolled: every ``roll_interval_s`` once non-empty, at ``roll_bytes``, when the hour ends, and
    on :meth:`roll` / :meth:`close`. Published files never change again.

    Commit record: ``<dir>/_committed/<prefix>.json``, replaced atomically, ``{"writer": prefix, "at_us": t,
    "open": {"<partition>/<published name>": committed_bytes}}``: the first ``committed_bytes`` of each open
    file are whole lines a reader may count. It is rewritten after a write at most every
    ``commit_interval_s`` (a write sooner than that leaves it to :meth:`flush_commits`, which
    :meth:`maybe_roll` calls: call it every ~10-20 ms) and after a roll.

    ``write_lines`` flushes to the OS before returning: a process crash after it returns loses nothing
    (a machine crash may; the pipeline's verification job covers that window). :meth:`recover_orphans`
    publishes the in-progress files a crashed writer with the same prefix left, cutting a torn last line.
    """

    def __init__(self, directory: str | Path, prefix: str, roll_interval_s: float = 60.0,
                 roll_bytes: int = 64 << 20, commit_interval_s: float = 0.05, publisher=None) -> None:
        self.dir = Path(directory)
        self.publisher = publisher
        """Given (an :class:`photon.S3Publisher`), each published file is uploaded as
        ``<partition>/<name>`` and removed locally."""
        self.prefix = prefix
        self.roll_interval_s = roll_interval_s
        self.roll_bytes = roll_bytes
        self.commit_interval_s = commit_interval_s
        self.commit_path = self.dir / COMMITS_DIR / f"{prefix}.json"
        self.stats = RollingWriterStatistics()
        self._start_us = time.time_ns() // 1000
        self._seq = 0
        self._f = None
        self._path: Path | None = None
        self._logical = ""          # "<partition>/<published name>" of the open file
        self._partition = ""
        self._opened_at = 0.0
        self._size = 0
        self._dirty = False
        self._last_commit = float("-inf")
        self._lock = threading.Lock()

    def recover_orphans(self) -> list[Path]:
        """Publish the in-progress files of this prefix a crashed writer left (torn last line cut, empty
        ones removed) and reset this prefix's commit record. Call once, before writing."""
        published = []
        if not self.dir.is_dir():
            return published
        orphans = [*self.dir.rglob(inprogress_name(f"{self.prefix}-*.jsonl")),
                   *self.dir.glob(f"{self.prefix}-*.jsonl{INPROGRESS}")]       # the older flat layout
        for p in sorted(set(orphans)):
            data = p.read_bytes()
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                with open(p, "r+b") as f:
                    f.truncate(cut)
            final = p.with_name(published_name(p.name))
            if cut == 0:
                p.unlink()
                continue
            os.replace(p, final)
            published.append(final)
        if self.publisher is not None:      # closed files a crashed writer had not uploaded yet
            self.publisher.publish_pending(self.dir, prefix=f"{self.prefix}-")
        with self._lock:
            self._write_commit_record()
        return published

    def lines_written_since(self, since_us: int) -> list[bytes]:
        """The lines of this prefix's published files last modified at or after ``since_us`` (wall clock,
        µs): what an earlier run wrote since then, for a restarted writer that may be asked to write
        them again. Call after :meth:`recover_orphans`."""
        out: list[bytes] = []
        if self.publisher is not None:
            for o in self.publisher.objects():
                base = o.name.rsplit("/", 1)[-1]
                if base.startswith(f"{self.prefix}-") and base.endswith(".jsonl") and int(o.version) >= since_us:
                    out.extend(self.publisher.read(o.name).splitlines())
        if not self.dir.is_dir():
            return out
        for p in _visible_files(self.dir, f"{self.prefix}-*.jsonl"):
            try:
                if p.stat().st_mtime_ns // 1000 >= since_us:
                    out.extend(p.read_bytes().splitlines())
            except FileNotFoundError:   # removed meanwhile by whoever consumes the output
                continue
        return out

    def write_lines(self, lines: list[bytes]) -> None:
        """Append ``lines`` (each without ``\\n``) and hand them to the OS, all or none: when the write
        fails (``ENOSPC``, ``EIO``) the file is cut back to its size before the call and the error is raised,
        so no torn or partial line stays behind and a later call may simply try again."""
        if not lines:
            return
        data = b"\n".join(lines) + b"\n"
        with self._lock:
            if self._f is not None and partition_of(time.time_ns() // 1000) != self._partition:
                self._roll()                 # the hour ended: a file never spans two partitions
            if self._f is None:
                self._open()
            try:
                view, done = memoryview(data), 0
                while done < len(data):           # an unbuffered file: a short write is continued
                    done += self._f.write(view[done:])
            except OSError:
                os.ftruncate(self._f.fileno(), self._size)
                raise
            self._size += len(data)
            self._dirty = True
            self.stats.lines_written += len(lines)
            self.stats.bytes_written += len(data)
            if self._size >= self.roll_bytes:
                self._roll()
            elif time.monotonic() - self._last_commit >= self.commit_interval_s:
                self._write_commit_record()

    def maybe_roll(self) -> None:
        """Roll if the current file is older than the roll interval or its hour ended, and publish the
        commit record if it is due; call this periodically (every ~10-20 ms for fresh readers)."""
        with self._lock:
            if self._f is not None and (time.monotonic() - self._opened_at >= self.roll_interval_s
                                        or partition_of(time.time_ns() // 1000) != self._partition):
                self._roll()
            elif self.publisher is not None and self.publisher.statistics().pending_files:
                self.publisher.publish_pending()
            if self._dirty and time.monotonic() - self._last_commit >= self.commit_interval_s:
                self._write_commit_record()

    def flush_commits(self) -> None:
        """Publish the commit record now if lines were written since it was last published."""
        with self._lock:
            if self._dirty:
                self._write_commit_record()

    def roll(self) -> None:
        with self._lock:
            if self._f is not None:
                self._roll()
            if self._dirty:
                self._write_commit_record()

    close = roll

    def _open(self) -> None:
        now_us = time.time_ns() // 1000
        self._partition = partition_of(now_us)
        folder = self.dir / self._partition
        folder.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        name = f"{self.prefix}-{self._start_us}-{self._seq:06d}.jsonl"
        self._logical = f"{self._partition}/{name}"
        self._path = folder / inprogress_name(name)
        self._f = open(self._path, "ab", buffering=0)   # unbuffered: a failed write leaves nothing queued
        self._opened_at = time.monotonic()
        self._size = 0

    def _roll(self) -> None:
        self._f.close()
        final = self._path.with_name(published_name(self._path.name))
        os.replace(self._path, final)
        if self.publisher is not None:
            self.publisher.publish(final, f"{self._partition}/{final.name}")
        self.stats.files_rolled += 1
        self._f = None
        self._path = None
        self._dirty = True          # the record still names the file: readers then look for it published

    def _write_commit_record(self) -> None:
        """Replace the commit record (caller holds the lock). A failure (e.g. a full disk) is counted and
        logged; the lines stay written and the record is retried on the next call."""
        record = {"writer": self.prefix, "at_us": time.time_ns() // 1000,
                  "open": {self._logical: self._size} if self._f is not None else {}}
        try:
            self.commit_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.commit_path, orjson.dumps(record))
        except OSError as e:
            self.stats.commit_record_errors += 1
            log.warning("output %s: publishing the commit record %s failed: %s", self.prefix, self.commit_path, e)
            return
        self.stats.commit_records_written += 1
        self._dirty = False
        self._last_commit = time.monotonic()


def wait_until(predicate, timeout: float, interval: float = 0.02, message: str = "condition") -> None:
    """Poll ``predicate`` until it is true; raise ``TimeoutError`` naming ``message`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)
