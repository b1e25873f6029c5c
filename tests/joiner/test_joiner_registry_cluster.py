"""Every component real and in its own process: a 3-replica Raft registry cluster, the event store and two
joiners of one region fed the same clicks at the same time. Each click is joined exactly once."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter

import pytest

import idregistry
from eventstore import EventStoreClient
from joiner import JoinerClient, JoinerUnavailable, Outcome
from photon import free_port, load_config, wait_until

from joiner_helpers import click_id, clicks, joined_lines, write_queries
from service_helpers import read_serving_address, write_photon_toml

J, AJ, NF = Outcome.JOINED, Outcome.ALREADY_REGISTERED, Outcome.NOT_FOUND
NOW_US = time.time_ns() // 1000  # the real registry answers TOO_OLD for ids older than its GC horizon


def start_service(pipes, what: str, *args: str, **kw) -> tuple[subprocess.Popen, str]:
    proc = pipes.python("-m", *args, "--port", str(free_port()), stdout=subprocess.PIPE, **kw)
    return proc, read_serving_address(proc, what)


def stop_and_count(tmp_path, procs, clients) -> Counter:
    """Stop the joiners (SIGTERM: each exits 0) and count the click ids in their output."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    for client in clients:
        client.close()
    return Counter(e["click_id"] for e in joined_lines(tmp_path / "out" / "joined"))


@contextlib.contextmanager
def registry_and_store(pipes, tmp_path, queries: int):
    """A real 3-replica registry with a leader and region a's event store having read ``queries`` queries;
    yields the registry client and the joiners' common arguments (closed after)."""
    config_path = write_photon_toml(tmp_path, joiner={"roll_interval_s": 0.3})
    config = load_config(config_path)
    for spec in idregistry.registry_processes(config):
        pipes.start(spec.argv)
    endpoints = idregistry.registry_endpoints(config)
    registry = idregistry.connect(endpoints)
    try:
        wait_until(lambda: any(s.get("is_leader") for s in registry.status()), 60, message="a registry leader")
        write_queries(tmp_path, range(queries))
        _, store = start_service(pipes, "eventstore a", "eventstore.main", "--config", str(config_path),
                                 "--region", "a")
        with EventStoreClient(store) as es:
            wait_until(lambda: es.status()["events_indexed"] == queries, 20,
                       message="event store has read the queries")
        yield registry, ["--config", str(config_path), "--region", "a", "--eventstore", store,
                         "--registry", ",".join(endpoints)]
    finally:
        registry.close()


@pytest.mark.timeout(120)
def test_two_joiners_on_a_real_registry_cluster_join_each_click_once(pipes, tmp_path):
    with registry_and_store(pipes, tmp_path, 150) as (registry, common):
        j0, a0 = start_service(pipes, "joiner a-j0", "joiner.main", "--name", "a-j0", *common)
        j1, a1 = start_service(pipes, "joiner a-j1", "joiner.main", "--name", "a-j1", *common)
        c0, c1 = JoinerClient(a0), JoinerClient(a1)
        batch = clicks(range(200), base_us=NOW_US)  # clicks 150..199 have no query yet
        f0, f1 = c0.join_future(*batch, timeout=60), c1.join_future(*batch, timeout=60)
        r0, r1 = f0.result(timeout=90), f1.result(timeout=90)
        for n in range(150):
            assert sorted([r0[n], r1[n]]) == [J, AJ], (n, r0[n], r1[n])
        assert r0[150:] == [NF] * 50 and r1[150:] == [NF] * 50
        assert c0.join(*clicks(range(150), base_us=NOW_US)) == [AJ] * 150
        # a click far older than the registry's garbage-collection horizon can never be joined
        assert c1.join(*clicks([7])) == [Outcome.UNJOINABLE]
        out = stop_and_count(tmp_path, (j0, j1), (c0, c1))
        assert out == Counter({click_id(n, base_us=NOW_US): 1 for n in range(150)})
        assert registry.lookup([click_id(n, base_us=NOW_US) for n in range(200)]) == [True] * 150 + [False] * 50


@pytest.mark.timeout(180)
def test_a_joiner_killed_after_its_commit_on_a_real_cluster(pipes, tmp_path):
    """Real registry cluster, event store and joiner processes. Joiner a-j0 is SIGKILLed mid-request, after
    its commit and before its write (the loss window, on demand); the same clicks then go to a-j1, as the
    dispatcher resends them, and to both at once: the killed batch answers ALREADY_REGISTERED (its commit
    finds them held; none is written again), every other click is joined
    exactly once, and the killed batch is registered under a-j0's token and in no output: the verification
    job's lost clicks, nothing else missing. A restarted a-j0 then joins beside a-j1 with no duplicate."""
    with registry_and_store(pipes, tmp_path, 300) as (registry, common):
        marker = tmp_path / "killed-batch.txt"
        env = {**os.environ, "PHOTON_TEST_KILL_AFTER_COMMIT": str(marker)}
        j0, a0 = start_service(pipes, "joiner a-j0", "joiner.main", "--name", "a-j0", *common, env=env)
        j1, a1 = start_service(pipes, "joiner a-j1", "joiner.main", "--name", "a-j1", *common)
        c0, c1 = JoinerClient(a0), JoinerClient(a1)
        ids = [click_id(n, base_us=NOW_US) for n in range(300)]
        first = clicks(range(100), base_us=NOW_US)
        with pytest.raises(JoinerUnavailable):
            c0.join(*first, timeout=60)
        assert j0.wait(timeout=30) == -signal.SIGKILL
        killed = set(marker.read_text().split())
        assert killed == set(ids[:100])
        assert registry.lookup(ids[:100]) == [True] * 100          # committed by the killed joiner
        assert c1.join(*first, timeout=60) == [AJ] * 100
        assert c1.status()["lines_written"] == 0
        j0, a0 = start_service(pipes, "joiner a-j0", "joiner.main", "--name", "a-j0", *common)   # restarted
        c0.close()
        c0 = JoinerClient(a0)
        rest = clicks(range(100, 300), base_us=NOW_US)
        f0, f1 = c0.join_future(*rest, timeout=60), c1.join_future(*rest, timeout=60)
        r0, r1 = f0.result(timeout=90), f1.result(timeout=90)
        for k in range(200):
            assert sorted([r0[k], r1[k]]) == [J, AJ], (k, r0[k], r1[k])
        assert c0.join(*clicks(range(300), base_us=NOW_US)) == [AJ] * 300
        out = stop_and_count(tmp_path, (j0, j1), (c0, c1))
        assert out == Counter({i: 1 for i in ids[100:]})           # each once; the killed batch in none
        tokens = {}
        for shard in range(len(registry.sharding().endpoints)):
            tokens.update({i: t for i, t, _ in registry.export(shard) if i in killed})
        assert set(tokens) == killed and len(set(tokens.values())) == 1   # one attempt's token: the killed one
