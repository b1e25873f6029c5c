"""Raft message frames: the registry's stored (uncompressed) zlib frames decode with plain ``zlib``, and
members sending them form one group with members sending pysyncobj's own compressed frames (real
pysyncobj members on 127.0.0.1 in this process, leaders of both kinds, a member stopped and restarted)."""
from __future__ import annotations

import os
import pickle
import threading
import zlib

import pytest
from pysyncobj.tcp_connection import TcpConnection

from idregistry import _replica
from idregistry._replica import RaftReplica, RaftSettings, zlib_stored
from idregistry._state import OP_COMMIT, ShardState
from photon import free_port, wait_until


@pytest.mark.timeout(10)
@pytest.mark.parametrize("size", [0, 1, 100, 65534, 65535, 65536, 3 * 65535 + 7])
def test_stored_frames_are_what_zlib_reads_back(size):
    data = os.urandom(size)
    frame = zlib_stored(data)
    assert zlib.decompress(frame) == data
    assert len(frame) == size + 2 + 5 * max(1, -(-size // 65535)) + 4     # header, block headers, adler32
    message = {"type": "append_entries", "entries": [(data, 7, 2)], "term": 2}
    assert pickle.loads(zlib.decompress(zlib_stored(pickle.dumps(message, _replica.WIRE_PICKLE_PROTOCOL)))) \
        == message


def _connections(replica: RaftReplica) -> list:
    transport = replica._sync._SyncObj__transport
    return list(transport._connections.values())


def _commit(leader: RaftReplica, ids: list[str]) -> None:
    done, errors = threading.Event(), []

    def answered(results, error) -> None:
        errors.append(error)
        done.set()

    leader.submit([(OP_COMMIT, "wire", ids)], answered)
    assert done.wait(30), "no answer to a commit"
    assert errors == [0], f"commit failed: {errors}"


@pytest.mark.timeout(180)
def test_stored_and_compressing_members_form_one_group(tmp_path, monkeypatch):
    """Replica 0 sends pysyncobj's compressed frames, replicas 1 and 2 the registry's stored ones. Every
    round commits through the current leader, checks all three members applied it, then stops the leader
    and starts it again on its data; rounds go on until a member of each kind has led (at most 8)."""
    stored_frames = []
    real_stored = _replica.zlib_stored
    monkeypatch.setattr(_replica, "zlib_stored", lambda data: stored_frames.append(len(data)) or real_stored(data))

    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    settings = [RaftSettings(compress_messages=(k == 0), first_election_rank=k) for k in range(3)]

    def start(k: int) -> RaftReplica:
        return RaftReplica(addresses[k], addresses, tmp_path / f"r{k}", ShardState(0), settings[k])

    replicas = [start(k) for k in range(3)]
    committed: list[str] = []
    led: set[bool] = set()      # compress_messages of each member that has led a round
    try:
        for round_ in range(8):
            wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 30, message="one leader")
            k = next(i for i, r in enumerate(replicas) if r.is_leader())
            ids = [f"10.7.7.7:{round_ + 1}:17637120{n:08d}" for n in range(1, 201)]
            _commit(replicas[k], ids)
            committed += ids
            wait_until(lambda held=tuple(committed): all(all(r.state.contains(i) for i in held) for r in replicas), 30,
                       message=f"round {round_}: every member applied every committed id (leader r{k})")
            led.add(settings[k].compress_messages)
            for i, r in enumerate(replicas):
                kinds = {type(c) for c in _connections(r)}
                assert kinds == ({TcpConnection} if i == 0 else {_replica._StoredTcpConnection}), (i, kinds)
            if led == {True, False}:
                break
            replicas[k].destroy()
            replicas[k] = start(k)
        assert led == {True, False}, f"no leader of each kind in 8 rounds: {led}"
        assert stored_frames and max(stored_frames) > 200 * 20, "no stored frame carried the commands"
    finally:
        for r in replicas:
            r.destroy()


@pytest.mark.timeout(120)
def test_protocol_4_commands_and_pysyncobj_protocol_2_commands_replay_together(tmp_path):
    """Commands the registry submits are pickled with protocol 4; commands pysyncobj's own decorator
    pickles (protocol 2, as journals written before hold them) apply beside them, and a whole group
    restarted from its journals holds the ids of both."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]

    def start(k: int) -> RaftReplica:
        return RaftReplica(addresses[k], addresses, tmp_path / f"r{k}", ShardState(0), RaftSettings())

    replicas = [start(k) for k in range(3)]
    new_ids = [f"10.7.7.8:1:17637120{n:08d}" for n in range(1, 101)]
    old_ids = [f"10.7.7.8:2:17637120{n:08d}" for n in range(1, 101)]
    try:
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 30, message="one leader")
        leader = next(r for r in replicas if r.is_leader())
        _commit(leader, new_ids)
        done, errors = threading.Event(), []
        leader._consumer.apply([(OP_COMMIT, "old", old_ids)],
                               callback=lambda results, error: (errors.append(error), done.set()))
        assert done.wait(30) and errors == [0], errors
        journal = leader._sync._SyncObj__raftLog
        commands = [journal[i][0] for i in range(len(journal))]
        assert any(c[1:3] == b"\x80\x04" for c in commands), "no protocol-4 command in the journal"
        assert any(c[1:3] == b"\x80\x02" for c in commands), "no protocol-2 command in the journal"
        for r in replicas:
            r.destroy()
        replicas = [start(k) for k in range(3)]
        wait_until(lambda: all(all(r.state.contains(i) for i in new_ids + old_ids) for r in replicas), 60,
                   message="every restarted member holds the ids of both kinds of command")
    finally:
        for r in replicas:
            r.destroy()
