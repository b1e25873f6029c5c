"""A real 3-replica cluster (processes on 127.0.0.1 free ports, pysyncobj + gRPC)."""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from photon import IdGenerator, wait_until
import idregistry
from idregistry import CommitResult

OK, EXISTS = CommitResult.OK, CommitResult.ALREADY_EXISTS


def fresh_ids(n: int, gen=IdGenerator("10.9.9.9", 4242)) -> list[str]:
    return [gen.next_id() for _ in range(n)]


def test_status_names_every_replica_and_one_leader(cluster):
    # A member that has not yet heard the leader elected by pre-vote still shows the term it started with.
    def agreed() -> bool:
        rows = cluster.client.status()
        return len(rows) == 3 and len({r["term"] for r in rows}) == 1
    wait_until(agreed, 20, message="every replica following one leader in one term")
    rows = cluster.client.status()
    assert len(rows) == 3
    assert {r["replica"] for r in rows} == {0, 1, 2}
    assert sum(1 for r in rows if r["is_leader"]) == 1
    assert {r["term"] for r in rows} == {rows[0]["term"]}
    for r in rows:
        assert set(r) >= {"shard", "replica", "address", "pid", "is_leader", "term", "commit_index", "ids_held"}


@pytest.mark.timeout(120)
@pytest.mark.timeout(60)
def test_leaders_names_each_shards_leader_as_the_replicas_see_it(cluster):
    rows = cluster.client.status()
    leader = next(r["address"] for r in rows if r.get("is_leader"))
    assert cluster.client.leaders() == {0: leader}
    near = idregistry.RegistryClient(cluster.endpoints(), near_host=leader.rpartition(":")[0])
    try:
        assert near.leaders() == {0: leader}
    finally:
        near.close()


def test_conflicting_commits_from_many_threads_have_exactly_one_winner(cluster):
    ids = fresh_ids(400)
    threads = 8
    wins: list[Counter] = [Counter() for _ in range(threads)]

    def worker(k: int) -> None:
        client = idregistry.RegistryClient(cluster.endpoints())
        try:
            order = ids[k % 2::2] + ids[(k + 1) % 2::2]   # half the threads start from the other half
            for start in range(0, len(order), 25):
                chunk = order[start:start + 25]
                for event_id, result in zip(chunk, client.commit(chunk, f"joiner-{k}")):
                    assert result in (OK, EXISTS)
                    if result == OK:
                        wins[k][event_id] += 1
        finally:
            client.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    total = Counter()
    for w in wins:
        assert all(v == 1 for v in w.values())
        total.update(w)
    assert set(total) == set(ids)
    assert all(v == 1 for v in total.values()), "an id was accepted for two tokens"
    assert cluster.client.lookup(ids) == [True] * len(ids)


def test_retry_with_the_same_token_is_idempotent(cluster):
    ids = fresh_ids(50)
    first = cluster.client.commit(ids, "joiner-a")
    assert first == [OK] * 50
    assert cluster.client.commit(ids, "joiner-a") == [OK] * 50      # the reply was "lost": retry
    assert cluster.client.commit(ids[:10], "joiner-b") == [EXISTS] * 10
    mixed = ids[:5] + fresh_ids(5)
    assert cluster.client.commit(mixed, "joiner-b") == [EXISTS] * 5 + [OK] * 5


def test_retry_after_a_lost_response_is_ok(cluster):
    """The reply of a commit is lost (the caller gave up before it came); the commit itself went through.
    The retry with the same token is OK; another joiner's commit of the same ids is refused."""
    from idregistry import registry_pb2, registry_pb2_grpc
    import grpc

    ids = fresh_ids(20000)
    leader = cluster.wait_leader()["address"]
    with grpc.insecure_channel(leader) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = registry_pb2_grpc.RegistryStub(channel)
        # the caller never reads the reply and hangs up: from the registry's side, a lost response (a
        # short deadline would do the same, but on a loaded machine it can expire before the request is in)
        call = stub.Commit.future(registry_pb2.CommitRequest(ids=ids, token="joiner-lost"), timeout=30)
        wait_until(lambda: cluster.client.lookup(ids[-1:]) == [True], 30, message="the lost commit to apply")
        call.cancel()
    assert cluster.client.commit(ids, "joiner-lost") == [OK] * len(ids)
    assert cluster.client.commit(ids[:100], "joiner-other") == [EXISTS] * 100


