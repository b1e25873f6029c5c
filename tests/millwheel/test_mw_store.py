"""One conformance suite for every store: in memory, SQLite on disk, PostgreSQL (a real embedded server),
and the framework cache in front of SQLite; then what only PostgreSQL does (restarts, lost acks)."""
from __future__ import annotations

import random
import threading

import psycopg
import pytest

from millwheel import (CachedStore, MemoryStore, PostgresStore, SQLiteStore, StaleSequencer,
                       open_store)
from millwheel._store import KEEP, SetAsideRecord, StoredProduction, Write
from photon import wait_until

KINDS = ["memory", "sqlite", "postgres", "cached-sqlite"]


@pytest.fixture(params=KINDS)
def opener(request, tmp_path):
    """``opener()`` opens a handle on the test's store; each call is another connection to the same data
    (another worker), except in memory, where the one object is shared."""
    handles = []
    shared = MemoryStore()

    def open_handle():
        kind = request.param
        if kind == "memory":
            s = shared
        elif kind == "sqlite":
            s = SQLiteStore(tmp_path / "state.db")
        elif kind == "postgres":
            s = open_store(url)
        else:
            s = CachedStore(SQLiteStore(tmp_path / "state.db"), capacity=4)
        handles.append(s)
        return s

    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    try:
        yield open_handle
    finally:
        for h in handles:
            h.close()


@pytest.fixture
def store(opener):
    return opener()


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


def test_claim_under_a_masters_sequencer_fences_older_ones_in_the_commit(opener):
    """A master's sequencers: the store keeps the one it is given, refuses a claim with a smaller one and
    a commit under any other; claiming the same one again (a retried grant) is allowed."""
    a, b = opener(), opener()
    assert a.claim("c", 2, 7) == 7
    assert a.claim("c", 2, 7) == 7
    a.commit([Write("c", 2, 7, "k", b"1")])
    assert b.claim("c", 2, 9) == 9                       # moved: the new owner claims under 9
    with pytest.raises(StaleSequencer):
        a.commit([Write("c", 2, 7, "k", b"2")])          # the zombie's write is refused ...
    assert b.read_states("c", ["k"]) == {"k": b"1"}     # ... and changes nothing
    with pytest.raises(StaleSequencer):
        a.claim("c", 2, 8)                               # a grant older than the holder's
    b.commit([Write("c", 2, 9, "k", b"3")])
    assert a.read_states("c", ["k"]) == {"k": b"3"}


def test_set_aside_records_are_written_with_the_key_and_fenced_by_the_sequencer(opener):
    a, b = opener(), opener()
    seq = a.claim("c", 1, 4)
    bad = SetAsideRecord("c", "r9", "k", "ValueError: no", 5, b'{"i":9}', 90, "inj", 900)
    a.commit([Write("c", 1, seq, "k", b"1", processed=[("r8", "inj", 800), ("r9", "inj", 900)], set_aside=[bad])])
    a.commit([Write("c", 1, seq, "k", KEEP, set_aside=[bad])])            # again (a retried commit): one row
    assert b.set_aside_records() == [bad] and b.set_aside_records("c") == [bad]
    assert b.set_aside_records("other") == []
    assert b.seen("c", ["r9"]) == {"r9"}
    b.claim("c", 1, 5)
    with pytest.raises(StaleSequencer):                                    # a zombie sets nothing aside
        a.commit([Write("c", 1, seq, "k2", KEEP, set_aside=[SetAsideRecord("c", "r10", "k2", "E", 5, b"1", 1, "s", 1)])])
    assert [r.id for r in b.set_aside_records()] == ["r9"]


def test_watermark_reports_keep_the_newest_sequencer_per_interval(opener):
    a, b = opener(), opener()
    a.report_watermarks([("c", 1, 5, 100, 90, 100), ("c", 2, 5, 200, None, None)])
    b.report_watermarks([("c", 1, 6, 150, 140, 150)])
    a.report_watermarks([("c", 1, 5, 900, 900, 900)])    # a fenced owner's report changes nothing
    assert sorted(b.read_watermark_reports()) == [("c", 1, 6, 150, 140, 150), ("c", 2, 5, 200, None, None)]


def test_a_report_under_a_sequencer_older_than_the_intervals_claim_changes_nothing(opener):
    """The interval moved: its new owner claimed it and has not reported yet. The old owner's late reports
    (watermark and cut) change nothing: the interval keeps its last value until its new owner reports."""
    old, new = opener(), opener()
    old.claim("c", 1, 5)
    old.claim("c", 2, 5)
    old.report_watermarks([("c", 1, 5, 100, 90, 100), ("c", 2, 5, 200, 190, 200)])
    old.report_cuts([("c", 1, 5, 3, 100)])
    new.claim("c", 1, 7)                                  # moved; no report under 7 yet
    old.report_watermarks([("c", 1, 5, 900, 900, 900), ("c", 2, 5, 250, 240, 250)])
    old.report_cuts([("c", 1, 5, 9, 900)])
    assert sorted(new.read_watermark_reports()) == [("c", 1, 5, 100, 90, 100), ("c", 2, 5, 250, 240, 250)]
    assert new.read_cuts() == [("c", 1, 5, 3, 100)]
    new.report_watermarks([("c", 1, 7, 120, 110, 120)])
    new.report_cuts([("c", 1, 7, 4, 120)])
    assert sorted(old.read_watermark_reports()) == [("c", 1, 7, 120, 110, 120), ("c", 2, 5, 250, 240, 250)]
    assert old.read_cuts() == [("c", 1, 7, 4, 120)]


