"""The MillWheel master's placement (paper §4, §6.2): a pure, deterministic state machine.

Facts in, commands out. :meth:`MasterState.handle` is the only way to change the state; it reads no clock
(time arrives inside every fact as ``now_us``), opens no socket and starts no thread. The replicated log
carries the facts, so every replica that applies the same facts in the same order holds the same map and
returns the same commands.

The map: per computation, lexicographic key intervals ``[lo, hi)`` partitioning the whole key space
(the first ``lo`` is ``""``, the last ``hi`` is ``None``: no upper bound), each with its owner (a live
worker once one exists), its **sequencer** and its lease.

Sequencers come from one counter per computation, and every change to an interval (assigned, moved,
split, merged, its owner gone) takes the next values. So for any key, the sequencer of the interval that
covers it only ever grows, and strictly grows whenever its owner or bounds change. That is what a store
fences with: a write of key ``k`` carrying sequencer ``s`` is current iff ``s`` is the largest sequencer
the store has seen claimed over ``k`` (a new owner claims ``[lo, hi)`` with its sequencer before it
writes), so a worker that lost the interval can never write, whatever the clocks say.

Leases only tell a worker when to stop trying: a worker's lease runs ``lease_us`` from its last heartbeat
(every interval it holds carries that expiry); a :class:`TimePassed` fact at or past it declares the
worker gone and hands its intervals on, each with a new sequencer. After a change of Raft leader,
:class:`LeaderChanged` restarts every lease (a grace period, as Chubby's master gives on fail-over):
workers could not heartbeat while there was no leader, and expiring them for it would move every interval.

Facts: :class:`ComputationDeclared`, :class:`WorkerJoined`, :class:`Heartbeat`, :class:`LoadReported`,
:class:`WorkerLeft`, :class:`TimePassed`, :class:`LeaderChanged`.
Commands: :class:`Assign`, :class:`Revoke`, :class:`Split`, :class:`Merge`, :class:`Move`.

Rebalancing runs on every :class:`TimePassed`, with hysteresis so that steady load never flaps:

* **split** an interval whose records/s is above ``split_ratio`` times its computation's mean (and at
  least ``split_min_rate``), or above ``max_interval_rate``, at the key its worker reported as the middle
  of its traffic (else at a key midway between its bounds); both halves stay with the owner;
* **merge** the coldest adjacent pair whose combined rate is below ``merge_ratio`` times the mean
  (``merge_ratio * 2 < split_ratio``: a merged pair is never hot enough to split again);
* **move** one interval from the most loaded worker (load: the records/s of its intervals; an interval
  without a fresh report weighs its computation's mean, or 1) when it carries more than ``move_ratio``
  times the mean worker load and has in every round for ``move_after_us`` (one noisy report moves
  nothing; the wait is waived when the receiver carries at most half the mean: a new worker gets
  intervals at once), to the least loaded one, only if the receiver then carries at most the giver's load
  divided by ``move_ratio`` (a clear gain, so noise cannot trade an interval back and forth); an interval
  moved by load is not moved by load again for ``move_gap_us``.

At most one split and one merge per computation and one move overall per round; an interval changed less
than ``cooldown_us`` ago, or without a fresh load report for its current sequencer, is not split, merged
or moved.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from millwheel._master_facts import (FACTS, Assign, Command, ComputationDeclared, Heartbeat, Interval,  # noqa: F401
                                      IntervalLoad, LeaderChanged, LoadReported, Merge, Move, PlacementPolicy,
                                      Revoke, Split, TimePassed, WorkerJoined, WorkerLeft, WorkerLoad, WorkerView)

KEY_MIN = ""
"""The lowest key: the ``lo`` of every computation's first interval."""


# ---- the state ----------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Slot:
    """One interval, mutable inside the state; ``changed_us`` is when its sequencer last changed."""
    lo: str
    hi: str | None
    worker: str
    sequencer: int
    changed_us: int
    rate: float = -1.0            # last reported records/s for this sequencer (-1: none)
    split_key: str = ""
    reported_us: int = 0
    moved_us: int = -1            # when load last moved it (-1: never; kept across its sequencers)


@dataclass(slots=True)
class _Computation:
    slots: list[_Slot]
    last_sequencer: int = 0

    def next_sequencer(self) -> int:
        self.last_sequencer += 1
        return self.last_sequencer


@dataclass(slots=True)
class _Worker:
    address: str
    incarnation: int
    registration: str
    lease_until_us: int
    cpu: float = 0.0
    queue: int = 0
    over_since_us: int = -1       # since when it has been overloaded, round after round (-1: it is not)


