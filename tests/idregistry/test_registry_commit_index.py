"""The leader tells the followers its commit index without a message of its own per command: while later
entries still wait for a majority (or commands wait to be appended) the next message carries it, and the
last commit of a burst is told at once, not at the next heartbeat (real pysyncobj members on 127.0.0.1 in
this process, heartbeats 5 s apart so that only the leader's own sends can tell a follower in time)."""
from __future__ import annotations

import threading

import pytest

from idregistry import _replica
from idregistry._replica import RaftReplica, RaftSettings
from idregistry._state import OP_COMMIT, ShardState
from photon import free_port, wait_until

SLOW_HEARTBEAT = dict(append_entries_period_s=5.0, raft_min_timeout_s=30.0, raft_max_timeout_s=60.0,
                      leader_fallback_s=60.0)
COMMANDS = 40
IN_FLIGHT = 4


@pytest.mark.timeout(120)
def test_commit_index_rides_on_the_next_entries_and_the_burst_end_is_told_at_once(tmp_path, monkeypatch):
    sent: list[int] = []        # entries in every append_entries any member sends
    real_send = _replica._StoredTcpConnection.send

    def counting(self, message) -> None:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            sent.append(len(message.get("entries") or ()))
        real_send(self, message)

    monkeypatch.setattr(_replica._StoredTcpConnection, "send", counting)
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [RaftReplica(addresses[k], addresses, tmp_path / f"r{k}", ShardState(0),
                            RaftSettings(**SLOW_HEARTBEAT, first_election_rank=k)) for k in range(3)]
    try:
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 30, message="one leader")
        leader = next(r for r in replicas if r.is_leader())
        followers = [r for r in replicas if r is not leader]
        errors: list[int] = []
        answered = threading.Semaphore(0)
        ids = [[f"10.1.1.2:{c}:17637120{n:08d}" for n in range(1, 51)] for c in range(COMMANDS)]
        following = iter(range(IN_FLIGHT, COMMANDS))

        def done(_results, error) -> None:
            if error:
                errors.append(error)
            answered.release()
            c = next(following, None)
            if c is not None:           # as the batcher does: the completion submits the next command
                leader.submit([(OP_COMMIT, f"t{c}", ids[c])], done)

        first = [f"10.1.1.1:1:17637120{n:08d}" for n in range(1, 11)]
        warm: list[int] = []
        leader.submit([(OP_COMMIT, "warm", first)], lambda _results, error: (warm.append(error), answered.release()))
        assert answered.acquire(timeout=30), "no answer to the first commit"
        assert warm == [0]
        wait_until(lambda: all(f.state.contains(first[-1]) for f in followers), 10,
                   message="the followers applied the first commit")
        sent.clear()

        for c in range(IN_FLIGHT):         # IN_FLIGHT commands in Raft at a time, as the batcher keeps them
            leader.submit([(OP_COMMIT, f"t{c}", ids[c])], done)
        for _ in range(COMMANDS):
            assert answered.acquire(timeout=30), "a command was not answered"
        assert errors == []
        # the heartbeat is 5 s away: only the leader's send after the last commit can tell them this soon
        wait_until(lambda: all(f.state.contains(ids[-1][-1]) for f in followers), 2.5,
                   message="the followers applied the burst's last command before the next heartbeat")
        assert all(f.state.contains(i) for f in followers for batch in ids for i in batch)

        with_entries = sum(1 for n in sent if n)
        commit_only = sum(1 for n in sent if not n)
        assert with_entries >= COMMANDS, sent
        # pysyncobj alone sends one to each follower after every apply: about 2 x COMMANDS of them
        assert commit_only <= COMMANDS // 4, f"{commit_only} append_entries without entries: {sent}"
    finally:
        for r in replicas:
            r.destroy()


@pytest.mark.timeout(120)
def test_a_command_queued_from_the_raft_thread_is_appended_without_waking_the_pipe(tmp_path):
    """A completion that submits the next command (the batcher's pump) runs in the Raft thread: the command
    is taken by the same tick, so no byte goes through pysyncobj's wake-up pipe for it (pysyncobj's own
    ``_applyCommand`` writes one per command), and every command of the chain is still applied."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [RaftReplica(addresses[k], addresses, tmp_path / f"r{k}", ShardState(0),
                            RaftSettings(first_election_rank=k)) for k in range(3)]
    try:
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 30, message="one leader")
        leader = next(r for r in replicas if r.is_leader())
        sync = leader._sync
        raft_thread = sync._SyncObj__thread
        notifier = sync._SyncObj__pipeNotifier
        real_notify = notifier.notify
        woken_from_raft_thread: list[int] = []

        def counting_notify() -> None:
            if threading.current_thread() is raft_thread:
                woken_from_raft_thread.append(1)
            real_notify()

        notifier.notify = counting_notify
        ids = [[f"10.1.1.3:{c}:17637120{n:08d}" for n in range(1, 21)] for c in range(COMMANDS)]
        results: list[tuple[str, int]] = []
        finished = threading.Event()

        def chain(c: int):
            def done(_results, error) -> None:
                results.append((threading.current_thread().name, error))
                if error or c + 1 == COMMANDS:
                    finished.set()
                else:
                    leader.submit([(OP_COMMIT, f"c{c + 1}", ids[c + 1])], chain(c + 1))
            return done

        leader.submit([(OP_COMMIT, "c0", ids[0])], chain(0))
        assert finished.wait(30), f"the chain stopped after {len(results)} commands"
        assert [e for _, e in results] == [0] * COMMANDS
        assert {name for name, _ in results} == {raft_thread.name}      # every later submit came from it
        assert woken_from_raft_thread == [], "the Raft thread wrote to its own wake-up pipe"
        assert all(leader.state.contains(batch[-1]) for batch in ids)
    finally:
        for r in replicas:
            r.destroy()
