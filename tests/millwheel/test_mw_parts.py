"""Smaller parts: the file injector's positions and watermark estimate, the state cache, the Bloom
filter, dedup garbage collection, configuration and topology checks."""
from __future__ import annotations

import os

import orjson
import pytest

from millwheel import (END_OF_TIME, FileInjector, JoinedInjector, ListInjector, MillWheelConfigError, Runtime,
                       RuntimeConfig, Topology, TopologyError)
from millwheel._bloom import BloomFilter
from millwheel._model import Delivery, Record
from millwheel._interval import StateCache
from mw_helpers import BASE_US, joined_event
from photon import id_timestamp_us, wait_until

NOW = BASE_US + 3_600_000_000


def write(path, events, tail=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events) + tail)


def old(path):
    os.utime(path, ns=(0, 0))  # finished long ago


def test_file_injector_resumes_exactly_after_returned_records(tmp_path):
    evs = [joined_event(BASE_US + i * 1000, "adv-1", i) for i in range(10)]
    write(tmp_path / "joined" / "a.jsonl", evs[:6], tail=b'{"click_id": "torn')
    write(tmp_path / "joined" / "b.jsonl.inprogress", evs[6:])
    inj = JoinedInjector(tmp_path)
    inj.restore(None)
    first = inj.poll(4, NOW)
    assert [r[0] for r in first.records] == [e["click_id"] for e in evs[:4]]
    assert first.records[0][2] == id_timestamp_us(evs[0]["click_id"])
    again = JoinedInjector(tmp_path)
    again.restore(first.position)
    rest = again.poll(100, NOW)
    assert [r[0] for r in rest.records] == [e["click_id"] for e in evs[4:6]]  # no torn line, no in-progress file
    (tmp_path / "joined" / "b.jsonl.inprogress").rename(tmp_path / "joined" / "b.jsonl")
    assert [r[0] for r in again.poll(100, NOW).records] == [e["click_id"] for e in evs[6:]]


def test_file_injector_estimate_follows_figure_10(tmp_path):
    root = tmp_path / "logs"
    write(root / "a.jsonl", [{"id": "x", "ts": NOW - 5000}, {"id": "y", "ts": NOW - 9000}])
    old(root / "a.jsonl")
    inj = FileInjector(root, key=lambda e: e["id"], timestamp_us=lambda e: e["ts"], max_delay_us=1000)
    inj.restore(None)
    p = inj.poll(1, NOW)
    assert p.watermark_us == NOW - 9000 and not p.caught_up  # the oldest read-but-unreturned event holds it
    p = inj.poll(10, NOW + 10_000)
    assert p.watermark_us == NOW + 9_000 and p.caught_up  # nothing unfinished: now - max delay
    (root / "b.jsonl.inprogress").write_bytes(b"")
    os.utime(root / "b.jsonl.inprogress", ns=(0, 0))
    assert inj.poll(10, NOW + 20_000).watermark_us == NOW + 19_000  # first seen now, later than now - delay
    assert inj.poll(10, NOW + 30_000).watermark_us == NOW + 20_000  # the unfinished file holds it
    write(root / "c.jsonl", [{"id": "z", "ts": NOW + 40_000}])  # just written: unfinished for a while
    assert inj.poll(10, NOW + 40_000).watermark_us == NOW + 20_000
    (root / "b.jsonl.inprogress").rename(root / "b.jsonl")
    os.utime(root / "b.jsonl", ns=(0, 0))
    os.utime(root / "c.jsonl", ns=(0, 0))
    assert inj.poll(10, NOW + 50_000).watermark_us == NOW + 49_000
    assert inj.poll(10, NOW + 45_000).watermark_us == NOW + 49_000  # it never moves back


def test_file_injector_holds_its_estimate_until_caught_up(tmp_path):
    root = tmp_path / "logs"
    write(root / "a.jsonl", [{"id": str(i), "ts": 100 + i, "pad": "x" * 200} for i in range(50)])
    old(root / "a.jsonl")
    inj = FileInjector(root, key=lambda e: e["id"], timestamp_us=lambda e: e["ts"], read_bytes=512)
    inj.restore(None)
    p = inj.poll(1, 1 << 40)
    assert p.watermark_us == 0 and not p.caught_up  # unread bytes may hold anything


