"""Each region started by its own ``photon run --region NAME`` (as on separate machines sharing one
config): one registry between them, and every joinable click exactly once in the union of the outputs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from photon import load_config, wait_until
from regions_helpers import joinable, regions_workload, union_joined, wait_all_joined


@pytest.mark.timeout(240)
def test_two_region_launchers_share_one_registry_and_join_each_click_once(tmp_path, region_run):
    config_path = regions_workload(tmp_path, regions=("a", "b"), queries=3000)
    config = load_config(config_path)
    b = region_run(config_path, "b").start()
    wait_until(lambda: "b-dispatcher" in b.processes(), 30, message="region b's processes started")
    assert not (tmp_path / "state" / "a").exists(), "region b's launcher wrote into region a's state dir"
    assert not [n for n in b.processes() if n.startswith("registry")], "region b started a registry of its own"
    a = region_run(config_path, "a").start()
    wait_until(lambda: "a-dispatcher" in a.processes(), 30, message="region a's processes started")
    assert sorted(n for n in a.processes() if n.startswith("registry")) == [f"registry-s0-r{i}" for i in range(3)]
    expected = joinable(tmp_path)
    wait_all_joined(config, expected, 150, runs=(a, b))
    wait_until(lambda: a.dispatcher_status().get("caught_up") and b.dispatcher_status().get("caught_up"), 90,
               message="both dispatchers caught up")
    r = subprocess.run([sys.executable, "-m", "photon.app.cli", "status", "--config", str(config_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "region a: launched here" in r.stdout and "region b: launched here" in r.stdout
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert all(rows[f"registry-s0-r{i}"].split()[1] == "up" for i in range(3))
    assert sum("LEADER" in rows[f"registry-s0-r{i}"] for i in range(3)) == 1
    assert "wasted joins" in rows["b-dispatcher"] and rows["b-eventstore"].split()[1] == "up"
    assert b.stop() == 0 and a.stop() == 0
    ids = union_joined(config)
    assert set(ids) == expected
    assert [k for k, v in ids.items() if v > 1] == []
    assert sum(ids.values()) == len(expected)
    # both regions really joined (each read its own full copy and raced the other through the registry)
    per_region = {r: a.dispatcher_status() if r == "a" else b.dispatcher_status() for r in ("a", "b")}
    assert all(s["events_read"] > 0 for s in per_region.values())
