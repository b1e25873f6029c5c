import json

import orjson

from photon import load_config, parse_event_id
from photon.app import GenOptions, generate


def test_gen_writes_logs_config_and_truth(tmp_path):
    s = generate(GenOptions(out=str(tmp_path), queries=5000, regions=("a", "b"), rotate_lines=100,
                            bad_line_fraction=0.01, duplicate_fraction=0.05, unjoinable_fraction=0.1, seed=3))
    cfg = load_config(s.config)
    assert [r.name for r in cfg.regions] == ["a", "b"]
    joinable = set((tmp_path / "truth" / "joinable.txt").read_text().split())
    unjoinable = set((tmp_path / "truth" / "unjoinable.txt").read_text().split())
    assert len(joinable) == s.joinable_clicks > 0 and len(unjoinable) == s.unjoinable_clicks > 0
    queries, clicks, bad = {}, [], 0
    for stream, sink in (("queries", None), ("clicks", clicks)):
        files = sorted((tmp_path / "logs" / "a" / stream).rglob("*.jsonl"))
        assert len(files) > 3                     # several writers, rotated files
        for f in files:
            assert f.read_bytes() == (tmp_path / "logs" / "b" / f.relative_to(tmp_path / "logs" / "a")).read_bytes()
            for line in f.read_bytes().splitlines():
                try:
                    ev = orjson.loads(line)
                    parse_event_id(ev["click_id" if sink is not None else "query_id"])
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    bad += 1
                    continue
                if sink is None:
                    queries[ev["query_id"]] = ev
                else:
                    sink.append(ev)
    assert bad == s.bad_query_lines + s.bad_click_lines
    assert len(clicks) == s.clicks_lines
    ids = [c["click_id"] for c in clicks]
    assert len(ids) - len(set(ids)) == s.duplicate_click_lines
    assert {c["click_id"] for c in clicks if c["query_id"] in queries} == joinable
    assert {c["click_id"] for c in clicks if c["query_id"] not in queries} == unjoinable
    assert json.loads((tmp_path / "truth" / "summary.json").read_text())["queries"] == 5000
