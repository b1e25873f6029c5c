"""Garbage collection, overload and live resharding, on a cluster with short horizons (GC after 3 s,
clock-skew bound 1 s)."""
from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter

import grpc
import pytest

from photon import IdGenerator, SystemClock, wait_until
import idregistry
from idregistry import CommitResult
from idregistry import registry_pb2 as pb
from idregistry import registry_pb2_grpc as pb_grpc
from registry_helpers import start_cluster

OK, EXISTS, TOO_OLD = CommitResult.OK, CommitResult.ALREADY_EXISTS, CommitResult.TOO_OLD


def boundaries(cluster) -> dict[int, int]:
    return {r["replica"]: r["gc_boundary_us"] for r in cluster.status() if "error" not in r}


@pytest.mark.timeout(90)
def test_old_ids_are_too_old_and_counted(fast_cluster):
    gen = IdGenerator("10.3.3.3", 31)
    old = [gen.next_id() for _ in range(5)]
    client = idregistry.RegistryClient(fast_cluster.endpoints())
    try:
        assert client.commit(old, "j") == [OK] * 5
        newest = int(old[-1][-16:])
        wait_until(lambda: min(boundaries(fast_cluster).values()) > newest, 20,
                   message="the GC boundary to pass the ids")
        fresh = gen.next_id()
        assert client.commit(old + [fresh], "j") == [TOO_OLD] * 5 + [OK]
        assert client.lookup(old) == [False] * 5
        assert client.client_statistics().ids_too_old == 5
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_gc_boundary_never_goes_back_across_a_leader_change(fast_cluster):
    leader = fast_cluster.wait_leader()
    seen = max(boundaries(fast_cluster).values())
    assert seen > 0
    fast_cluster.kill(fast_cluster.name_of(leader))
    try:
        new_leader = fast_cluster.wait_leader(timeout=30)
        assert new_leader["replica"] != leader["replica"]
        history = []

        def advanced() -> bool:
            now = boundaries(fast_cluster)
            history.append(now)
            return all(b > seen for b in now.values())
        wait_until(advanced, 20, message="the new leader to advance the boundary")
        for replica in history[0]:
            series = [h[replica] for h in history if replica in h]
            assert series == sorted(series), f"replica {replica}'s GC boundary went back: {series}"
            assert series[0] >= seen
    finally:
        fast_cluster.start_missing()
        fast_cluster.wait_all_up()
    # the restarted replica catches up and never reports a boundary below what it had
    wait_until(lambda: min(boundaries(fast_cluster).values()) > seen, 20, message="the old leader to catch up")


@pytest.mark.timeout(120)
def test_overloaded_leader_answers_resource_exhausted_and_clients_back_off(tmp_path, procs):
    """The followers are stopped, so nothing commits: the leader's 4 commands in flight hold at most 80,000
    ids and its queue 5,000, so 24 clients sending 5,000 ids each at once must be turned away; once the
    followers resume, the clients' retries commit every id. (Its own cluster: the default GC horizon, so
    that ids waiting out the back-off are not too old.)"""
    cluster = start_cluster(tmp_path, procs, max_queued_ids=5000)
    leader = cluster.wait_leader()
    followers = [cluster.running[cluster.name_of(r)] for r in cluster.status()
                 if r["replica"] != leader["replica"]]
    errors: list[BaseException] = []
    results: list[list] = []
    batches = [[IdGenerator("10.4.4.4", 100 + k).next_id() for _ in range(5000)] for k in range(24)]
    start = threading.Barrier(len(batches))

    clients = [idregistry.RegistryClient(cluster.endpoints(), retry_timeout_s=60) for _ in batches]
    for client in clients:   # each knows the leader before the followers stop
        client.commit([IdGenerator("10.4.4.5", 1).next_id()], "warm-up")

    def worker(k: int) -> None:
        try:
            start.wait(timeout=30)
            results.append(clients[k].commit(batches[k], f"j{k}"))
        except BaseException as e:
            errors.append(e)
        finally:
            clients[k].close()

    channel = grpc.insecure_channel(leader["address"])
    leader_stub = pb_grpc.RegistryStub(channel)

    def refused() -> int:   # the leader's own count (the stopped followers would hold up a status of all)
        return json.loads(leader_stub.Status(pb.StatusRequest(), timeout=2).status_json)["refused_overloaded"]

    refused_before = refused()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(batches))]
    for p in followers:
        os.kill(p.pid, signal.SIGSTOP)
    try:
        for t in threads:
            t.start()
        # within the leader's fallback (3 s without an answer from any follower)
        wait_until(lambda: refused() > refused_before, 2.5, message="the leader to refuse a request")
    finally:
        for p in followers:
            os.kill(p.pid, signal.SIGCONT)
        channel.close()
    for t in threads:
        t.join(timeout=100)
    assert not errors, errors
    assert len(results) == len(batches)
    assert Counter(x for r in results for x in r) == {OK: 5000 * len(batches)}
    assert client_lookup_all(cluster, batches)
    cluster.client.close()


