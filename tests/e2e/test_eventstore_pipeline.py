"""End to end with the whole event store: a cache far too small for its queries (100 KB) and a cold cache
over an hour of backlog both join every joinable click exactly once, the old ones through the logs store."""
from __future__ import annotations

import time

import orjson
import pytest

from photon.app import GenOptions, generate


def _run(tmp_path, pipeline, truth, eventstore: dict, **gen):
    generate(GenOptions(out=str(tmp_path), unjoinable_after_s=3.0, **gen))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[eventstore]\n" + "".join(f"{k} = {v}\n" for k, v in eventstore.items()))
    p = pipeline(cfg).start("--until-caught-up", "--timeout", "200", "--json")
    assert p.wait(230) == 0, p.output_text()[-3000:]
    joined = p.joined_ids()
    assert set(joined) == truth(tmp_path, "joinable")
    assert all(n == 1 for n in joined.values())
    return p


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_a_100_kb_cache_joins_everything_through_the_logs_store(tmp_path, pipeline, truth):
    p = _run(tmp_path, pipeline, truth, {"cache_mb": 0.1, "cache_servers": 2},
             queries=40_000, clicks_per_query=0.15, rotate_lines=5000, seed=21)
    served = [orjson.loads(line)["_photon"]["served_by"] for line in
              (f.read_bytes() for f in p.config.regions[0].joined_dir.rglob("*.jsonl")) for line in line.splitlines()]
    assert served.count("logs") > len(served) // 2 and set(served) <= {"cache", "logs"}


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_a_cold_cache_over_an_hour_of_backlog_joins_everything(tmp_path, pipeline, truth):
    now_us = time.time_ns() // 1000
    _run(tmp_path, pipeline, truth, {"cache_mb": 1.0, "warm_tail_s": 60.0},
         queries=30_000, clicks_per_query=0.1, span_s=3600.0, start_us=now_us - 3 * 3600 * 10**6, seed=22)