@dataclass(frozen=True)
class MasterStatistics:
    """Counts over every fact handled (the same on every replica)."""
    now_us: int
    workers: int
    computations: int
    intervals: int
    facts: int
    commands: int
    assigns: int
    revokes: int
    splits: int
    merges: int
    moves: int
    expired_workers: int


@dataclass
class MasterState:
    """The map of every computation and the live workers. Only :meth:`handle` changes it."""
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    now_us: int = 0
    computations: dict[str, _Computation] = field(default_factory=dict)
    workers: dict[str, _Worker] = field(default_factory=dict)
    last_incarnation: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    # ---- the one way in ----

    def handle(self, fact) -> list[Command]:
        """Apply one fact; return the commands it caused (in a deterministic order)."""
        if fact.now_us > self.now_us:
            self.now_us = fact.now_us          # time never goes back, whichever leader proposed it
        out: list[Command] = []
        kind = type(fact)
        if kind is Heartbeat:
            self._heartbeat(fact, out)
        elif kind is TimePassed:
            self._expire(out)
            self._rebalance(out)
        elif kind is LoadReported:
            self._record_load(fact.worker, fact.incarnation, fact.load)
        elif kind is WorkerJoined:
            self._joined(fact, out)
        elif kind is WorkerLeft:
            w = self.workers.get(fact.worker)
            if w is not None and w.incarnation == fact.incarnation:
                self._drop_worker(fact.worker, "worker left", out)
        elif kind is LeaderChanged:
            for w in self.workers.values():
                w.lease_until_us = max(w.lease_until_us, self.now_us + self.policy.lease_us)
        elif kind is ComputationDeclared:
            self._declare(fact, out)
        else:
            raise TypeError(f"not a master fact: {fact!r}")
        self._count("facts")
        for c in out:
            self._count(type(c).__name__.lower() + "s")
        self._count("commands", len(out))
        return out

    # ---- reading ----

    def interval_map(self, computation: str | None = None) -> list[Interval]:
        """Every interval (of one computation, or of all, by computation then key), in key order."""
        names = [computation] if computation is not None else sorted(self.computations)
        out = []
        for name in names:
            comp = self.computations.get(name)
            if comp is None:
                continue
            out += [self._view(name, s) for s in comp.slots]
        return out

    def view_of(self, worker: str, incarnation: int | None = None) -> WorkerView:
        """What ``worker`` (that incarnation, when given) owns now."""
        w = self.workers.get(worker)
        if w is None or (incarnation is not None and w.incarnation != incarnation):
            return WorkerView(worker, False, 0, 0, ())
        owned = tuple(self._view(name, s) for name in sorted(self.computations)
                      for s in self.computations[name].slots if s.worker == worker)
        return WorkerView(worker, True, w.incarnation, w.lease_until_us, owned)

    def owner_address(self, worker: str) -> str:
        w = self.workers.get(worker)
        return w.address if w is not None else ""

    def snapshot(self) -> tuple:
        """Everything that decides future commands, as plain values (equal states: equal snapshots)."""
        return (self.now_us, self.last_incarnation,
                tuple((n, c.last_sequencer, tuple((s.lo, s.hi, s.worker, s.sequencer, s.changed_us, s.rate,
                                                   s.split_key, s.reported_us, s.moved_us) for s in c.slots))
                      for n, c in sorted(self.computations.items())),
                tuple((n, w.address, w.incarnation, w.registration, w.lease_until_us, w.cpu, w.queue,
                       w.over_since_us)
                      for n, w in sorted(self.workers.items())))

    def statistics(self) -> MasterStatistics:
        c = self.counts.get
        return MasterStatistics(self.now_us, len(self.workers), len(self.computations),
                                sum(len(x.slots) for x in self.computations.values()), c("facts", 0),
                                c("commands", 0), c("assigns", 0), c("revokes", 0), c("splits", 0),
                                c("merges", 0), c("moves", 0), c("expired_workers", 0))

    # ---- facts ----

    def _declare(self, fact: ComputationDeclared, out: list) -> None:
        if fact.computation in self.computations:
            return
        keys = sorted({k for k in fact.split_keys if k != KEY_MIN})
        bounds = [KEY_MIN, *keys]
        comp = _Computation([])
        for i, lo in enumerate(bounds):
            hi = bounds[i + 1] if i + 1 < len(bounds) else None
            comp.slots.append(_Slot(lo, hi, "", comp.next_sequencer(), self.now_us))
        self.computations[fact.computation] = comp
        self._place_orphans(out)

    def _joined(self, fact: WorkerJoined, out: list) -> None:
        old = self.workers.get(fact.worker)
        if old is not None and old.registration == fact.registration:
            return                                        # the same registration, retried
        if old is not None:
            self._drop_worker(fact.worker, "worker registered again (new incarnation)", out, place=False)
        self.last_incarnation += 1
        self.workers[fact.worker] = _Worker(fact.address, self.last_incarnation, fact.registration,
                                            self.now_us + self.policy.lease_us)
        self._place_orphans(out)

    def _heartbeat(self, fact: Heartbeat, out: list) -> None:
        w = self.workers.get(fact.worker)
        if w is None or w.incarnation != fact.incarnation:
            return
        w.lease_until_us = max(w.lease_until_us, self.now_us + self.policy.lease_us)
        if fact.load is not None:
            self._record_load(fact.worker, fact.incarnation, fact.load)

    def _record_load(self, worker: str, incarnation: int, load: WorkerLoad) -> None:
        w = self.workers.get(worker)
        if w is None or w.incarnation != incarnation:
            return
        w.cpu, w.queue = float(load.cpu), int(load.queue)
        for r in load.intervals:
            slot = self._slot_at(r.computation, r.lo)
            if slot is not None and slot.worker == worker and slot.sequencer == r.sequencer:
                slot.rate = max(0.0, float(r.records_per_s))
                slot.split_key = r.split_key
                slot.reported_us = self.now_us

    def _expire(self, out: list) -> None:
        for name in sorted(self.workers):
            if self.workers[name].lease_until_us <= self.now_us:
                self._count("expired_workers")
                self._drop_worker(name, "lease expired", out, place=False)
        self._place_orphans(out)

    def _drop_worker(self, name: str, reason: str, out: list, place: bool = True) -> None:
        del self.workers[name]
        for cname in sorted(self.computations):
            for s in self.computations[cname].slots:
                if s.worker == name:
                    out.append(Revoke(cname, s.lo, s.hi, name, s.sequencer, reason))
                    s.worker = ""
        if place:
            self._place_orphans(out)

    # ---- placement ----

    def _place_orphans(self, out: list) -> None:
        """Give every interval without a live owner to the least loaded live worker, one at a time."""
        if not self.workers:
            return
        loads = self._worker_loads()
        for cname in sorted(self.computations):
            comp = self.computations[cname]
            mean = self._mean_rate(comp)
            for s in comp.slots:
                if s.worker in self.workers:
                    continue
                target = min(loads, key=lambda n: (loads[n], n))
                self._reassign(comp, s, target)
                loads[target] += self._weight(s, mean)
                out.append(Assign(cname, s.lo, s.hi, target, s.sequencer, self.workers[target].lease_until_us))

    def _reassign(self, comp: _Computation, s: _Slot, worker: str) -> None:
        s.worker = worker
        s.sequencer = comp.next_sequencer()
        s.changed_us = self.now_us
        s.rate, s.split_key, s.reported_us = -1.0, "", 0

    def _fresh(self, s: _Slot) -> bool:
        return s.rate >= 0 and self.now_us - s.reported_us <= self.policy.load_ttl_us

    def _settled(self, s: _Slot) -> bool:
        return self._fresh(s) and self.now_us - s.changed_us >= self.policy.cooldown_us

    def _mean_rate(self, comp: _Computation) -> float | None:
        rates = [s.rate for s in comp.slots if self._fresh(s)]
        return sum(rates) / len(rates) if rates else None

    def _weight(self, s: _Slot, mean: float | None) -> float:
        if self._fresh(s):
            return s.rate
        return mean if mean is not None else 1.0

    def _worker_loads(self) -> dict[str, float]:
        loads = {n: 0.0 for n in self.workers}
        for comp in self.computations.values():
            mean = self._mean_rate(comp)
            for s in comp.slots:
                if s.worker in loads:
                    loads[s.worker] += self._weight(s, mean)
        return loads

    # ---- rebalancing ----

    def _rebalance(self, out: list) -> None:
        if not self.workers:
            return
        for cname in sorted(self.computations):
            comp = self.computations[cname]
            self._split_one(cname, comp, out)
            self._merge_one(cname, comp, out)
        self._move_one(out)

    def _split_one(self, cname: str, comp: _Computation, out: list) -> None:
        p = self.policy
        mean = self._mean_rate(comp)
        if mean is None or len(comp.slots) >= p.max_intervals:
            return
        hot = [s for s in comp.slots if self._settled(s) and (
            (s.rate > p.split_ratio * mean and s.rate >= p.split_min_rate)
            or (p.max_interval_rate and s.rate > p.max_interval_rate))]
        for s in sorted(hot, key=lambda s: (-s.rate, s.lo)):
            mid = s.split_key
            if not _strictly_inside(mid, s.lo, s.hi):
                continue          # one hot key, or no report of where the traffic halves: splitting cannot help
            i = comp.slots.index(s)
            old = s.sequencer
            left = _Slot(s.lo, mid, s.worker, comp.next_sequencer(), self.now_us)
            right = _Slot(mid, s.hi, s.worker, comp.next_sequencer(), self.now_us)
            comp.slots[i:i + 1] = [left, right]
            out.append(Split(cname, s.lo, mid, s.hi, s.worker, old, left.sequencer, right.sequencer))
            return

    def _merge_one(self, cname: str, comp: _Computation, out: list) -> None:
        p = self.policy
        mean = self._mean_rate(comp)
        if mean is None or len(comp.slots) <= max(1, p.min_intervals):
            return
        best = None
        for i in range(len(comp.slots) - 1):
            a, b = comp.slots[i], comp.slots[i + 1]
            if not (self._settled(a) and self._settled(b)):
                continue
            combined = a.rate + b.rate
            if combined < p.merge_ratio * mean and (best is None or combined < best[0]):
                best = (combined, i)
        if best is None:
            return
        i = best[1]
        a, b = comp.slots[i], comp.slots[i + 1]
        loads = self._worker_loads()
        owner = a.worker if a.worker == b.worker else min((a.worker, b.worker), key=lambda n: (loads[n], n))
        merged = _Slot(a.lo, b.hi, owner, comp.next_sequencer(), self.now_us)
        comp.slots[i:i + 2] = [merged]
        out.append(Merge(cname, a.lo, b.lo, b.hi, a.worker, b.worker, owner, a.sequencer, b.sequencer,
                         merged.sequencer))

    def _move_one(self, out: list) -> None:
        if len(self.workers) < 2:
            return
        p = self.policy
        loads = self._worker_loads()
        mean_load = sum(loads.values()) / len(loads)
        for n, w in self.workers.items():             # how long each worker has been overloaded
            if loads[n] <= p.move_ratio * mean_load:
                w.over_since_us = -1
            elif w.over_since_us < 0:
                w.over_since_us = self.now_us
        source = max(loads, key=lambda n: (loads[n], n))
        target = min(loads, key=lambda n: (loads[n], n))
        giver, taker = loads[source], loads[target]
        if source == target or self.workers[source].over_since_us < 0:
            return
        starved = taker <= mean_load / 2
        if not starved and self.now_us - self.workers[source].over_since_us < p.move_after_us:
            return                                     # not lasting yet: one report may be noise
        best = None
        for cname in sorted(self.computations):
            comp = self.computations[cname]
            mean = self._mean_rate(comp)
            for s in comp.slots:
                if s.worker != source or self.now_us - s.changed_us < p.cooldown_us:
                    continue
                if s.moved_us >= 0 and self.now_us - s.moved_us < p.move_gap_us:
                    continue
                w = self._weight(s, mean)
                # the receiver must end clearly below where the giver was (hysteresis: no trading places)
                if w <= 0 or (taker + w) * p.move_ratio > giver:
                    continue
                score = (max(giver - w, taker + w), cname, s.lo)
                if best is None or score < best[0]:
                    best = (score, cname, s)
        if best is None:
            return
        _, cname, s = best
        old = s.sequencer
        self._reassign(self.computations[cname], s, target)
        s.moved_us = self.now_us
        self.workers[source].over_since_us = -1       # judged afresh from the next round
        out.append(Move(cname, s.lo, s.hi, source, target, old, s.sequencer))

    # ---- helpers ----

    def _slot_at(self, computation: str, lo: str) -> _Slot | None:
        comp = self.computations.get(computation)
        if comp is None:
            return None
        for s in comp.slots:
            if s.lo == lo:
                return s
        return None

    def _view(self, computation: str, s: _Slot) -> Interval:
        w = self.workers.get(s.worker)
        if w is None:
            return Interval(computation, s.lo, s.hi, "", s.sequencer, 0)
        return Interval(computation, s.lo, s.hi, s.worker, s.sequencer, w.lease_until_us, w.address)

    def _count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


def _strictly_inside(key: str, lo: str, hi: str | None) -> bool:
    return bool(key) and lo < key and (hi is None or key < hi)
