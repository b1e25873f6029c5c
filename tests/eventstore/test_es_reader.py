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


def _reference_index(lines: list[bytes]) -> tuple[list[int], list[str]]:
    """What a line-by-line reading calls good: a JSON object with a string id that parses."""
    from photon import is_event_id
    good, ids = [], []
    for k, raw in enumerate(lines):
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and type(event.get("query_id")) is str and is_event_id(event["query_id"]):
            good.append(k)
            ids.append(event["query_id"])
    return good, ids


def test_bulk_indexing_agrees_with_a_line_by_line_reading():
    """Chunks indexed in bulk (one orjson map, one regular expression over all ids) keep exactly the
    lines a line-by-line reading keeps, with their offsets, and quarantine exactly the others; a chunk of
    one writer in time order also comes with its key and timestamps, others without."""
    import random
    from eventstore._state import index_lines, split_photon_ids
    rng = random.Random(4)
    odd = [b"not json", b'{"q":"no id"}', b'{"query_id":7}', b'{"query_id":"nope"}', b"[1]", b'"s"', b"{}",
           b'{"query_id":"a:1:123"}', b'{"query_id":"a\\n:1:1763712000000000"}', b"1", b"null", b"",
           b'{"query_id":"10.0.0.1:4242:\xd9\xa1763712000000000"}', b'{"query_id":":1:1763712000000000"}']
    for case in range(60):
        n = rng.randrange(1, 400)
        ks = sorted(rng.sample(range(10**6), n)) if case % 3 else [rng.randrange(10**6) for _ in range(n)]
        lines = [query_line(k) if rng.random() > 0.05 or case % 5 == 0 else rng.choice(odd) for k in ks]
        if case % 7 == 0:
            lines = [orjson.dumps({"query_id": f"10.0.0.{k % 3}:1:{1763712000000000 + k}"}) for k in ks]
        offsets = list(range(0, 10 * n, 10))
        kept: list[int] = []
        found = index_lines(LogChunk("q.log", offsets, lines, 10 * n), "query_id", kept)
        good, ids = _reference_index(lines)
        assert found.ids == ids and found.lines == [lines[k] for k in good]
        assert kept == [offsets[k] for k in good]
        assert [b.offset for b in found.bad] == [offsets[k] for k in range(n) if k not in set(good)]
        assert found.timed == (split_photon_ids(ids) if ids else None)
        if found.timed is not None:
            key, tss = found.timed
            assert [f"{key}:{ts:016x}" for ts in tss] == ids and list(tss) == sorted(set(tss))   # packed decimal


def test_map_entries_per_chunk_are_those_line_by_line():
    """MapEmitter.observe_many (by bisection for one writer in time order) makes exactly the entries and
    marks that observe, line by line, makes: several chunks of a file, other keys, time going back."""
    import random
    from eventstore._map import MapEmitter
    from eventstore._state import split_photon_ids
    from photon import format_event_id
    rng = random.Random(8)
    for case in range(40):
        every_us, every_bytes = rng.choice([1_000, 50_000]), rng.choice([300, 5_000])
        bulk, single = MapEmitter(every_us, every_bytes), MapEmitter(every_us, every_bytes)
        off, ts = 0, 1_763_712_000_000_000
        for chunk in range(rng.randrange(1, 6)):
            n = rng.randrange(1, 300)
            offsets, ids = [], []
            for _ in range(n):
                ts += rng.choice([0, 1, 7, 900, 20_000]) if case % 4 else rng.randrange(-5_000, 9_000)
                host = "10.0.0.1" if case % 3 else rng.choice(["10.0.0.1", "10.0.0.2"])
                offsets.append(off)
                ids.append(format_event_id(host, 7, ts))
                off += rng.randrange(50, 400)
            timed = split_photon_ids(ids) if chunk % 2 else None
            got = bulk.observe_many("f.jsonl", offsets, ids, timed)
            want = [e for e in map(single.observe, ["f.jsonl"] * n, offsets, ids) if e is not None]
            assert sorted(got) == sorted(want)
            assert bulk.marks() == single.marks()


