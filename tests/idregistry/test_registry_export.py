"""Export as Parquet (consistent per shard, while commits run), token clearing and the memory it saves."""
from __future__ import annotations

import pickle
import threading

import orjson
import pyarrow.parquet as pq
import pytest

from photon import IdGenerator, parse_config
import idregistry
from idregistry._state import OP_CLEAR_TOKENS, OP_COMMIT, OP_SNAPSHOT, ShardState

GEN = IdGenerator("10.9.9.9", 6161)
T0 = 1_763_712_000_000_000


def eid(n: int, proc: int = 1) -> str:
    return f"10.0.0.1:{proc}:{T0 + n:016d}"


def test_clearing_every_token_of_a_run_drops_its_array_and_commits_still_work():
    s = ShardState(bucket_us=1_000_000)
    ids = [eid(n) for n in range(1000)]
    s.apply([(OP_COMMIT, "A", ids)])
    before = s.approx_bytes()
    assert s.token_bytes_saved() == (0, 0)
    assert s.apply([(OP_CLEAR_TOKENS, ids[:999])]) == [999]
    assert s.token_bytes_saved() == (0, 0)                  # one token left: the array stays
    assert s.apply([(OP_CLEAR_TOKENS, ids[999:])]) == [1]
    assert s.token_bytes_saved() == (1000, 4000)
    assert s.approx_bytes() < before - 3900
    assert s.token_of(ids[5]) == "" and s.lookup(ids[:2]) == [True, True]
    copy = pickle.loads(pickle.dumps(s))                    # snapshots keep the dropped array dropped
    assert list(copy.entries()) == list(s.entries()) and copy.token_bytes_saved() == (1000, 4000)
    late = eid(1000)
    assert list(s.apply([(OP_COMMIT, "B", [late, ids[3]])])[0]) == [0, 1]   # OK, ALREADY_EXISTS
    assert s.token_of(late) == "B" and s.token_of(ids[3]) == ""
    snap = s.apply([(OP_SNAPSHOT,)])[0]
    assert dict((i, t) for i, t, _ in snap.entries())[late] == "B"
    assert snap.ids_held == 1001


def test_registration_time_travels_in_the_command_and_is_kept_per_token():
    s = ShardState(bucket_us=1_000_000)
    replica = ShardState(bucket_us=1_000_000)
    first = [(OP_COMMIT, "A", [eid(1), eid(2)], T0 + 500)]
    for state in (s, replica):                              # every replica applies the same command
        state.apply(first)
    assert s.token_time == replica.token_time
    s.apply([(OP_COMMIT, "A", [eid(3)], T0 + 900)])         # a retry with the same token: first time kept
    s.apply([(OP_COMMIT, "B", [eid(4)], T0 + 700), (OP_COMMIT, "old", [eid(5)])])   # a pre-time journal entry
    s.apply([(OP_CLEAR_TOKENS, [eid(2)])])
    rows = {i: reg for i, _, _, reg in s.snapshot().rows()}
    assert rows == {eid(1): T0 + 500, eid(2): 0, eid(3): T0 + 500, eid(4): T0 + 700, eid(5): 0}
    assert [r[:3] for r in s.snapshot().rows()] == list(s.entries())
    copy = pickle.loads(pickle.dumps(s))                    # Raft snapshots keep the times
    assert {i: reg for i, _, _, reg in copy.snapshot().rows()} == rows
    legacy = copy.__dict__.copy()
    del legacy["token_time"]                                # a snapshot written before times were kept
    old = ShardState.__new__(ShardState)
    old.__setstate__(legacy)
    assert {reg for *_, reg in old.snapshot().rows()} == {0}
    s._renumber_tokens()                                    # renumbering keeps each token's time
    assert {i: reg for i, _, _, reg in s.snapshot().rows()} == rows
    refused = s.apply([(OP_COMMIT, "C", [eid(1)], T0 + 999)])[0]
    assert list(refused) == [1] and "C" not in s.token_numbers and len(s.token_time) == 2   # A and B