def test_lookup_is_answered_by_every_replica(cluster):
    ids = fresh_ids(20)
    absent = fresh_ids(5)
    cluster.client.commit(ids, "joiner-a")
    for address in cluster.endpoints():
        with idregistry.RegistryClient([address]) as one:
            # a follower may lag by a heartbeat; wait until it has applied the commit
            wait_until(lambda: one.lookup(ids) == [True] * 20, 10, message=f"{address} to see the ids")
            assert one.lookup(absent) == [False] * 5


def test_malformed_ids_are_refused(cluster):
    with pytest.raises(ValueError, match="event id"):
        cluster.client.commit(["not-an-id"], "joiner-a")
    with pytest.raises(ValueError, match="event id"):
        cluster.client.lookup(["10.0.0.1:1:12"])


def test_commit_answers_at_once_when_idle(cluster):
    latencies = []
    for _ in range(30):
        ids = fresh_ids(1)
        t = time.perf_counter()
        assert cluster.client.commit(ids, "joiner-a") == [OK]
        latencies.append(time.perf_counter() - t)
    latencies.sort()
    # no tick wait: pysyncobj's default batching would make each commit wait ~100 ms
    assert latencies[len(latencies) // 2] < 0.05


@pytest.mark.timeout(180)
def test_leader_sigkill_under_load_accepts_no_id_twice(cluster):
    leader = cluster.wait_leader()
    ids = fresh_ids(3000)
    solo_ids = fresh_ids(3000)          # committed by one writer only: any ALREADY_EXISTS is a wrong refusal
    oks: list[Counter] = [Counter(), Counter()]
    progress = [0, 0]
    solo_results: list[CommitResult] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def solo() -> None:
        client = idregistry.RegistryClient(cluster.endpoints(), retry_timeout_s=60.0)
        try:
            for start in range(0, len(solo_ids), 20):
                solo_results.extend(client.commit(solo_ids[start:start + 20], "solo"))
        except BaseException as e:
            errors.append(e)
        finally:
            client.close()

    def worker(k: int) -> None:
        client = idregistry.RegistryClient(cluster.endpoints(), retry_timeout_s=60.0)
        try:
            for start in range(0, len(ids), 20):
                if stop.is_set():
                    return
                chunk = ids[start:start + 20]
                for event_id, result in zip(chunk, client.commit(chunk, f"racer-{k}")):
                    if result == OK:
                        oks[k][event_id] += 1
                progress[k] = start + 20
        except BaseException as e:   # surfaced below
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)] + [threading.Thread(target=solo)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: min(progress) >= 400, 60, message="commits flowing before the kill")
        cluster.kill(cluster.name_of(leader))
        killed_at = time.monotonic()
        new_leader = cluster.wait_leader(timeout=30)
        assert new_leader["replica"] != leader["replica"]
        assert time.monotonic() - killed_at < 10
        for t in threads:
            t.join(timeout=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        cluster.start_missing()      # bring the killed replica back for the tests after this one
    assert not errors, errors
    assert min(progress) >= len(ids)
    both = oks[0] + oks[1]
    assert set(both) == set(ids)
    assert [i for i, n in both.items() if n != 1] == [], "ids accepted twice across the failover"
    assert solo_results == [OK] * len(solo_ids), "a retried commit was refused as ALREADY_EXISTS"
    cluster.wait_all_up()
    restarted = cluster.name_of(leader)
    address = next(r["address"] for r in cluster.client.status() if cluster.name_of(r) == restarted)
    with idregistry.RegistryClient([address]) as one:
        wait_until(lambda: one.lookup(ids[-50:]) == [True] * 50, 30, message="the restarted replica to catch up")