def client_lookup_all(cluster, batches) -> bool:
    client = idregistry.RegistryClient(cluster.endpoints())
    try:
        return all(client.lookup(ids) == [True] * len(ids) for ids in batches)
    finally:
        client.close()


class Racers:
    """Two clients committing the same stream of fresh ids under different tokens, chunk by chunk."""

    def __init__(self, cluster, chunk: int = 40) -> None:
        self.cluster = cluster
        self.gen = IdGenerator("10.6.6.6", 66)
        self.chunks: list[list[str]] = []
        self.lock = threading.Lock()
        self.oks = [Counter(), Counter()]
        self.done = [0, 0]
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.chunk = chunk
        self.threads = [threading.Thread(target=self.run, args=(k,)) for k in range(2)]

    def chunk_at(self, n: int) -> list[str]:
        with self.lock:
            while len(self.chunks) <= n:
                self.chunks.append([self.gen.next_id() for _ in range(self.chunk)])
            return self.chunks[n]

    def run(self, k: int) -> None:
        client = idregistry.RegistryClient(self.cluster.endpoints(), retry_timeout_s=60)
        try:
            n = 0
            while not self.stop.is_set():
                ids = self.chunk_at(n)
                for event_id, result in zip(ids, client.commit(ids, f"racer-{k}")):
                    assert result in (OK, EXISTS), (event_id, result)
                    if result == OK:
                        self.oks[k][event_id] += 1
                n += 1
                self.done[k] = n
        except BaseException as e:
            self.errors.append(e)
        finally:
            client.close()

    def __enter__(self) -> "Racers":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)

    def newest_committed_us(self) -> int:
        n = min(self.done)
        return int(self.chunks[n - 1][-1][-16:]) if n else 0


def reshard(cluster, shards: int, effective_in: float) -> int:
    """Run ``photon registry reshard`` while playing the launcher (starting new shards' replicas)."""
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(idregistry.registry_command(
        ["reshard", "--config", cluster.config.path, "--shards", str(shards),
         "--effective-in", str(effective_in), "--wait", "60"])))
    t.start()

    def launcher_tick() -> bool:
        cluster.start_missing()
        return bool(rc)
    wait_until(launcher_tick, 90, interval=0.2, message=f"reshard to {shards} shards")
    t.join()
    return rc[0]


@pytest.mark.timeout(240)
def test_reshard_up_and_down_while_committing_accepts_no_id_twice(fast_cluster, capsys):
    assert idregistry.registry_command(["reshard", "--config", fast_cluster.config.path, "--shards", "3",
                                        "--effective-in", "0.5"]) == 2        # not beyond the skew bound
    assert "max_clock_skew_s" in capsys.readouterr().err
    endpoints = {0: fast_cluster.endpoints()}
    with pytest.raises(ValueError, match="later than now"):                    # shard 0 refuses it too
        fast_cluster.client.reshard(SystemClock().now_us() + 500_000, 1, endpoints)
    with Racers(fast_cluster) as racers:
        wait_until(lambda: min(racers.done) >= 5, 30, message="commits flowing")
        assert reshard(fast_cluster, 3, 2.0) == 0
        sharding = fast_cluster.client.sharding(refresh=True)
        grow_at = sharding.epochs[-1][0]
        assert sharding.epochs[-1][1] == 3
        wait_until(lambda: racers.newest_committed_us() > grow_at + 1_000_000, 60,
                   message="commits past the 3-shard epoch")
        assert reshard(fast_cluster, 2, 2.0) == 0
        shrink_at = fast_cluster.client.sharding(refresh=True).epochs[-1][0]
        wait_until(lambda: racers.newest_committed_us() > shrink_at + 300_000, 60,
                   message="commits past the 2-shard epoch")
    holders: dict[str, list[int]] = {}
    for shard in (2, 1, 0):                 # right away, shard 2 (3-shard epoch only) first: GC drops ids 3 s old
        for event_id, _, _ in fast_cluster.client.export(shard):
            holders.setdefault(event_id, []).append(shard)
    # each shard's leader advances its own GC boundary on its own tick: judge each id by its shard's
    gc_boundary: dict[int, int] = {}
    for r in fast_cluster.client.status():
        if "error" not in r:
            gc_boundary[r["shard"]] = max(gc_boundary.get(r["shard"], 0), r["gc_boundary_us"])
    assert not racers.errors, racers.errors
    both = racers.oks[0] + racers.oks[1]
    committed = [i for n in range(min(racers.done)) for i in racers.chunks[n]]
    assert set(committed) <= set(both)
    assert [i for i, n in both.items() if n != 1] == [], "an id was accepted twice across a reshard"
    # every id lives in exactly one shard: the one the final config maps it to (ids GC has reached are gone)
    final = fast_cluster.client.sharding(refresh=True)
    assert [n for _, n in final.epochs] == [1, 3, 2]
    recent = [i for i in committed if int(i[-16:]) > gc_boundary[final.shard_for(i)] + 100_000]
    for event_id in recent:
        assert holders.get(event_id) == [final.shard_for(event_id)], event_id
    used = Counter(final.shard_for(i) for i in recent)
    assert set(used) == {0, 1, 2}
