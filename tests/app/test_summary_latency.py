"""The run summary's latency percentiles: the total is computed over every region's joins of the whole run
(merged histograms), not the largest of the regions' figures, and not over a window of recent samples."""
from __future__ import annotations

import random

import orjson

from photon import LatencyHistogram, parse_config
from photon.app._summary import build_summary


def _status(path, latencies_us, recent_ms):
    hist = LatencyHistogram()
    for us in latencies_us:
        hist.add(us)
    path.mkdir(parents=True)
    (path / "status.json").write_bytes(orjson.dumps(
        {"events_read": len(latencies_us), "joined": len(latencies_us), "join_latency_ms": recent_ms,
         "join_latency_hist": hist.to_json()}))


def test_total_percentiles_are_over_all_regions_joins(tmp_path):
    regions = [{"name": n, "log_root": str(tmp_path / n / "logs"), "output_root": str(tmp_path / n / "out"),
                "state_dir": str(tmp_path / n / "state")} for n in ("a", "b")]
    config = parse_config({"regions": regions}, str(tmp_path / "photon.toml"), tmp_path)
    # a: 9,000 joins at 10 ms, of which its recent window only shows the last; b: 1,000 slow joins at 1 s
    _status(tmp_path / "a" / "state" / "dispatcher", [10_000] * 9000, {"p50": 50.0, "p90": 50.0, "p99": 50.0})
    _status(tmp_path / "b" / "state" / "dispatcher", [1_000_000] * 1000, {"p50": 1000.0, "p90": 1000.0, "p99": 1000.0})
    s = build_summary(config, 1.0)
    total = s["total"]["join_latency_ms"]
    assert abs(total["p50"] - 10.0) <= 0.25 and abs(total["p90"] - 10.0) <= 0.25   # 90% of joins took 10 ms
    assert abs(total["p99"] - 1000.0) <= 25
    assert abs(s["regions"]["a"]["join_latency_ms"]["p99"] - 10.0) <= 0.25         # a's whole run, not its window


def test_histogram_percentiles_are_within_a_bucket_and_merge():
    rng = random.Random(7)
    samples = [rng.randrange(1, 5_000_000) for _ in range(20_000)]
    halves = LatencyHistogram(), LatencyHistogram()
    for n, us in enumerate(samples):
        halves[n % 2].add(us)
    merged = LatencyHistogram.from_json(halves[0].to_json()).merge(LatencyHistogram.from_json(halves[1].to_json()))
    assert merged.total == len(samples)
    exact = sorted(samples)
    for p in (50, 90, 99):
        want = exact[-(-p * len(exact) // 100) - 1] / 1000
        assert abs(merged.percentile_ms(p) - want) <= 0.023 * want, (p, merged.percentile_ms(p), want)
    assert LatencyHistogram.from_json("junk").percentiles_ms() == {}
