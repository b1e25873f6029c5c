"""The master replica's storage rules, one by one: the journal is synced after every change and a failed
sync is fail-stop, compaction writes a new journal instead of rewriting the live one, the term/vote record
is durable and an unreadable one is an error, and a full disk fails up front (a real tmpfs)."""
from __future__ import annotations

import errno
import pickle

import pysyncobj.journal
import pytest

from millwheel._master_raft import (JOURNAL_FILE, _DurableMetaStorer, _PlacementConsumer, _ReservedFile,
                                    _SyncedJournal)
from millwheel._master_state import ComputationDeclared, MasterState, WorkerJoined

pytestmark = pytest.mark.timeout(60)


class Failures:
    def __init__(self) -> None:
        self.seen: list[tuple[str, BaseException]] = []

    def __call__(self, what, error) -> None:
        self.seen.append((what, error))


def test_every_append_is_synced_and_a_failed_sync_is_fail_stop(tmp_path):
    failures = Failures()
    journal = _SyncedJournal(pysyncobj.journal.FileJournal(str(tmp_path / JOURNAL_FILE)), tmp_path, failures)
    journal.add(b"one", 1, 1)
    journal.add(b"two", 2, 1)
    assert journal.syncs == 2 and not failures.seen
    journal._destroy()

    class BrokenDisk:
        def add(self, *entry):
            pass

        def flush(self):
            raise OSError(errno.EIO, "I/O error")
    broken = _SyncedJournal(BrokenDisk(), tmp_path, failures)
    with pytest.raises(OSError):
        broken.add(b"three", 3, 1)
    assert len(failures.seen) == 1 and "syncing the Raft journal" in failures.seen[0][0]
    assert broken.syncs == 0


def test_what_a_compaction_cut_short_left_is_removed_when_the_journal_opens(tmp_path):
    """A crash (SIGKILL) in the middle of a compaction leaves its half-written copy beside the journal: never
    read, and removed when the replica opens its journal again."""
    path = tmp_path / JOURNAL_FILE
    journal = _SyncedJournal(pysyncobj.journal.FileJournal(str(path)), tmp_path, Failures())
    for i in range(1, 6):
        journal.add(f"entry {i}".encode(), i, 1)
    journal._destroy()
    (tmp_path / ".raft.journal.compacting").write_bytes(b"half a journal")
    (tmp_path / ".raft.journal.compacting.meta").write_bytes(b"\0")
    again = _SyncedJournal(pysyncobj.journal.FileJournal(str(path)), tmp_path, Failures())
    assert not list(tmp_path.glob(".raft.journal.compacting*"))
    assert [again[i][1] for i in range(len(again))] == [1, 2, 3, 4, 5]
    again._destroy()


def test_compaction_writes_a_new_journal_and_renames_it_keeping_the_tail(tmp_path):
    failures = Failures()
    path = tmp_path / JOURNAL_FILE
    journal = _SyncedJournal(pysyncobj.journal.FileJournal(str(path)), tmp_path, failures)
    for i in range(1, 31):
        journal.add(f"entry {i}".encode(), i, 1)
    inode = path.stat().st_ino
    journal.deleteEntriesTo(20)
    assert [journal[i][1] for i in range(len(journal))] == list(range(21, 31))
    assert path.stat().st_ino != inode, "the live journal was rewritten in place"
    assert not list(tmp_path.glob(".raft.journal.compacting*")) and not failures.seen
    journal.add(b"entry 31", 31, 1)
    journal._destroy()
    again = pysyncobj.journal.FileJournal(str(path))      # what a restarted replica reads back
    assert [again[i][1] for i in range(len(again))] == list(range(21, 32))
    again._destroy()


def test_the_vote_record_is_durable_and_an_unreadable_one_is_an_error(tmp_path):
    storer = _DurableMetaStorer(str(tmp_path / "raft.journal.meta"))
    assert storer.getMeta() == {}
    storer.storeMeta({"currentTerm": 7, "votedForNodeId": "a"})
    assert _DurableMetaStorer(str(tmp_path / "raft.journal.meta")).getMeta()["currentTerm"] == 7
    assert not (tmp_path / "raft.journal.meta.tmp").exists()
    (tmp_path / "raft.journal.meta").write_bytes(b"\x00garbage")
    with pytest.raises(Exception):
        storer.getMeta()


def test_a_full_disk_fails_when_the_journal_reserves_space_not_mid_entry(tmp_path, small_disk, monkeypatch):
    disk = small_disk(tmp_path / "disk", "64k")
    failures = Failures()
    monkeypatch.setattr(_ReservedFile, "on_failure", staticmethod(failures))
    journal = pysyncobj.journal.FileJournal(str(disk.path / JOURNAL_FILE))
    disk.fill()
    with pytest.raises(OSError) as e:
        for i in range(1, 1000):
            journal.add(b"x" * 512, i, 1)
    assert e.value.errno == errno.ENOSPC
    assert failures.seen and "reserving" in failures.seen[0][0]
    (disk.path / ".filler").unlink()
    journal._destroy()


def test_a_snapshot_round_trips_the_placement_state(tmp_path):
    consumer = _PlacementConsumer(MasterState())
    for fact in (ComputationDeclared("c", ("k",), 1), WorkerJoined("w", "h:1", "r", 2)):
        consumer.state.handle(fact)
    consumer.write_snapshot(str(tmp_path / "snap"), {"raft": 1})
    restored = _PlacementConsumer(MasterState())
    assert restored.read_snapshot(str(tmp_path / "snap")) == {"raft": 1}
    assert restored.state.snapshot() == consumer.state.snapshot()
    with open(tmp_path / "bad", "wb") as f:
        pickle.dump((99, None, None), f)
    with pytest.raises(ValueError, match="format 99"):
        restored.read_snapshot(str(tmp_path / "bad"))
