"""Snapshots written beside the Raft thread: the frozen state (a view that later commands do not change)
and the serializer/checker cycle pysyncobj drives. No cluster needed (restarts after compaction of a real
cluster: test_registry_tokens_durability, test_registry_cluster)."""
from __future__ import annotations

import errno
import os
import pickle
import threading

import pytest
from pysyncobj.config import SERIALIZER_STATE

from idregistry._replica import WRITING_SUFFIX, RaftReplica, RaftSettings, _SnapshotWriter, _StateConsumer, _SyncedFile
from idregistry._state import (OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT, OP_COMMIT_RUNS, OP_DELETE, OP_NOOP, ShardState,
                               pack_ids)
from photon import free_port, wait_until
from photon.raft import CompactingJournal

pytestmark = pytest.mark.timeout(60)

T0 = 1_763_712_000_000_000
BUCKET = 1_000_000


def eid(n: int, proc: int = 1) -> str:
    return f"10.0.0.1:{proc}:{T0 + n:016d}"


def _contents(state: ShardState):
    return (sorted(state.entries()), state.ids_held, dict(state.token_names), dict(state.token_bucket),
            state.gc_boundary_us, state.next_token)


def _filled() -> ShardState:
    s = ShardState(bucket_us=BUCKET)
    s.apply([(OP_COMMIT_RUNS, "A", pack_ids([eid(n) for n in range(0, 2000, 2)]), 1),
             (OP_COMMIT_RUNS, "B", pack_ids([eid(n, proc=2) for n in range(100)]), 2),
             (OP_COMMIT_RUNS, "C", pack_ids([eid(BUCKET + n) for n in range(50)]), 3)])
    return s


def test_a_frozen_state_pickles_as_the_state_was_whatever_is_applied_after():
    s = _filled()
    expected = _contents(s)
    view = s.freeze()
    # every kind of change after the freeze: appends, inserts among held ids (one by one and merged), token
    # clearing, a delete, new tokens, GC dropping a bucket
    s.apply([(OP_COMMIT_RUNS, "D", pack_ids([eid(n) for n in range(2000, 2100)]), 4),
             (OP_COMMIT, "E", [eid(1), eid(3), eid(7, proc=2)], 5),
             (OP_COMMIT_RUNS, "F", pack_ids([eid(n) for n in range(5, 400, 2)]), 6),
             (OP_CLEAR_TOKENS, [eid(0), eid(2), eid(4, proc=2)]),
             (OP_DELETE, eid(10), "A"),
             (OP_ADVANCE_GC, T0 + BUCKET)])
    after = _contents(s)
    restored = pickle.loads(pickle.dumps(view, pickle.HIGHEST_PROTOCOL))
    view.release()
    assert type(restored) is ShardState
    assert _contents(restored) == expected
    assert _contents(s) == after and after != expected          # the live state went on changing
    assert restored.lookup([eid(0), eid(1), eid(10), eid(2050)]) == [True, False, True, False]
    # the restored state goes on working (a run that was shared is its own now)
    restored.apply([(OP_COMMIT, "G", [eid(1)])])
    assert restored.lookup([eid(1)]) == [True]


