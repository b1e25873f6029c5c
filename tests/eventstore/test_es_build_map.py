"""``photon eventstore build-map``: the Spark-built log-file map agrees with the primary reader's, within
the W/M rule, on the same logs; and it is published where the logs stores read it."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

import eventstore
from photon import load_config
from photon.app import GenOptions, generate
from photon.app import build_map
from photon.app.cli import main as photon

from es_helpers import query_lines_by_id


def _workload(tmp_path, **kw) -> Path:
    generate(GenOptions(out=str(tmp_path), queries=kw.pop("queries", 6000), rotate_lines=1500, writers=3,
                        clicks_per_query=0.01, seed=3, **kw))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[eventstore]\nmap_every_s = 20.0\nmap_every_kb = 8\n")
    return cfg


def _reader_entries(config, region="a") -> set:
    """Run the region's primary reader (cache server 0) over its logs; its map entries."""
    from eventstore._shell import CacheEventStore, ReaderOptions
    reg = config.region(region)
    es = config.eventstore
    store = CacheEventStore(region, Path(reg.log_root) / "queries", "query_id", 1 << 20, reg.quarantine_dir,
                            ReaderOptions(state_dir=eventstore.store_dir(config, region),
                                          map_dir=eventstore.map_dir(reg.state_dir), map_every_s=es.map_every_s,
                                          map_every_kb=es.map_every_kb))
    while store.read_once():
        pass
    store.close()
    entries, bad = eventstore.read_map(eventstore.map_dir(reg.state_dir))     # only reader.jsonl so far
    assert bad == 0
    return set(entries)


def _spark_entries(config, region="a") -> list:
    entries = []
    for d in eventstore.map_dir(config.region(region).state_dir).glob("spark-*"):
        entries += eventstore.read_map(d)[0]
    return entries


def assert_w_m_rule(entries, root: Path, every_us: int, every_bytes: int) -> int:
    """Every good primary line has, in its own file, an entry of its key at or before it in time and offset,
    fewer than M bytes and W µs before it, and the last entry at or before its timestamp is such an entry."""
    from eventstore._map import MapView, split_id
    view = MapView()
    for e in entries:
        view.add(e)
    checked = 0
    for f in sorted(root.rglob("*.jsonl")):
        rel, off = str(f.relative_to(root)), 0
        for line in f.read_bytes().splitlines(keepends=True):
            try:
                qid = orjson.loads(line)["query_id"]
                key, ts = split_id(qid)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                qid = None
            if qid is not None:
                where = view.find(key, ts)
                assert where is not None and where[0] == rel, (qid, where)
                assert 0 <= off - where[1] < every_bytes, (qid, off, where)
                entry_ts = max(e.ts for e in entries if (e.key, e.file, e.offset) == (key, rel, where[1]))
                assert 0 <= ts - entry_ts < every_us
                checked += 1
            off += len(line)
    return checked


def test_spark_map_equals_the_readers_and_both_keep_the_w_m_rule(tmp_path, spark):
    config = load_config(_workload(tmp_path))
    reader = _reader_entries(config)
    result = build_map(config, "a", range_mb=1024, session=spark)     # one range per file
    spark_built = _spark_entries(config)
    assert result.entries == len(spark_built) == len(reader) > 20
    assert set(spark_built) == reader
    assert spark_built == sorted(spark_built)                       # sorted by key, ts, file, offset
    root = Path(config.region("a").log_root) / "queries"
    assert assert_w_m_rule(reader, root, 20_000_000, 8192) == 6000


def test_spark_map_over_small_file_ranges_keeps_the_rule_and_replaces_the_older_build(tmp_path, spark):
    config = load_config(_workload(tmp_path))
    first = build_map(config, "a", range_mb=1024, session=spark)
    second = build_map(config, "a", range_mb=0.02, session=spark)     # ~20 KB per task: many ranges per file
    assert second.ranges > 3 * second.files
    assert not Path(first.out_dir).exists() and Path(second.out_dir).is_dir()
    entries = _spark_entries(config)
    assert len(entries) == second.entries >= first.entries
    root = Path(config.region("a").log_root) / "queries"
    assert assert_w_m_rule(entries, root, 20_000_000, 8192) == 6000


def test_cli_builds_each_regions_map(tmp_path, spark, capsys):
    config = load_config(_workload(tmp_path, queries=900, regions=("a", "b")))
    assert photon(["eventstore", "build-map", "--config", config.path, "--json"]) == 0
    results = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["region"] for r in results] == ["a", "b"] and all(r["entries"] > 0 for r in results)
    assert photon(["eventstore", "build-map", "--config", config.path, "--region", "zz"]) == 2
    assert "no region named 'zz'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_logs_store_finds_every_query_through_the_spark_built_map(tmp_path, spark):
    from eventstore._logstore import LogsEventStore
    config = load_config(_workload(tmp_path))
    build_map(config, "a", range_mb=0.05, session=spark)
    reg = config.region("a")
    root = Path(reg.log_root) / "queries"
    store = LogsEventStore("a", root, "query_id", eventstore.map_dir(reg.state_dir), None, 8192)
    store.refresh()
    lines = query_lines_by_id(root)
    ids = list(lines)
    assert store.lookup(ids) == [lines[i] for i in ids] and len(ids) == 6000
    store.close()
