"""A region lost whole and back: three regions (a and b run the pipeline, c hosts registry replicas only;
5 replicas as 2/2/1). Region b is SIGKILLed mid-run, with its 2 of 5 registry replicas; a finishes alone
(commits go on with 3 of 5): every click but those b's killed joiners had registered and not yet written
(the loss window: the registry holds them under those joiners' tokens) is joined. b returns and catches
up; the verification job finds the loss window's clicks and recovery re-joins them. The union of the
output is exact, no click twice."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

import idregistry
import joiner
from photon import load_config, wait_until
from photon.app import run_recover, run_verify
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


def _joiner_addresses(run) -> set[str]:
    return {p["address"] for p in run.processes().values() if p.get("role") == "joiner"}


def _held_tokens(config, ids: set[str], out) -> dict[str, str]:
    """The registry's token for each of ``ids`` it holds (from a registry export into ``out``)."""
    client = idregistry.connect(idregistry.registry_endpoints(config))
    try:
        idregistry.export_registry(client, out)
    finally:
        client.close()
    held = {}
    for f in sorted(out.glob("*.parquet")):
        for row in pq.read_table(f, columns=["id", "token"]).to_pylist():
            if row["id"] in ids:
                held[row["id"]] = row["token"]
    return held


def _a_finishes_alone(config, runs, expected, b_joiners: set[str], out) -> set[str]:
    """Waits until a's dispatcher has caught up alone; every click still missing then must be in b's loss
    window: held by the registry under a token of one of b's killed joiners. Returns those clicks."""
    since_us = time.time_ns() // 1000

    def a_caught_up() -> bool:          # from a scan that started after b was gone
        status = runs["a"].dispatcher_status()
        return (bool(status.get("caught_up")) and status.get("scan_at_us", 0) > since_us
                and status.get("pid") == runs["a"].processes().get("a-dispatcher", {}).get("pid"))
    wait_until(a_caught_up, 180, interval=0.5, message="region a caught up alone")
    # b's committed lines only: a line a killed joiner of b wrote after its last commit record is cut when b
    # returns (its id put into b's lost-ids ledger), so its click is in the loss window too (a's joiners are
    # alive: their lines after the last commit record are committed at their next one)
    missing = expected - set(union_joined(config, committed_only=("b",)))
    held = _held_tokens(config, missing, out)
    assert set(held) == missing, f"{len(missing - set(held))} missing click(s) the registry does not hold"
    assert {t.split("/")[0] for t in held.values()} <= b_joiners, "a missing click held by a live joiner"
    print(f"loss window of the killed region: {len(missing)} click(s)")
    return missing


def _recover_loss_window(config, spark, runs, expected, window: set[str]) -> None:
    """The verification job finds exactly the loss window's clicks, recovery re-joins them."""
    if not window:
        return
    report = run_verify(config, spark)
    assert (report.lost, report.recoverable, report.duplicates) == (len(window), len(window), 0)
    done = run_recover(config, report.recoverable_path)
    assert done.deleted == len(window)
    wait_all_joined(config, expected, 120, runs=runs.values())


def _ledger_reasons(config) -> dict:
    """Per pipeline region, how many lost-ids ledger entries give each reason (for a failure's message)."""
    return {r.name: Counter(e.get("reason") for e in joiner.read_lost(r.state_dir)) for r in config.pipeline_regions}


def _finish(config, runs, expected, b_log_before: int, spark, window: set[str]) -> None:
    def b_caught_up() -> bool:
        # judged from files written by this launcher's processes only: a killed launcher's launcher.json
        # and its dispatcher's status.json are still there and would say "caught up" at once
        if runs["b"].launcher_pid() != runs["b"].proc.pid:
            return False
        status = runs["b"].dispatcher_status()
        pid = runs["b"].processes().get("b-dispatcher", {}).get("pid")
        return bool(pid) and status.get("pid") == pid and status.get("caught_up")
    wait_until(b_caught_up, 120, interval=0.2, message="region b's new dispatcher caught up after its return")
    _recover_loss_window(config, spark, runs, expected, window)
    for name in ("b", "a", "c"):
        code = runs[name].stop()
        assert code == 0, (runs[name].output_text()[-2000:], _ledger_reasons(config))
    ids = union_joined(config)
    assert set(ids) == expected
    assert [k for k, v in ids.items() if v > 1] == []
    summary = runs["b"].output_text()[b_log_before:]
    assert "wasted" in summary and "Photon run summary" in summary


@pytest.mark.timeout(300)
def test_region_down_hard_and_up_during_a_run(tmp_path, region_run, spark):
    config_path, config, runs, expected = _start_three(tmp_path, region_run, queries=20_000)
    before = runs["b"].processes()
    b_joiners = _joiner_addresses(runs["b"])
    r = _photon("region", "down", "b", "--config", str(config_path), "--hard")
    assert r.returncode == 0, r.stderr
    assert "registry-s0-r1" in r.stdout and "registry-s0-r4" in r.stdout and "b-dispatcher" in r.stdout
    assert not any(_alive(p["pid"]) for p in before.values()), "a process of region b survived"
    assert all(p["pid"] is None for p in runs["b"].processes().values())
    # a joins everything alone: every commit from now on is decided by the 3 replicas in a and c
    window = _a_finishes_alone(config, runs, expected, b_joiners, tmp_path / "export")
    assert all(p["pid"] is None for p in runs["b"].processes().values()), "region b came back by itself"
    r = _photon("region", "up", "b", "--config", str(config_path))
    assert r.returncode == 0, r.stderr
    _finish(config, runs, expected, 0, spark, window)


@pytest.mark.timeout(300)
def test_region_killed_whole_with_its_launcher_returns_and_catches_up(tmp_path, region_run, spark):
    config_path, config, runs, expected = _start_three(tmp_path, region_run, queries=20_000)
    b_joiners = _joiner_addresses(runs["b"])
    killed = runs["b"].kill_hard()
    wait_until(lambda: not any(_alive(p) for p in killed), 20, message="region b's processes gone")
    window = _a_finishes_alone(config, runs, expected, b_joiners, tmp_path / "export")
    log_len = len(runs["b"].output_text())
    runs["b"] = region_run(config_path, "b").start()
    _finish(config, runs, expected, log_len, spark, window)
    status = runs["b"].dispatcher_status()
    assert status["events_read"] > 0