def test_a_report_under_a_sequencer_older_than_the_masters_grant_changes_nothing_before_the_claim(opener):
    """The master moved interval 1 (sequencer 5 -> 7) and a process that read its map recorded the grant;
    the new owner has not claimed yet. The old owner, which has not heard of the move (its heartbeat is
    later), or whose report statement had passed its lease check when it was stopped, reports under 5:
    nothing changes (watermark and cut). Interval 2, not moved, takes its owner's reports. A lower grant
    read from a lagging replica's map does not lower the fence; the new owner's reports under 7 land."""
    old, reader, new = opener(), opener(), opener()
    old.claim("c", 1, 5)
    old.claim("c", 2, 5)
    old.report_watermarks([("c", 1, 5, 100, 90, 100), ("c", 2, 5, 200, 190, 200)])
    old.report_cuts([("c", 1, 5, 3, 100)])
    reader.record_grants([("c", 1, 7), ("c", 2, 5)])
    reader.record_grants([("c", 1, 6)])
    old.report_watermarks([("c", 1, 5, 900, 900, 900), ("c", 2, 5, 250, 240, 250)])
    old.report_cuts([("c", 1, 5, 9, 900)])
    assert sorted(new.read_watermark_reports()) == [("c", 1, 5, 100, 90, 100), ("c", 2, 5, 250, 240, 250)]
    assert new.read_cuts() == [("c", 1, 5, 3, 100)]
    new.claim("c", 1, 7)
    new.report_watermarks([("c", 1, 7, 120, 110, 120)])
    new.report_cuts([("c", 1, 7, 4, 120)])
    assert sorted(old.read_watermark_reports()) == [("c", 1, 7, 120, 110, 120), ("c", 2, 5, 250, 240, 250)]
    assert old.read_cuts() == [("c", 1, 7, 4, 120)]
    reader.record_grants([("c", 2, 6)])       # grants fence reports only: commits are fenced by claims
    old.commit([Write("c", 2, 5, "k", b"v")])
    assert new.read_states("c", ["k"]) == {"k": b"v"}


def test_reporting_and_reading_in_one_call_gives_what_a_read_after_the_report_gives(opener):
    """A worker process writes its reports and reads every process's in one call (one statement on
    PostgreSQL): the same fences as :meth:`report_watermarks`, and the rows a read after it gives (its own
    new values, a fenced report's stored value kept, the other intervals' rows)."""
    old, new, reader = opener(), opener(), opener()
    old.claim("c", 1, 5)
    old.claim("c", 2, 5)
    assert sorted(old.report_and_read_watermarks([("c", 1, 5, 100, 90, 100), ("c", 2, 5, 200, 190, 200)])) == [
        ("c", 1, 5, 100, 90, 100), ("c", 2, 5, 200, 190, 200)]
    new.claim("c", 1, 7)                                  # moved; no report under 7 yet
    reader.record_grants([("c", 3, 4)])
    got = old.report_and_read_watermarks([("c", 1, 5, 900, 900, 900), ("c", 2, 5, 250, 240, 250),
                                          ("c", 3, 3, 1, 1, 1)])
    expected = [("c", 1, 5, 100, 90, 100), ("c", 2, 5, 250, 240, 250)]   # 1 claimed under 7, 3 granted under 4
    assert sorted(got) == expected
    assert sorted(reader.read_watermark_reports()) == expected
    got = new.report_and_read_watermarks([("c", 1, 7, 120, 110, 120), ("c", 1, 7, 130, 120, 130)])
    assert sorted(got) == [("c", 1, 7, 130, 120, 130), ("c", 2, 5, 250, 240, 250)]
    assert sorted(new.report_and_read_watermarks([])) == sorted(got)
    assert sorted(reader.read_watermark_reports()) == sorted(got)


def test_cut_reports_keep_the_newest_sequencer_and_an_epoch_advances_one_step_at_a_time(opener):
    a, b = opener(), opener()
    a.report_cuts([("c", 1, 5, 3, 100), ("c", 2, 5, 3, None)])
    b.report_cuts([("c", 1, 6, 4, 150)])
    a.report_cuts([("c", 1, 5, 9, 900)])                  # a fenced owner's report changes nothing
    assert sorted(b.read_cuts()) == [("c", 1, 6, 4, 150), ("c", 2, 5, 3, None)]
    a.advance_epoch("c/d", 2, 70, "[]")
    b.advance_epoch("c/d", 2, 80, "[1]")                  # the same step decided elsewhere first: no change
    b.advance_epoch("c/d", 4, 90, "[2]")                  # not the next step: no change
    assert b.read_epochs() == [("c/d", 2, 70, "[]")]
    b.advance_epoch("c/d", 3, 90, "[3]")
    assert a.read_epochs() == [("c/d", 3, 90, "[3]")]


