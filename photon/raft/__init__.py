"""Durable Raft storage for pysyncobj, shared by every replicated room (the IdRegistry's replicas and the
MillWheel master): a layer of its own above the base, like :mod:`photon.rpc`, because the base stays free of
pysyncobj.

pysyncobj keeps its term and vote in a small file it rewrites in place without fsync, and writes its journal
through a memory map that it grows sparsely. Importing this module installs, once for the process:

* :class:`DurableMetaStorer`: the term/vote/commit-index record written as temp file, fsync, rename, folder
  fsync; an unreadable record raises (a replica that forgot its vote could vote twice in one term);
* :class:`ReservedFile`: the journal's disk blocks reserved with ``posix_fallocate`` before any byte of an
  entry goes into the map (the whole file when opened, every growth before it is used). On a full disk the
  kernel could otherwise only answer a write into an unallocated page with SIGBUS: the process would die
  mid-entry with no message. Here it is an ENOSPC while the journal is still whole.

Any failure goes to ``on_failure(what, error)`` (default :func:`storage_failed`: a clear message, exit
status :data:`EXIT_STORAGE_FAILED`, nothing more acknowledged). It overrides private internals of pysyncobj
:data:`PYSYNCOBJ_VERSION` (pinned in ``pyproject.toml``) and refuses to load on another version.
"""
from __future__ import annotations

import errno
import logging
import os
import threading

import pysyncobj.journal
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as INSTALLED_PYSYNCOBJ

from pathlib import Path

from photon import fsync_path

log = logging.getLogger("photon.raft")

PYSYNCOBJ_VERSION = "0.3.17"
"""The pysyncobj release whose private names Photon overrides (and ``pyproject.toml`` pins)."""
JOURNAL_FILE = "raft.journal"
"""A group member's journal file, in its data folder."""
EXIT_STORAGE_FAILED = 75
"""Exit status of a replica that stopped because its journal, term/vote record or snapshot could not be
made durable."""

__all__ = ["DurableMetaStorer", "EXIT_STORAGE_FAILED", "INSTALLED_PYSYNCOBJ", "PYSYNCOBJ_VERSION",
           "CompactingJournal", "JOURNAL_FILE", "discard_journal", "PipelinedTransport", "PysyncobjMismatch",
           "RaftMember", "ReservedFile", "storage_failed"]


class PysyncobjMismatch(RuntimeError):
    """The installed pysyncobj is not the release whose internals Photon overrides."""


if INSTALLED_PYSYNCOBJ != PYSYNCOBJ_VERSION:
    raise PysyncobjMismatch(f"Photon's replicated parts need pysyncobj=={PYSYNCOBJ_VERSION} (they override its "
                            f"private internals), found {INSTALLED_PYSYNCOBJ}: install the pinned version")


def storage_failed(what: str, error: BaseException) -> None:
    """Fail-stop: log why, then exit at once (no cleanup that could acknowledge anything)."""
    full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    log.critical("replica: %s failed (%s: %s); exiting (status %d) so that nothing not on disk is ever "
                 "acknowledged; %s", what, type(error).__name__, error, EXIT_STORAGE_FAILED,
                 "THE DISK IS FULL: this replica stays out of its group (the others keep the majority) and "
                 "comes back, journal intact, once space is freed" if full else
                 "the supervisor restarts this replica")
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    os._exit(EXIT_STORAGE_FAILED)


class _MetaPath:
    """What every storer of one record path shares (a journal reopened after compaction gets a new storer):
    the lock serializing writes, the (term, vote) on disk, and the newest record stored."""
    __slots__ = ("lock", "on_disk", "newest")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.on_disk: tuple | None = None
        self.newest = None


