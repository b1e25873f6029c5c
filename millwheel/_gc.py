"""Dedup garbage collection across worker processes (the one-process runtime's is in ``_runtime.py``).

A consumer keeps the id of every record it committed, to drop repeats (exactly-once). An id may go once
no copy of its record can still arrive as new: a record produced before its sender's *floor* is dropped
as a repeat without a lookup, so its id is no longer needed. Across processes no one sees every sender's
unacked productions, so the floors are computed from reports, like the low watermarks:

1. **Reports** (sender side). Every ``gc_interval_us`` each process reports, for every interval of every
   sender it holds, under the interval's sequencer, the oldest production time any production of it may
   still have: min(the process's oldest unacked production of that sender, the production time of any
   step still producing, now); a grant holds 0 until it has registered the productions it replays. The
   store keeps the newest sequencer's report per interval (:meth:`Store.report_production_floors`). A
   moved interval keeps its last report until its new owner reports; that value still bounds it, since
   everything produced in it later was produced later, and its replayed productions were unacked when
   it was reported.
2. **Floors.** A sender's floor is the minimum of its intervals' reports less ``dedup_retention_us``, once
   every interval has reported (each process computes the same from the store).
3. **Raise** (consumer side). The process sends the floors to its own workers as :class:`RaiseFloors`
   messages; each applies them to its interval cores and answers :class:`FloorsRaised`.
4. **Collect.** Once every worker answered, for the consumer intervals that were held when the round
   began and are still held under the same sequencer, :meth:`Store.gc_dedup` raises the stored floor and
   deletes those intervals' ids below this round's floor (the one their cores apply; a report can go
   down when a new owner replays old productions that were acked, so another process may have stored a
   higher floor than this round's) in one transaction, fenced by their sequencers (an owner that claims
   one later reads the raised floor at its grant, after its claim).

The floors travel as messages (reports through the store, ``RaiseFloors`` to the workers); nothing here
writes into a worker's state. :class:`ProcessDedupCollector` is driven by its process's coordinator
thread: :meth:`ProcessDedupCollector.tick` with the messages the workers sent and the time.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping

from millwheel._messages import FloorsRaised, RaiseFloors
from millwheel._store import Store
from millwheel._topology import Topology


def sender_floors(reports: list[tuple[str, int, int, int]], expected: Mapping[str, int],
                  retention_us: int) -> dict[str, int]:
    """Per sender whose ``expected[sender]`` intervals all reported: min(report) - retention (positive only)."""
    lows: dict[str, int] = {}
    seen: Counter = Counter()
    for sender, interval, _seq, oldest in reports:
        if sender not in expected or interval >= expected[sender]:
            continue
        seen[sender] += 1
        lows[sender] = min(oldest, lows.get(sender, oldest))
    return {s: low - retention_us for s, low in lows.items()
            if seen[s] == expected[s] and low - retention_us > 0}


@dataclass(frozen=True)
class CollectorStatistics:
    rounds: int
    """Rounds whose floors every worker applied and whose ids were deleted."""
    deleted: int
    """Dedup ids deleted by this process."""
    floors: Mapping[str, int]
    """The last round's floor per sender."""


class ProcessDedupCollector:
    """See the module docstring. ``held()`` returns ``{(name, interval): sequencer}`` of everything the
    process holds (computations and injectors); ``oldest_produced()`` is the tracker's
    ``oldest_produced_at`` (per sender, and of steps still producing); ``send(index, message)`` puts a
    message into worker ``index``'s inbox."""

    def __init__(self, topology: Topology, store: Store, *, slots: int, workers: int, retention_us: int,
                 interval_us: int, held: Callable[[], dict], oldest_produced: Callable[[], tuple],
                 send: Callable[[int, object], None]) -> None:
        self.topology, self.store = topology, store
        self._expected = {**{c: slots for c in topology.computations}, **{i: 1 for i in topology.injectors}}
        self._workers, self._retention, self._interval = workers, retention_us, interval_us
        self._held, self._oldest, self._send = held, oldest_produced, send
        self._last_us: int | None = None
        self._round = 0
        self._pending: tuple[int, dict, set, dict] | None = None
        self.rounds = self.deleted = 0
        self.floors: dict[str, int] = {}

    def tick(self, now_us: int, messages: list) -> None:
        for m in messages:
            if isinstance(m, FloorsRaised):
                self._answered(m)
        if self._pending is None and (self._last_us is None or now_us - self._last_us >= self._interval):
            self._last_us = now_us
            self._start(now_us)

    def _start(self, now_us: int) -> None:
        held = self._held()            # before the tracker: a slot held here has its productions there
        oldest, producing = self._oldest()
        bound = now_us if producing is None else min(now_us, producing)
        self.store.report_production_floors(
            [(name, i, seq, min(oldest.get(name, bound), bound)) for (name, i), seq in held.items()])
        floors = sender_floors(self.store.read_production_floors(), self._expected, self._retention)
        consumers = sorted({name for name, _ in held if name in self.topology.computations})
        if not floors or not consumers:
            return
        self._round += 1
        snapshot = {c: {i: seq for (name, i), seq in held.items() if name == c} for c in consumers}
        waiting = set()
        for c in consumers:
            for index in range(self._workers):
                waiting.add((index, c))
                self._send(index, RaiseFloors(self._round, c, floors))
        self._pending = (self._round, floors, waiting, snapshot)

    def _answered(self, m: FloorsRaised) -> None:
        if self._pending is None or self._pending[0] != m.round:
            return
        _, floors, waiting, snapshot = self._pending
        waiting.discard((m.worker, m.consumer))
        if waiting:
            return
        self._pending = None
        held = self._held()
        for consumer, intervals in snapshot.items():
            still = {i: seq for i, seq in intervals.items() if held.get((consumer, i)) == seq}
            for sender, floor in floors.items():
                self.deleted += self.store.gc_dedup(consumer, sender, floor, still)
        self.rounds += 1
        self.floors = dict(floors)

    def statistics(self) -> CollectorStatistics:
        return CollectorStatistics(self.rounds, self.deleted, dict(self.floors))
