"""A registry member that has heard no leader stands early only after a pre-vote that every peer it reaches
granted: a fresh group (and a whole group restarted together) elects well within the steady election
timeout, while a member restarted into a group that has a leader is refused and never changes the
leader or its term."""
from __future__ import annotations

import shutil
import threading
import time

import pytest

from photon import free_port, wait_until
from idregistry._first_election import (PREVOTE, STAGGER_S, Ask, FirstElection, Stand, grants_prevote)
from idregistry import _replica
from idregistry._replica import RaftReplica, RaftSettings
from idregistry._state import ShardState

# Steady timeouts far beyond the waits below: only the pre-voted first election can produce these leaders.
SLOW_STEADY = dict(raft_min_timeout_s=30.0, raft_max_timeout_s=60.0)


# ---- the pure core --------------------------------------------------------------------------------------

def test_a_peer_grants_only_without_a_leader_without_another_vote_and_to_an_up_to_date_log():
    base = dict(leader_known=False, voted_for=None, asker="a", asker_last=(3, 10), own_last=(3, 10))
    assert grants_prevote(**base)
    assert grants_prevote(**{**base, "voted_for": "a"})
    assert not grants_prevote(**{**base, "leader_known": True})
    assert not grants_prevote(**{**base, "voted_for": "b"})
    assert not grants_prevote(**{**base, "asker_last": (3, 9)})
    assert not grants_prevote(**{**base, "asker_last": (2, 99)})
    assert grants_prevote(**{**base, "asker_last": (4, 1)})


def test_a_member_asks_after_its_rank_delay_and_stands_only_when_every_peer_asked_granted():
    fe = FirstElection(started_at=100.0, rank=1, group_size=3)
    assert fe.tick(100.0, True, ["p", "q"]) is None                 # rank 1 waits one stagger
    ask = fe.tick(100.0 + STAGGER_S, True, ["p", "q"])
    assert isinstance(ask, Ask) and set(ask.peers) == {"p", "q"}
    fe.reply("p", ask.round, True)
    assert fe.tick(100.3, True, ["p", "q"]) is None                 # q has not answered
    fe.reply("q", ask.round, True)
    assert fe.tick(100.31, True, ["p", "q"]) == Stand()
    assert fe.statistics().stood == 1


def test_one_refusal_or_a_silent_peer_ends_the_round_without_standing():
    fe = FirstElection(started_at=0.0, rank=0, group_size=3)
    ask = fe.tick(0.0, True, ["p", "q"])
    fe.reply("p", ask.round, True)
    fe.reply("q", ask.round, False)
    assert fe.tick(0.01, True, ["p", "q"]) is None
    again = fe.tick(0.2, True, ["p", "q"])                           # the next round, a round interval later
    assert isinstance(again, Ask) and again.round == ask.round + 1
    fe.reply("p", ask.round, True)                                  # a late answer to the old round counts not
    fe.reply("p", again.round, True)
    assert fe.tick(0.3, True, ["p", "q"]) is None                   # q silent
    assert fe.tick(0.8, True, ["p", "q"]) is None                   # timed out: refused
    assert fe.statistics().refused == 2 and fe.statistics().stood == 0


def test_a_member_that_cannot_reach_a_majority_or_heard_a_leader_never_asks():
    fe = FirstElection(started_at=0.0, rank=0, group_size=5)
    assert fe.tick(1.0, True, ["p"]) is None                        # 2 of 5
    assert isinstance(fe.tick(1.0, True, ["p", "q"]), Ask)          # 3 of 5
    fe.heard_leader()
    fe.reply("p", 1, True)
    fe.reply("q", 1, True)
    assert fe.tick(2.0, True, ["p", "q"]) is None and fe.statistics().done
    voted_elsewhere = FirstElection(started_at=0.0, rank=0, group_size=3)
    assert voted_elsewhere.tick(1.0, False, ["p", "q"]) is None


# ---- real pysyncobj members ------------------------------------------------------------------------------

def start(addresses, root, k, rank=None):
    settings = RaftSettings(**SLOW_STEADY, first_election_rank=k if rank is None else rank)
    return RaftReplica(addresses[k], addresses, root / f"r{k}", ShardState(0), settings)


def one_leader(replicas):
    leaders = [r for r in replicas if r.is_leader()]
    return leaders[0] if len(leaders) == 1 else None


def destroy_all(replicas):
    for r in replicas:
        if r is not None:
            r.destroy()


@pytest.mark.timeout(60)
def test_a_fresh_group_elects_by_pre_vote_well_within_the_steady_timeout(tmp_path):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    t0 = time.monotonic()
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        wait_until(lambda: one_leader(replicas) is not None, 20, message="a leader")
        took = time.monotonic() - t0
        assert took < SLOW_STEADY["raft_min_timeout_s"] / 2, took
        assert sum(r.first_election_statistics().stood for r in replicas) >= 1
        wait_until(lambda: all(r.first_election_statistics().done for r in replicas), 10,
                   message="every member heard the leader")
    finally:
        destroy_all(replicas)