def test_dedup_gc_floor_only_rises(store):
    seq = store.claim("c", 0)
    store.commit([Write("c", 0, seq, "k", KEEP, processed=[("a", "s1", 10), ("b", "s1", 20), ("c", "s2", 5)])])
    assert store.gc_dedup("c", "s1", 15) == 1
    assert store.seen("c", ["a", "b", "c"]) == {"b", "c"}
    assert store.gc_dedup("c", "s1", 12) == 0
    assert store.gc_floors("c") == {"s1": 15}


def test_dedup_gc_of_the_intervals_a_worker_holds_is_fenced_by_their_sequencers(opener):
    """A worker process collects only the intervals it holds: ids of an interval claimed since by another
    owner stay (that owner may have loaded an older floor), and the floor is raised for every owner."""
    a, b = opener(), opener()
    a.claim("c", 0, 3)
    a.claim("c", 1, 3)
    a.commit([Write("c", 0, 3, "k0", KEEP, processed=[("x0", "s", 10)]),
              Write("c", 1, 3, "k1", KEEP, processed=[("x1", "s", 10), ("y1", "s", 30)])])
    b.claim("c", 1, 4)                                      # interval 1 moved to b
    assert a.gc_dedup("c", "s", 20, {0: 3, 1: 3}) == 1      # only x0: interval 1 is not a's any more
    assert b.seen("c", ["x0", "x1", "y1"]) == {"x1", "y1"}
    assert b.gc_floors("c") == {"s": 20}
    assert b.gc_dedup("c", "s", 20, {}) == 0
    assert b.gc_dedup("c", "s", 20, {1: 4}) == 1
    assert a.seen("c", ["x1", "y1"]) == {"y1"}
    # a floor stored by another process above the caller's: the caller's cores apply only its own, so only
    # ids below that go; the stored floor stays the higher one
    b.commit([Write("c", 1, 4, "k1", KEEP, processed=[("z1", "s", 25)])])
    b.gc_dedup("c", "s", 40, {})
    assert b.gc_dedup("c", "s", 28, {1: 4}) == 1        # z1 (25), not y1 (30)
    assert b.seen("c", ["y1", "z1"]) == {"y1"} and b.gc_floors("c") == {"s": 40}


def test_production_floor_reports_keep_the_newest_sequencer_per_interval(opener):
    a, b = opener(), opener()
    a.report_production_floors([("s", 0, 5, 100), ("s", 1, 5, 200)])
    b.report_production_floors([("s", 0, 6, 150)])
    a.report_production_floors([("s", 0, 5, 900)])          # a fenced owner's report changes nothing
    assert sorted(b.read_production_floors()) == [("s", 0, 6, 150), ("s", 1, 5, 200)]


def test_watermarks_never_decrease(store):
    store.save_watermarks({"a": 10, "b": 5})
    store.save_watermarks({"a": 7, "b": 9})
    assert store.read_watermarks() == {"a": 10, "b": 9}


@pytest.mark.timeout(60)
def test_survives_reopen_and_fences_across_connections(opener):
    s1 = opener()
    seq1 = s1.claim("c", 0)
    s1.commit([Write("c", 0, seq1, "k", b"1", [("t", 9, "watermark")], [], [("r", "s", 1)], [prod("p")])])
    s2 = opener()
    assert s2.read_states("c", ["k"]) == {"k": b"1"}
    assert s2.read_timers("c", [0]) == [("k", "t", 9, "watermark")]
    assert [p.id for p in s2.pending_productions("c", 0)] == ["p"]
    s2.claim("c", 0)  # another process takes the interval over
    with pytest.raises(StaleSequencer):
        s1.commit([Write("c", 0, seq1, "k", b"2")])
    assert s2.read_states("c", ["k"]) == {"k": b"1"}
    assert s1.read_states("c", ["k"]) == {"k": b"1"}


def test_a_batch_ends_as_its_writes_applied_one_by_one(store):
    """The same key, timer and production changed several times in one batch: the last change wins."""
    seq = store.claim("c", 1)
    store.commit([Write("c", 1, seq, "gone", b"old", [("x", 1, "wall")])])
    store.commit([
        Write("c", 1, seq, "k", b"a", [("t", 10, "watermark")], [], [("r1", "s", 5)], [prod("p1"), prod("p2")]),
        Write("c", 1, seq, "k", KEEP, [("u", 20, "wall")], ["t"], [("r2", "s", 6)], [], ["p1"]),
        Write("c", 1, seq, "k", b"b", [("t", 30, "watermark")], ["u"]),
        Write("c", 1, seq, "gone", None, [], ["x"], productions=[prod("p1")]),
        Write("c", 1, seq, "k2", b"c", [("v", 5, "wall")]),
        Write("c", 1, seq, "k2", KEEP, [], ["v"], productions_done=["p2"]),
    ])
    assert store.read_states("c", ["k", "k2", "gone"]) == {"k": b"b", "k2": b"c"}
    assert sorted(store.read_timers("c", [1])) == [("k", "t", 30, "watermark")]
    assert store.seen("c", ["r1", "r2"]) == {"r1", "r2"}
    assert [p.id for p in store.pending_productions("c", 1)] == ["p1"]


