"""Tokens (ClearTokens, Delete, Export) and durability (a whole shard restarted) on a real cluster."""
from __future__ import annotations

import pytest

from photon import IdGenerator, wait_until
import idregistry
from idregistry import CommitResult

OK, EXISTS = CommitResult.OK, CommitResult.ALREADY_EXISTS
GEN = IdGenerator("10.8.8.8", 5151)


def fresh_ids(n: int) -> list[str]:
    return [GEN.next_id() for _ in range(n)]


def sees(client, ids: list[str], expected: list[bool]) -> None:
    """Lookups may be answered by a follower a heartbeat behind: wait until it has applied the change."""
    wait_until(lambda: client.lookup(ids) == expected, 10, message=f"lookups to read {expected}")


def test_delete_only_with_the_matching_token(cluster):
    a, b = fresh_ids(2)
    client = cluster.client
    assert client.commit([a, b], "joiner-1") == [OK, OK]
    assert client.delete(a, "joiner-2") is False            # wrong token: refused
    assert client.delete(fresh_ids(1)[0], "joiner-1") is False   # absent
    sees(client, [a], [True])
    assert client.delete(a, "joiner-1") is True
    sees(client, [a, b], [False, True])
    assert client.commit([a], "recovery") == [OK]           # recovery re-joins it under a new token
    assert client.commit([a], "joiner-1") == [EXISTS]


def test_clear_tokens_keeps_ids_and_blocks_deletes(cluster):
    ids = fresh_ids(30)
    client = cluster.client
    client.commit(ids, "joiner-1")
    assert client.clear_tokens(ids[:20] + fresh_ids(3)) == 20
    assert client.clear_tokens(ids[:20]) == 0
    sees(client, ids, [True] * 30)
    assert client.delete(ids[0], "joiner-1") is False        # its token is gone: it is known to be output
    assert client.delete(ids[25], "joiner-1") is True
    assert client.commit(ids[:20], "joiner-2") == [EXISTS] * 20


def test_export_streams_every_entry_with_token_and_timestamp(cluster):
    ids = fresh_ids(12_000)                                 # more than one export chunk
    client = cluster.client
    for start in range(0, len(ids), 3000):
        client.commit(ids[start:start + 3000], "joiner-x")
    client.clear_tokens(ids[:10])
    exported = {event_id: (token, ts) for event_id, token, ts in client.export(0)}
    assert len(exported) == sum(r["ids_held"] for r in cluster.status() if r["is_leader"])
    for event_id in ids[:10]:
        assert exported[event_id] == ("", idregistry_ts(event_id))
    for event_id in ids[10:]:
        assert exported[event_id] == ("joiner-x", idregistry_ts(event_id))


def test_status_command_and_statistics(cluster, capsys):
    client = cluster.client
    client.commit(fresh_ids(10), "joiner-s")
    assert idregistry.registry_command(["status", "--config", cluster.config.path]) == 0
    out = capsys.readouterr().out
    assert out.count("leader") == 1 and out.count("follower") == 2
    assert idregistry.registry_command(["status", "--config", cluster.config.path, "--json"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert len(rows) == 3
    stats = client.statistics()
    (shard,) = stats.shards
    assert shard.shard == 0 and shard.replicas_up == 3 and shard.leader in cluster.endpoints()
    assert shard.ids_held >= 10 and shard.bytes_held > 0 and shard.commit_index > 0
    assert sum(n for _, n in shard.batch_ids_histogram) > 0
    assert stats.client.commits > 0


def idregistry_ts(event_id: str) -> int:
    from photon import id_timestamp_us
    return id_timestamp_us(event_id)


@pytest.mark.timeout(120)
def test_restarting_every_replica_of_the_shard_loses_no_committed_id(cluster):
    client = cluster.client
    committed = []
    for _ in range(120):                                    # > 50 commands: a snapshot plus a journal tail
        ids = fresh_ids(25)
        assert client.commit(ids, "joiner-before") == [OK] * 25
        committed.extend(ids)
    wait_until(lambda: len({r["commit_index"] for r in cluster.status()}) == 1, 20,
               message="every replica to apply the last commit")
    held_before = max(r["ids_held"] for r in cluster.status())
    data = cluster.config.registry_data_dir / "shard-0"
    wait_until(lambda: all((data / f"replica-{r}" / "raft.snapshot").exists() for r in range(3)), 30,
               message="every replica to have written a snapshot")
    for name in list(cluster.running):
        cluster.kill(name)                                  # SIGKILL: no clean shutdown
    cluster.start_missing()
    cluster.wait_leader(timeout=60)
    cluster.wait_all_up(timeout=60)
    wait_until(lambda: min(r["ids_held"] for r in cluster.status()) >= held_before, 30,
               message="every restarted replica to hold every id again")
    assert client.commit(committed, "joiner-after") == [EXISTS] * len(committed)
    assert client.commit(committed[-25:], "joiner-before") == [OK] * 25
    for address in cluster.endpoints():
        with idregistry.RegistryClient([address]) as one:
            assert one.lookup(committed) == [True] * len(committed)


@pytest.mark.timeout(60)
def test_followers_acknowledge_entries_only_after_their_fsync(tmp_path):
    """With the "batch" fsync policy a follower holds its acknowledgement until its journal is on disk, so
    an entry counts towards the majority only once it is durable there. Three real pysyncobj members on
    127.0.0.1 in this process; the followers' fsync thread is replaced by a gate the test opens."""
    import threading
    from photon import free_port
    from idregistry._replica import RaftReplica, RaftSettings
    from idregistry._state import OP_COMMIT, ShardState

    gate_open = threading.Event()
    held: list = []
    lock = threading.Lock()

    def after_sync(fn) -> None:          # the fsync thread's contract: fn runs after a later fsync
        with lock:
            if not gate_open.is_set():
                held.append(fn)
                return
        fn()

    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [RaftReplica(a, addresses, tmp_path / f"r{k}", ShardState(0), RaftSettings(),
                            ack_after_sync=after_sync) for k, a in enumerate(addresses)]
    try:
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 30, message="a leader")
        gate_open.set()                  # let the election's own acknowledgements through
        for fn in held:
            fn()
        held.clear()
        leader = next(r for r in replicas if r.is_leader())
        followers = [r for r in replicas if r is not leader]
        wait_until(lambda: all(f.raft_status()["log_len"] == leader.raft_status()["log_len"] for f in followers),
                   30, message="the followers in step")
        with lock:
            gate_open.clear()
        before = leader.raft_status()["log_len"]
        done = threading.Event()
        leader.submit([(OP_COMMIT, "j", ["10.9.9.9:1:1763712000000001"])], lambda res, err: done.set())
        wait_until(lambda: leader.raft_status()["log_len"] > before and len(held) >= 2 and all(
            f.raft_status()["log_len"] == leader.raft_status()["log_len"] for f in followers), 30,
                   message="the entry appended by both followers, their acknowledgements held")
        assert not done.wait(1.0), "committed before any follower had the entry on disk"
        with lock:
            gate_open.set()
            release, held[:] = list(held), []
        for fn in release:
            fn()
        assert done.wait(30), "not committed once the followers' fsync finished"
        assert leader.state.contains("10.9.9.9:1:1763712000000001")
    finally:
        for r in replicas:
            r.destroy()