def test_while_catching_up_the_store_says_how_far_it_has_read_each_writer(tmp_path, queries_dir, monkeypatch):
    """A pass cut by its read budget leaves the store catching up: per id key, the greatest timestamp read
    (a dispatcher holds back clicks whose query is past it). Over gRPC an empty lookup asks for that alone,
    and the lookup chain takes the least position over its cache servers. A pass that reaches every file's
    end sets read_through_us and the positions are gone (None: caught up)."""
    import time
    from concurrent import futures

    import grpc

    import eventstore._shell as shell
    from eventstore import EventStoreChain, eventstore_pb2_grpc
    from eventstore._servicer import EventStoreServicer
    from photon import format_event_id, id_timestamp_us

    other = [format_event_id("10.9.9.9", 7, 1_763_712_000_000_000 + n) for n in (5, 9)]
    first = b"".join(query_line(n) + b"\n" for n in (1, 2, 3))
    (queries_dir / "a.log").write_bytes(first)
    (queries_dir / "b.log").write_bytes(b"".join(orjson.dumps({"query_id": i}) + b"\n" for i in other))
    store = make_store(tmp_path, queries_dir)
    assert store.read_to_us == {} and store.read_through_us == 0          # nothing read yet
    monkeypatch.setattr(shell, "POLL_MAX_BYTES", len(first))             # one pass reads a.log only
    assert store.read_once() == 3
    assert store.read_to_us == {"10.0.0.1:4242": id_timestamp_us(query_id(3))} and store.read_through_us == 0
    server = grpc.server(futures.ThreadPoolExecutor(2))
    eventstore_pb2_grpc.add_EventStoreServicer_to_server(EventStoreServicer(store), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    chain = EventStoreChain([f"127.0.0.1:{port}"])
    try:
        assert chain.lookup([]) == [] and chain.read_through_us == 0      # a probe: positions alone
        assert chain.read_to_us == {"10.0.0.1:4242": id_timestamp_us(query_id(3))}
        assert chain.lookup([query_id(2), other[0]]) == [query_line(2), None]
        assert chain.read_to_us == {"10.0.0.1:4242": id_timestamp_us(query_id(3))}
        monkeypatch.setattr(shell, "POLL_MAX_BYTES", 8 << 20)
        before_us = time.time_ns() // 1000
        assert store.read_once() == 2
        assert store.read_to_us is None and store.read_through_us >= before_us   # caught up
        assert chain.lookup([other[1]]) == [orjson.dumps({"query_id": other[1]})]
        assert chain.read_to_us is None and chain.read_through_us >= before_us
        assert chain.lookup([]) == [] and chain.read_to_us is None
    finally:
        chain.close()
        server.stop(0)
        store.close()


def test_the_chain_takes_the_least_position_over_its_cache_servers():
    from eventstore._chain import _least_read_to
    assert _least_read_to([(None, 100), (None, 200)]) is None                # all caught up
    # a caught-up server has read every key up to its read_through_us; a key a server has not met: its own
    assert _least_read_to([({"k": 50, "j": 300}, 0), (None, 120)]) == {"k": 50, "j": 120}
    assert _least_read_to([({"k": 50}, 0), ({"j": 70}, 10)]) == {"k": 10, "j": 0}


def test_a_writers_position_stops_at_the_last_id_read_in_its_files_still_being_read(tmp_path, queries_dir,
                                                                                       monkeypatch):
    """One writer's files may be read side by side: its position is the last id read in a file of it that still
    has bytes to read (its later ids there are not read yet), not the greatest id read anywhere."""
    import eventstore._shell as shell
    from photon import id_timestamp_us

    later = b"".join(query_line(n) + b"\n" for n in (7, 8, 9))
    earlier = [query_line(n) + b"\n" for n in range(1, 7)]
    (queries_dir / "a-later.log").write_bytes(later)               # listed, and read, first
    (queries_dir / "b-earlier.log").write_bytes(b"".join(earlier))
    store = make_store(tmp_path, queries_dir)
    monkeypatch.setattr(shell, "POLL_MAX_BYTES", len(later) + sum(map(len, earlier[:3])))
    assert store.read_once() == 6
    assert store.read_to_us == {"10.0.0.1:4242": id_timestamp_us(query_id(3))}
    monkeypatch.setattr(shell, "POLL_MAX_BYTES", 8 << 20)
    assert store.read_once() == 3 and store.read_to_us is None


def test_a_backlog_is_read_one_file_per_folder_at_a_time_writers_side_by_side():
    from types import SimpleNamespace

    from eventstore._shell import MIN_FILE_READ_BYTES, POLL_MAX_BYTES, oldest_first

    size = lambda n: SimpleNamespace(size=n)
    view = {"w1/q-1.log": size(100), "w0/q-1.log": size(100), "w0/q-0.log": size(100), "w1/q-0.log": size(100),
            "w2/q-0.log": size(50), "top.log": size(10)}
    offsets = {"w0/q-0.log": 100, "w2/q-0.log": 50}              # w0's first file and w2's only one are read
    names, per_file = oldest_first(view, offsets)
    assert names[:3] == ["top.log", "w0/q-1.log", "w1/q-0.log"]  # in each folder the first with bytes to read
    assert sorted(names) == sorted(view) and len(names) == len(view)
    assert per_file == max(MIN_FILE_READ_BYTES, POLL_MAX_BYTES // 3)
    names, per_file = oldest_first(view, {n: i.size for n, i in view.items()})   # all read: no file in front
    assert names == sorted(view) and per_file == POLL_MAX_BYTES


def test_one_writer_chunk_with_one_odd_id_is_indexed_as_a_line_by_line_reading():
    """A chunk of one writer's ids in time order where one id differs in one place (its width, a digit that
    ``int`` would still read, another key, a time out of order): the same lines kept, ids and quarantine as
    a line-by-line reading, and key and timestamps only when every id kept is the writer's in order."""
    from eventstore._state import index_lines, split_photon_ids
    key, t0 = "10.0.0.9:77", 1763712000000000
    odd = [f"{key}:{t0 + 5:015d}", f"{key}:{t0 + 5:017d}", f"{key}:+{t0 + 5:015d}", f"{key}:1_{t0 + 5:014d}",
           f"{key}:{t0 + 5:016d}".replace("0", "\u0660", 1), f"{key}:{t0 - 1:016d}", f"{key}:{t0 + 3:016d}",
           f"10.0.0.9:78:{t0 + 5:016d}", f"{key}x:{t0 + 5:016d}", f"{key[:-1]}:{t0 + 5:016d}", f"{key} {t0 + 5:016d}"]
    for at in (0, 4, 9):
        for bad in odd:
            ids = [f"{key}:{t0 + 10 * k:016d}" for k in range(10)]
            ids[at] = bad
            lines = [orjson.dumps({"query_id": i, "n": k}) for k, i in enumerate(ids)]
            found = index_lines(LogChunk("q.log", list(range(0, 100, 10)), lines, 100), "query_id")
            good, want = _reference_index(lines)
            assert list(found.ids) == want and found.lines == [lines[k] for k in good], (at, bad)
            assert [b.offset for b in found.bad] == [10 * k for k in range(10) if k not in set(good)]
            assert found.timed == (split_photon_ids(want) if want else None), (at, bad)