class DurableMetaStorer(pysyncobj.journal.MetaStorer):
    """pysyncobj's term/vote/commit-index store, made durable: temp file, fsync, rename, folder fsync.

    A store that changes the term or the vote is on disk before it returns (Raft: before any message that
    reflects them is sent). For a path in :attr:`background_paths` (a member that waits with
    :meth:`settle` before letting its data dir go), a store that only moves the commit index (pysyncobj's
    once-a-second save, a hint for restarts) is written the same durable way by one writer thread, so the
    Raft thread does not wait for the disk every second. Every write of one path (whichever storer, whichever
    thread) holds that path's lock and writes the newest record stored for it, so none goes back to an older
    term or vote."""

    on_failure = staticmethod(storage_failed)
    background_paths: set = set()
    _paths: dict = {}
    _paths_lock = threading.Lock()

    def __init__(self, path) -> None:
        super().__init__(path)
        with self._paths_lock:
            self._path_state = self._paths.setdefault(os.path.abspath(path), _MetaPath())

    def getMeta(self):  # noqa: N802 (pysyncobj's name)
        """The stored record; {} when there is none yet. Unlike pysyncobj's, an unreadable record raises
        and the file is closed."""
        state = self._path_state
        with state.lock:
            try:
                with open(self.getPath(), "rb") as f:
                    meta = pysyncobj.journal.loads(f.read())
            except FileNotFoundError:
                meta = {}
            state.on_disk = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        return meta

    def storeMeta(self, meta) -> None:  # noqa: N802 (pysyncobj's name)
        state = self._path_state
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        if vote == state.on_disk and self.getPath() in self.background_paths:
            state.newest = meta
            _META_WRITER.submit(self)
            return
        with state.lock:
            state.newest = meta            # a background write still queued writes this one too
            self._write(meta)

    def _write_newest(self) -> None:
        state = self._path_state
        with state.lock:
            self._write(state.newest)

    def _write(self, meta) -> None:
        path = self.getPath()
        tmp = path + ".tmp"
        meta = dict(meta)               # pysyncobj's own dict, which its thread may change meanwhile
        vote = (meta.get("currentTerm"), meta.get("votedForNodeId"))
        try:
            with open(tmp, "wb") as f:
                f.write(pysyncobj.journal.dumps(meta))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_path(os.path.dirname(os.path.abspath(path)))
        except OSError as e:
            type(self).on_failure(f"writing the Raft term/vote record {path}", e)
            raise
        self._path_state.on_disk = vote

    @staticmethod
    def settle(timeout: float = 10.0) -> None:
        """Wait for the commit-index records being written in the background (before a data dir is let go)."""
        _META_WRITER.settle(timeout)


class _MetaWriter:
    """One thread writing the commit-index records of :class:`DurableMetaStorer` (the newest of each)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list = []
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, storer) -> None:
        with self._cond:
            if all(queued._path_state is not storer._path_state for queued in self._queue):
                self._queue.append(storer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raft-meta", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                storer = self._queue.pop(0)
                self._busy = True
            try:
                storer._write_newest()
            except OSError:      # on_failure has been told (and by default the process has exited)
                pass
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def settle(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)


_META_WRITER = _MetaWriter()


class ReservedFile(pysyncobj.journal.ResizableFile):
    """pysyncobj's memory-mapped journal file, its disk blocks reserved before anything is written into the
    map (see the module docstring); its header's last-record offset only moves after a whole entry."""

    on_failure = staticmethod(storage_failed)

    def __init__(self, fileName, *args, **kwargs) -> None:  # noqa: N803 (pysyncobj's name)
        super().__init__(fileName, *args, **kwargs)
        missing = [n for n in ("_ResizableFile__mm", "_ResizableFile__f", "_ResizableFile__resizeFactor")
                   if not hasattr(self, n)]
        if missing:
            raise PysyncobjMismatch(f"pysyncobj {INSTALLED_PYSYNCOBJ}: ResizableFile lacks {missing}")
        self._path = fileName
        self._reserve(0, self._ResizableFile__mm.size())

    def _reserve(self, start: int, end: int) -> None:
        if end <= start:
            return
        try:
            os.posix_fallocate(self._ResizableFile__f.fileno(), start, end - start)
        except OSError as e:
            type(self).on_failure(f"reserving {end} bytes of disk for the Raft journal {self._path}", e)
            raise

    def write(self, offset, values) -> None:
        mm = self._ResizableFile__mm
        size = len(mm)
        if offset + len(values) > size:       # grown as pysyncobj would, but reserved on disk first
            new = max(int(size * self._ResizableFile__resizeFactor), offset + len(values))
            self._reserve(size, new)
            mm.resize(new)
        super().write(offset, values)


pysyncobj.journal.MetaStorer = DurableMetaStorer    # every FileJournal created from now on stores durably
pysyncobj.journal.ResizableFile = ReservedFile      # ... and reserves its disk space before writing into it


class RaftMember:
    """What a replicated room asks of its pysyncobj member (``self._sync``, a ``SyncObj``): leadership,
    status, and whether it can serve now (the registry's replicas and the MillWheel master share this)."""

    _sync = None

    def is_leader(self) -> bool:
        return self._sync._isLeader()

    def leader(self) -> str | None:
        node = self._sync._getLeader()
        return None if node is None else node.address

    def raft_status(self) -> dict:
        return self._sync.getStatus()

    def serving_problem(self) -> str | None:
        """Why this member cannot serve now (None: it can): no leader known, or a follower that lost its
        connection to the leader (a follower left alone keeps naming the old leader: pysyncobj only forgets
        it when it can stand for election, which needs a connection), or no majority connected."""
        sync = self._sync
        leader = sync._getLeader()
        if leader is None:
            return "no Raft leader known"
        if leader != sync.selfNode and not sync.isNodeConnected(leader):
            return f"not connected to the Raft leader {leader.address}"
        if not sync.hasQuorum:
            return "no majority of the Raft group connected"
        return None