@pytest.mark.timeout(90)
def test_a_group_restarted_together_elects_by_pre_vote_again(tmp_path):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        wait_until(lambda: one_leader(replicas) is not None, 20, message="a leader")
        term = one_leader(replicas).raft_status()["raft_term"]
        destroy_all(replicas)
        replicas = [None] * 3
        t0 = time.monotonic()
        replicas = [start(addresses, tmp_path, k) for k in range(3)]
        wait_until(lambda: one_leader(replicas) is not None, 20, message="a leader after the restart")
        assert time.monotonic() - t0 < SLOW_STEADY["raft_min_timeout_s"] / 2
        assert one_leader(replicas).raft_status()["raft_term"] > term
    finally:
        destroy_all(replicas)


@pytest.mark.timeout(60)
def test_the_leader_and_a_follower_refuse_a_pre_vote_over_the_wire(tmp_path):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        wait_until(lambda: one_leader(replicas) is not None, 20, message="a leader")
        leader = one_leader(replicas)
        asker = next(r for r in replicas if r is not leader)
        # both peers must know the leader (that is what refuses): on a loaded host the other follower may
        # hear the new leader's first append_entries after the asker does
        wait_until(lambda: all(r.leader() == leader.self_addr for r in replicas), 10,
                   message="every member follows the leader")
        sync = asker._sync
        replies: list = []
        sync._on_prevote_message = lambda node, message: replies.append((node.address, message))
        sent = threading.Event()

        def ask_once():                 # in the Raft thread, as the member's own pre-vote would be
            if not sent.is_set():
                sent.set()
                for node in sync.otherNodes:    # a log far ahead: only "a leader is known" can refuse
                    sync._SyncObj__transport.send(node, {"type": PREVOTE, "round": 7, "last": (10**9, 10**9)})
        asker.add_tick_callback(ask_once)
        wait_until(lambda: len(replies) == 2, 10, message="both peers answered the pre-vote")
        assert {a for a, _ in replies} == set(addresses) - {asker.self_addr}
        assert all(m["round"] == 7 and m["granted"] is False for _, m in replies), replies
    finally:
        destroy_all(replicas)


class _SlowToHearTheLeader(_replica._PipelinedTransport):
    """A restarted member's transport that drops the leader's append_entries until ``deaf_until`` (as when
    a loaded host delays its heartbeats), so that the member asks its pre-votes before it hears the leader."""
    deaf_until = 0.0

    def _onMessageReceived(self, node, message) -> None:
        if message.get("type") == "append_entries" and time.monotonic() < type(self).deaf_until:
            return
        super()._onMessageReceived(node, message)


@pytest.mark.timeout(90)
def test_a_member_restarted_into_a_group_with_a_leader_changes_neither_leader_nor_term(tmp_path, monkeypatch):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    replicas = [start(addresses, tmp_path, k) for k in range(3)]
    try:
        wait_until(lambda: one_leader(replicas) is not None, 20, message="a leader")
        leader = one_leader(replicas)
        term = leader.raft_status()["raft_term"]
        monkeypatch.setattr(_replica, "_transport_class", lambda *_: _SlowToHearTheLeader)
        pace = threading.Event()
        for wiped in (False, True):     # restarted as rank 0: it would ask (and stand) at once if it could
            k = next(i for i, r in enumerate(replicas) if r is not leader)
            replicas[k].destroy()
            if wiped:                   # a replaced disk: no journal, no vote, so nothing of its own stops it
                shutil.rmtree(tmp_path / f"r{k}")
            _SlowToHearTheLeader.deaf_until = time.monotonic() + 1.5
            replicas[k] = start(addresses, tmp_path, k, rank=0)
            until = time.monotonic() + 2.0          # deaf to the leader, then past any standing it could make
            while time.monotonic() < until:
                assert leader.is_leader() and leader.raft_status()["raft_term"] == term, "the restarted member stood"
                pace.wait(0.02)                     # checks paced over the whole span (no condition to wait for)
            wait_until(lambda: replicas[k].leader() == leader.self_addr, 20, message="the restarted member follows")
            stats = replicas[k].first_election_statistics()
            assert stats.stood == 0, stats
            if wiped:                   # it asked while deaf to the leader, and every round was refused
                assert stats.rounds >= 1 and stats.refused >= 1, stats
            # (kept data: its vote for the leader in the current term keeps it from asking at all)
            assert leader.is_leader() and leader.raft_status()["raft_term"] == term
    finally:
        destroy_all(replicas)