@pytest.mark.timeout(60)
def test_two_workers_racing_on_one_interval_with_a_claim_between(opener):
    """Worker A commits ever higher values to one key; worker B claims the interval midway. Every commit
    of A that returned is before the claim (B sees the last one), and every later one is refused whole."""
    a, b = opener(), opener()
    seq_a = a.claim("c", 7)
    done: list[int] = []
    refused: list[BaseException] = []

    def worker_a() -> None:
        n = 0
        while True:
            n += 1
            try:
                a.commit([Write("c", 7, seq_a, "k", str(n).encode(), [("t", n, "watermark")], [],
                                [(f"r{n}", "s", n)])])
            except StaleSequencer as e:
                refused.append(e)
                return
            done.append(n)

    t = threading.Thread(target=worker_a, daemon=True)
    t.start()
    try:
        wait_until(lambda: len(done) >= 20 or not t.is_alive(), 30, message="worker A committing")
        seq_b = b.claim("c", 7)
        seen_by_b = b.read_states("c", ["k"])["k"]
    finally:
        t.join(30)
    assert refused and done, (refused, len(done))
    assert seen_by_b == str(done[-1]).encode()
    assert b.read_timers("c", [7]) == [("k", "t", done[-1], "watermark")]
    refused_id = f"r{done[-1] + 1}"
    assert b.seen("c", [refused_id, f"r{done[-1]}"]) == {f"r{done[-1]}"}
    b.commit([Write("c", 7, seq_b, "k", b"b")])
    assert a.read_states("c", ["k"]) == {"k": b"b"}


def test_store_url_is_checked(pg_url):
    assert isinstance(open_store("memory://"), MemoryStore)
    pg = open_store(pg_url)
    assert isinstance(pg, PostgresStore) and pg.schema.startswith("t_")
    pg.close()
    with pytest.raises(ValueError, match="scheme must be one of memory://, sqlite:///, postgresql://"):
        open_store("redis://x")
    with pytest.raises(ValueError, match="schema"):
        open_store(pg_url.split("?")[0] + "?schema=Robert'); DROP TABLE state;--")


def _waiting_locks(conn: psycopg.Connection) -> int:
    """Locks other sessions of the server wait for now."""
    return conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND pid <> pg_backend_pid()").fetchone()[0]


@pytest.mark.timeout(120)
def test_a_commit_meeting_a_claim_in_progress_waits_for_it_and_is_refused(pg_url):
    """The fence across sessions: a claim not yet committed holds the interval's fence; a commit under the
    old sequencer that comes meanwhile waits for the claim, then reads the new sequencer and is refused
    (a commit that took no lock, or read the sequencers under the snapshot it began with, would land)."""
    from millwheel._pgstore import _FENCE_LOCK
    old_owner, schema = open_store(pg_url), pg_url.split("schema=")[1]
    try:
        assert old_owner.claim("c", 0, sequencer=1) == 1
        old_owner.commit([Write("c", 0, 1, "k", state=b"before")])
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as claimer, \
                psycopg.connect(pg_url.split("?")[0], autocommit=True) as look:
            claimer.execute(f"SET search_path TO {schema}")
            claimer.execute("BEGIN")           # the claim's own statements, its COMMIT held back
            claimer.execute("UPDATE intervals SET sequencer = 2 WHERE computation = 'c' AND interval_id = 0")
            claimer.execute(_FENCE_LOCK, ("c", 0))
            outcome = []

            def commit():
                try:
                    old_owner.commit([Write("c", 0, 1, "k", state=b"after")])
                    outcome.append("landed")
                except StaleSequencer:
                    outcome.append("refused")
            t = threading.Thread(target=commit, daemon=True)
            t.start()
            wait_until(lambda: _waiting_locks(look) >= 1 or outcome, 30, message="the commit waiting for the claim")
            assert outcome == []               # it waits ...
            claimer.execute("COMMIT")
            t.join(30)
        assert outcome == ["refused"]          # ... and then sees the claim's sequencer
        assert old_owner.read_states("c", ["k"]) == {"k": b"before"}
    finally:
        old_owner.close()


@pytest.mark.timeout(120)
def test_a_claim_meeting_a_commit_in_progress_waits_for_it_to_land(pg_url):
    """A commit in flight (held inside its transaction, after its fence check, by a trigger waiting on a
    lock the test holds) keeps a claim of its interval waiting until it has landed: the write is in, and
    the claim's sequencer fences the next commit (a claim that did not wait would return first)."""
    schema = pg_url.split("schema=")[1]
    owner, new_owner = open_store(pg_url), open_store(pg_url)
    try:
        assert owner.claim("c", 0, sequencer=1) == 1
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as test:
            test.execute(f"SET search_path TO {schema}")
            test.execute("CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$")
            test.execute("CREATE TRIGGER hold BEFORE INSERT ON state FOR EACH ROW WHEN (NEW.key = 'slow') "
                         "EXECUTE FUNCTION hold()")
            test.execute("SELECT pg_advisory_lock(4242)")
            done = []
            committing = threading.Thread(target=lambda: done.append(owner.commit([Write("c", 0, 1, "slow",
                                                                                        state=b"v")])),
                                          daemon=True)
            committing.start()
            wait_until(lambda: _waiting_locks(test) >= 1, 30, message="the commit held in its trigger")
            claimed = []
            claiming = threading.Thread(target=lambda: claimed.append(new_owner.claim("c", 0, sequencer=2)),
                                        daemon=True)
            claiming.start()
            wait_until(lambda: _waiting_locks(test) >= 2 or claimed, 30, message="the claim waiting for the commit")
            assert claimed == [] and done == []
            test.execute("SELECT pg_advisory_unlock(4242)")
            committing.join(30)
            claiming.join(30)
        assert done == [None] and claimed == [2]
        assert new_owner.read_states("c", ["slow"]) == {"slow": b"v"}
        with pytest.raises(StaleSequencer):
            owner.commit([Write("c", 0, 1, "k", state=b"late")])
    finally:
        owner.close()
        new_owner.close()


