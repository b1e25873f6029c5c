"""FileSink's writes fenced by the interval's sequencer: an old owner of the sink's interval, stopped in the
middle of a batch and resumed after its interval moved, must not cut or change what the new owner has
written. Driven interleavings of FileSink calls (each owner a FileSink of its own on the same file, its
context the state it read and the sequencer it claimed, the store a model that refuses commits under an
older sequencer), and a Runtime run showing the runtime gives user code its interval's sequencer."""
from __future__ import annotations

import random

import orjson
import pytest

from millwheel import FileSink, ListInjector, Runtime, RuntimeConfig, Topology
from millwheel._model import new_record
from millwheel._runner import KeyInput, run_key
from millwheel._sinks import SINK_KEY
from millwheel._store import open_store

pytestmark = pytest.mark.timeout(120)


class _Ctx:
    """What FileSink reads and sets of a context: the key's state and the interval's sequencer."""

    def __init__(self, state, sequencer):
        self.state, self.sequencer, self.key = state, sequencer, SINK_KEY


class _Record:
    def __init__(self, value):
        self.value = value


class _Owner:
    """One owner of the sink's interval: the sequencer it claimed and the state it read from the store at
    its claim, advanced by its own writes (a key's next records run on the checkpoint in flight)."""

    def __init__(self, path, sequencer, store):
        self.sink, self.sequencer = FileSink(path), sequencer
        self.state, self.lines = dict(store.state) if store.state else None, list(store.lines)

    def write(self, n):
        """Process record ``n``; False if the sink refused it (nothing written, state unchanged)."""
        ctx = _Ctx(self.state, self.sequencer)
        try:
            self.sink.process_record(ctx, _Record({"n": n}))
        except Exception:  # noqa: BLE001 - the run raised: its checkpoint is never committed
            return False
        self.state = ctx.state
        self.lines.append(orjson.dumps({"n": n}) + b"\n")
        return True


class _Store:
    """The store's committed state of the sink's key and the lines it stands for; commits under a sequencer
    older than the newest claim are refused."""

    def __init__(self):
        self.state, self.lines, self.sequencer = None, [], 0

    def claim(self):
        self.sequencer += 1
        return self.sequencer

    def commit(self, owner):
        if owner.sequencer < self.sequencer:
            return False
        self.state, self.lines = owner.state, list(owner.lines)
        return True


def _committed_part(path, store) -> bytes:
    data = path.read_bytes() if path.exists() else b""
    return data[:(store.state or {}).get("bytes", 0)]


def test_an_old_owner_resumed_after_its_interval_moved_neither_cuts_nor_changes_the_new_owners_lines(tmp_path):
    """Q writes and commits record 0; it is stopped with record 1 in its batch (its state the committed
    length). P claims the interval, writes and commits records 1-3. Q resumes and processes record 1 from
    the length it had: before the fence it cut the file back to that length, removing P's committed lines,
    and wrote its own; now it writes nothing and its run fails (its commit would be refused anyway)."""
    path, store = tmp_path / "windows.jsonl", _Store()
    q = _Owner(path, store.claim(), store)
    assert q.write(0) and store.commit(q)
    p = _Owner(path, store.claim(), store)
    for n in (1, 2, 3):
        assert p.write(n)
    assert store.commit(p)
    assert not q.write(1), "the old owner's write went through"
    assert not store.commit(q)
    assert path.read_bytes() == b"".join(store.lines), path.read_bytes()


def test_an_old_owners_lines_written_before_the_new_owners_first_write_are_cut_by_it(tmp_path):
    """An old owner that writes after the new owner's claim but before the new owner's first write writes
    past the committed length; the new owner's first write cuts it back, as after a crash."""
    path, store = tmp_path / "windows.jsonl", _Store()
    q = _Owner(path, store.claim(), store)
    assert q.write(0) and store.commit(q)
    p = _Owner(path, store.claim(), store)
    assert q.write(1) and q.write(2)                  # uncommitted: its commit is refused
    assert not store.commit(q)
    assert p.write(5) and store.commit(p)
    assert path.read_bytes() == b"".join(store.lines) == b'{"n":0}\n{"n":5}\n'


def test_random_interleavings_of_owners_and_resumed_old_owners_keep_the_committed_lines(tmp_path):
    """Random runs: owners claim one after another (each from the committed state), any owner, old ones
    included, writes records and tries to commit at any time. The committed part of the file always holds
    exactly the store's committed lines, and after the newest owner's next write and commit the file is
    exactly those lines (before the fence, an old owner's write cut the committed lines in most runs)."""
    for seed in range(200):
        rng = random.Random(seed)
        path, store = tmp_path / f"w{seed}.jsonl", _Store()
        owners = [_Owner(path, store.claim(), store)]
        n = 0
        for _ in range(rng.randrange(5, 40)):
            action = rng.random()
            if action < 0.15:
                owners.append(_Owner(path, store.claim(), store))
            else:
                owner = owners[-1] if action < 0.6 else rng.choice(owners)
                for _ in range(rng.randrange(1, 4)):
                    owner.write(n)
                    n += 1
                if rng.random() < 0.7:
                    store.commit(owner)
            assert _committed_part(path, store) == b"".join(store.lines), f"seed {seed}: committed lines changed"
        last = owners[-1]
        last.state, last.lines = (dict(store.state) if store.state else None), list(store.lines)
        assert last.write(n) and store.commit(last)
        assert path.read_bytes() == b"".join(store.lines), f"seed {seed}"


