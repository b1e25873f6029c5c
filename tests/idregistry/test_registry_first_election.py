"""A freshly started registry group elects its leader within the first-election range, not the steady
election timeout; a member restarted into a group that has a leader does not stand for election."""
from __future__ import annotations

import threading
import time

import pytest

from photon import free_port, wait_until
from idregistry._replica import RaftReplica, RaftSettings
from idregistry._state import ShardState

# Steady timeouts far beyond the waits below: only the first-election range can produce these leaders.
SLOW_STEADY = dict(raft_min_timeout_s=30.0, raft_max_timeout_s=60.0)


def start(addresses, root, k, **settings):
    return RaftReplica(addresses[k], addresses, root / f"r{k}", ShardState(0), RaftSettings(**SLOW_STEADY, **settings))


@pytest.mark.timeout(60)
def test_a_fresh_group_elects_within_the_first_election_range(tmp_path):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    t0 = time.monotonic()
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        deadlines = [r._sync._SyncObj__raftElectionDeadline for r in replicas]
        assert all(d <= time.monotonic() + RaftSettings.first_election_max_s for d in deadlines)
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 20, message="a leader")
        assert time.monotonic() - t0 < SLOW_STEADY["raft_min_timeout_s"]
    finally:
        for r in replicas:
            r.destroy()


@pytest.mark.timeout(90)
def test_a_restarted_member_joins_without_an_election(tmp_path):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        wait_until(lambda: sum(r.is_leader() for r in replicas) == 1, 20, message="a leader")
        leader = next(r for r in replicas if r.is_leader())
        term = leader.raft_status()["raft_term"]
        k = next(i for i, r in enumerate(replicas) if r is not leader)
        replicas[k].destroy()
        replicas[k] = start(addresses, tmp_path, k)
        wait_until(lambda: replicas[k].leader() == leader.self_addr, 20, message="the restarted member follows")
        pace = threading.Event()
        until = time.monotonic() + RaftSettings.first_election_max_s + 0.5   # past its first-election deadline
        while time.monotonic() < until:
            assert leader.is_leader() and leader.raft_status()["raft_term"] == term, "the restarted member stood"
            pace.wait(0.02)                 # checks paced over the whole span (no condition to wait for)
    finally:
        for r in replicas:
            r.destroy()