@pytest.mark.timeout(60)
def test_a_session_left_idle_inside_a_transaction_is_ended_so_a_new_owners_claim_does_not_wait_for_ever(pg_url):
    """A worker stopped between the statements of a commit holds its intervals' rows locked; the server
    ends such a session after ``idle_in_transaction_s``, so the next owner's claim goes through."""
    with pytest.raises(ValueError, match="idle_in_transaction_s must not be negative"):
        open_store(f"{pg_url}&idle_in_transaction_s=-1")
    stopped = open_store(f"{pg_url}&idle_in_transaction_s=1")
    new_owner = open_store(pg_url)
    try:
        assert stopped.claim("c", 0, sequencer=1) == 1
        with stopped._conn() as conn:          # one of the store's own sessions, as a commit uses it
            conn.execute("BEGIN")
            conn.execute("SELECT sequencer FROM intervals WHERE computation = 'c' FOR SHARE").fetchall()
            claimed = []
            claimer = threading.Thread(target=lambda: claimed.append(new_owner.claim("c", 0, sequencer=2)),
                                       daemon=True)
            claimer.start()                    # waits on the lock the idle transaction holds ...
            wait_until(lambda: claimed, 20, message="the new owner's claim once the idle session is ended")
            assert claimed == [2]              # ... until the server ends that session
        # the stopped owner resumes: its next commit meets the ended session (back in its pool), is tried
        # again on a new one, and its old sequencer is fenced
        with pytest.raises(StaleSequencer):
            stopped.commit([Write("c", 0, 1, "k", state=b"v")])
        assert stopped.statistics().retries >= 1
        assert new_owner.read_states("c", ["k"]) == {}
    finally:
        stopped.close()
        new_owner.close()


# ---- PostgreSQL only: a server that goes away and comes back --------------------------------------------
@pytest.mark.timeout(120)
def test_postgres_restarted_between_commits_the_client_retries_and_nothing_is_lost_or_doubled(own_pg):
    store = open_store(f"{own_pg.url}?retry_s=60")
    try:
        seq = store.claim("c", 0)
        store.commit([Write("c", 0, seq, "k", b"1", processed=[("r1", "s", 1)], productions=[prod("p1")])])
        own_pg.crash()  # as after a power cut: the next start replays the WAL
        own_pg.start()
        # the pooled connection is dead: the commit fails once, then succeeds on a new connection
        store.commit([Write("c", 0, seq, "k", b"2", processed=[("r2", "s", 2)], productions=[prod("p2")])])
        assert store.statistics().retries >= 1
        own_pg.stop()
        outcome: list = []

        def commit_while_down() -> None:
            try:
                store.commit([Write("c", 0, seq, "k", b"3", processed=[("r3", "s", 3)],
                                    productions_done=["p1"])])
                outcome.append("ok")
            except BaseException as e:  # noqa: BLE001 - reported below
                outcome.append(e)

        before = store.statistics().retries
        t = threading.Thread(target=commit_while_down, daemon=True)
        t.start()
        try:
            wait_until(lambda: store.statistics().retries >= before + 2, 30, message="the client retrying")
            assert outcome == []  # still waiting for the server
            own_pg.start()
        finally:
            t.join(60)
        assert outcome == ["ok"]
        assert store.read_states("c", ["k"]) == {"k": b"3"}
        assert store.seen("c", ["r1", "r2", "r3"]) == {"r1", "r2", "r3"}
        assert [p.id for p in store.pending_productions("c", 0)] == ["p2"]
        assert store.claim("c", 0) == seq + 1
    finally:
        store.close()


class LosesTheAck(PostgresStore):
    """Commits, then lets another worker claim the interval, then reports the connection lost: the commit
    landed, but its writer cannot know."""

    def __init__(self, url: str, rival: PostgresStore) -> None:
        self.rival, self.fired = rival, False
        super().__init__(url.split("?")[0], schema=url.split("schema=")[1])

    def _commit(self, conn, attempt, net):
        landed = super()._commit(conn, attempt, net)
        if not self.fired:
            self.fired = True
            self.rival.claim("c", 0)
            raise psycopg.OperationalError("server closed the connection unexpectedly (injected)")
        return landed