def test_bad_lines_are_quarantined_and_skipped(tmp_path):
    root = tmp_path / "logs"
    root.mkdir()
    (root / "a.jsonl").write_bytes(b'{"id": "1", "ts": 5}\nnot json\n{"ts": 7}\n{"id": "2", "ts": 9}\n')
    inj = FileInjector(root, key=lambda e: e["id"], timestamp_us=lambda e: e["ts"],
                       quarantine_dir=tmp_path / "q")
    inj.restore(None)
    p = inj.poll(10, 100)
    assert [r[0] for r in p.records] == ["1", "2"] and inj.bad_records == 2
    inj.close()
    bad = [orjson.loads(x) for x in (tmp_path / "q" / "millwheel-injector.jsonl").read_bytes().splitlines()]
    assert [b["offset"] for b in bad] == [21, 30]
    assert p.position["offsets"] == {"a.jsonl": (root / "a.jsonl").stat().st_size}


def test_state_cache_evicts_keys_that_will_not_be_read_again_first():
    cache = StateCache(2)
    for key in ("timer-key", "plain", "newest"):
        cache.put(key, b"1")
    cache.evict(lambda k: k == "timer-key")
    assert cache.get("timer-key") == (True, b"1") and cache.get("plain") == (False, None)


def test_bloom_filter_has_no_false_negatives():
    bloom = BloomFilter(1000, 0.01)
    ids = [f"id-{i}" for i in range(1000)]
    for i in ids:
        bloom.add(i)
    assert all(bloom.might_contain(i) for i in ids)
    false_positives = sum(bloom.might_contain(f"other-{i}") for i in range(10000))
    assert false_positives < 300
    assert bloom.full


@pytest.mark.timeout(60)
def test_dedup_ids_are_collected_once_no_sender_can_retry_and_older_repeats_are_dropped(tmp_path):
    from test_mw_runtime import QueueInjector, counts, records, topo
    inj = QueueInjector()
    cfg = RuntimeConfig(store=f"sqlite:///{tmp_path / 's.db'}", threads=2, intervals=4, dedup_retention_us=1,
                        gc_interval_us=20_000)
    rt = Runtime(topo(inj), cfg).start()
    try:
        inj.push(records(40), estimate=0)
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 40, 30, message="counted")
        wait_until(lambda: rt.store.gc_floors("count").get("in", 0) > 0 and
                   rt.store.dedup_ids("count", range(4)) == [], 30, message="dedup ids collected")
        before = counts(rt)
        stale = Record("k1", {"i": 1}, 1_000_010, id="in/1/2", stream="nums", sender="in", produced_at_us=1)
        rt.transport.send([Delivery("count", rt.interval_of("k1"), stale)])
        wait_until(lambda: rt.statistics().computations["count"].duplicates_dropped == 1, 30,
                   message="the stale repeat dropped")
        assert counts(rt) == before
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_dedup_gc_never_passes_productions_still_being_stored(tmp_path):
    """A production is stamped, then stored, then registered as outstanding. A dedup GC that runs while the
    store is slow must not raise the floor past it, or its first delivery would be dropped as a repeat."""
    import threading
    from millwheel._store import SQLiteStore
    from test_mw_runtime import QueueInjector, records, topo

    class SlowInjectorCommits(SQLiteStore):
        def __init__(self, path):
            super().__init__(path)
            self.entered, self.release = threading.Event(), threading.Event()

        def commit(self, writes):
            if any(w.computation == "in" and w.productions for w in writes):
                self.entered.set()
                self.release.wait(30)
            return super().commit(writes)

    store = SlowInjectorCommits(str(tmp_path / "s.db"))
    inj = QueueInjector()
    cfg = RuntimeConfig(threads=2, intervals=4, dedup_retention_us=1, gc_interval_us=20_000)
    rt = Runtime(topo(inj), cfg, store=store).start()
    try:
        inj.push(records(40), estimate=0)
        assert store.entered.wait(30)
        wait_until(lambda: rt.store.gc_floors("count").get("in", 0) > 0, 30, message="a dedup GC round")
        store.release.set()
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 40, 30, message="counted")
        assert rt.statistics().computations["count"].duplicates_dropped == 0
    finally:
        store.release.set()
        rt.stop()


