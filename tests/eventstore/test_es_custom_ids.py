"""Primary events with custom ids and a time field (``[join].primary_time_field``): the cache holds them by
the user's id; the log-file map has an entry per line, keyed by the line's Photon key, so a query evicted
from the cache is still found by its id alone (a click carries no query time)."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from eventstore import EventStoreClient, map_dir, scan_map_range, serve, serve_logs
from eventstore._logstore import LogsEventStore
from eventstore._map import MapEntry
from photon import EventIds, load_config, wait_until
from photon.app import GenOptions, generate

IDS = EventIds("query_id", "query_time", "rfc3339")


def _good_queries(root: Path) -> dict[str, bytes]:
    out = {}
    for f in sorted(root.rglob("*.jsonl")):
        for line in f.read_bytes().splitlines():
            key = IDS.key_of_line(line)
            if key is not None:
                out[orjson.loads(line)["query_id"]] = line
    return out


@pytest.mark.timeout(180)
def test_every_uuid_query_is_found_through_the_map_though_the_cache_holds_few(tmp_path):
    s = generate(GenOptions(out=str(tmp_path), queries=6000, rotate_lines=2000, clicks_per_query=0.01, seed=4,
                            bad_line_fraction=0.01, id_style="uuid"))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[eventstore]\ncache_mb = 0.1\nmap_every_kb = 16\ncheckpoint_interval_s = 0.1\n")
    config = load_config(cfg)
    root = Path(config.region("a").log_root) / "queries"
    lines = _good_queries(root)
    ids = list(lines)
    assert len(ids) == s.queries
    cache = serve(config, "a", port=0)
    logs = serve_logs(config, "a", port=0)
    try:
        with EventStoreClient(cache.address) as c, EventStoreClient(logs.address) as lc:
            wait_until(lambda: c.status()["events_indexed"] == len(ids), 60, message="backlog read")
            assert c.status()["entries"] < len(ids) // 10           # 100 KB holds only the newest queries
            evicted = [i for i, got in zip(ids, c.lookup(ids)) if got is None]
            assert len(evicted) > len(ids) // 2
            wait_until(lambda: lc.status()["read_through_us"] > 0, 30, message="logs store sees the map")
            for k in range(0, len(evicted), 1000):
                assert lc.lookup(evicted[k:k + 1000]) == [lines[i] for i in evicted[k:k + 1000]]
            assert lc.lookup(["6018366c-0000-4000-8000-000000000000", ":bad", ""]) == [None, None, None]
            st = lc.status()
            assert st["found"] == len(evicted) and st["not_found_reasons"]["no_entry"] == 1
        entries = [orjson.loads(x) for f in map_dir(config.region("a").state_dir).glob("*.jsonl")
                   for x in f.read_bytes().splitlines()]
        assert len(entries) == len(ids)                             # one entry per good primary line
        assert {e["key"] for e in entries} == {f"{i}:0" for i in ids}
        quarantined = [orjson.loads(x) for p in config.region("a").quarantine_dir.glob("*.jsonl")
                       for x in p.read_bytes().splitlines()]
        assert len(quarantined) == s.bad_query_lines
        assert any("'query_time'" in q["reason"] for q in quarantined)   # "bad id" lines have no time field
    finally:
        logs.stop()
        cache.stop()


@pytest.mark.timeout(30)
def test_a_custom_id_written_with_json_escapes_is_found_by_its_map_entry(tmp_path):
    root = tmp_path / "q"
    root.mkdir()
    events = [{"query_id": f"q-{n}-ü\"x", "query_time": f"2025-11-21T08:00:{n:02d}Z", "n": n} for n in range(50)]
    # a writer that escapes non-ASCII and quotes (Python's json): the id's text in the line is not its UTF-8
    data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    (root / "f.jsonl").write_bytes(data)
    entries = scan_map_range(root, "f.jsonl", 0, len(data), IDS, 10.0, 64)
    assert len(entries) == 50 and entries[7][0] == 'q-7-ü"x:0' and entries[7][1] == 1_763_712_007_000_000
    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "reader.jsonl").write_bytes(b"".join(MapEntry(*e).to_json() + b"\n" for e in entries))
    store = LogsEventStore("a", root, "query_id", tmp_path / "map", None, 64 * 1024, custom_ids=True)
    try:
        store.refresh()
        got = store.lookup([events[7]["query_id"], events[49]["query_id"], "q-99"])
        assert [orjson.loads(g)["n"] if g else None for g in got] == [7, 49, None]
    finally:
        store.close()
