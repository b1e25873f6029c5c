"""The primary reader keeps its place durably: a restarted cache server resumes at its offsets (counting
the bytes it reads), warms its cache from the recent tail through the map, and read_through_us keeps its
meaning."""
from __future__ import annotations

import json

from eventstore._map import MapEmitter
from eventstore._shell import CacheEventStore, ReaderOptions
from photon import format_event_id

BASE_US = 1_763_712_000_000_000


def qline(n: int, writer: int = 0) -> bytes:
    qid = format_event_id(f"10.0.0.{writer + 1}", 100 + writer, BASE_US + n * 1_000_000)   # one per second
    return json.dumps({"query_id": qid, "q": f"shoes {n:06d}"}, separators=(",", ":")).encode()


def qid(n: int, writer: int = 0) -> str:
    return format_event_id(f"10.0.0.{writer + 1}", 100 + writer, BASE_US + n * 1_000_000)


def write_backlog(queries_dir, n: int, files: int = 4) -> int:
    per = n // files
    total = 0
    for f in range(files):
        data = b"".join(qline(i) + b"\n" for i in range(f * per, (f + 1) * per))
        (queries_dir / f"q-{f:03d}.jsonl").write_bytes(data)
        total += len(data)
    return total


def make(tmp_path, queries_dir, **kw) -> CacheEventStore:
    opts = ReaderOptions(state_dir=tmp_path / "state", map_dir=tmp_path / "state" / "map", map_every_s=30,
                         map_every_kb=4, warm_tail_s=kw.pop("warm_tail_s", 60), checkpoint_interval_s=3600, **kw)
    return CacheEventStore("a", queries_dir, "query_id", kw.pop("max_bytes", 1 << 20), tmp_path / "out" / "q", opts)


def read_all(store: CacheEventStore) -> None:
    while store.read_once():
        pass


def test_restart_resumes_at_its_offsets_without_rereading_the_backlog(tmp_path, queries_dir):
    total = write_backlog(queries_dir, 4000)
    first = make(tmp_path, queries_dir)
    read_all(first)
    assert first.statistics().bytes_read == total and not first.resumed
    first.close()                                   # writes the last checkpoint
    with open(queries_dir / "q-003.jsonl", "ab") as f:
        f.write(qline(4000) + b"\n")
    second = make(tmp_path, queries_dir)
    assert second.resumed
    assert second.read_through_us == 0             # not caught up yet: joiners defer NOT_FOUND
    read_all(second)
    s = second.statistics()
    assert s.bytes_read == len(qline(4000)) + 1    # only the new line, nothing of the backlog again
    assert s.read_through_us > 0 and s.lines_read == 1
    # warmed from the tail: the last warm_tail_s (60 s = 60 queries) of event time before the newest entry
    assert 0 < s.warm_bytes < total // 10
    got = second.lookup([qid(3999), qid(3950), qid(4000), qid(10)])
    assert got[:3] == [qline(3999), qline(3950), qline(4000)] and got[3] is None
    second.close()


def test_the_map_written_across_a_restart_equals_one_written_in_one_go(tmp_path, queries_dir):
    write_backlog(queries_dir, 2000, files=1)
    a = make(tmp_path, queries_dir)
    a.read_once()
    a.close()
    with open(queries_dir / "q-000.jsonl", "ab") as f:
        f.write(b"".join(qline(i) + b"\n" for i in range(2000, 2500)))
    b = make(tmp_path, queries_dir)
    read_all(b)
    b.close()
    written = [json.loads(x) for x in (tmp_path / "state" / "map" / "reader.jsonl").read_bytes().splitlines()]
    emitter, expected, off = MapEmitter(30_000_000, 4096), [], 0
    for i in range(2500):
        e = emitter.observe("q-000.jsonl", off, qid(i))
        if e is not None:
            expected.append({"key": e.key, "ts": e.ts, "file": e.file, "offset": e.offset})
        off += len(qline(i)) + 1
    assert written == expected and len(expected) > 50


def test_an_unreadable_checkpoint_means_reading_from_the_start(tmp_path, queries_dir):
    total = write_backlog(queries_dir, 400, files=1)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "cache-0.json").write_text("{torn")
    store = make(tmp_path, queries_dir)
    read_all(store)
    assert not store.resumed and store.statistics().bytes_read == total
    store.close()


def test_a_cache_shard_keeps_only_its_ring_share_and_only_shard_0_writes_the_map(tmp_path, queries_dir):
    write_backlog(queries_dir, 1000, files=2)
    shards = [make(tmp_path, queries_dir, shard=s, servers=3) for s in range(3)]
    for s in shards:
        read_all(s)
    entries = [s.statistics().entries for s in shards]
    assert sum(entries) == 1000 and all(200 < e < 500 for e in entries), entries
    assert [s.statistics().map_entries_written > 0 for s in shards] == [True, False, False]
    for s in shards:
        s.close()