def test_the_same_owner_writes_again_after_a_write_it_did_not_commit(tmp_path):
    """A run tried again by its owner (its checkpoint not committed: user code raised on a later record, or
    the commit is retried) writes from the committed length again, under the same sequencer."""
    path, store = tmp_path / "windows.jsonl", _Store()
    q = _Owner(path, store.claim(), store)
    assert q.write(0) and store.commit(q)
    assert q.write(1)
    q.state, q.lines = dict(store.state), list(store.lines)       # the run undone
    assert q.write(2) and store.commit(q)
    assert path.read_bytes() == b'{"n":0}\n{"n":2}\n'


def test_without_a_sequencer_the_sink_writes_unfenced(tmp_path):
    """The pure runner gives no sequencer: the sink writes as before (cut back, then append)."""
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b'{"n":0}\nleft by a crash')
    records = [new_record(SINK_KEY, {"n": n}, 1, f"r{n}", "in", "up", 1) for n in (1, 2)]
    res = run_key(FileSink(path), KeyInput("sink", SINK_KEY, records, orjson.dumps({"bytes": 8}), {}, set(), 0, 1))
    assert path.read_bytes() == b'{"n":0}\n{"n":1}\n{"n":2}\n'
    assert orjson.loads(res.state) == {"bytes": len(path.read_bytes())}
    assert not (tmp_path / ".windows.jsonl.fence").exists()


def test_the_runtime_gives_user_code_its_intervals_sequencer_and_the_sink_fences_with_it(tmp_path):
    """A one-process run: every record's ``ctx.sequencer`` is the sequencer its interval was claimed under
    (each interval claimed once here: 1), and the sink's fence file holds the sink interval's."""
    seen = []

    class Seen(FileSink):
        def process_record(self, ctx, record):
            seen.append(ctx.sequencer)
            super().process_record(ctx, record)

    records = [(f"k{i}", {"i": i}, 1_000_000 + i) for i in range(50)]
    t = Topology()
    t.add_injector("in", ListInjector(records), produces="in")
    t.add_computation("sink", Seen(tmp_path / "out.jsonl"), consumes={"in": FileSink.key})
    with Runtime(t, RuntimeConfig(store="memory://", threads=2, intervals=4)) as rt:
        rt.run_until_idle(timeout_s=60)
    assert len(seen) == 50 and set(seen) == {1}, seen
    assert int((tmp_path / ".out.jsonl.fence").read_bytes().split()[-1]) == 1
    assert sorted(orjson.loads(line)["i"] for line in (tmp_path / "out.jsonl").read_bytes().splitlines()) \
        == list(range(50))


def _run_sink(records, out, store_url):
    """A one-process run of ``records`` into a FileSink at ``out`` on the store at ``store_url``; the
    sink's statistics."""
    t = Topology()
    t.add_injector("in", ListInjector(records), produces="in")
    t.add_computation("sink", FileSink(out), consumes={"in": FileSink.key})
    with Runtime(t, RuntimeConfig(store=store_url, threads=2, intervals=4)) as rt:
        rt.run_until_idle(timeout_s=60)
        return rt.statistics().computations["sink"]


def test_a_new_store_on_the_same_output_takes_the_fence_over_and_writes_every_record_once(tmp_path):
    """The sink's output kept while its store is replaced (a new SQLite file, or the embedded server's
    folder removed): the new store's sequencers start again from 1, below the fence the old store's runs
    left (two starts: 2). The fence is the old store's, so it is not compared with: the new store's first
    write takes it over and cuts the file back to the new store's committed length, as after a crash, and
    every record is written once, none set aside. (Compared across stores, every write was refused and
    every record set aside after its attempts.)"""
    out = tmp_path / "out.jsonl"
    records = [(f"k{i}", {"i": i}, 1_000_000 + i) for i in range(40)]
    old = f"sqlite:///{tmp_path / 'old.db'}"
    _run_sink(records[:20], out, old)
    _run_sink(records, out, old)         # a second start (the injector goes on from 20) claims sequencer 2
    old_fence = (tmp_path / ".out.jsonl.fence").read_bytes().split()
    assert int(old_fence[-1]) == 2, old_fence
    stats = _run_sink(records, out, f"sqlite:///{tmp_path / 'new.db'}")
    assert stats.records_processed == 40 and stats.records_set_aside == 0, stats
    assert sorted(orjson.loads(line)["i"] for line in out.read_bytes().splitlines()) == list(range(40))
    new_fence = (tmp_path / ".out.jsonl.fence").read_bytes().split()
    assert new_fence[0] != old_fence[0] and int(new_fence[-1]) == 1, (old_fence, new_fence)


def test_a_stores_identity_is_kept_in_it_and_differs_between_stores(tmp_path, pg_url):
    """``Store.identity``: made once, read back by every later opening of the same store (SQLite file,
    PostgreSQL schema), another for another store."""
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    ids = []
    for url in (a, a, b, pg_url, pg_url):
        store = open_store(url)
        try:
            ids.append(store.identity)
        finally:
            store.close()
    assert all(isinstance(i, str) and len(i) == 32 for i in ids), ids
    assert ids[0] == ids[1] and ids[3] == ids[4], ids
    assert len({ids[0], ids[2], ids[3]}) == 3, ids