def test_config_rejects_unknown_and_bad_options():
    with pytest.raises(MillWheelConfigError, match="threads"):
        RuntimeConfig(threads=0)
    with pytest.raises(MillWheelConfigError, match="unknown millwheel option"):
        RuntimeConfig.from_mapping({"thread": 2})
    with pytest.raises(MillWheelConfigError, match="store"):
        RuntimeConfig(store="redis://x")


def test_topology_rejects_duplicate_names_and_non_computations():
    t = Topology().add_injector("in", ListInjector([]), produces="s")
    with pytest.raises(TopologyError, match="already used"):
        t.add_injector("in", ListInjector([]), produces="s")
    with pytest.raises(TopologyError, match="not a millwheel.Computation"):
        t.add_computation("c", lambda: object(), consumes=["s"])
    assert END_OF_TIME > 0


def test_cli_rejects_unknown_options_with_a_clear_message(tmp_path, capsys):
    from millwheel.cli import main
    rc = main(["run", "examples.ad_windows", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
               "--option", "bogus=1"])
    assert rc == 2
    assert "unknown millwheel option(s) ['bogus']" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_serve_until_idle_runs_a_topology_to_completion():
    from millwheel import serve
    from test_mw_runtime import Collect
    t = Topology()
    t.add_injector("in", ListInjector([("a", {"n": i}, 1_000 + i) for i in range(20)]), produces="s")
    t.add_computation("c", Collect, consumes={"s": lambda r: "all"})
    rt = serve(t, RuntimeConfig(store="memory://"), until_idle=True)
    assert rt.statistics().computations["c"].records_processed == 20
    assert rt.statistics().injector_watermarks_us["in"] == END_OF_TIME


def test_joined_injector_reads_committed_lines_of_open_files_and_resumes_after_publishing(tmp_path):
    from photon import RollingWriter
    evs = [joined_event(BASE_US + i * 1000, "adv-1", i) for i in range(6)]
    w = RollingWriter(tmp_path / "joined", "a-j0", roll_interval_s=3600, commit_interval_s=3600)
    w.write_lines([orjson.dumps(e) for e in evs[:3]])     # committed at once (first record)
    w.write_lines([orjson.dumps(evs[3])])                   # flushed, not committed yet
    inj = JoinedInjector(tmp_path)
    inj.restore(None)
    p = inj.poll(100, NOW)
    assert [r[0] for r in p.records] == [e["click_id"] for e in evs[:3]]
    assert p.caught_up                       # what is not committed is not there yet for a reader
    w.flush_commits()
    again = JoinedInjector(tmp_path)
    again.restore(p.position)
    assert [r[0] for r in again.poll(100, NOW).records] == [evs[3]["click_id"]]
    w.write_lines([orjson.dumps(e) for e in evs[4:]])
    w.roll()                                 # published under its visible name: read on from the same offset
    assert [r[0] for r in again.poll(100, NOW).records] == [e["click_id"] for e in evs[4:]]


@pytest.mark.timeout(60)
def test_dedup_gc_follows_the_injected_clock_and_reaches_workers_as_messages(tmp_path):
    from millwheel._messages import RaiseFloors
    from photon import FakeClock
    from test_mw_runtime import QueueInjector, records, topo
    clock = FakeClock()
    inj = QueueInjector()
    cfg = RuntimeConfig(store=f"sqlite:///{tmp_path / 's.db'}", threads=2, intervals=4, dedup_retention_us=1_000,
                        gc_interval_us=60_000_000)
    rt = Runtime(topo(inj), cfg, clock=clock)
    sent: list = []
    for w in rt.workers:   # watch what reaches the workers' inboxes
        put = w.inbox.put_many
        w.inbox.put_many = lambda items, put=put: (sent.extend(i for i in items if isinstance(i, RaiseFloors)),
                                                   put(items))
    rt.start()
    try:
        inj.push(records(40), estimate=0)
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 40, 30, message="counted")
        rt.wait_ticks(5)
        assert rt.store.gc_floors("count") == {} and sent == []    # the clock has not moved: no GC round
        clock.advance(60_000_000)
        wait_until(lambda: rt.store.gc_floors("count").get("in") == clock.now_us() - 1_000, 30,
                   message="a GC round at the injected clock's time")
        assert {(m.consumer, m.floors["in"]) for m in sent} >= {("count", clock.now_us() - 1_000)}
        assert rt.store.dedup_ids("count", range(4)) == []
    finally:
        rt.stop()
