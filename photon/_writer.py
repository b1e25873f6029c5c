"""Photon's output writer: the write side of the output contract (README "Output contract").

Files. Lines are appended to the hidden file ``<dir>/date=YYYY-MM-DD/hour=HH/.<prefix>-<start_us>-<seq>.jsonl
.inprogress`` (the partition is the UTC hour in which the file was opened, and every line of a file is
stamped, through ``write_lines(stamp=...)``, under the same lock and from the same clock reading that chose
its file, so a line's ``joined_at_us`` always lies in its file's hour). A file is published by renaming it
to ``<prefix>-<start_us>-<seq>.jsonl`` in the same folder when rolled: every ``roll_interval_s`` once
non-empty, at ``roll_bytes``, when the hour ends, and on :meth:`roll` / :meth:`close`. Published files never
change again.

The commit record ``<dir>/_committed/<prefix>.json`` (``{"writer": prefix, "at_us": t, "open":
{"<partition>/<published name>": committed_bytes}}``) is the one truth about an open file, for every reader
and for this writer's own successor: the first ``committed_bytes`` of each open file are whole lines a
reader may count; the rest is not output (yet). A record only ever vouches for durable bytes: a commit
fsyncs the open file's data first, then replaces the record durably (temporary file fsynced, renamed over
the record, folder fsynced).

Life of a line: :meth:`write_lines` (handed to the OS; returns a *ticket*) -> :meth:`sync` of that ticket
(durable and visible under the contract) -> a roll (published whole, fsynced before the rename). Commits
are grouped: a :meth:`sync` commits everything written so far, so one commit (one fsync of the data, one
of the record, one of its folder) covers every request that wrote meanwhile; :meth:`maybe_roll` commits
what nobody synced within ``commit_interval_s``.

Failures never let the record and the bytes disagree:

* a failed write is cut back (the file is as before the call) and raised;
* a failed fsync, or a record that could not be replaced: the open file is cut back to what the standing
  record vouches for and closed (published as such, or left for a later try); the lines written since
  are *lost*: :meth:`sync` raises :class:`LinesLost` for their tickets, so the caller records them (the
  joiner: its lost-ids ledger);
* a failed rename at a roll: the file, fsynced whole, stays under its hidden name, the record vouches for
  all of it, and every :meth:`maybe_roll` tries the rename again; if the record cannot say so either, the
  file is cut back to what the standing record vouches for, and the lines beyond are lost as above;
* after a crash, :meth:`recover_orphans` publishes each in-progress file of the prefix up to what its record
  vouched for, and hands the whole lines beyond it to ``set_aside`` before cutting them: whatever a reader
  could not count while the writer was down never appears later.

:attr:`error` names the last failure until :meth:`clear_error`.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson

from photon._clock import Clock, SystemClock
from photon._logs import (COMMITS_DIR, INPROGRESS, FolderNotDurable, fsync_path, inprogress_name, partition_of,
                          published_name, visible_files, write_atomic)

log = logging.getLogger("photon.logs")

MAX_LOST_RANGES = 1024
"""Ticket ranges of lost lines remembered (a caller syncs its ticket right after writing it)."""


class LinesLost(OSError):
    """The lines of a ticket were written but will never be output: a commit failed and the file was cut
    back to what its record vouched for. They are registered (the joiner's case) and must be recorded as
    lost."""


@dataclass
class RollingWriterStatistics:
    files_rolled: int = 0
    lines_written: int = 0
    bytes_written: int = 0
    commit_records_written: int = 0
    commit_record_errors: int = 0
    commits: int = 0                # group commits (fsync of data, then of the record)
    commit_failures: int = 0        # commits that failed: the lines since the last one were cut
    bytes_cut: int = 0              # bytes cut back after a failed commit
    publish_failures: int = 0       # renames at a roll that failed (tried again later)
    orphan_lines_cut: int = 0       # whole lines beyond a dead writer's record, set aside at restart


@dataclass
class Orphans:
    """What :meth:`RollingWriter.recover_orphans` did: the files it published and the whole lines it cut
    (beyond the dead writer's record: never output)."""
    published: list[Path] = field(default_factory=list)
    cut_lines: list[bytes] = field(default_factory=list)


class RollingWriter:
    """Writes Photon's output files following the output contract (see the module docstring).

    Thread-safe. ``clock`` (default the system clock) stamps lines and picks their partition."""

    def __init__(self, directory: str | Path, prefix: str, roll_interval_s: float = 60.0,
                 roll_bytes: int = 64 << 20, commit_interval_s: float = 0.05, publisher=None,
                 clock: Clock | None = None) -> None:
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
        self.error = ""
        self._clock = clock or SystemClock()
        self._start_us = time.time_ns() // 1000
        self._seq = 0
        self._f = None
        self._path: Path | None = None
        self._logical = ""          # "<partition>/<published name>" of the open file
        self._partition = ""
        self._opened_at = 0.0
        self._size = 0              # bytes written to the open file
        self._durable = 0           # bytes of the open file the standing record vouches for
        self._stuck: dict[str, tuple[Path, int]] = {}   # closed, not renamed: logical -> (path, vouched bytes)
        self._written = 0           # tickets: bytes this writer appended, all files together
        self._committed = 0         # every ticket up to here is committed or lost
        self._lost: list[tuple[int, int]] = []          # (lo, hi]: tickets whose lines were cut
        self._dirty = False
        self._last_commit = float("-inf")
        self._lock = threading.Lock()
        self._commit_done = threading.Condition(self._lock)   # notified when a commit in flight ends
        self._committing = False    # a commit's fsyncs run outside the lock (see _commit)

    # ----------------------------------------------------------------------------------------------- writing

    def write_lines(self, lines: list[bytes],
                    stamp: Callable[[int, list[bytes]], list[bytes] | bytes] | None = None) -> int:
        """Append ``lines`` (each without ``\\n``) and hand them to the OS, all or none; returns their ticket
        for :meth:`sync`. ``stamp(now_us, lines)``, if given, returns the lines to write, stamped with the
        time that also picks their file (under the writer's lock), or those lines already joined, each
        ending in ``\\n``, as one ``bytes``. A failed write (``ENOSPC``, ``EIO``) is cut
        back to the file's size before the call and raised, so a later call may simply try again."""
        if not lines:
            return 0
        with self._lock:
            now_us = self._clock.now_us()
            if self._f is not None and partition_of(now_us) != self._partition:
                self._idle()
                if self._f is not None and partition_of(now_us) != self._partition:
                    self._roll()             # the hour ended: a file never spans two partitions
            if self._f is None:
                self._open(now_us)
            n = len(lines)
            if stamp is not None:
                lines = stamp(now_us, lines)
            data = lines if type(lines) is bytes else b"\n".join(lines) + b"\n"
            f = self._f
            try:
                view, done = memoryview(data), 0
                while done < len(data):           # an unbuffered file: a short write is continued
                    done += f.write(view[done:])
            except OSError as e:
                self._set_error(f"output write failed: {e}")
                try:
                    os.ftruncate(f.fileno(), self._size)
                except OSError:
                    self._idle()
                    if self._f is f:
                        self._abandon(f"cutting back a failed write failed: {e}")
                raise
            self._size += len(data)
            self._written += len(data)
            ticket = self._written
            self._dirty = True
            self.stats.lines_written += n
            self.stats.bytes_written += len(data)
            if self._size >= self.roll_bytes:
                self._idle()
                if self._f is f and self._size >= self.roll_bytes:
                    self._roll()
            elif not self._committing and time.monotonic() - self._last_commit >= self.commit_interval_s:
                self._commit()
            return ticket

    def sync(self, ticket: int | None = None) -> None:
        """Return once the lines of ``ticket`` (default: everything written so far) are durable and committed
        (a reader counts them); raise :class:`LinesLost` if they were cut instead."""
        with self._lock:
            t = self._written if ticket is None else ticket
            tried = False
            while t > self._committed:
                if self._committing:          # a commit is in flight: it may cover t; else lead the next
                    self._commit_done.wait()
                    continue
                if tried:
                    break                     # the record could not be replaced: the standing one holds
                tried = True
                self._commit()
            if any(lo < t <= hi for lo, hi in self._lost):
                raise LinesLost(errno.EIO, f"output {self.prefix}: lines cut back after a failed commit "
                                           f"({self.error or 'see the log'})")

    def maybe_roll(self) -> None:
        """Roll if the open file is older than the roll interval or its hour ended, try again to publish
        files whose rename failed, and commit what was written if the commit is due; call this periodically
        (every ~10-20 ms for fresh readers)."""
        with self._lock:
            if self._committing:
                return                        # a commit is in flight; the next call rolls or commits
            if self._stuck:
                self._settle()
            if self._f is not None and (time.monotonic() - self._opened_at >= self.roll_interval_s
                                        or partition_of(self._clock.now_us()) != self._partition):
                self._roll()
            elif self.publisher is not None and self.publisher.statistics().pending_files:
                self.publisher.publish_pending()
            if self._dirty and time.monotonic() - self._last_commit >= self.commit_interval_s:
                self._commit()

    def flush_commits(self) -> None:
        """Commit now if lines were written since the last commit."""
        with self._lock:
            self._idle()
            if self._dirty:
                self._commit()

    def roll(self) -> None:
        """Publish the open file (and any whose rename failed before) and commit."""
        with self._lock:
            self._idle()
            if self._f is not None:
                self._roll()
            if self._stuck:
                self._settle()
            if self._dirty:
                self._commit()

    close = roll

    def clear_error(self) -> None:
        """Forget :attr:`error` (the caller saw the output folder take writes again)."""
        with self._lock:
            self.error = ""

    # ------------------------------------------------------------------------------------------- restarting

    def recover_orphans(self, set_aside: Callable[[list[bytes]], None] | None = None) -> Orphans:
        """Publish the in-progress files of this prefix a crashed writer left, each up to what its commit
        record vouched for, and reset the record (when it vouched for anything). The whole lines beyond are
        handed to ``set_aside`` (before anything is cut: if it raises, nothing is, and the error propagates)
        and cut: no reader counted them, so they are not output, ever. Call once, before writing; raises OSError
        when the folder cannot be put in order (then nothing may be written)."""
        out = Orphans()
        if not self.dir.is_dir():
            return out
        vouched = self._standing_record()
        orphans = [*self.dir.rglob(inprogress_name(f"{self.prefix}-*.jsonl")),
                   *self.dir.glob(f"{self.prefix}-*.jsonl{INPROGRESS}")]       # the older flat layout
        for p in sorted(set(orphans)):
            final = p.with_name(published_name(p.name))
            logical = final.relative_to(self.dir).as_posix()
            data = p.read_bytes()
            whole = data.rfind(b"\n") + 1
            keep = int(vouched.get(logical, 0))
            if keep > whole:
                log.critical("output %s: the record vouches for %d bytes of %s but only %d whole bytes are there",
                             self.prefix, keep, p, whole)
                keep = whole
            cut = [line for line in data[keep:whole].split(b"\n") if line]
            if cut:
                if set_aside is not None:
                    set_aside(cut)
                out.cut_lines += cut
                self.stats.orphan_lines_cut += len(cut)
                log.warning("output %s: %d whole line(s) of %s beyond its commit record were never output; "
                            "set aside as lost", self.prefix, len(cut), p)
            if keep < len(data):
                os.truncate(p, keep)
            if keep == 0:
                p.unlink()
                continue
            fsync_path(p)
            os.replace(p, final)
            fsync_path(final.parent)
            out.published.append(final)
        if self.publisher is not None:      # closed files a crashed writer had not uploaded yet
            self.publisher.publish_pending(self.dir, prefix=f"{self.prefix}-")
        with self._lock:
            self._idle()
            if vouched:
                self._write_record()
            # else the standing record (or its absence: a reader counts nothing of an open file either way)
            # vouches for nothing already, which is what the reset would write: a start with nothing to
            # recover makes no durable write (a folder and two fsyncs before a dispatcher or joiner serves)
        return out

    def _standing_record(self) -> dict:
        try:
            return dict(orjson.loads(self.commit_path.read_bytes()).get("open", {}))
        except FileNotFoundError:
            return {}
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
            raise OSError(errno.EINVAL, f"{self.commit_path} is not a commit record ({e}); move it away to "
                                        "treat every open file of this writer as uncommitted") from None

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
        for p in visible_files(self.dir, f"{self.prefix}-*.jsonl"):
            try:
                if p.stat().st_mtime_ns // 1000 >= since_us:
                    out.extend(p.read_bytes().splitlines())
            except FileNotFoundError:   # removed meanwhile by whoever consumes the output
                continue
        return out

    # ------------------------------------------------------------------------ inside the lock from here on

    def _open(self, now_us: int) -> None:
        self._partition = partition_of(now_us)
        folder = self.dir / self._partition
        folder.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        name = f"{self.prefix}-{self._start_us}-{self._seq:06d}.jsonl"
        self._logical = f"{self._partition}/{name}"
        self._path = folder / inprogress_name(name)
        self._f = open(self._path, "ab", buffering=0)   # unbuffered: a failed write leaves nothing queued
        self._opened_at = time.monotonic()
        self._size = self._durable = 0

    def _idle(self) -> None:
        """Wait (releasing the lock) until no commit is in flight: rolls, cut-backs and other record
        writes never overlap a commit's fsyncs."""
        while self._committing:
            self._commit_done.wait()

    def _commit(self) -> None:
        """Make what was written durable, then let the record vouch for it; on failure cut back (see the
        module docstring). Called with the lock held and no commit in flight.

        A group commit: the fsync of the data and the replacement of the record run with the lock released,
        so other requests append meanwhile (never rolling, cutting or rewriting the record: those wait in
        :meth:`_idle`); the record vouches for the bytes written when the commit began, and a request whose
        lines came later waits for this commit and then leads the next one, covering every line appended
        during this one.

        The data's fsync runs beside the new record's own write and fsync (``write_atomic(alongside=...)``):
        the record is renamed into place only once both are done, so it never vouches for bytes that are not
        durable, and the two fsyncs overlap instead of following each other."""
        f, path, size, written = self._f, self._path, self._size, self._written
        sync_data = f is not None and size > self._durable
        data = self._record_bytes()
        self._committing = True
        failure, record_failed = "", False
        data_failed: list[OSError] = []

        def fsync_data() -> None:
            try:
                os.fdatasync(f.fileno())
            except OSError as e:
                data_failed.append(e)
                raise
        self._lock.release()
        try:
            try:
                self._replace_record(data, alongside=fsync_data if sync_data else None)
            except OSError as e:
                if data_failed:               # the record was not replaced: the standing one holds
                    failure = f"fsync of {path} failed: {data_failed[0]}"
                else:
                    failure, record_failed = f"replacing the commit record {self.commit_path} failed: {e}", True
        finally:
            self._lock.acquire()
            self._committing = False
            self._commit_done.notify_all()
        if failure:
            if record_failed:
                self.stats.commit_record_errors += 1
                self._set_error(failure)
            if sync_data:
                self._abandon(failure)
            return
        self.stats.commit_records_written += 1
        if self._f is f and f is not None:
            self._durable = max(self._durable, size)
        self._committed = max(self._committed, written)
        self._dirty = self._written > written
        self._last_commit = time.monotonic()
        self.stats.commits += 1

    def _roll(self) -> None:
        """Publish the open file: fsync it whole, close, rename (see the module docstring for failures)."""
        f, path, logical = self._f, self._path, self._logical
        try:
            os.fdatasync(f.fileno())
        except OSError as e:
            self._abandon(f"fsync of {path} failed: {e}")
            return
        try:
            f.close()
        except OSError:
            pass                           # the data is on disk (fsynced above)
        size, vouched = self._size, self._durable
        self._f = self._path = None
        self._dirty = True                 # the record still names the file: readers then look for it published
        final = path.with_name(published_name(path.name))
        try:
            os.replace(path, final)
        except OSError as e:
            self.stats.publish_failures += 1
            self._set_error(f"publishing {path} failed: {e}")
            self._stuck[logical] = (path, size)      # fsynced whole: the record may vouch for all of it
            try:
                self._write_record()
            except OSError:
                self._stuck[logical] = (path, vouched)
                self._cut_stuck(path, vouched, size)
                return
            self._committed = self._written
            return
        try:
            fsync_path(final.parent)
        except OSError as e:
            self._set_error(f"fsync of {final.parent} failed after publishing {final.name}: {e}")
        if self.publisher is not None:
            self.publisher.publish(final, logical)
        self.stats.files_rolled += 1
        self._committed = self._written

    def _abandon(self, reason: str) -> None:
        """A commit failed: cut the open file back to what the standing record vouches for, close it (it is
        published as such, now or by a later try) and mark every uncommitted ticket lost."""
        self._set_error(reason)
        self.stats.commit_failures += 1
        if self._f is None:
            self._mark_lost()
            return
        path, logical, size, vouched = self._path, self._logical, self._size, self._durable
        try:
            self._f.close()
        except OSError:
            pass
        self._f = self._path = None
        self._stuck[logical] = (path, vouched)
        self._cut_stuck(path, vouched, size)
        self._settle()

    def _cut_stuck(self, path: Path, vouched: int, size: int) -> None:
        try:
            os.truncate(path, vouched)      # a failure is retried by _settle before any rename
        except OSError as e:
            log.error("output %s: cutting %s back to %d bytes failed (%s); tried again before publishing it",
                      self.prefix, path, vouched, e)
        self.stats.bytes_cut += size - vouched
        log.error("output %s: %s; %d byte(s) written since the last commit of %s are cut and lost",
                  self.prefix, self.error, size - vouched, path)
        self._mark_lost()

    def _mark_lost(self) -> None:
        if self._written > self._committed:
            self._lost.append((self._committed, self._written))
            del self._lost[:-MAX_LOST_RANGES]
        self._committed = self._written
        self._dirty = True

    def _settle(self) -> None:
        """Publish the closed files whose rename failed (each cut to what the record vouched for first)."""
        for logical, (path, vouched) in list(self._stuck.items()):
            final = path.with_name(published_name(path.name))
            try:
                if path.exists():
                    if vouched == 0:
                        path.unlink()
                    else:
                        if path.stat().st_size > vouched:
                            os.truncate(path, vouched)
                        fsync_path(path)
                        os.replace(path, final)
                        fsync_path(final.parent)
                        self.stats.files_rolled += 1
            except OSError as e:
                self._set_error(f"publishing {path} failed: {e}")
                continue
            del self._stuck[logical]
            self._dirty = True
            if vouched and self.publisher is not None and final.exists():
                self.publisher.publish(final, logical)
            log.info("output %s: published %s after an earlier failure", self.prefix, final)

    def _record_bytes(self) -> bytes:
        """The commit record for what is vouched for now: the open file up to its size, and closed files
        whose rename failed."""
        record = {name: n for name, (_, n) in self._stuck.items() if n > 0}
        if self._f is not None and self._size > 0:
            record[self._logical] = self._size
        return orjson.dumps({"writer": self.prefix, "at_us": self._clock.now_us(), "open": record})

    def _replace_record(self, data: bytes, alongside=None) -> None:
        """Replace the commit record with ``data`` durably (its folder made at the first write, or again
        if it went away), once ``alongside`` (run beside the record's write, see :func:`write_atomic`) has
        returned. A failing fsync of the folder after the rename only sets :attr:`error`."""
        try:
            try:
                write_atomic(self.commit_path, data, durable=True, alongside=alongside)
            except FileNotFoundError:
                self.commit_path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(self.commit_path, data, durable=True, alongside=alongside)
        except FolderNotDurable as e:
            self._set_error(str(e))

    def _write_record(self) -> None:
        """Replace the commit record durably with what is vouched for now, the lock held (outside commits).
        Raises OSError when the record is not replaced (the standing one holds); once it is, a failing fsync
        of the folder is only logged (its bytes are durable; the rename itself may not survive a power
        loss, which leaves the older record, vouching for less)."""
        try:
            self._replace_record(self._record_bytes())
        except OSError as e:
            self.stats.commit_record_errors += 1
            self._set_error(f"replacing the commit record {self.commit_path} failed: {e}")
            raise
        self.stats.commit_records_written += 1

    def _set_error(self, reason: str) -> None:
        if reason != self.error:
            log.warning("output %s: %s", self.prefix, reason)
        self.error = reason
