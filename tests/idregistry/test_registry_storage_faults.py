"""A registry replica never acknowledges what is not on disk: a failed journal fsync releases no waiter and is
fail-stop; the Raft term/vote record is fsynced (file and folder) before it is relied on, and a full disk
there is fail-stop too; compaction makes the snapshot's rename and the rewritten journal durable; a
pysyncobj other than the pinned one is refused at start."""
from __future__ import annotations

import errno
import os
import threading

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


def test_compaction_fsyncs_the_snapshot_folder_and_the_rewritten_journal(tmp_path):
    calls: list = []

    class Journal:
        def deleteEntriesTo(self, n):
            calls.append(("compact", n))

        def flush(self):
            calls.append(("flush",))

    (tmp_path / "raft.journal").write_bytes(b"j")
    _NotifyingJournal(Journal(), None, tmp_path).deleteEntriesTo(5)
    assert calls == [("compact", 5), ("flush",)]
    failures: list = []
    gone = _NotifyingJournal(Journal(), None, tmp_path / "missing", on_failure=lambda w, e: failures.append(w))
    with pytest.raises(OSError):
        gone.deleteEntriesTo(6)
    assert failures and "snapshot" in failures[0] and ("compact", 6) not in calls


def test_another_pysyncobj_version_is_refused():
    check_pysyncobj(PYSYNCOBJ_VERSION)
    with pytest.raises(PysyncobjMismatch, match=f"pysyncobj=={PYSYNCOBJ_VERSION}"):
        check_pysyncobj("0.3.18")
