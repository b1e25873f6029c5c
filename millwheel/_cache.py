"""The framework cache (MillWheel paper §8.3) in front of any store.

:class:`CachedStore` wraps a :class:`Store` and answers :meth:`read_states` from memory where it can:

* **hot keys** stay in an LRU of ``capacity`` keys (cachetools); a cold key is read from the store once
  and then served from memory until it is evicted;
* **pending windows** stay regardless of the LRU: a key with a pending timer (learnt from the timers the
  store returns and from every commit's timer changes) will be read again when its timer fires, so it is
  kept in a separate map until its last timer is deleted, then it joins the LRU;
* "known to have no state" is cached too, so a new key costs one read;
* **writes go through**: :meth:`commit` writes to the store first, and only once that succeeded updates
  the cache, so the cache never holds what the store does not;
* **invalidation**: the keys of an interval are dropped when it is claimed (another worker may have
  written them since this process last held it) and when a commit to it is refused (the interval was
  lost); a commit that fails otherwise drops the keys it touched. A read that overlaps a commit or an
  invalidation of the same key does not fill the cache with what it read.

Keys whose interval is not known yet (read, never committed here) go with every invalidation of their
computation. Everything else (timers, dedup ids, productions, watermarks) passes straight to the store.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable

from cachetools import LRUCache

from millwheel._store import StaleSequencer, Store, StoredProduction, Write, _Keep

@dataclass(frozen=True)
class CacheStatistics:
    hits: int
    """Keys answered from memory."""
    misses: int
    """Keys read from the store."""
    hot_keys: int
    """Keys in the LRU."""
    pending_window_keys: int
    """Keys kept because they have a pending timer."""
    evictions: int
    invalidations: int
    """Keys dropped because their interval was claimed or lost, or a commit failed."""

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Entry:
    __slots__ = ("value", "interval")

    def __init__(self, value: bytes | None, interval: int | None) -> None:
        self.value, self.interval = value, interval


class _LRU(LRUCache):
    def __init__(self, maxsize: int, on_evict) -> None:
        super().__init__(maxsize)
        self._on_evict = on_evict

    def popitem(self):
        item = super().popitem()
        self._on_evict()
        return item


class CachedStore(Store):
    """See the module docstring. Thread-safe; one per process, shared by its workers."""

    def __init__(self, store: Store, capacity: int = 100_000) -> None:
        self.store = store
        self.identity = store.identity
        self._lock = threading.Lock()
        self._evictions = 0
        self._lru: LRUCache = _LRU(capacity, self._evicted)
        self._pinned: dict[tuple[str, str], _Entry] = {}
        self._timers: dict[tuple[str, str], set[str]] = {}
        self._reading: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str]] = set()
        self.hits = self.misses = self._invalidations = 0

    def _evicted(self) -> None:
        self._evictions += 1

    # ---- cached reads -----------------------------------------------------------------------------
    def _get(self, ck: tuple[str, str]) -> _Entry | None:
        entry = self._pinned.get(ck)
        return entry if entry is not None else self._lru.get(ck)

    def _put(self, ck: tuple[str, str], entry: _Entry) -> None:
        if self._timers.get(ck):
            self._lru.pop(ck, None)
            self._pinned[ck] = entry
        else:
            self._pinned.pop(ck, None)
            self._lru[ck] = entry

    def read_states(self, computation: str, keys: Iterable[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        missing: list[str] = []
        with self._lock:
            for key in keys:
                ck = (computation, key)
                entry = self._get(ck)
                if entry is None:
                    missing.append(key)
                    self._reading[ck] = self._reading.get(ck, 0) + 1
                    continue
                self.hits += 1
                if entry.value is not None:
                    out[key] = entry.value
            self.misses += len(missing)
        if not missing:
            return out
        found: dict[str, bytes] | None = None
        try:
            found = self.store.read_states(computation, missing)
        finally:
            with self._lock:
                for key in missing:
                    ck = (computation, key)
                    left = self._reading[ck] - 1
                    if left:
                        self._reading[ck] = left
                        continue
                    del self._reading[ck]
                    if ck in self._dirty:  # a commit or an invalidation overlapped this read: do not fill
                        self._dirty.discard(ck)
                    elif found is not None and self._get(ck) is None:
                        self._put(ck, _Entry(found.get(key), None))
        out.update(found)
        return out

    def read_timers(self, computation: str, intervals: Iterable[int]) -> list[tuple[str, str, int, str]]:
        rows = self.store.read_timers(computation, intervals)
        with self._lock:
            for key, tag, _, _ in rows:
                self._timers.setdefault((computation, key), set()).add(tag)
                entry = self._lru.pop((computation, key), None)
                if entry is not None:
                    self._pinned[(computation, key)] = entry
        return rows

    # ---- writes through -----------------------------------------------------------------------------
    def commit(self, writes: list[Write]) -> None:
        try:
            self.store.commit(writes)
        except StaleSequencer:
            with self._lock:
                for c, i in {(w.computation, w.interval) for w in writes}:
                    self._invalidate(c, i)
            raise
        except BaseException:
            with self._lock:  # outcome unknown: forget what the batch touched
                for w in writes:
                    if w.key is not None:
                        self._drop((w.computation, w.key))
            raise
        with self._lock:
            for w in writes:
                if w.key is None:
                    continue
                ck = (w.computation, w.key)
                if w.timers_set or w.timers_deleted:
                    tags = self._timers.setdefault(ck, set())
                    tags.difference_update(w.timers_deleted)
                    tags.update(t for t, _, _ in w.timers_set)
                    if not tags:
                        del self._timers[ck]
                entry = self._get(ck)
                if isinstance(w.state, _Keep):
                    if entry is None:
                        continue
                    entry.interval = w.interval
                else:
                    entry = _Entry(None if w.state is None else bytes(w.state), w.interval)
                if ck in self._reading:
                    self._dirty.add(ck)
                self._put(ck, entry)

    def claim(self, computation: str, interval: int, sequencer: int | None = None) -> int:
        with self._lock:
            self._invalidate(computation, interval)
        return self.store.claim(computation, interval, sequencer)

    def _drop(self, ck: tuple[str, str]) -> None:
        if self._pinned.pop(ck, None) is not None or self._lru.pop(ck, None) is not None:
            self._invalidations += 1
        if ck in self._reading:
            self._dirty.add(ck)

    def _invalidate(self, computation: str, interval: int) -> None:
        for cache in (self._pinned, self._lru):
            gone = [ck for ck, e in cache.items()
                    if ck[0] == computation and e.interval in (interval, None)]
            for ck in gone:
                self._drop(ck)
        for ck in self._reading:
            if ck[0] == computation:
                self._dirty.add(ck)

    # ---- passed through ---------------------------------------------------------------------------------
    def seen(self, computation: str, ids: Iterable[str]) -> set[str]:
        return self.store.seen(computation, ids)

    def dedup_ids(self, computation: str, intervals: Iterable[int]) -> list[str]:
        return self.store.dedup_ids(computation, intervals)

    def gc_dedup(self, computation: str, sender: str, floor_us: int, intervals=None) -> int:
        return self.store.gc_dedup(computation, sender, floor_us, intervals)

    def report_production_floors(self, reports) -> None:
        self.store.report_production_floors(reports)

    def read_production_floors(self) -> list[tuple]:
        return self.store.read_production_floors()

    def gc_floors(self, computation: str) -> dict[str, int]:
        return self.store.gc_floors(computation)

    def pending_productions(self, sender: str, interval: int) -> list[StoredProduction]:
        return self.store.pending_productions(sender, interval)

    def set_aside_records(self, computation: str | None = None) -> list:
        return self.store.set_aside_records(computation)

    def read_watermarks(self) -> dict[str, int]:
        return self.store.read_watermarks()

    def save_watermarks(self, watermarks: dict[str, int]) -> None:
        self.store.save_watermarks(watermarks)

    def report_watermarks(self, reports) -> None:
        self.store.report_watermarks(reports)

    def read_watermark_reports(self) -> list[tuple]:
        return self.store.read_watermark_reports()

    def report_and_read_watermarks(self, reports) -> list[tuple]:
        return self.store.report_and_read_watermarks(reports)

    def record_grants(self, grants) -> None:
        self.store.record_grants(grants)

    def report_cuts(self, reports) -> None:
        self.store.report_cuts(reports)

    def read_cuts(self) -> list[tuple]:
        return self.store.read_cuts()

    def advance_epoch(self, component: str, epoch: int, external_us: int, cohort: str) -> None:
        self.store.advance_epoch(component, epoch, external_us, cohort)

    def read_epochs(self) -> list[tuple]:
        return self.store.read_epochs()

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(self.hits, self.misses, len(self._lru), len(self._pinned), self._evictions,
                                   self._invalidations)

    @property
    def interruptible(self) -> bool:
        return self.store.interruptible

    def give_up_when(self, event: threading.Event) -> None:
        self.store.give_up_when(event)

    def interrupt(self) -> None:
        self.store.interrupt()

    def close(self) -> None:
        self.store.close()
