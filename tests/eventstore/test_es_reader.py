"""Reading the primary logs: growing files, new files at any depth, torn lines, bad records."""
from __future__ import annotations

import orjson

from eventstore._state import index_primary_lines
from eventstore._shell import CacheEventStore
from photon import LogChunk

from es_helpers import query_id, query_line


def make_store(tmp_path, queries_dir, max_bytes=1 << 20) -> CacheEventStore:
    return CacheEventStore("a", queries_dir, "query_id", max_bytes, tmp_path / "out" / "quarantine")


def test_index_keeps_raw_lines_and_reports_bad_records_with_offsets():
    lines = [query_line(1), b"not json", b'{"q":"no id"}', b'{"query_id":7}', b'{"query_id":"nope"}', b"[1]",
             query_line(2, note="caf\xc3\xa9")]
    offsets, pos = [], 100
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    good, bad = index_primary_lines(LogChunk("x/q.log", offsets, lines, pos), "query_id")
    assert good == [(query_id(1), lines[0]), (query_id(2), lines[6])]
    assert [(b.file, b.offset, b.raw) for b in bad] == [("x/q.log", offsets[i], lines[i]) for i in range(1, 6)]
    reasons = [b.reason for b in bad]
    assert "not valid JSON" in reasons[0]
    assert "missing field 'query_id'" in reasons[1]
    assert "not a string" in reasons[2]
    assert "'nope'" in reasons[3]
    assert "not a JSON object" in reasons[4]


def test_growing_file_and_a_line_written_in_two_halves(tmp_path, queries_dir):
    store = make_store(tmp_path, queries_dir)
    f = queries_dir / "q-000.log"
    line1, line2 = query_line(1), query_line(2)
    with open(f, "ab") as out:
        out.write(line1 + b"\n" + line2[:10])
        out.flush()
        assert store.read_once() == 1
        assert store.lookup([query_id(1), query_id(2)]) == [line1, None]
        out.write(line2[10:])  # the rest of the line, still without its newline: not written yet
        out.flush()
        assert store.read_once() == 0
        assert store.lookup([query_id(2)]) == [None]
        out.write(b"\n")
        out.flush()
    assert store.read_once() == 1
    assert store.lookup([query_id(2)]) == [line2]
    assert store.statistics().bad_records == 0


def test_new_files_at_any_depth_are_read(tmp_path, queries_dir):
    store = make_store(tmp_path, queries_dir)
    (queries_dir / "q-0.log").write_bytes(query_line(1) + b"\n")
    store.read_once()
    deep = queries_dir / "2026" / "11" / "21"
    deep.mkdir(parents=True)
    (deep / "q-1.log").write_bytes(query_line(2) + b"\n" + query_line(3) + b"\n")
    (deep / "q-2.log.inprogress").write_bytes(query_line(4) + b"\n")  # unpublished: not a log file yet
    store.read_once()
    assert store.lookup([query_id(n) for n in (1, 2, 3, 4)]) == [query_line(1), query_line(2), query_line(3), None]
    assert store.statistics().files == 2


def test_bad_lines_are_quarantined_and_the_good_around_them_kept(tmp_path, queries_dir):
    store = make_store(tmp_path, queries_dir)
    bad1, bad2 = b'{"query_id": "10.0.0.1:1:123"}', b"{broken"
    data = query_line(1) + b"\n" + bad1 + b"\n" + query_line(2) + b"\n" + bad2 + b"\n" + query_line(3) + b"\n"
    (queries_dir / "sub").mkdir()
    (queries_dir / "sub" / "q.log").write_bytes(data)
    store.read_once()
    assert store.lookup([query_id(1), query_id(2), query_id(3)]) == [query_line(1), query_line(2), query_line(3)]
    entries = [orjson.loads(x) for x in (tmp_path / "out" / "quarantine" / "eventstore-a.jsonl").read_bytes().splitlines()]
    assert [(e["file"], e["offset"], e["raw"]) for e in entries] == [
        ("sub/q.log", data.index(bad1), bad1.decode()), ("sub/q.log", data.index(bad2), bad2.decode())]
    assert "timestamp" in entries[0]["reason"] and "not valid JSON" in entries[1]["reason"]
    s = store.statistics()
    assert (s.bad_records, s.events_indexed, s.lines_read) == (2, 3, 5)
    store.close()


def test_cache_bound_holds_while_reading_more_than_fits(tmp_path, queries_dir):
    store = make_store(tmp_path, queries_dir, max_bytes=20_000)
    (queries_dir / "q.log").write_bytes(b"".join(query_line(n) + b"\n" for n in range(1000)))
    while store.read_once():
        pass
    s = store.statistics()
    assert s.events_indexed == 1000 and s.bytes <= 20_000 and 0 < s.entries < 1000
    assert s.evictions == 1000 - s.entries
    assert store.lookup([query_id(999), query_id(0)]) == [query_line(999), None]


def test_a_restarted_store_reads_from_the_start_without_quarantining_again(tmp_path, queries_dir):
    (queries_dir / "q.log").write_bytes(query_line(1) + b"\n{broken\n" + query_line(2) + b"\n")
    for _ in range(2):
        store = make_store(tmp_path, queries_dir)
        store.read_once()
        assert store.lookup([query_id(1), query_id(2)]) == [query_line(1), query_line(2)]
        store.close()
    entries = (tmp_path / "out" / "quarantine" / "eventstore-a.jsonl").read_bytes().splitlines()
    assert [orjson.loads(e)["raw"] for e in entries] == ["{broken"]
