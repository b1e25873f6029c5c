"""A registry replica never acknowledges what is not on disk: a failed journal fsync releases no waiter and is
fail-stop; the Raft term/vote record is fsynced (file and folder) before it is relied on, and a full disk
there is fail-stop too; compaction makes the snapshot's rename durable and swaps in a new journal, never
rewriting the live one in place; a pysyncobj other than the pinned one is refused at start."""
from __future__ import annotations

import errno
import os
import threading

import pysyncobj.journal
import pytest

from photon import wait_until
from idregistry._replica import (PYSYNCOBJ_VERSION, PysyncobjMismatch, _DurableMetaStorer, _NotifyingJournal,
                                 check_pysyncobj)
from idregistry._shell import _Syncer


def test_a_failed_journal_fsync_releases_no_waiter_and_stops_the_replica(tmp_path):
    journal = tmp_path / "raft.journal"
    journal.write_bytes(b"x")
    fail = threading.Event()
    failures: list = []

    def fsync(path):
        if fail.is_set():
            raise OSError(errno.EIO, "Input/output error", path)
        os.stat(path)

    syncer = _Syncer(lambda: str(journal), fsync=fsync, on_failure=lambda what, e: failures.append((what, e)))
    try:
        released: list = []
        syncer.appended()
        syncer.after_sync(lambda: released.append(1))
        wait_until(lambda: released == [1], 10, message="a waiter released after a good fsync")
        fail.set()
        syncer.appended()
        syncer.after_sync(lambda: released.append(2))
        wait_until(lambda: failures, 10, message="the failed fsync reported")
        assert "fsync of the Raft journal" in failures[0][0] and failures[0][1].errno == errno.EIO
        fail.clear()                  # a later good fsync proves nothing: still no acknowledgement
        syncer.appended()
        syncer.after_sync(lambda: released.append(3))
        assert released == [1] and syncer.failed is not None
    finally:
        syncer.close()


def test_the_fsync_thread_keeps_the_journal_open_and_opens_it_again_once_replaced(tmp_path, monkeypatch):
    """One fsync of a kept descriptor per round (no open and close each time), and after ``replaced()`` (a
    compaction renamed a new file over the journal) the new file is what gets fsynced."""
    journal = tmp_path / "raft.journal"
    journal.write_bytes(b"old")
    synced_inodes: list[int] = []
    opened: list[str] = []
    real_fsync, real_open = os.fsync, os.open

    def recording_fsync(fd):
        synced_inodes.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    def recording_open(path, *args, **kwargs):
        if str(path) == str(journal):
            opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "open", recording_open)
    syncer = _Syncer(lambda: str(journal), on_failure=lambda what, e: pytest.fail(f"{what}: {e}"))
    try:
        released: list[int] = []
        for k in range(3):
            syncer.appended()
            syncer.after_sync(lambda k=k: released.append(k))
            wait_until(lambda: len(released) == k + 1, 10, message=f"waiter {k} released")
        old_inode = journal.stat().st_ino
        assert set(synced_inodes) == {old_inode} and len(opened) == 1
        new = tmp_path / "new.journal"
        new.write_bytes(b"new")
        os.replace(new, journal)
        syncer.replaced()
        syncer.appended()
        syncer.after_sync(lambda: released.append(3))
        wait_until(lambda: len(released) == 4, 10, message="the waiter after the replacement released")
        assert synced_inodes[-1] == journal.stat().st_ino != old_inode
        assert len(opened) == 2
    finally:
        syncer.close()


def _open_fds_of(path) -> list[str]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                fds.append(fd)
        except OSError:
            pass
    return fds


def test_a_journal_held_by_an_fsync_that_outlives_close_is_closed_by_its_thread(tmp_path, monkeypatch):
    """close() waits 2 s for the fsync thread; an fsync still running then must not have its descriptor
    closed under it, and the descriptor must not leak: the thread closes it once the fsync returns."""
    journal = tmp_path / "raft.journal"
    journal.write_bytes(b"entries")
    real_fsync = os.fsync
    hold = threading.Event()
    release = threading.Event()

    def slow_fsync(fd):
        if hold.is_set():
            release.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncer = _Syncer(lambda: str(journal), on_failure=lambda what, e: pytest.fail(f"{what}: {e}"))
    try:
        released: list[int] = []
        syncer.appended()
        syncer.after_sync(lambda: released.append(1))
        wait_until(lambda: released == [1], 10, message="the first fsync")
        assert len(_open_fds_of(journal)) == 1
        hold.set()
        syncer.appended()
        syncer.after_sync(lambda: released.append(2))
        syncer.close()              # gives up after 2 s: the fsync is still held
        assert syncer._thread.is_alive() and len(_open_fds_of(journal)) == 1
    finally:
        release.set()
    wait_until(lambda: not syncer._thread.is_alive(), 10, message="the fsync thread ends")
    assert _open_fds_of(journal) == [] and released == [1, 2]


