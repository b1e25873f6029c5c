"""Where things go: key intervals, their placement on workers, production ids and routing to consumers.

Pure: no threads, clocks or I/O. :class:`Placement` is the one place that says which worker owns a
computation's key interval; the one-process runtime uses :class:`ModuloPlacement`, and a master that moves
intervals between worker processes replaces it with its own map (same two methods).
"""
from __future__ import annotations

from typing import Iterable, Protocol

import mmh3
import orjson

from millwheel._model import Delivery, Production, default_key, new_record
from millwheel._store import StoredProduction


class Placement(Protocol):
    """Which worker owns each key interval of each computation."""

    def owner(self, computation: str, interval: int) -> int:
        """The index of the worker owning ``interval`` of ``computation``."""
        ...

    def intervals_of(self, computation: str, worker: int) -> list[int]:
        """Every interval of ``computation`` that ``worker`` owns (in increasing order)."""
        ...


class ModuloPlacement:
    """Interval ``i`` of every computation belongs to worker ``i mod workers`` (fixed for the run)."""

    def __init__(self, workers: int, intervals: int) -> None:
        if workers <= 0 or intervals <= 0:
            raise ValueError("workers and intervals must be positive")
        self.workers, self.intervals = workers, intervals

    def owner(self, computation: str, interval: int) -> int:
        return interval % self.workers

    def intervals_of(self, computation: str, worker: int) -> list[int]:
        return list(range(worker, self.intervals, self.workers))


def interval_of(key: str, intervals: int) -> int:
    """The key interval of ``key``: ``mmh3(key) mod intervals``."""
    return mmh3.hash(key, signed=False) % intervals


def encode(p: Production) -> StoredProduction:
    """A production as stored and sent: its id is the sender's name and a hash of the causing id, so a
    deterministic re-run produces the same ids."""
    pid = f"{p.sender}:{mmh3.hash_bytes(p.id).hex()}"
    return StoredProduction(pid, p.stream, p.key, orjson.dumps(p.value), p.timestamp_us, p.produced_at_us)


def encode_all(prods: list[Production]) -> list[StoredProduction]:
    """``[encode(p) for p in prods]`` in one call (names bound once, not looked up per production)."""
    if not prods:
        return []
    hash_bytes, dumps, stored = mmh3.hash_bytes, orjson.dumps, StoredProduction
    return [stored(f"{p.sender}:{hash_bytes(p.id).hex()}", p.stream, p.key, dumps(p.value), p.timestamp_us,
                   p.produced_at_us) for p in prods]


class Router:
    """One delivery per consumer of a production's stream, keyed by that consumer's key extractor.
    ``consumers_of(stream)`` gives ``(consumer, extractor)`` pairs (the topology's method)."""

    def __init__(self, consumers_of, intervals: int) -> None:
        self._consumers_of = consumers_of
        self.intervals = intervals

    def interval_of(self, key: str) -> int:
        return interval_of(key, self.intervals)

    def route(self, p: StoredProduction, sender: str, consumers: list | None = None,
              failed: list | None = None) -> list[Delivery]:
        """One delivery per consumer of ``p``'s stream (``consumers``: that stream's ``consumers_of``, when
        the caller already has it). Each consumer gets a value of its own (decoded once per consumer: user
        code may change it); a consumer with the default key extractor takes the production's key as is.
        A key extractor that raises on ``p`` raises here, unless ``failed`` is given: then that consumer gets
        no delivery and ``(consumer, p, "Type: message")`` is appended to it."""
        if consumers is None:
            consumers = self._consumers_of(p.stream)
        out = []
        intervals = self.intervals
        for consumer, extract in consumers:
            rec = new_record(p.key, orjson.loads(p.value), p.timestamp_us, p.id, p.stream, sender, p.produced_at_us)
            if extract is not default_key:
                try:
                    key = extract(rec)
                except Exception as e:  # noqa: BLE001 - user code
                    if failed is None:
                        raise
                    failed.append((consumer, p, f"{type(e).__name__}: {e}"))
                    continue
                if key != rec.key:
                    rec = new_record(str(key), rec.value, p.timestamp_us, p.id, p.stream, sender, p.produced_at_us)
            out.append(Delivery(consumer, mmh3.hash(rec.key, signed=False) % intervals, rec))
        return out

    def outgoing(self, sender: str, interval: int, prods: Iterable[StoredProduction], stored: bool,
                 failed: list | None = None) -> list:
        """The ``(production, sender interval, stored?, deliveries)`` rows the tracker registers. The
        consumers of each stream are looked up once per call (not per production). ``failed``: see
        :meth:`route`."""
        by_stream: dict[str, list] = {}
        out = []
        for p in prods:
            consumers = by_stream.get(p.stream)
            if consumers is None:
                consumers = by_stream[p.stream] = self._consumers_of(p.stream)
            out.append((p, interval, stored, self.route(p, sender, consumers, failed)))
        return out


