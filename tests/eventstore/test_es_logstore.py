"""The LogsEventStore: every query of a generated workload found through the map over gRPC; bad map
entries, missing and short files are NOT_FOUND with a reason, never a crash or a wrong line."""
from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from eventstore import EventStoreClient, serve, serve_logs
from eventstore._logstore import LogsEventStore
from eventstore._map import MapEntry
from photon import load_config, wait_until
from photon.app import GenOptions, generate


def _lines(root: Path) -> dict:
    out = {}
    for f in sorted(root.rglob("*.jsonl")):
        for line in f.read_bytes().splitlines():
            try:
                qid = orjson.loads(line)["query_id"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if isinstance(qid, str) and qid.startswith("10.1."):
                out[qid] = line
    return out


@pytest.fixture
def workload(tmp_path):
    generate(GenOptions(out=str(tmp_path), queries=8000, rotate_lines=2000, clicks_per_query=0.01, seed=4))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[eventstore]\ncache_mb = 0.1\nmap_every_kb = 16\ncheckpoint_interval_s = 0.1\n")
    return load_config(cfg)


@pytest.mark.timeout(120)
def test_every_query_of_a_workload_is_found_over_grpc_though_the_cache_holds_few(workload):
    cache = serve(workload, "a", port=0)
    logs = serve_logs(workload, "a", port=0)
    root = Path(workload.region("a").log_root) / "queries"
    lines = _lines(root)
    ids = list(lines)
    try:
        with EventStoreClient(cache.address) as c, EventStoreClient(logs.address) as lc:
            wait_until(lambda: c.status()["events_indexed"] == len(ids), 30, message="backlog read")
            assert c.status()["entries"] < len(ids) // 10          # 100 KB holds only the newest queries
            wait_until(lambda: lc.status()["read_through_us"] > 0, 30, message="logs store sees the map")
            for k in range(0, len(ids), 1000):
                assert lc.lookup(ids[k:k + 1000]) == [lines[i] for i in ids[k:k + 1000]]
            assert lc.read_through_us > 0
            st = lc.status()
            assert st["found"] == len(ids) and st["not_found"] == 0 and 0 < st["open_files"] <= 64
            unknown = ["10.1.0.1:1000:0000000000000001", "10.77.0.1:1:1763712000000000", "garbage"]
            assert lc.lookup(unknown) == [None, None, None]
            assert lc.status()["not_found_reasons"]["no_entry"] == 2
    finally:
        logs.stop()
        cache.stop()


def _store(tmp_path, root, every=4096, max_open=64) -> LogsEventStore:
    return LogsEventStore("a", root, "query_id", tmp_path / "map", None, every, max_open=max_open)


def _write_map(tmp_path, entries, extra: bytes = b"") -> None:
    (tmp_path / "map").mkdir(exist_ok=True)
    (tmp_path / "map" / "reader.jsonl").write_bytes(b"".join(e.to_json() + b"\n" for e in entries) + extra)


def _q(n: int) -> bytes:
    return orjson.dumps({"query_id": f"10.0.0.1:7:{1_763_712_000_000_000 + n:016d}", "n": n})


def _qid(n: int) -> str:
    return f"10.0.0.1:7:{1_763_712_000_000_000 + n:016d}"


def test_bad_entries_missing_and_short_files_are_not_found_with_a_reason(tmp_path, caplog):
    root = tmp_path / "q"
    root.mkdir()
    data = b"".join(_q(n) + b"\n" for n in range(100))
    (root / "f.jsonl").write_bytes(data)
    mid = data.index(_q(50)) + 3                       # inside a line
    key = "10.0.0.1:7"
    _write_map(tmp_path, [MapEntry(key, 1_763_712_000_000_000, "f.jsonl", 0),
                          MapEntry(key, 1_763_712_000_000_050, "f.jsonl", mid),
                          MapEntry(key, 1_763_712_000_000_080, "gone.jsonl", 0),
                          MapEntry(key, 1_763_712_000_000_090, "f.jsonl", len(data) + 500)],
               extra=b'{"key":"10.0.0.1:7","ts":-1,"file":"f.jsonl","offset":0}\n{not json\n'
                     b'{"key":"10.0.0.1:7","ts":5,"file":"../../etc/passwd","offset":0}\n')
    store = _store(tmp_path, root)
    with caplog.at_level(logging.WARNING, logger="photon.eventstore"):
        store.refresh()
        got = store.lookup([_qid(10), _qid(60), _qid(85), _qid(95), _qid(50)])
    assert got[0] == _q(10)
    assert got[1] == _q(60)           # the mid-line entry's partial line is skipped, the rest read
    assert got[2:] == [None, None, None]    # gone file, past the end, and 50 lies before its (mid-line) entry
    st = store.statistics()
    assert st.bad_map_entries == 3
    r = st.not_found_reasons
    assert r["file_missing"] == 1 and r["file_short"] == 1 and r["entry_mid_line"] >= 1
    assert "gone.jsonl" in caplog.text and "ends before offset" in caplog.text and "bad entry skipped" in caplog.text
    store.close()


def test_the_answer_is_always_the_line_of_the_asked_id(tmp_path):
    root = tmp_path / "q"
    root.mkdir()
    # other lines mention the id (as a reference), before and after: only the line that has it as its id counts
    lines = [orjson.dumps({"query_id": _qid(1), "n": 1}),
             orjson.dumps({"query_id": _qid(2), "see": _qid(3)}),
             orjson.dumps({"query_id": _qid(3), "n": 3}), orjson.dumps({"query_id": _qid(4), "see": _qid(9)})]
    (root / "f.jsonl").write_bytes(b"\n".join(lines) + b"\n" + b'{"query_id":"' + _qid(9).encode() + b'"')
    _write_map(tmp_path, [MapEntry("10.0.0.1:7", 1_763_712_000_000_001, "f.jsonl", 0)])
    store = _store(tmp_path, root)
    store.refresh()
    assert store.lookup([_qid(3), _qid(9), _qid(5)]) == [lines[2], None, None]   # 9: its line is not complete
    store.close()


def test_reads_at_most_about_m_bytes_and_keeps_a_bounded_pool_of_open_files(tmp_path):
    root = tmp_path / "q"
    root.mkdir()
    entries = []
    for f in range(10):
        data = b"".join(_q(f * 100 + n) + b"\n" for n in range(100))
        (root / f"f{f}.jsonl").write_bytes(data)
        entries.append(MapEntry("10.0.0.1:7", 1_763_712_000_000_000 + f * 100, f"f{f}.jsonl", 0))
    _write_map(tmp_path, entries)
    store = _store(tmp_path, root, every=1024, max_open=3)
    store.refresh()
    got = store.lookup([_qid(f * 100 + 5) for f in range(10)] + [_qid(990)])
    assert got[:10] == [_q(f * 100 + 5) for f in range(10)]
    assert got[10] is None                              # ~3 KB past the file's only entry: beyond M
    st = store.statistics()
    assert st.open_files == 3 and st.files_opened == 10
    assert st.bytes_read <= 11 * (1024 + 4096 + 1)
    store.close()


def test_the_map_view_follows_entries_as_they_land(tmp_path):
    root = tmp_path / "q"
    root.mkdir()
    (root / "f.jsonl").write_bytes(_q(1) + b"\n")
    _write_map(tmp_path, [])
    store = _store(tmp_path, root)
    store.start()
    try:
        assert store.lookup([_qid(1)]) == [None]
        with open(tmp_path / "map" / "reader.jsonl", "ab") as f:
            f.write(MapEntry("10.0.0.1:7", 1_763_712_000_000_001, "f.jsonl", 0).to_json() + b"\n")
        wait_until(lambda: store.lookup([_qid(1)]) == [_q(1)], 10, message="entry picked up")
    finally:
        store.close()