@pytest.mark.timeout(60)
def test_postgres_commit_whose_ack_was_lost_is_found_by_its_dedup_ids_and_not_applied_again(pg_url):
    rival = open_store(pg_url)
    store = LosesTheAck(pg_url, rival)
    try:
        seq = store.claim("c", 0)
        store.commit([Write("c", 0, seq, "k", b"1", processed=[("r1", "s", 1), ("r2", "s", 1)],
                            productions=[prod("p1")])])  # lands, then the ack is lost; retried: found
        stats = store.statistics()
        assert (stats.retries, stats.already_applied, stats.commits, stats.fenced) == (1, 1, 0, 0)
        assert rival.read_states("c", ["k"]) == {"k": b"1"}
        assert rival.seen("c", ["r1", "r2"]) == {"r1", "r2"}
        assert [p.id for p in rival.pending_productions("c", 0)] == ["p1"]
        with pytest.raises(StaleSequencer):  # the interval is the rival's now
            store.commit([Write("c", 0, seq, "k", b"2", processed=[("r3", "s", 2)])])
        assert store.statistics().fenced == 1
    finally:
        store.close()
        rival.close()


@pytest.mark.timeout(60)
def test_postgres_a_batch_with_record_ids_already_stored_is_applied_whole_and_keeps_their_first_rows(pg_url):
    """The commit function inserts a batch's record ids with a plain INSERT and, when one is stored already
    (a batch applied again), with ON CONFLICT instead: the batch still lands whole (state, new ids,
    productions), and an id stored before keeps its first row."""
    store = open_store(pg_url)
    schema = pg_url.split("schema=")[1]
    try:
        seq = store.claim("c", 0)
        store.commit([Write("c", 0, seq, "k", b"1", processed=[("r1", "s", 1)])])
        store.commit([Write("c", 0, seq, "k", b"2", processed=[("r2", "s", 2), ("r1", "t", 9)],
                            productions=[prod("p1")]),
                      Write("c", 0, seq, "j", b"3", processed=[("r3", "s", 3)])])
        assert store.statistics().commits == 2
        other = open_store(pg_url)
        try:
            assert other.read_states("c", ["k", "j"]) == {"k": b"2", "j": b"3"}
            assert other.seen("c", ["r1", "r2", "r3"]) == {"r1", "r2", "r3"}
            assert [p.id for p in other.pending_productions("c", 0)] == ["p1"]
        finally:
            other.close()
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            assert conn.execute(f"SELECT id, sender, produced_at FROM {schema}.dedup ORDER BY id").fetchall() == \
                [("r1", "s", 1), ("r2", "s", 2), ("r3", "s", 3)]
    finally:
        store.close()


# ---- PostgreSQL only: productions stored a row per commit ----------------------------------------------
def _batch_rows(pg_url: str) -> list[tuple]:
    schema = pg_url.split("schema=")[1]
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        return conn.execute(f"SELECT sender, interval_id, acked FROM {schema}.production_batches "
                            "ORDER BY acked").fetchall()


@pytest.mark.timeout(60)
def test_postgres_keeps_a_commits_productions_in_one_row_until_the_last_is_acked_even_by_a_new_owner(pg_url):
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        seq = first.claim("c", 0)
        first.commit([Write("c", 0, seq, "k1", b"1", productions=[prod("p1"), prod("p2")]),
                      Write("c", 0, seq, "k2", b"1", productions=[prod("p3", at=90)])])
        first.commit([Write("c", 0, seq, "k3", b"1", productions=[prod("p4")])])
        assert [r[:2] for r in _batch_rows(pg_url)] == [("c", 0), ("c", 0)]   # a row per commit, not per production
        first.commit([Write("c", 0, seq, productions_done=["p1", "p4"])])
        rows = _batch_rows(pg_url)
        assert len(rows) == 1 and '"p1"' in rows[0][2]       # p4's row is gone, p1 is marked in the other
        # a new owner (another process) sees only what is not acked, and finishes the row
        seq2 = second.claim("c", 0)
        assert [p.id for p in second.pending_productions("c", 0)] == ["p3", "p2"]
        with pytest.raises(StaleSequencer):                  # the old owner can no longer ack (nor write)
            first.commit([Write("c", 0, seq, productions_done=["p2", "p3"])])
        assert len(_batch_rows(pg_url)) == 1
        second.commit([Write("c", 0, seq2, productions_done=["p2"])])
        assert [p.id for p in second.pending_productions("c", 0)] == ["p3"]
        second.commit([Write("c", 0, seq2, productions_done=["p3"])])
        assert _batch_rows(pg_url) == []
        # acks of productions this store never saw written or read: it reads their rows first
        seq3 = first.claim("c", 0)
        first.commit([Write("c", 0, seq3, productions=[prod("p5"), prod("p6")])])
        third = open_store(pg_url)
        try:
            third.commit([Write("c", 0, seq3, productions_done=["p5", "p6"])])
        finally:
            third.close()
        assert _batch_rows(pg_url) == [] and first.pending_productions("c", 0) == []
    finally:
        first.close()
        second.close()


def _older_schema(pg_url: str, *statements: str) -> str:
    """Make the store's schema as an older version left it (``statements``, ``{schema}`` filled in) before
    any store opens it; returns the schema's name."""
    schema = pg_url.split("schema=")[1]
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for statement in statements:
            conn.execute(statement.format(schema=schema))
    return schema


