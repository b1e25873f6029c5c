"""Each click's first region: how active-active regions avoid joining the same click twice (wasted joins).

Every pipeline region reads its own copy of every click. Left alone, both regions race for each click and
one of the two joins is wasted (the registry lets one commit win; the other gets ALREADY_EXISTS). The Photon
paper's dispatchers look the id up in the registry before joining (§3.3, §4.4); that only helps when the other
region has already committed. Here each click also has an *owner*: the pipeline region that a stable hash of
its id (``mmh3(id) mod n`` over the config's pipeline regions, the same on every machine) picks. A region
joins the clicks it owns at once; it holds another region's click back for a *grace* period and then looks it
up: by then the owner has normally joined it (the lookup says present: resolved with no join at all), and
only when the owner has not (down, or slower than the grace) does this region join it.

The grace adapts per owner, from what the deferred clicks turn out to be (all facts the dispatcher sees):

* found present at the lookup after the grace: the owner was in time; the grace shrinks slowly (x0.98);
* joined here and answered ALREADY_REGISTERED (a wasted join after all: the owner was slower than the grace):
  the grace grows (x1.5 + 5 ms), up to ``grace_max``;
* joined here successfully: the owner had not joined it in time. While the owner is seen alive (one of its
  held clicks was found present within the last ``ALIVE_WINDOW_GRACES`` graces, at least
  ``ALIVE_WINDOW_MIN_US``), this is a race the owner probably lost later (its own commit then finds the id
  registered: a wasted join counted on its side), so the grace grows as on a wasted join. Otherwise it counts
  towards the owner being down: ``DOWN_AFTER`` such in a row mark it down, and its clicks are then taken at
  once, except one in ``PROBE_EVERY``, still held back for the grace as a probe; a probe found present (or
  wasted) marks the owner up again.

So with both regions up, wasted joins are the share of clicks the owner joins later than the grace (which
the grace learns to cover), and the owner's clicks are joined at the owner's latency; a region that goes
down delays its share by about one grace until ``DOWN_AFTER`` clicks have shown it. Pure: no clock reads
(times are passed in), no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

import mmh3

DOWN_AFTER = 8
"""Deferred clicks of one owner joined here in a row (none found present) that mark the owner down."""
PROBE_EVERY = 16
"""While an owner is down, one of this many of its clicks is still held back for the grace (a probe)."""
GROW, SHRINK = 1.5, 0.98
GROW_ADD_US = 5_000
ALIVE_WINDOW_GRACES = 3
ALIVE_WINDOW_MIN_US = 1_000_000


@dataclass(frozen=True)
class ShareStatistics:
    owners: tuple[str, ...]
    grace_ms: tuple[float, ...]          # per owner region (0 for this region)
    down: tuple[bool, ...]               # per owner region: judged down
    deferred: int                        # clicks held back for their owner
    found_present: int                   # of those, found joined by the owner after the grace (no join here)
    deferred_joined: int                 # of those, joined here (the owner had not)
    deferred_wasted: int                 # of those, joined here too late (ALREADY_REGISTERED)


class RegionShare:
    """Which region joins a click first, and how long the others wait (see the module docstring)."""

    def __init__(self, regions: list[str], me: str, grace_initial_us: int, grace_min_us: int,
                 grace_max_us: int) -> None:
        if me not in regions:
            raise ValueError(f"region {me!r} is not one of the pipeline regions {regions}")
        self.regions = list(regions)
        self.me = self.regions.index(me)
        self.grace_min_us, self.grace_max_us = grace_min_us, grace_max_us
        self._grace = [0 if k == self.me else grace_initial_us for k in range(len(regions))]
        self._joined_in_row = [0] * len(regions)
        self._present_at = [None] * len(regions)       # when a held click of each owner was last found present
        self._down = [False] * len(regions)
        self._seen = [0] * len(regions)
        self._c = dict(deferred=0, found_present=0, deferred_joined=0, deferred_wasted=0)

    def owner(self, cid: str) -> int:
        return mmh3.hash(cid, signed=False) % len(self.regions)

    def hold_us(self, owner: int) -> int:
        """How long to hold back a click of ``owner`` before looking it up (0: at once)."""
        if owner == self.me:
            return 0
        self._seen[owner] += 1
        if self._down[owner] and self._seen[owner] % PROBE_EVERY:
            return 0
        self._c["deferred"] += 1
        return self._grace[owner]

    def found_present(self, owner: int, now_us: int) -> None:
        self._c["found_present"] += 1
        self._present_at[owner] = now_us
        self._joined_in_row[owner] = 0
        self._down[owner] = False
        self._grace[owner] = max(self.grace_min_us, int(self._grace[owner] * SHRINK))

    def joined(self, owner: int, now_us: int) -> None:
        self._c["deferred_joined"] += 1
        seen = self._present_at[owner]
        window = max(ALIVE_WINDOW_MIN_US, ALIVE_WINDOW_GRACES * self._grace[owner])
        if seen is not None and now_us - seen <= window and not self._down[owner]:
            self._grow(owner)            # alive, and slower than the grace: we raced it
            return
        self._joined_in_row[owner] += 1
        if self._joined_in_row[owner] >= DOWN_AFTER:
            self._down[owner] = True

    def wasted(self, owner: int) -> None:
        self._c["deferred_wasted"] += 1
        self._joined_in_row[owner] = 0
        self._down[owner] = False
        self._grow(owner)

    def _grow(self, owner: int) -> None:
        self._grace[owner] = min(self.grace_max_us, int(self._grace[owner] * GROW) + GROW_ADD_US)

    def statistics(self) -> ShareStatistics:
        return ShareStatistics(tuple(self.regions), tuple(g / 1000 for g in self._grace), tuple(self._down),
                               **self._c)
