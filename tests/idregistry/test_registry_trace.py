"""The commit path's timing records (``PHOTON_REGISTRY_TRACE``, idregistry/_trace.py) from a real cluster:
off unless asked; when asked, every replica records its fsyncs, its snapshots and compactions and (the
leader) each request and command, the followers their acknowledgements, on one clock with the client's;
``bench/registry_tail.py`` splits every commit into parts that add up to what the client waited."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.registry_tail import _load, summarise
from idregistry import _trace
from photon import wait_until
from tests.idregistry.registry_helpers import start_cluster


def test_tracing_is_off_unless_the_environment_names_a_folder(monkeypatch):
    monkeypatch.delenv(_trace.ENV, raising=False)
    assert _trace.install_replica(object()) is None       # nothing of the replica is touched
    assert _trace.client_recorder() is None


@pytest.mark.timeout(180)
def test_a_traced_cluster_splits_each_commit_into_parts_that_add_up(tmp_path, monkeypatch, procs):
    where = tmp_path / "trace"
    monkeypatch.setenv(_trace.ENV, str(where))
    (tmp_path / "registry").mkdir()
    cluster = start_cluster(tmp_path / "registry", procs, snapshot_after_commands=20)
    recorder = _trace.client_recorder()
    try:
        base = int(time.time() * 1e6)
        firsts = []
        for k in range(60):
            ids = [f"10.9.9.9:7100:{t:016d}" for t in range(base + 100 * k, base + 100 * k + 50)]
            t0 = time.perf_counter()
            results = cluster.client.commit(ids, "trace-test")
            recorder.add("commit", t0, time.perf_counter(), first=ids[0], thread=0)
            assert all(r == 0 for r in results)
            firsts.append(ids[0])
    finally:
        recorder.close()
        cluster.client.close()

    def recorded() -> bool:
        rows = _load(where)
        named = {r.get("first") for r in rows if r["kind"] == "request"}
        kinds = {(r["role"], r["kind"]) for r in rows}
        return (set(firsts) <= named and all((f"replica{k}", kind) in kinds for k in range(3)
                                             for kind in ("fsync", "freeze", "snapshot", "compact"))
                and sum(1 for r in rows if r["kind"] == "ack") >= 60)
    wait_until(recorded, 30, interval=0.2, message="every replica's records of the 60 commits")
    rows = _load(where)
    commands = [r for r in rows if r["kind"] == "command"]
    assert {f for c in commands for f in c["firsts"]} >= set(firsts)
    assert all(c["t0"] <= c["applied"] <= c["t1"] for c in commands)
    summary = summarise(rows, 0.0, float("inf"), slow_ms=0.0)
    assert summary["commits"] == summary["slow"] == summary["matched_at_leader"] == 60
    by_first = {r["first"]: r for r in rows if r["kind"] == "commit"}
    for example in summary["examples"]:         # the first twelve: every part named, adding up
        parts = example["parts"]
        assert {"to_leader", "queued", "leader_fsync", "wake", "back"} <= set(parts)
        assert parts["to_leader"] >= 0 and parts["back"] >= 0     # one clock across the processes
        assert abs(sum(parts.values()) - example["ms"]) <= 0.01 * len(parts) + 0.01
    assert len(by_first) == 60
    json.dumps(summary)
    assert Path(where).is_dir()
