"""Each click's first region: how active-active regions avoid joining the same click twice (wasted joins).

Every pipeline region reads its own copy of every click. Left alone, both regions race for each click and
one of the two joins is wasted (the registry lets one commit win; the other gets ALREADY_EXISTS). The Photon
paper's dispatchers look the id up in the registry before joining (§3.3, §4.4); that only helps when the other
region has already committed. Here each click also has an *owner*, picked by a stable hash of its id (``mmh3``,
the same on every machine): when every registry shard's leader is in one pipeline region, that region owns
``leader_fraction`` of the clicks (:meth:`RegionShare.follow_leader`: its commits pay one round trip, any
other region's two) and the other pipeline regions the rest; otherwise ``mmh3(id) mod n`` over the config's
pipeline regions picks. A region
joins the clicks it owns at once; it holds another region's click back for a *grace* and then looks it up.
Found present: resolved with no join at all. Found still unjoined: it is held again, for another grace, for
as long as the owner shows *progress*; it is joined here only once the owner is judged *down*.

Progress and down are judged from what the lookups of held clicks find (all facts the dispatcher sees):

* a held click of the owner found present (or a join here answered ALREADY_REGISTERED) is progress: the
  owner is up and joining, however far behind it is (a large backlog puts it seconds behind);
* an owner is *silent* from the first lookup that found one of its held clicks still unjoined after its last
  progress; silent for ``patience`` (the larger of its grace and ``down_after``) it is judged *down*: every
  click of it held now is released to be joined here at once (:meth:`RegionShare.still_unjoined` says so),
  and its new clicks are taken at once, except one in ``PROBE_EVERY``, still held back for the grace as a
  probe; progress (a probe found present, or a wasted join) marks the owner up again.

So the grace follows how far behind the owner is: a click is never taken from an owner that keeps joining,
and an owner that goes down delays its share by at most its grace plus the patience (then not at all).

The grace itself adapts per owner to how late the owner joins: a lookup answer finding held clicks present at
their first lookup shrinks it slowly (x0.98); one finding any still unjoined there grows it (x1.5 + 5 ms), up
to ``grace_max``, at most once per answer (the clicks of one answer were read together: one fact about the
owner); so it settles where about 1 answer in 21 needs a second lookup for some of its clicks; each
lookup of a held click costs one id in a batched lookup to a near replica, never a join. Pure: no clock
reads (times are passed in), no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import mmh3

PROBE_EVERY = 16
"""While an owner is down, one of this many of its clicks is still held back for the grace (a probe)."""
GROW, SHRINK = 1.5, 0.98
GROW_ADD_US = 5_000


@dataclass(frozen=True)
class ShareStatistics:
    owners: tuple[str, ...]
    grace_ms: tuple[float, ...]          # per owner region (0 for this region)
    down: tuple[bool, ...]               # per owner region: judged down
    leader_region: str                   # the leader's region, owning leader_fraction of the clicks ("": none)
    deferred: int                        # clicks held back for their owner
    found_present: int                   # of those, found joined by the owner (no join here)
    deferred_joined: int                 # of those, joined here (the owner had not)
    deferred_wasted: int                 # of those, joined here too late (ALREADY_REGISTERED)
    held_again: int                      # lookups of held clicks that found them unjoined: held again
    judged_down: int                     # times an owner was judged down (silent for its patience)
    late: int                            # held clicks joined here while their owner progressed: waited longer
                                         # than the owner's lag plus the patience


class RegionShare:
    """Which region joins a click first, and how long the others wait (see the module docstring)."""

    def __init__(self, regions: list[str], me: str, grace_initial_us: int, grace_min_us: int,
                 grace_max_us: int, down_after_us: int = 1_000_000, leader_fraction: float = 0.75) -> None:
        if me not in regions:
            raise ValueError(f"region {me!r} is not one of the pipeline regions {regions}")
        self.regions = list(regions)
        self.me = self.regions.index(me)
        self.grace_min_us, self.grace_max_us, self.down_after_us = grace_min_us, grace_max_us, down_after_us
        self._leader: int | None = None     # see follow_leader
        self._others: list[int] = []
        self._leader_permille = round(leader_fraction * 1000)
        self._grace = [0 if k == self.me else grace_initial_us for k in range(len(regions))]
        self._progress_at: list[int | None] = [None] * len(regions)   # last progress seen of each owner
        self._lag = [0] * len(regions)      # how long after this region read them its latest clicks were found
        self._silent_since: list[int | None] = [None] * len(regions)  # first unjoined lookup after it
        self._down = [False] * len(regions)
        self._adapted_at: list[int | None] = [None] * len(regions)   # when each owner's grace last changed
        self._grown_at: list[int | None] = [None] * len(regions)     # when it last grew
        self._seen = [0] * len(regions)
        self._c = dict(deferred=0, found_present=0, deferred_joined=0, deferred_wasted=0, held_again=0,
                       judged_down=0, late=0)

    def owner(self, cid: str) -> int:
        h = mmh3.hash(cid, signed=False)
        leader = self._leader
        if leader is None:
            return h % len(self.regions)
        if h % 1000 < self._leader_permille:
            return leader
        others = self._others
        return others[(h // 1000) % len(others)]

    def follow_leader(self, region: str | None) -> None:
        """The region of every registry shard's leader (None: unknown, or the leaders are in several
        regions). When it is a pipeline region, that region owns ``leader_fraction`` of the clicks (by the
        hash) and the other pipeline regions the rest: its commits need one round trip less than any other's
        (the leader is at home), so with more than half the clicks there the union's median click pays one
        round trip, while the other regions still take part of the work (a backlog drains on every region).
        Every region asks the registry and so finds the same region; while they disagree (a new leader), a
        click both own costs a wasted join and a click neither owns waits the owner's lag plus the patience."""
        self._leader = self.regions.index(region) if region in self.regions else None
        self._others = [k for k in range(len(self.regions)) if k != self._leader]

    def hold_us(self, owner: int) -> int:
        """How long to hold back a click of ``owner`` before looking it up (0: at once)."""
        if owner == self.me:
            return 0
        self._seen[owner] += 1
        if self._down[owner] and self._seen[owner] % PROBE_EVERY:
            return 0
        self._c["deferred"] += 1
        return self._grace[owner]

    def patience_us(self, owner: int) -> int:
        """How long ``owner`` may stay silent (held clicks of it found unjoined, none found joined) before it
        is judged down."""
        return max(self._grace[owner], self.down_after_us)

    def found_present(self, owner: int, now_us: int, first_lookup: bool = True, waited_us: int = 0) -> None:
        """A held click of ``owner`` was found joined at its lookup (``first_lookup``: at the first one),
        ``waited_us`` after this region read it."""
        self._c["found_present"] += 1
        if self._progress_at[owner] != now_us:
            self._lag[owner] = waited_us
        else:
            self._lag[owner] = max(self._lag[owner], waited_us)
        self._progress(owner, now_us)
        if first_lookup and self._adapted_at[owner] != now_us:
            self._adapted_at[owner] = now_us
            self._grace[owner] = max(self.grace_min_us, int(self._grace[owner] * SHRINK))

    def still_unjoined(self, owner: int, now_us: int, first_lookup: bool = True,
                       waited_us: int = 0) -> tuple[int, bool]:
        """A held click of ``owner`` was found unjoined at its lookup, ``waited_us`` after this region read
        it: ``(hold_us, judged_down_now)``. ``hold_us`` > 0: hold it again that long; 0: join it here now.
        ``judged_down_now``: the owner was judged down by this lookup, so every click of it still held is to
        be joined here now too. A click that waited longer than the owner's lag plus the patience is
        joined here even while the owner shows progress (it may never join it: it saw another owner)."""
        if self._down[owner]:
            return 0, False
        if waited_us > self._lag[owner] + self.patience_us(owner) and self._progress_at[owner] is not None:
            late_alone = now_us - self._progress_at[owner] < self.patience_us(owner)
        else:
            late_alone = False
        since = self._silent_since[owner]
        progress = self._progress_at[owner]
        if since is None or (progress is not None and progress >= since):
            since = self._silent_since[owner] = now_us
        if first_lookup and (since == now_us or progress == now_us):
            self._grow(owner, now_us)    # late but progressing (not while silent: that may be down, not late)
        if now_us - since >= self.patience_us(owner):
            self._down[owner] = True
            self._silent_since[owner] = None
            self._c["judged_down"] += 1
            return 0, True
        if late_alone:
            self._c["late"] += 1
            return 0, False
        self._c["held_again"] += 1
        if since == now_us:
            return self._grace[owner], False
        # silent: look again when the patience runs out, so a down owner is noticed then, not a grace later
        return max(self.grace_min_us, min(self._grace[owner], since + self.patience_us(owner) - now_us)), False

    def joined(self, owner: int, now_us: int) -> None:
        """A held click of ``owner`` was joined here (the owner had been judged down)."""
        self._c["deferred_joined"] += 1

    def wasted(self, owner: int, now_us: int = 0) -> None:
        """A held click of ``owner`` joined here was answered ALREADY_REGISTERED: the owner is up after all."""
        self._c["deferred_wasted"] += 1
        self._progress(owner, now_us)
        self._grow(owner, now_us)

    def is_down(self, owner: int) -> bool:
        return self._down[owner]

    def _progress(self, owner: int, now_us: int) -> None:
        self._progress_at[owner] = now_us
        self._silent_since[owner] = None
        self._down[owner] = False

    def _grow(self, owner: int, now_us: int) -> None:
        """The grace grows at most once per instant (and shrinks only when it did not grow then): the clicks
        of one lookup answer were read together and tell one fact about the owner's lateness, not one each."""
        if self._grown_at[owner] == now_us:
            return
        self._grown_at[owner] = self._adapted_at[owner] = now_us
        self._grace[owner] = min(self.grace_max_us, int(self._grace[owner] * GROW) + GROW_ADD_US)

    def statistics(self) -> ShareStatistics:
        leader = "" if self._leader is None else self.regions[self._leader]
        return ShareStatistics(tuple(self.regions), tuple(g / 1000 for g in self._grace), tuple(self._down),
                               leader, **self._c)