# ---- the master's key ranges over slots -------------------------------------------------------------
#
# Keys are spread over ``slots`` slots (``interval_of``); the store fences, and keeps timers, dedup ids and
# productions, per slot. A master's interval of a computation is a lexicographic range [lo, hi) of *slot
# keys* (``slot_key``: fixed-width hex, so their order is the slots' order): it covers whole slots, and a
# split or merge moves slot boundaries. The sequencer the master gives an interval is claimed for every
# slot it covers, so a write of a fenced owner is refused by the store in its own transaction.

SLOT_KEY_WIDTH = 4


def slot_key(slot: int) -> str:
    """The master's key for ``slot``."""
    return f"{slot:0{SLOT_KEY_WIDTH}x}"


def split_keys(slots: int, pieces: int) -> list[str]:
    """Split keys cutting ``slots`` into ``pieces`` (at most ``slots``) nearly equal ranges."""
    pieces = max(1, min(pieces, slots))
    return [slot_key(slots * i // pieces) for i in range(1, pieces)]


def slots_in(lo: str, hi: str | None, slots: int) -> list[int]:
    """The slots whose keys lie in [lo, hi)."""
    return [s for s in range(slots) if lo <= slot_key(s) and (hi is None or slot_key(s) < hi)]


def middle_slot_key(lo: str, hi: str | None, counts: dict[int, float], slots: int) -> str:
    """The slot key strictly inside (lo, hi) where a split divides the traffic ``counts`` (slot -> records
    or records/s) most evenly (the first such boundary on a tie); ``""`` when the range has fewer than two
    slots, no traffic, or all of it in one slot (which no split can divide)."""
    inside = slots_in(lo, hi, slots)
    total = sum(counts.get(s, 0) for s in inside)
    if len(inside) < 2 or total <= 0:
        return ""
    best, best_gap, seen = inside[1], None, 0.0
    for s in inside[1:]:
        seen += counts.get(s - 1, 0)
        gap = abs(2 * seen - total)
        if best_gap is None or gap < best_gap:
            best, best_gap = s, gap
    return slot_key(best) if best_gap < total else ""     # all in one slot: no cut divides it


class IntervalMap:
    """The master's interval map as a router uses it: for each (computation, slot), the owner's worker
    name, address and sequencer. Built from ``MasterClient.interval_map()`` rows; replaced whole."""

    def __init__(self, intervals, slots: int) -> None:
        self.slots = slots
        self.rows = list(intervals)
        self._owner: dict[tuple[str, int], tuple[str, str, int]] = {}
        for iv in self.rows:
            for s in slots_in(iv.lo, iv.hi, slots):
                self._owner[(iv.computation, s)] = (iv.worker, iv.address, iv.sequencer)

    def owner(self, computation: str, slot: int) -> tuple[str, str, int] | None:
        """``(worker, address, sequencer)``, or None when the map has no live owner for it."""
        got = self._owner.get((computation, slot))
        return got if got and got[0] else None

    def sequencers(self) -> dict[tuple[str, int], int]:
        """Each ``(computation, slot)``'s sequencer, with a live owner or not."""
        return {k: v[2] for k, v in self._owner.items()}

    def moved_since(self, older: "IntervalMap") -> set[tuple[str, int]]:
        """The ``(computation, slot)`` pairs that had an owner in ``older`` and now have another address or
        none. (What was sent while a slot had no owner was parked, and goes out by this map anyway.)"""
        out = set()
        for k in older._owner:
            was = older.owner(*k)
            if was is not None:
                now = self.owner(*k)
                if now is None or now[1] != was[1]:
                    out.add(k)
        return out
