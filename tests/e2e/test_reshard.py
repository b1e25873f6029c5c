"""Live resharding under a running pipeline: `photon registry reshard` while clicks flow; the launcher
starts the new shard's replicas, and every click is still joined exactly once."""
from __future__ import annotations

import subprocess
import sys
import time

import orjson
import pytest

from photon import IdGenerator, wait_until
from photon.app import GenOptions, generate


@pytest.mark.timeout(240)
def test_reshard_up_while_clicks_flow(tmp_path, pipeline):
    import idregistry
    generate(GenOptions(out=str(tmp_path), queries=10, unjoinable_fraction=0.0, duplicate_fraction=0.0,
                        bad_line_fraction=0.0, seed=3))
    cfg = tmp_path / "photon.toml"
    cfg.write_text(cfg.read_text() + "\n[registry]\nmax_clock_skew_s = 1.0\n")
    p = pipeline(cfg).start()
    logs = tmp_path / "logs" / "a"
    qgen, cgen = IdGenerator("10.7.0.1", 7), IdGenerator("10.8.0.1", 8)
    expected = set((tmp_path / "truth" / "joinable.txt").read_text().split())
    qf = open(logs / "queries" / "w0" / "live.jsonl", "ab", buffering=0)
    cf = open(logs / "clicks" / "w0" / "live.jsonl", "ab", buffering=0)

    def write_some(n: int) -> None:
        for _ in range(n):
            qid, cid = qgen.next_id(), cgen.next_id()
            qf.write(orjson.dumps({"query_id": qid, "advertiser_id": "adv-2"}) + b"\n")
            cf.write(orjson.dumps({"click_id": cid, "query_id": qid}) + b"\n")
            expected.add(cid)
    try:
        write_some(200)
        wait_until(lambda: set(p.joined_ids(include_inprogress=True)) == expected, 60, message="first clicks")
        reshard = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "registry", "reshard", "--config", str(cfg),
                                    "--shards", "2", "--effective-in", "3"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 90
        while reshard.poll() is None and time.monotonic() < deadline:   # clicks keep flowing meanwhile
            write_some(20)
            time.sleep(0.05)
        out, _ = reshard.communicate(timeout=30)
        assert reshard.returncode == 0, out
        assert {"registry-s1-r0", "registry-s1-r1", "registry-s1-r2"} <= set(p.processes())
        switch_seen = time.time()
        while time.time() < switch_seen + 5:                            # ids from after the switch
            write_some(20)
            time.sleep(0.05)
        wait_until(lambda: set(p.joined_ids(include_inprogress=True)) == expected, 90, interval=0.2,
                   message="every click joined after the reshard")
        client = idregistry.connect(idregistry.registry_endpoints(p.config))
        try:
            in_shard1 = [i for i, _, _ in client.export(1)]
        finally:
            client.close()
        assert in_shard1 and set(in_shard1) <= expected, "no click was committed in the new shard"
    finally:
        qf.close()
        cf.close()
    assert p.stop() == 0
    assert p.joined_ids() == {c: 1 for c in expected}