def test_term_and_vote_are_fsynced_file_and_folder(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = tmp_path / "raft.journal.meta"
    _DurableMetaStorer(str(path)).storeMeta({"currentTerm": 7, "votedForNodeId": "n1"})
    assert _DurableMetaStorer(str(path)).getMeta() == {"currentTerm": 7, "votedForNodeId": "n1"}
    assert str(path) + ".tmp" in synced and str(tmp_path) in synced
    assert synced.index(str(path) + ".tmp") < synced.index(str(tmp_path))


def _record(path: str) -> dict:
    with open(path, "rb") as f:
        return pysyncobj.journal.loads(f.read())


def test_only_commit_index_records_are_written_beside_the_raft_thread(tmp_path, monkeypatch):
    """For a member's path in background_paths, a record that moves only the commit index returns at once
    and is written (durably) by another thread; a new term or vote is on disk before storeMeta returns."""
    path = str(tmp_path / "raft.journal.meta")
    monkeypatch.setattr(_DurableMetaStorer, "background_paths", {path})
    gate = threading.Event()
    real_fsync = os.fsync
    writers: list[str] = []

    def gated_fsync(fd):
        writers.append(threading.current_thread().name)
        if threading.current_thread().name == "raft-meta":
            assert gate.wait(10)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", gated_fsync)
    storer = _DurableMetaStorer(path)
    assert storer.getMeta() == {}
    meta = {"currentTerm": 3, "votedForNodeId": "a", "raftCommitIndex": 1}
    storer.storeMeta(meta)                                     # a new vote: written here, now
    assert writers and set(writers) == {threading.current_thread().name}
    meta["raftCommitIndex"] = 40
    storer.storeMeta(meta)                                     # the commit index only: returns before the disk
    assert _record(path)["raftCommitIndex"] == 1
    meta["currentTerm"], meta["votedForNodeId"] = 4, "b"
    voting = threading.Thread(target=storer.storeMeta, args=(meta,))
    voting.start()                                             # waits for the background write, then its own
    gate.set()
    voting.join(10)
    _DurableMetaStorer.settle()
    assert _record(path) == {"currentTerm": 4, "votedForNodeId": "b", "raftCommitIndex": 40}
    assert "raft-meta" in writers


def test_a_queued_commit_index_record_never_brings_back_an_older_vote(tmp_path, monkeypatch):
    """A journal reopened after compaction has a new storer (and its own record dict): a commit-index
    record the old one queued, written after the new one stored a newer term and vote, writes the newest
    record of that path, not the old dict."""
    busy, path = str(tmp_path / "other.meta"), str(tmp_path / "raft.journal.meta")
    monkeypatch.setattr(_DurableMetaStorer, "background_paths", {busy, path})
    gate = threading.Event()
    real_fsync = os.fsync

    def gated_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(busy):
            assert gate.wait(10)
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", gated_fsync)
    other = _DurableMetaStorer(busy)
    other.getMeta()
    other.storeMeta({"currentTerm": None, "votedForNodeId": None, "raftCommitIndex": 9})   # the writer waits here
    old = _DurableMetaStorer(path)
    old.getMeta()
    old_meta = {"currentTerm": 5, "votedForNodeId": "a", "raftCommitIndex": 1}
    old.storeMeta(old_meta)
    old_meta["raftCommitIndex"] = 70
    old.storeMeta(old_meta)                                    # queued behind the busy path
    reopened = _DurableMetaStorer(path)
    new_meta = reopened.getMeta()
    new_meta["currentTerm"], new_meta["votedForNodeId"] = 6, "b"
    reopened.storeMeta(new_meta)                               # a new vote, on disk now
    assert _record(path)["currentTerm"] == 6
    gate.set()
    _DurableMetaStorer.settle()
    assert _record(path)["currentTerm"] == 6 and _record(path)["votedForNodeId"] == "b"


def test_pysyncobj_journals_store_their_meta_durably():
    import pysyncobj.journal
    assert pysyncobj.journal.MetaStorer is _DurableMetaStorer


def test_a_full_disk_under_the_term_record_is_fail_stop(small_disk, tmp_path, monkeypatch):
    disk = small_disk(tmp_path / "data", "64k")
    disk.fill()
    failures: list = []
    monkeypatch.setattr(_DurableMetaStorer, "on_failure",
                        staticmethod(lambda what, e: failures.append((what, e))))
    with pytest.raises(OSError):
        _DurableMetaStorer(str(tmp_path / "data" / "raft.journal.meta")).storeMeta({"currentTerm": 3, "x": "y" * 9000})
    assert failures and "term/vote record" in failures[0][0] and failures[0][1].errno == errno.ENOSPC


def _real_journal(path, entries: int):
    journal = pysyncobj.journal.FileJournal(str(path))
    for i in range(1, entries + 1):
        journal.add(b"command-%d" % i, i, 1)
    journal.flush()
    return journal


def test_compaction_writes_a_new_journal_and_renames_it_into_place(tmp_path):
    path = tmp_path / "raft.journal"
    journal = _NotifyingJournal(_real_journal(path, 50), None, tmp_path)
    inode = path.stat().st_ino
    journal.deleteEntriesTo(30)
    assert len(journal) == 20 and journal[0] == (b"command-31", 31, 1)
    assert path.stat().st_ino != inode                     # a new file, not the old one rewritten
    reread = pysyncobj.journal.FileJournal(str(path))
    assert [reread[i] for i in range(len(reread))] == [(b"command-%d" % i, i, 1) for i in range(31, 51)]
    reread._destroy()
    journal.add(b"command-51", 51, 1)                       # appends go on into the new file
    journal.flush()
    reread = pysyncobj.journal.FileJournal(str(path))
    assert len(reread) == 21 and reread[20] == (b"command-51", 51, 1)
    reread._destroy()
    journal._destroy()
    assert not (tmp_path / _NotifyingJournal.COMPACT_FILE).exists()


def test_compaction_closes_the_replaced_journal_without_writing_its_map_back(tmp_path, monkeypatch):
    """The old journal (its file already replaced) is closed in another thread, not through pysyncobj's
    ``_destroy``, whose msync of the whole map stalled the Raft thread for tens of milliseconds."""
    path = tmp_path / "raft.journal"
    live = _real_journal(path, 50)
    journal = _NotifyingJournal(live, None, tmp_path)
    mapped = live._FileJournal__journalFile._ResizableFile__mm

    def no_msync():
        raise AssertionError("the replaced journal's map was written back")
    monkeypatch.setattr(live, "_destroy", no_msync)
    journal.deleteEntriesTo(30)
    wait_until(lambda: mapped.closed, 10, interval=0.01, message="the replaced journal closed")
    assert len(journal) == 20 and journal[0] == (b"command-31", 31, 1)
    journal._destroy()


def test_a_compaction_that_fails_midway_leaves_the_live_journal_untouched(tmp_path, monkeypatch):
    """A crash (here: the rename failing) before the new journal is in place leaves the old one byte for
    byte: never a journal rewritten halfway."""
    path = tmp_path / "raft.journal"
    failures: list = []
    journal = _NotifyingJournal(_real_journal(path, 50), None, tmp_path,
                                on_failure=lambda what, e: failures.append(what))
    before = path.read_bytes()

    def crash(*_):
        raise OSError(errno.EIO, "power lost")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        journal.deleteEntriesTo(30)
    assert path.read_bytes() == before
    assert failures and "replacing the Raft journal" in failures[0]
    reread = pysyncobj.journal.FileJournal(str(path))
    assert len(reread) == 50
    reread._destroy()
    journal._destroy()


def test_compaction_without_its_folder_is_fail_stop(tmp_path):
    failures: list = []
    gone = _NotifyingJournal(None, None, tmp_path / "missing", on_failure=lambda w, e: failures.append(w))
    with pytest.raises(OSError):
        gone.deleteEntriesTo(6)
    assert failures and "snapshot" in failures[0]


def test_another_pysyncobj_version_is_refused():
    check_pysyncobj(PYSYNCOBJ_VERSION)
    with pytest.raises(PysyncobjMismatch, match=f"pysyncobj=={PYSYNCOBJ_VERSION}"):
        check_pysyncobj("0.3.18")
