"""One conformance suite for every store: SQLite on disk and the in-memory twin."""
from __future__ import annotations

import pytest

from millwheel import MemoryStore, SQLiteStore, StaleSequencer, open_store
from millwheel._store import KEEP, StoredProduction, Write


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = SQLiteStore(tmp_path / "state.db") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


def prod(i: str, ts: int = 10, at: int = 100) -> StoredProduction:
    return StoredProduction(i, "out", "k", b'{"v":1}', ts, at)


def test_checkpoint_round_trip(store):
    seq = store.claim("c", 3)
    store.commit([Write("c", 3, seq, "k1", b'{"n":1}', [("t1", 50, "watermark"), ("t2", 60, "wall")], [],
                        [("r1", "inj", 100)], [prod("p1"), prod("p2", at=90)])])
    assert store.read_states("c", ["k1", "k2"]) == {"k1": b'{"n":1}'}
    assert sorted(store.read_timers("c", [3])) == [("k1", "t1", 50, "watermark"), ("k1", "t2", 60, "wall")]
    assert store.read_timers("c", [4]) == []
    assert store.seen("c", ["r1", "r2"]) == {"r1"}
    assert store.seen("other", ["r1"]) == set()
    assert store.dedup_ids("c", [3]) == ["r1"]
    assert [p.id for p in store.pending_productions("c", 3)] == ["p2", "p1"]  # by production time


def test_keep_delete_and_timer_changes(store):
    seq = store.claim("c", 0)
    store.commit([Write("c", 0, seq, "k", b"1", [("a", 1, "watermark"), ("b", 2, "watermark")])])
    store.commit([Write("c", 0, seq, "k", KEEP, [("a", 5, "watermark")], ["b"])])
    assert store.read_states("c", ["k"]) == {"k": b"1"}
    assert store.read_timers("c", [0]) == [("k", "a", 5, "watermark")]
    store.commit([Write("c", 0, seq, "k", None, [], ["a"])])
    assert store.read_states("c", ["k"]) == {}
    assert store.read_timers("c", [0]) == []


def test_productions_done_are_deleted(store):
    seq = store.claim("c", 1)
    store.commit([Write("c", 1, seq, productions=[prod("p1"), prod("p2")])])
    store.commit([Write("c", 1, seq, productions_done=["p1"])])
    assert [p.id for p in store.pending_productions("c", 1)] == ["p2"]


def test_zombie_writer_with_old_sequencer_is_rejected_and_writes_nothing(store):
    old = store.claim("c", 2)
    store.commit([Write("c", 2, old, "k", b'"before"')])
    new = store.claim("c", 2)
    assert new > old
    other = store.claim("c", 5)
    batch = [Write("c", 5, other, "k5", b'"fine"'),
             Write("c", 2, old, "k", b'"zombie"', [("t", 1, "watermark")], [], [("r9", "s", 1)], [prod("pz")])]
    with pytest.raises(StaleSequencer, match="sequencer"):
        store.commit(batch)
    assert store.read_states("c", ["k", "k5"]) == {"k": b'"before"'}
    assert store.read_timers("c", [2]) == []
    assert store.seen("c", ["r9"]) == set()
    assert store.pending_productions("c", 2) == []
    store.commit([Write("c", 2, new, "k", b'"owner"')])
    assert store.read_states("c", ["k"]) == {"k": b'"owner"'}


def test_dedup_gc_floor_only_rises(store):
    seq = store.claim("c", 0)
    store.commit([Write("c", 0, seq, "k", KEEP, processed=[("a", "s1", 10), ("b", "s1", 20), ("c", "s2", 5)])])
    assert store.gc_dedup("c", "s1", 15) == 1
    assert store.seen("c", ["a", "b", "c"]) == {"b", "c"}
    assert store.gc_dedup("c", "s1", 12) == 0
    assert store.gc_floors("c") == {"s1": 15}


def test_watermarks_never_decrease(store):
    store.save_watermarks({"a": 10, "b": 5})
    store.save_watermarks({"a": 7, "b": 9})
    assert store.read_watermarks() == {"a": 10, "b": 9}


def test_sqlite_survives_reopen_and_fences_across_connections(tmp_path):
    path = tmp_path / "s.db"
    s1 = SQLiteStore(path)
    seq1 = s1.claim("c", 0)
    s1.commit([Write("c", 0, seq1, "k", b"1", [("t", 9, "watermark")], [], [("r", "s", 1)], [prod("p")])])
    s2 = open_store(f"sqlite:///{path}")
    assert s2.read_states("c", ["k"]) == {"k": b"1"}
    assert s2.read_timers("c", [0]) == [("k", "t", 9, "watermark")]
    assert [p.id for p in s2.pending_productions("c", 0)] == ["p"]
    s2.claim("c", 0)  # another process takes the interval over
    with pytest.raises(StaleSequencer):
        s1.commit([Write("c", 0, seq1, "k", b"2")])
    assert s2.read_states("c", ["k"]) == {"k": b"1"}
    s1.close()
    s2.close()


def test_store_url_is_checked():
    assert isinstance(open_store("memory://"), MemoryStore)
    with pytest.raises(ValueError, match="scheme"):
        open_store("redis://x")
