"""A region lost whole and back: three regions (a and b run the pipeline, c hosts registry replicas only;
5 replicas as 2/2/1). Region b is SIGKILLed mid-run, with its 2 of 5 registry replicas; a finishes alone
(commits go on with 3 of 5); b returns and catches up. The union of the output is exact, no click twice."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from photon import load_config, wait_until
from regions_helpers import joinable, regions_workload, union_joined, wait_all_joined


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                 # a zombie (not yet reaped by its launcher) is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def _start_three(tmp_path, region_run, queries):
    config_path = regions_workload(tmp_path, regions=("a", "b"), registry_only=("c",), queries=queries)
    config = load_config(config_path)
    assert config.registry.replica_regions == ["a", "b", "c", "a", "b"]
    runs = {name: region_run(config_path, name).start() for name in ("c", "a", "b")}
    for name, run in runs.items():
        wait_until(lambda: len(run.processes()) > 0, 30, message=f"region {name} started")
    expected = joinable(tmp_path)
    wait_until(lambda: len(union_joined(config)) >= len(expected) // 10, 120, interval=0.2,
               message="a tenth of the clicks joined")
    return config_path, config, runs, expected


def _photon(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "photon.app.cli", *args], capture_output=True, text=True,
                          timeout=120)


def _finish(config, runs, expected, b_log_before: int) -> None:
    def b_caught_up() -> bool:
        # judged from files written by this launcher's processes only: a killed launcher's launcher.json
        # and its dispatcher's status.json are still there and would say "caught up" at once
        if runs["b"].launcher_pid() != runs["b"].proc.pid:
            return False
        status = runs["b"].dispatcher_status()
        pid = runs["b"].processes().get("b-dispatcher", {}).get("pid")
        return bool(pid) and status.get("pid") == pid and status.get("caught_up")
    wait_until(b_caught_up, 120, interval=0.2, message="region b's new dispatcher caught up after its return")
    for name in ("b", "a", "c"):
        assert runs[name].stop() == 0, runs[name].output_text()[-2000:]
    ids = union_joined(config)
    assert set(ids) == expected
    assert [k for k, v in ids.items() if v > 1] == []
    summary = runs["b"].output_text()[b_log_before:]
    assert "wasted" in summary and "Photon run summary" in summary


@pytest.mark.timeout(300)
def test_region_down_hard_and_up_during_a_run(tmp_path, region_run):
    config_path, config, runs, expected = _start_three(tmp_path, region_run, queries=20_000)
    before = runs["b"].processes()
    r = _photon("region", "down", "b", "--config", str(config_path), "--hard")
    assert r.returncode == 0, r.stderr
    assert "registry-s0-r1" in r.stdout and "registry-s0-r4" in r.stdout and "b-dispatcher" in r.stdout
    assert not any(_alive(p["pid"]) for p in before.values()), "a process of region b survived"
    assert all(p["pid"] is None for p in runs["b"].processes().values())
    # a joins everything alone: every commit from now on is decided by the 3 replicas in a and c
    wait_all_joined(config, expected, 180, runs=runs.values())
    assert all(p["pid"] is None for p in runs["b"].processes().values()), "region b came back by itself"
    r = _photon("region", "up", "b", "--config", str(config_path))
    assert r.returncode == 0, r.stderr
    _finish(config, runs, expected, 0)


@pytest.mark.timeout(300)
def test_region_killed_whole_with_its_launcher_returns_and_catches_up(tmp_path, region_run):
    config_path, config, runs, expected = _start_three(tmp_path, region_run, queries=20_000)
    killed = runs["b"].kill_hard()
    wait_until(lambda: not any(_alive(p) for p in killed), 20, message="region b's processes gone")
    wait_all_joined(config, expected, 180, runs=runs.values())
    log_len = len(runs["b"].output_text())
    runs["b"] = region_run(config_path, "b").start()
    _finish(config, runs, expected, log_len)
    status = runs["b"].dispatcher_status()
    assert status["events_read"] > 0
