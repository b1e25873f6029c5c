"""A member's first election without waiting out the steady election timeout, and without disturbing a
group that has a leader: a pre-vote, asked only by a member that has never heard a leader.

pysyncobj draws every election timeout, the first one included, from the steady range (1-2 s), so a fresh
group sits leaderless that long; and it has no pre-vote, so simply shortening the first timeout made a
member *restarted* into a healthy group stand before it heard the leader (its higher term deposes the
leader). Here a member that has heard no leader since it started asks its connected peers first:

* it asks only once its **rank delay** has passed since it started (rank 0 at once, each further rank
  :data:`STAGGER_S` later), so the members of a fresh group do not all stand together and split the vote;
* a peer **grants** only when it knows no leader (it is none itself and has heard of none), has voted for
  no one else in its current term (no election is under way) and the asker's log is at least as up to date
  as its own (the asker could win);
* the member stands at once (it sets pysyncobj's election deadline to now) only when **every** peer it
  asked granted and the grants with its own make a majority of the group. Any refusal, or a peer that
  does not answer within :data:`ROUND_TIMEOUT_S`, ends the round: it asks again :data:`ROUND_S` later.

The first leader it hears (an ``append_entries``) ends all of this for the life of the process: every
later election is pysyncobj's own, on the steady timeout. A member restarted into a group with a leader
never stands early: the leader refuses (it knows itself), and so does every follower connected to it.
Nothing here touches what Raft decides (terms, votes, logs): at worst a member stands earlier than
pysyncobj would have made it, and only when the peers it can reach say no leader exists.

:class:`FirstElection` is the pure core (facts in, one instruction out, time passed in);
:func:`grants_prevote` is the peer's rule. The pysyncobj shell is in :mod:`idregistry._replica`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PREVOTE = "photon_prevote"
PREVOTE_REPLY = "photon_prevote_reply"

STAGGER_S = 0.25
"""Between the ranks' first pre-votes: long enough for rank 0's election (two round trips on a busy host)
to finish before rank 1 asks, so that rank 1's peers refuse it (they voted for rank 0)."""
ROUND_S = 0.1
"""Between a refused (or unanswered) round and the next."""
ROUND_TIMEOUT_S = 0.5
"""A round whose answers are not all in by then counts as refused."""


@dataclass(frozen=True)
class Ask:
    """Instruction: send a pre-vote request of round ``round`` to each of ``peers``."""
    round: int
    peers: tuple


@dataclass(frozen=True)
class Stand:
    """Instruction: stand for election now."""


@dataclass(frozen=True)
class FirstElectionStatistics:
    rounds: int          # pre-vote rounds asked
    refused: int         # rounds that ended without standing (a refusal or a missing answer)
    stood: int           # rounds after which the member stood at once
    done: bool           # a leader was heard (or the member led): pre-votes are over for this process


def grants_prevote(*, leader_known: bool, voted_for, asker, asker_last: tuple[int, int],
                   own_last: tuple[int, int]) -> bool:
    """The peer's answer to a pre-vote: no leader known, no vote for another member in the current term
    (``voted_for`` None or the asker), and the asker's ``(last log term, last log index)`` at least
    ``own_last``."""
    if leader_known:
        return False
    if voted_for is not None and voted_for != asker:
        return False
    return tuple(asker_last) >= tuple(own_last)


@dataclass
class FirstElection:
    """The asking member's side. Call :meth:`tick` every Raft tick and :meth:`reply` with each answer;
    :meth:`heard_leader` once a leader is known. ``group_size`` counts the member itself."""
    started_at: float
    rank: int
    group_size: int
    stagger_s: float = STAGGER_S
    round_s: float = ROUND_S
    round_timeout_s: float = ROUND_TIMEOUT_S
    done: bool = field(default=False, init=False)
    _round: int = field(default=0, init=False, repr=False)
    _open_since: float | None = field(default=None, init=False, repr=False)   # the open round's start
    _asked: frozenset = field(default=frozenset(), init=False, repr=False)
    _granted: set = field(default_factory=set, init=False, repr=False)
    _refused: bool = field(default=False, init=False, repr=False)
    _next_at: float = field(default=0.0, init=False, repr=False)            # no new round before
    _refused_rounds: int = field(default=0, init=False, repr=False)
    _stood: int = field(default=0, init=False, repr=False)

    def heard_leader(self) -> None:
        self.done = True
        self._open_since = None

    def reply(self, peer, round_: int, granted: bool) -> None:
        if self.done or self._open_since is None or round_ != self._round or peer not in self._asked:
            return                      # a late answer to an earlier round
        if granted:
            self._granted.add(peer)
        else:
            self._refused = True

    def tick(self, now: float, can_stand: bool, connected) -> Ask | Stand | None:
        """``can_stand``: this member knows no leader and has voted for no one else in its current term;
        ``connected``: the peers it is connected to now."""
        if self.done:
            return None
        if self._open_since is not None:
            decided = self._decide(now, can_stand)
            if decided is not None or self._open_since is not None:
                return decided
        if not can_stand or now < self.started_at + self.rank * self.stagger_s or now < self._next_at:
            return None
        peers = tuple(connected)
        if 1 + len(peers) <= self.group_size / 2:
            return None                 # cannot reach a majority yet
        self._round += 1
        self._open_since, self._asked, self._granted, self._refused = now, frozenset(peers), set(), False
        if not peers:                   # a group of one
            return self._decide(now, can_stand)
        return Ask(self._round, peers)

    def _decide(self, now: float, can_stand: bool) -> Stand | None:
        everyone = self._granted == set(self._asked)
        if can_stand and everyone and 1 + len(self._granted) > self.group_size / 2:
            self._open_since = None
            self._next_at = now + 2 * self.round_timeout_s    # its election runs meanwhile
            self._stood += 1
            return Stand()
        if self._refused or not can_stand or now - self._open_since >= self.round_timeout_s:
            self._open_since = None
            self._next_at = now + self.round_s
            self._refused_rounds += 1
        return None

    def statistics(self) -> FirstElectionStatistics:
        return FirstElectionStatistics(rounds=self._round, refused=self._refused_rounds, stood=self._stood,
                                       done=self.done)
