"""End to end, as a user runs it: generate, run until caught up, check the output against the truth."""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from photon import IdGenerator, wait_until
from photon.app import GenOptions, generate


def _click_id(line: bytes):
    try:
        return orjson.loads(line).get("click_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None


@pytest.mark.timeout(240)
def test_generated_workload_is_joined_exactly_once(tmp_path, pipeline, truth):
    s = generate(GenOptions(out=str(tmp_path), queries=20_000, clicks_per_query=0.1, writers=3, rotate_lines=2000,
                            unjoinable_fraction=0.03, duplicate_fraction=0.02, bad_line_fraction=0.002,
                            unjoinable_after_s=3.0, seed=11))
    p = pipeline(tmp_path / "photon.toml").start("--until-caught-up", "--timeout", "180", "--json")
    assert p.wait(200) == 0, p.output_text()[-3000:]
    joined = p.joined_ids()
    assert set(joined) == truth(tmp_path, "joinable")
    assert not set(joined) & truth(tmp_path, "unjoinable")
    # unjoinable clicks are written to unjoinable/, each at least once
    unjoinable = set()
    for f in p.config.regions[0].unjoinable_dir.rglob("*.jsonl"):
        unjoinable |= {orjson.loads(x)["click_id"] for x in f.read_bytes().splitlines()}
    assert unjoinable == truth(tmp_path, "unjoinable")
    # every bad line is quarantined with its file and offset, which point at that very line
    bad = p.quarantined()
    assert len({(q["file"], q["offset"]) for q in bad}) == s.bad_query_lines + s.bad_click_lines
    log_root = Path(p.config.regions[0].log_root)
    for q in bad:
        source = log_root / "queries" / q["file"]
        if not source.exists():
            source = log_root / "clicks" / q["file"]
        with open(source, "rb") as f:
            f.seek(q["offset"])
            assert f.readline().rstrip(b"\n").decode() == q["raw"]
        assert q["reason"]
    # the summary is printed, as JSON on the last line with --json
    summary = json.loads(p.output_text().strip().splitlines()[-1])
    assert summary["total"]["joined"] == len(joined)
    assert summary["total"]["unjoinable"] >= s.unjoinable_clicks
    lines = Counter(_click_id(x) for f in (Path(p.config.regions[0].log_root) / "clicks").rglob("*")
                    if f.is_file() for x in f.read_bytes().splitlines())
    dup_joinable = sum(n - 1 for cid, n in lines.items() if cid in joined)
    assert summary["total"]["already_registered"] >= dup_joinable > 0
    # reconciled with the output at catch-up: every id this run registered is in the output
    rec = summary["reconciliation"]
    assert (rec["registered"], rec["lost"], rec["error"]) == (len(joined), 0, "")
    assert summary["total"]["lost_in_run"] == 0 and summary["exit_code"] == 0
    assert summary["total"]["quarantined"] == s.bad_query_lines + s.bad_click_lines
    assert summary["total"]["join_latency_ms"]["p90"] > 0


@pytest.mark.timeout(180)
def test_clicks_before_their_queries_are_joined(tmp_path, pipeline, truth):
    generate(GenOptions(out=str(tmp_path), queries=3000, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, unjoinable_after_s=60.0, seed=5))
    logs = tmp_path / "logs" / "a"
    held = tmp_path / "held-queries"
    os.rename(logs / "queries", held)
    (logs / "queries").mkdir()
    p = pipeline(tmp_path / "photon.toml").start()
    wait_until(lambda: p.dispatcher_status().get("events_read", 0) >= len(truth(tmp_path, "joinable")), 60,
               message="clicks read")
    time.sleep(5)  # the scenario itself: the queries arrive five seconds after their clicks
    assert p.joined_ids(include_inprogress=True) == {}
    for f in sorted(held.rglob("*.jsonl")):
        dest = logs / "queries" / f.relative_to(held)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
    wait_until(lambda: set(p.joined_ids()) == truth(tmp_path, "joinable"), 90, interval=0.2,
               message="every delayed click joined")
    assert p.stop() == 0


@pytest.mark.timeout(180)
def test_growing_files_and_half_written_lines(tmp_path, pipeline, truth):
    generate(GenOptions(out=str(tmp_path), queries=10, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=1))
    logs = tmp_path / "logs" / "a"
    p = pipeline(tmp_path / "photon.toml").start()
    qgen, cgen = IdGenerator("10.5.0.1", 55), IdGenerator("10.6.0.1", 66)
    expected = set(truth(tmp_path, "joinable"))
    qf = open(logs / "queries" / "w0" / "queries-live.jsonl", "ab", buffering=0)
    cf = open(logs / "clicks" / "w0" / "clicks-live.jsonl", "ab", buffering=0)
    try:
        for i in range(30):
            qid, cid = qgen.next_id(), cgen.next_id()
            qf.write(orjson.dumps({"query_id": qid, "advertiser_id": "adv-1"}) + b"\n")
            line = orjson.dumps({"click_id": cid, "query_id": qid, "n": i}) + b"\n"
            if i % 5 == 0:          # a line written in two halves, with the pipeline reading in between
                cf.write(line[:20])
                time.sleep(0.3)
                cf.write(line[20:])
            else:
                cf.write(line)
            expected.add(cid)
        wait_until(lambda: set(p.joined_ids()) == expected, 90, interval=0.2, message="live clicks joined")
    finally:
        qf.close()
        cf.close()
    assert p.stop() == 0
    assert p.joined_ids() == {c: 1 for c in expected}
    assert p.quarantined() == []


@pytest.mark.timeout(300)
def test_two_regions_join_each_click_once_in_all(tmp_path, pipeline, truth):
    generate(GenOptions(out=str(tmp_path), queries=10_000, regions=("a", "b"), unjoinable_fraction=0.02,
                        duplicate_fraction=0.01, bad_line_fraction=0.0, unjoinable_after_s=3.0, seed=2))
    p = pipeline(tmp_path / "photon.toml").start("--until-caught-up", "--timeout", "240")
    assert p.wait(260) == 0, p.output_text()[-3000:]
    per_region = {r.name: sum(f.read_bytes().count(b"\n") for f in r.joined_dir.rglob("*.jsonl"))
                  for r in p.config.regions}
    assert set(p.joined_ids()) == truth(tmp_path, "joinable")
    assert sum(per_region.values()) == len(truth(tmp_path, "joinable"))