def test_changes_after_release_do_not_copy_runs():
    s = _filled()
    view = s.freeze()
    pickle.dumps(view)
    view.release()
    run = s.buckets[T0 // BUCKET]["10.0.0.1:1"]
    offsets = run.offsets
    s.apply([(OP_CLEAR_TOKENS, [eid(0)])])
    assert run.offsets is offsets            # in place: no snapshot reads it any more


def _consumer(tmp_path, state=None) -> _StateConsumer:
    return _StateConsumer(state or _filled(), tmp_path / "raft.snapshot")


def _finished(consumer) -> int:
    states = []

    def settled() -> bool:
        states.append(consumer.check_snapshot())
        return states[-1] != SERIALIZER_STATE.SERIALIZING
    wait_until(settled, 30, interval=0.01, message="the snapshot writer")
    return states[-1]


def test_the_snapshot_is_written_beside_the_raft_thread_and_renamed_into_place_by_the_checker(tmp_path):
    consumer = _consumer(tmp_path)
    expected = _contents(consumer.state)
    pysyncobj_tmp = tmp_path / "raft.snapshot.tmp"
    pysyncobj_tmp.write_bytes(b"stale")                      # pysyncobj must find nothing to rename
    assert consumer.check_snapshot() == SERIALIZER_STATE.NOT_SERIALIZING
    consumer.write_snapshot(str(pysyncobj_tmp), ("raft", 1))
    assert not pysyncobj_tmp.exists()
    consumer.state.apply([(OP_COMMIT, "late", [eid(5000)])])   # applied while the writer runs
    assert _finished(consumer) == SERIALIZER_STATE.SUCCESS
    assert consumer.check_snapshot() == SERIALIZER_STATE.NOT_SERIALIZING   # success is told once
    assert not (tmp_path / ("raft.snapshot" + WRITING_SUFFIX)).exists()
    restored = _StateConsumer(ShardState())
    assert restored.read_snapshot(str(tmp_path / "raft.snapshot")) == ("raft", 1)
    assert _contents(restored.state) == expected             # as of the call, without the later commit


def test_a_snapshot_installed_meanwhile_is_not_replaced_by_an_older_one(tmp_path):
    consumer = _consumer(tmp_path)
    final = tmp_path / "raft.snapshot"
    final.write_bytes(b"old")
    consumer.write_snapshot(str(tmp_path / "raft.snapshot.tmp"), ("raft", 1))
    installed = tmp_path / "raft.snapshot.1.tmp"               # what pysyncobj does with a leader's snapshot
    installed.write_bytes(b"from the leader")
    os.replace(installed, final)
    assert _finished(consumer) == SERIALIZER_STATE.FAILED
    assert final.read_bytes() == b"from the leader"
    assert not (tmp_path / ("raft.snapshot" + WRITING_SUFFIX)).exists()


def test_a_failed_snapshot_write_is_fail_stop(tmp_path, monkeypatch):
    import idregistry._replica as replica
    failures = []
    monkeypatch.setattr(replica, "storage_failed", lambda what, e: failures.append((what, e)))
    consumer = _consumer(tmp_path)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(replica.os, "fsync", full)
    consumer.write_snapshot(str(tmp_path / "raft.snapshot.tmp"), ("raft", 1))
    assert _finished(consumer) == SERIALIZER_STATE.FAILED
    assert failures and "writing the snapshot" in failures[0][0] and failures[0][1].errno == errno.ENOSPC
    assert not (tmp_path / "raft.snapshot").exists()


@pytest.mark.parametrize("seed", range(3))
def test_a_snapshot_synced_as_it_is_written_holds_the_same_bytes_and_syncs_every_piece(tmp_path, monkeypatch, seed):
    """Random writes (empty, smaller than a piece, many pieces, memoryviews) through a _SyncedFile give
    the very bytes a plain file gets, with a data sync at every full piece and never more than a piece
    unsynced."""
    import random

    import idregistry._replica as replica
    rng = random.Random(seed)
    piece = rng.choice([1, 7, 64, 4096])
    synced_at = []
    real = os.fdatasync
    path = tmp_path / "synced"

    def fdatasync(fd):
        real(fd)
        synced_at.append(os.fstat(fd).st_size)
    monkeypatch.setattr(replica.os, "fdatasync", fdatasync)
    chunks = [rng.randbytes(rng.choice([0, 1, piece - 1, piece, piece + 1, rng.randrange(0, 20 * piece + 2)]))
              for _ in range(rng.randrange(1, 60))]
    with open(path, "wb") as f:
        out = _SyncedFile(f, sync_bytes=piece)
        for c in chunks:
            assert out.write(memoryview(c) if rng.random() < 0.3 else c) == len(c)
    data = b"".join(chunks)
    assert path.read_bytes() == data
    assert synced_at == [piece * k for k in range(1, len(data) // piece + 1)]
    assert out.syncs == len(data) // piece


def test_a_writer_left_over_from_an_earlier_life_is_removed(tmp_path):
    leftover = tmp_path / ("raft.snapshot" + WRITING_SUFFIX)
    leftover.write_bytes(b"half")
    _consumer(tmp_path)
    assert not leftover.exists()


def _member(path, address) -> RaftReplica:
    replica = RaftReplica(address, [address], path, ShardState(0), RaftSettings(log_compaction_min_entries=5))
    wait_until(replica.is_leader, 30, interval=0.05, message="a one-member group's leader")
    return replica


def _replicate(replica, ops) -> None:
    done, errors = threading.Event(), []
    replica.submit(ops, lambda results, error: (errors.append(error), done.set()))
    assert done.wait(30) and errors == [0], errors


@pytest.mark.timeout(120)
def test_a_stop_between_the_snapshot_and_the_journal_compaction_loses_no_entry(tmp_path, monkeypatch):
    """The snapshot is renamed into place but the journal is never compacted (the replica stops right
    there, as a crash between the two would leave it). Restarted, the replica drops the entries the
    snapshot covers instead of letting pysyncobj clear the journal down to the snapshot's last two
    entries, so every entry after the snapshot (acknowledged ones included) is still there."""
    address = f"127.0.0.1:{free_port()}"
    data = tmp_path / "member"
    monkeypatch.setattr(CompactingJournal, "deleteEntriesTo", lambda self, entry_to: None)
    replica = _member(data, address)
    ids = []
    gate = threading.Event()

    def stuck(writer) -> None:                 # later snapshots never get written
        gate.wait(60)
        writer.error = RuntimeError("stopped before writing")
        writer.done.set()
    try:
        for k in range(12):
            batch = [eid(100 * k + n) for n in range(3)]
            ids += batch
            _replicate(replica, [(OP_COMMIT, f"t{k}", batch)])
        wait_until(lambda: replica._consumer.snapshots >= 1, 30, interval=0.05, message="a snapshot in place")
        monkeypatch.setattr(_SnapshotWriter, "_run", stuck)
        for k in range(12, 20):                  # most of these only in the journal
            batch = [eid(100 * k + n) for n in range(3)]
            ids += batch
            _replicate(replica, [(OP_COMMIT, f"t{k}", batch)])
        journal = replica._sync._SyncObj__raftLog
        with open(data / "raft.snapshot", "rb") as f:
            _, _, raft_data = pickle.load(f)
        assert journal[0][1] <= 2                                   # never compacted
        assert journal[len(journal) - 1][1] > raft_data[0][1] + 3   # entries after the snapshot
    finally:
        gate.set()
        replica.destroy()
    monkeypatch.undo()
    restarted = _member(data, address)
    try:
        _replicate(restarted, [(OP_NOOP,)])       # commits what the new term's leader holds
        assert restarted.state.lookup(ids) == [True] * len(ids)
        assert restarted._sync._SyncObj__raftLog[0][1] > 2      # compacted at the restart
    finally:
        restarted.destroy()


def test_a_written_snapshot_waits_for_no_commit_waiting_before_it_is_renamed_and_compacted(tmp_path):
    consumer = _consumer(tmp_path)
    busy = [True]
    consumer.busy = lambda: busy[0]
    final = tmp_path / "raft.snapshot"
    consumer.write_snapshot(str(tmp_path / "raft.snapshot.tmp"), ("raft", 1))
    consumer._writer.done.wait(30)
    for _ in range(5):      # written, but commits wait on this member: not renamed, no compaction yet
        assert consumer.check_snapshot() == SERIALIZER_STATE.SERIALIZING
    assert not final.exists() and (tmp_path / ("raft.snapshot" + WRITING_SUFFIX)).exists()
    assert consumer.compactions_deferred == 5
    busy[0] = False
    assert consumer.check_snapshot() == SERIALIZER_STATE.SUCCESS
    assert final.exists() and not (tmp_path / ("raft.snapshot" + WRITING_SUFFIX)).exists()
    assert consumer.check_snapshot() == SERIALIZER_STATE.NOT_SERIALIZING


def test_a_written_snapshot_is_renamed_after_the_deferral_even_when_commits_never_stop(tmp_path, monkeypatch):
    import idregistry._replica as replica
    monkeypatch.setattr(replica, "COMPACTION_DEFER_S", 0.3)
    consumer = _consumer(tmp_path)
    consumer.busy = lambda: True
    consumer.write_snapshot(str(tmp_path / "raft.snapshot.tmp"), ("raft", 1))
    consumer._writer.done.wait(30)
    assert consumer.check_snapshot() == SERIALIZER_STATE.SERIALIZING
    assert _finished(consumer) == SERIALIZER_STATE.SUCCESS      # at most the deferral later
    assert (tmp_path / "raft.snapshot").exists()
