"""A real dispatcher process over real, growing files, feeding two real gRPC joiners that commit to a real
(one-replica, pysyncobj) IdRegistry; the dispatcher is SIGKILLed mid-run and restarted. Every click must end
in the joined output exactly once (or, for clicks whose query never comes, in the unjoinable output)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

import idregistry
import joiner
from dispatcher import read_status
from dispatcher._files import load_checkpoint
from eventstore import InMemoryEventStore
from photon import load_config, wait_until
from dispatcher_helpers import (append, append_lines, click_id, click_line, query_id, query_line,
                                read_jsonl_dir, write_config)

N_FIRST, N_TOTAL = 6000, 9000
LATE = range(8000, 8050)            # their queries arrive only after the restart
NEVER = range(N_TOTAL, N_TOTAL + 5)  # their queries never arrive


@pytest.fixture
def pipeline(tmp_path, procs):
    path = write_config(tmp_path, unjoinable_after_s=4.0,
                        extra="\n[registry]\nreplicas = 1\n\n[joiner]\nmax_in_flight = 4\n")
    cfg = load_config(path)
    for spec in idregistry.registry_processes(cfg):
        procs.start(spec.argv)
    endpoints = idregistry.registry_endpoints(cfg)
    client = idregistry.connect(endpoints)

    def registry_up():
        try:
            return client.lookup([click_id(0)]) == [False]
        except idregistry.RegistryUnavailable:
            return False

    wait_until(registry_up, 60, message="the registry answering lookups")
    store = InMemoryEventStore()
    for n in range(N_TOTAL):
        if n not in LATE:
            store.put(query_id(n), query_line(n))
    joiners = [joiner.serve(cfg, "r1", f"r1-j{i}", eventstore=store, registry=endpoints) for i in range(2)]
    try:
        yield cfg, path, store, joiners, endpoints, client
    finally:
        for j in joiners:
            j.stop(grace=5)
        client.close()


def start_dispatcher(procs, path, joiners, endpoints) -> subprocess.Popen:
    return procs.start([sys.executable, "-m", "dispatcher.main", "--config", str(path), "--region", "r1",
                        "--joiners", ",".join(j.address for j in joiners), "--registry", ",".join(endpoints)],
                       stdout=subprocess.DEVNULL)


def test_sigkill_and_restart_join_every_click_exactly_once(pipeline, procs, tmp_path):
    cfg, path, store, joiners, endpoints, client = pipeline
    region = cfg.regions[0]
    clicks = tmp_path / "logs" / "clicks"
    append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(N_FIRST)] + [b"{garbage"])
    d1 = start_dispatcher(procs, path, joiners, endpoints)

    def status():
        return read_status(region.state_dir) or {}

    wait_until(lambda: status().get("joined", 0) >= 1000, 60, message="first thousand clicks joined")
    # a line written in two halves, a new file in a deeper folder, and the first file growing
    half = click_line(N_FIRST)
    append(clicks / "w1" / "c-0001.jsonl", half[:25])
    append_lines(clicks / "w2" / "x" / "c-0001.jsonl", [click_line(n) for n in range(N_FIRST + 1, 7500)])
    os.kill(d1.pid, signal.SIGKILL)
    d1.wait(timeout=10)
    assert status().get("caught_up") is False
    killed_at = load_checkpoint(tmp_path / "state" / "dispatcher")
    written = sum(p.stat().st_size for p in clicks.rglob("*.jsonl"))
    assert killed_at["events"] or sum(killed_at["offsets"].values()) < written, "killed when already done"
    append(clicks / "w1" / "c-0001.jsonl", half[25:] + b"\n")
    append_lines(clicks / "w1" / "c-0001.jsonl", [click_line(n) for n in range(7500, N_TOTAL)])
    append_lines(clicks / "w3" / "c-0001.jsonl", [click_line(n) for n in NEVER] + [click_line(5)])  # 5: again

    def checkpoint():
        return load_checkpoint(tmp_path / "state" / "dispatcher")

    # the second run is killed while late clicks wait in its retry queue (saved in its checkpoint)
    d2 = start_dispatcher(procs, path, joiners, endpoints)
    late_ids = {click_id(n) for n in LATE}
    wait_until(lambda: late_ids & {e[0] for e in checkpoint()["events"] if e[4] >= 1}, 60,
               message="late clicks, tried once, saved in the checkpoint")
    os.kill(d2.pid, signal.SIGKILL)
    d2.wait(timeout=10)
    saved = {e[0]: e for e in checkpoint()["events"]}
    assert any(saved[i][4] >= 1 for i in late_ids & set(saved))
    for n in LATE:
        store.put(query_id(n), query_line(n))

    d3 = start_dispatcher(procs, path, joiners, endpoints)
    wait_until(lambda: status().get("pid") == d3.pid and status().get("caught_up"), 90,
               message="the restarted dispatcher caught up")
    s = status()
    assert s["in_flight"] == 0 and s["retry_queue"] == 0 and s["pending_bytes"] == 0
    assert s["already_registered"] >= 1 and s["bad_records"] == 1
    os.kill(d3.pid, signal.SIGTERM)
    assert d3.wait(timeout=20) == 0

    for j in joiners:
        j.stop(grace=5)  # publishes the joiners' last output files
    joined = Counter(r["click_id"] for r in read_jsonl_dir(region.joined_dir))
    dupes = {k: v for k, v in joined.items() if v > 1}
    assert dupes == {}, "clicks joined twice"
    assert set(joined) == {click_id(n) for n in range(N_TOTAL)}
    unjoinable = [r["click_id"] for r in read_jsonl_dir(region.unjoinable_dir)]
    assert sorted(set(unjoinable)) == sorted(click_id(n) for n in NEVER)
    bad = read_jsonl_dir(region.quarantine_dir)
    assert {b["raw"] for b in bad} == {"{garbage"} and {b["file"] for b in bad} == {"w1/c-0001.jsonl"}
    assert all(client.lookup([click_id(n) for n in range(0, N_TOTAL, 100)]))
    final = checkpoint()
    assert final["events"] == [] and sum(final["offsets"].values()) == sum(
        p.stat().st_size for p in clicks.rglob("*.jsonl"))