def discard_journal(journal) -> None:
    """Close a pysyncobj journal whose file was replaced (so unlinked): in a thread of its own, and without
    pysyncobj's ``_destroy``, which first writes every page of its memory map back to that file (an msync of
    the whole old journal, tens of milliseconds at thousands of entries) although nobody will read it;
    closing the last handle frees its blocks, which takes time too. Its entries are never read again."""
    journal_file = getattr(journal, "_FileJournal__journalFile", None)
    mm = getattr(journal_file, "_ResizableFile__mm", None)
    f = getattr(journal_file, "_ResizableFile__f", None)
    if mm is None or f is None:
        journal._destroy()
        return

    def close() -> None:
        try:
            mm.close()
            f.close()
        except (OSError, ValueError):   # only blocks of a file already replaced are at stake
            log.warning("closing a replaced Raft journal failed", exc_info=True)
    threading.Thread(target=close, name="raft-journal-discard", daemon=True).start()


class CompactingJournal:
    """pysyncobj's journal, compacted without ever rewriting the live file; everything else is passed on.

    Compaction (``deleteEntriesTo``, which pysyncobj runs right after renaming a new snapshot into place)
    never rewrites the live journal in place (pysyncobj's own does, through a memory map whose pages the
    kernel may write back in any order, so a power loss in the middle could leave a torn journal). Instead
    it fsyncs the data folder (making the snapshot's rename durable), writes the entries that remain into a
    new journal file beside it, fsyncs that, renames it over the old one, fsyncs the folder again and reads
    the new journal back; the old journal is closed in a thread of its own without writing its memory map
    back (:func:`discard_journal`). A crash at any point leaves either the old journal (whose entries the snapshot
    already covers, as after a crash between pysyncobj's snapshot and its compaction) or the new one, each
    whole. A failure is fail-stop (``on_failure``, default :func:`storage_failed`)."""

    COMPACT_FILE = ".raft.journal.compacting"

    def __init__(self, journal, data_dir: Path, on_failure=None, open_journal=None) -> None:
        self._journal = journal
        self._data_dir = Path(data_dir)
        self._on_failure = on_failure or storage_failed
        self._open = open_journal or pysyncobj.journal.FileJournal
        tmp = self._data_dir / self.COMPACT_FILE
        for leftover in (tmp, Path(f"{tmp}.meta")):   # of a compaction a crash cut short (never read)
            leftover.unlink(missing_ok=True)

    def deleteEntriesTo(self, entry_to) -> None:  # noqa: N802 (pysyncobj's name)
        path = self._data_dir / JOURNAL_FILE
        tmp = self._data_dir / self.COMPACT_FILE
        what = f"fsync of the folder holding the new snapshot ({self._data_dir})"
        try:
            fsync_path(self._data_dir)                  # the snapshot's rename first
            what = f"writing the compacted Raft journal {tmp}"
            for leftover in (tmp, Path(f"{tmp}.meta")):
                leftover.unlink(missing_ok=True)
            new = self._open(str(tmp))
            for i in range(entry_to, len(self._journal)):
                new.add(*self._journal[i])
            new.flush()
            new._destroy()
            fsync_path(tmp)
            what = f"replacing the Raft journal {path} by its compacted copy"
            self._journal.onOneSecondTimer()            # the commit index it has not saved yet, durably
            os.replace(tmp, path)                       # the old journal's open map keeps its own (old) file
            fsync_path(self._data_dir)
            old, self._journal = self._journal, self._open(str(path))
            Path(f"{tmp}.meta").unlink(missing_ok=True)
        except OSError as e:
            self._on_failure(what, e)
            raise
        discard_journal(old)

    def __len__(self) -> int:
        return len(self._journal)

    def __getitem__(self, item):
        return self._journal[item]

    def __getattr__(self, name):
        return getattr(self._journal, name)


class PipelinedTransport(TCPTransport):
    """pysyncobj's TCP transport, keeping the leader's pipeline intact (every replicated room uses it).

    pysyncobj's leader advances a follower's next index as it sends (so entries stream without waiting
    for acknowledgements), but on each acknowledgement it moves the next index back to just after the
    acknowledged entry. Every later send then repeats entries already on the wire, and the follower
    truncates and re-appends them, logging at CRITICAL "truncating already-applied log entries ... state
    machine may have diverged" when they were applied (they are the same entries of the same term, so
    nothing diverges, but each repeat costs a truncation and a journal write, and the message alarms). A
    successful acknowledgement proves nothing was lost on the ordered connection, so the next index is kept
    where it was; a follower that really misses entries answers with a reset, which still moves it back."""

    def _onMessageReceived(self, node, message) -> None:
        if message.get("type") == "next_node_idx" and message.get("success") and not message.get("reset"):
            next_index = getattr(self._syncObj, "_SyncObj__raftNextIndex", None)
            before = next_index.get(node) if next_index is not None else None
            super()._onMessageReceived(node, message)
            if before is not None and next_index.get(node, before) < before:
                next_index[node] = before
            return
        super()._onMessageReceived(node, message)