@pytest.mark.timeout(60)
def test_postgres_schema_with_a_row_per_production_is_upgraded_when_the_store_opens(pg_url):
    schema = _older_schema(
        pg_url, "CREATE TABLE {schema}.productions (sender TEXT, interval_id INTEGER, id TEXT, "
                "stream TEXT NOT NULL, key TEXT NOT NULL, value BYTEA NOT NULL, ts BIGINT NOT NULL, "
                "produced_at BIGINT NOT NULL, PRIMARY KEY (sender, interval_id, id))",
        "INSERT INTO {schema}.productions VALUES ('c', 2, 'a', 'out', 'k', '\\x7b7d', 5, 20), "
        "('c', 2, 'b', 'out', 'j', '\\x5b5d', 6, 10), ('d', 0, 'x', 's', 'k', '\\x31', 7, 30)")
    store = open_store(pg_url)
    try:
        assert [(p.id, p.key, p.value, p.timestamp_us) for p in store.pending_productions("c", 2)] == \
            [("b", "j", b"[]", 6), ("a", "k", b"{}", 5)]
        assert [p.id for p in store.pending_productions("d", 0)] == ["x"]
        seq = store.claim("c", 2)
        store.commit([Write("c", 2, seq, productions_done=["a", "b"])])
        assert store.pending_productions("c", 2) == []
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.productions",)).fetchone()[0] is None
    finally:
        store.close()


@pytest.mark.timeout(60)
def test_the_older_commit_function_is_dropped_when_the_store_opens(pg_url):
    """The commit function of the version before fenced with a row lock, which this version's claims do
    not wait for: the store drops it, so a process of that version still running fails instead of
    writing past a claim."""
    schema = _older_schema(
        pg_url, "CREATE FUNCTION {schema}.commit_v1(seqs json, state_put json, state_del json, timer_del json, "
                "timer_put json, dedup_put json, batch_put json, batch_del json, batch_ack json, aside json) "
                "RETURNS void LANGUAGE sql AS 'SELECT'")
    store = open_store(pg_url)
    try:
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            names = {r[0] for r in conn.execute("SELECT proname FROM pg_proc p JOIN pg_namespace n ON "
                                                "n.oid = p.pronamespace WHERE n.nspname = %s", (schema,))}
        assert "commit_v1" not in names and "commit_v2" in names
    finally:
        store.close()


# ---- PostgreSQL only: a commit is one call of the server-side function -------------------------------
def _random_batch(rng: random.Random, seqs: dict[int, int], unacked: dict[int, list[str]], n: list[int]) -> list[Write]:
    """A batch of random writes to three intervals: states set, kept and deleted, timers set and deleted,
    fresh record ids, productions written and acked (some in the batch that wrote them, some later), the
    same key changed several times, now and then a record set aside."""
    writes = []
    for _ in range(rng.randint(1, 8)):
        iv = rng.randrange(3)
        n[0] += 1
        if rng.random() < 0.15:      # acks only
            done = rng.sample(unacked[iv], min(len(unacked[iv]), rng.randint(1, 3)))
            for pid in done:
                unacked[iv].remove(pid)
            writes.append(Write("c", iv, seqs[iv], productions_done=done))
            continue
        prods = [StoredProduction(f"p{n[0]}-{j}", "out", f"k{rng.randrange(5)}", bytes([rng.randrange(256)]) * j,
                                  rng.randrange(1000), rng.randrange(1000)) for j in range(rng.randint(0, 3))]
        done = rng.sample(unacked[iv], min(len(unacked[iv]), rng.randint(0, 2)))
        for pid in done:
            unacked[iv].remove(pid)
        unacked[iv].extend(p.id for p in prods)
        aside = [SetAsideRecord("c", f"r{n[0]}", "k", "ValueError: x", 5, b'{"v":1}', 1, "s", 2)] \
            if rng.random() < 0.05 else []
        writes.append(Write("c", iv, seqs[iv], f"k{rng.randrange(6)}",
                            rng.choice([KEEP, None, f"v{n[0]}".encode()]),
                            [(f"t{t}", rng.randrange(1000), rng.choice(["wall", "watermark"]))
                             for t in rng.sample(range(3), rng.randint(0, 2))],
                            [f"t{t}" for t in rng.sample(range(3), rng.randint(0, 2))],
                            [(f"r{n[0]}", "s", n[0])] + ([(f"r{n[0]}x", "s2", n[0])] if rng.random() < 0.3 else []),
                            prods, done, aside))
    return writes


def _contents(store, sender_store=None) -> tuple:
    keys = [f"k{i}" for i in range(6)]
    prods = sender_store or store
    return (store.read_states("c", keys), sorted(store.read_timers("c", [0, 1, 2])),
            sorted(store.dedup_ids("c", [0, 1, 2])),
            {iv: sorted((p.id, p.stream, p.key, p.value, p.timestamp_us, p.produced_at_us)
                        for p in prods.pending_productions("c", iv)) for iv in range(3)},
            store.set_aside_records())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(4))