def test_export_writes_when_each_id_was_registered(cluster, tmp_path):
    import time
    client = cluster.client
    before = time.time_ns() // 1000
    early = fresh(20)
    client.commit(early, "joiner-r1")
    middle = time.time_ns() // 1000
    late = fresh(20)
    client.commit(late, "joiner-r2")
    after = time.time_ns() // 1000
    idregistry.export_registry(client, tmp_path / "export")
    table = pq.read_table(tmp_path / "export" / "shard-0.parquet").to_pylist()
    reg = {r["id"]: r["registered_us"] for r in table}
    assert all(before <= reg[i] <= middle for i in early)
    assert all(middle <= reg[i] <= after for i in late)
    assert len({reg[i] for i in early}) == 1                # one time per token (join request)


def fresh(n: int) -> list[str]:
    return [GEN.next_id() for _ in range(n)]


def test_export_is_a_consistent_copy_per_shard_while_commits_run(cluster, tmp_path):
    client = cluster.client
    batches: list[list[str]] = []
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            ids = fresh(500)
            client.commit(ids, "joiner-live")
            batches.append(ids)

    t = threading.Thread(target=writer)
    t.start()
    try:
        while len(batches) < 5:
            stop.wait(0.01)
        acknowledged = len(batches)
        manifest = idregistry.export_registry(client, tmp_path / "export")
    finally:
        stop.set()
        t.join()
    assert idregistry.check_export(tmp_path / "export") == manifest
    table = pq.read_table(tmp_path / "export" / "shard-0.parquet")
    assert table.column_names == ["id", "token", "timestamp_us", "registered_us"]
    exported = set(table.column("id").to_pylist())
    assert len(exported) == table.num_rows == manifest["shards"]["0"]["rows"]
    inside = [all(i in exported for i in b) for b in batches]
    partial = [b for b in batches if any(i in exported for i in b) and not all(i in exported for i in b)]
    assert partial == []                                    # one command is in it whole or not at all
    assert all(inside[:acknowledged])                       # everything acknowledged before it began
    k = inside.index(False) if False in inside else len(inside)
    assert not any(inside[k:])                              # a prefix of the commits, as of one log position


def test_a_truncated_export_file_is_named(cluster, tmp_path):
    cluster.client.commit(fresh(10), "joiner-t")
    idregistry.export_registry(cluster.client, tmp_path)
    path = tmp_path / "shard-0.parquet"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(idregistry.ExportError, match="shard-0.parquet.*not readable Parquet"):
        idregistry.check_export(tmp_path)
    (tmp_path / "_export.json").unlink()
    with pytest.raises(idregistry.ExportError, match="not a complete registry export"):
        idregistry.check_export(tmp_path)


def test_clear_tokens_of_output_ids_and_statistics_show_memory_saved(cluster, tmp_path):
    client = cluster.client
    gen = IdGenerator("10.7.7.7", 7171)
    ids = [gen.next_id() for _ in range(3000)]
    client.commit(ids, "joiner-c")
    config = parse_config({"regions": [{"name": "a", "log_root": "logs", "output_root": "out", "state_dir": "st"}],
                           "registry": {"data_dir": str(tmp_path / "reg")}}, base=tmp_path)
    joined = config.regions[0].joined_dir
    joined.mkdir(parents=True)
    (joined / "a-j0-1-000001.jsonl").write_bytes(b"".join(orjson.dumps({"click_id": i}) + b"\n" for i in ids[:2990]))
    (joined / "a-j0-1-000002.jsonl.inprogress").write_bytes(orjson.dumps({"click_id": ids[2995]}) + b"\n")
    before = sum(s.bytes_saved_by_clearing for s in client.statistics().shards)
    assert idregistry.clear_output_tokens(config, client) == {"files": 1, "ids": 2990, "cleared": 2990}
    assert idregistry.clear_output_tokens(config, client) == {"files": 0, "ids": 0, "cleared": 0}
    exported = {i: t for i, t, _ in client.export(0)}
    assert all(exported[i] == "" for i in ids[:2990]) and exported[ids[2995]] == "joiner-c"
    assert client.delete(ids[0], "joiner-c") is False        # in the output: recovery can no longer delete it
    # a process's ids of one time bucket drop their token array once all are cleared
    assert client.statistics().shards[0].bytes_saved_by_clearing == before
    (joined / "a-j0-1-000003.jsonl").write_bytes(b"".join(orjson.dumps({"click_id": i}) + b"\n" for i in ids[2990:]))
    assert idregistry.clear_output_tokens(config, client) == {"files": 1, "ids": 10, "cleared": 10}
    after = client.statistics().shards[0]
    assert after.bytes_saved_by_clearing >= before + 4 * 3000
    assert after.tokens_dropped_ids >= 3000