def test_postgres_commits_of_random_batches_leave_what_their_writes_applied_one_by_one_leave(pg_url, seed):
    """The commit function against the reference (the memory store applies each write in turn): after
    every batch the state, timers, record ids, unacked productions (read by this process and by another
    one, which reads the production rows) and set-aside records are the same."""
    rng = random.Random(seed)
    store, other, ref = open_store(pg_url), open_store(pg_url), MemoryStore()
    try:
        seqs = {iv: store.claim("c", iv) for iv in range(3)}
        assert {iv: ref.claim("c", iv) for iv in range(3)} == seqs
        unacked: dict[int, list[str]] = {0: [], 1: [], 2: []}
        n = [0]
        for step in range(40):
            batch = _random_batch(rng, seqs, unacked, n)
            store.commit(batch)
            ref.commit(batch)
            if step % 8 == 7:
                assert _contents(store) == _contents(ref)
        assert _contents(store) == _contents(ref)
        assert _contents(store, other) == _contents(ref)
        assert store.statistics().commits == 40
    finally:
        store.close()
        other.close()


@pytest.mark.timeout(60)
def test_postgres_a_batch_with_one_stale_interval_is_refused_whole_and_names_it(pg_url):
    owner, zombie = open_store(pg_url), open_store(pg_url)
    try:
        s1, s2 = zombie.claim("c", 1), zombie.claim("c", 2)
        zombie.commit([Write("c", 1, s1, "a", b"1", processed=[("r1", "s", 1)]),
                       Write("c", 2, s2, "b", b"1", productions=[prod("p1")])])
        new = owner.claim("c", 2)
        with pytest.raises(StaleSequencer, match=f"write to 'c' interval 2 with sequencer {s2} rejected: current is "
                                                 f"{new} \\(1 stale interval\\(s\\) in the batch\\)"):
            zombie.commit([Write("c", 1, s1, "a", b"2", [("t", 5, "wall")], [], [("r2", "s", 2)], [prod("p2")]),
                           Write("c", 2, s2, "b", None, productions_done=["p1"])])
        assert zombie.statistics().fenced == 1
        assert owner.read_states("c", ["a", "b"]) == {"a": b"1", "b": b"1"}     # nothing of it, not even interval 1's
        assert owner.read_timers("c", [1]) == [] and owner.seen("c", ["r1", "r2"]) == {"r1"}
        assert owner.pending_productions("c", 1) == [] and [p.id for p in owner.pending_productions("c", 2)] == ["p1"]
        zombie.commit([Write("c", 1, s1, "a", b"3")])      # the interval it still holds: its session goes on
        owner.commit([Write("c", 2, new, "b", b"4", productions_done=["p1"])])
        assert owner.read_states("c", ["a", "b"]) == {"a": b"3", "b": b"4"} and owner.pending_productions("c", 2) == []
    finally:
        owner.close()
        zombie.close()


def _scans(pg_url: str) -> dict[str, tuple[int, int]]:
    schema = pg_url.split("schema=")[1]
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        return {t: (s, i or 0) for t, s, i in conn.execute(
            "SELECT relname, seq_scan, idx_scan FROM pg_stat_user_tables WHERE schemaname = %s", (schema,))}


@pytest.mark.timeout(60)
def test_postgres_commits_go_by_key_even_when_the_production_rows_are_mostly_dead(pg_url):
    """Each commit inserts a production row and deletes the one before it, so the table is nearly all dead
    rows until a vacuum; the commit function's statements must look rows up by key, never scan (a plan that
    scanned cost more with every commit)."""
    tables = ("production_batches", "intervals", "state", "dedup")
    open_store(pg_url).close()     # the tables made (building their indexes scanned them), its session's counts in
    wait_until(lambda: all(t in _scans(pg_url) for t in tables), timeout=10)
    before = {t: s for t, (s, _) in _scans(pg_url).items() if t in tables}
    store = open_store(pg_url)
    try:
        seq = store.claim("c", 0)
        store.commit([Write("c", 0, seq, "k", b"0", productions=[prod("p0")])])
        for i in range(1, 300):
            store.commit([Write("c", 0, seq, "k", str(i).encode(), processed=[(f"r{i}", "s", i)],
                                productions=[prod(f"p{i}")], productions_done=[f"p{i - 1}"])])
    finally:
        store.close()             # its sessions end, and report their counts
    wait_until(lambda: _scans(pg_url)["production_batches"][1] >= 299, timeout=10)
    assert {t: s for t, (s, _) in _scans(pg_url).items() if t in tables} == before


@pytest.mark.timeout(60)
def test_postgres_schema_with_the_older_dedup_index_gets_the_brin_one_when_the_store_opens(pg_url):
    schema = _older_schema(
        pg_url, "CREATE TABLE {schema}.dedup (computation TEXT, id TEXT, sender TEXT NOT NULL, "
                "produced_at BIGINT NOT NULL, interval_id INTEGER NOT NULL, PRIMARY KEY (computation, id))",
        "CREATE INDEX dedup_by_sender ON {schema}.dedup (computation, sender, produced_at)",
        "INSERT INTO {schema}.dedup VALUES ('c', 'old', 's', 5, 0), ('c', 'new', 's', 50, 0)")
    store = open_store(pg_url)
    try:
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            indexes = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s "
                                        "AND tablename = 'dedup'", (schema,)).fetchall())
        assert "dedup_by_sender" not in indexes and "USING brin (produced_at)" in indexes["dedup_by_time"]
        assert store.gc_dedup("c", "s", 10) == 1
        assert store.seen("c", ["old", "new"]) == {"new"}
    finally:
        store.close()
