"""The framework cache (paper §8.3) in front of a store: hot keys and pending windows kept, cold keys read
once, writes through, invalidated when an interval is claimed or lost. (The store conformance suite in
test_mw_store.py also runs through it.)"""
from __future__ import annotations

import threading

import pytest

from millwheel import CachedStore, MemoryStore, StaleSequencer
from millwheel._store import KEEP, Write


def stats(cache: CachedStore) -> tuple[int, int]:
    s = cache.statistics()
    return s.hits, s.misses


def test_cold_keys_are_read_once_and_known_absence_is_cached_too():
    cache = CachedStore(MemoryStore(), capacity=10)
    seq = cache.claim("c", 0)
    cache.commit([Write("c", 0, seq, "k", b"1")])       # written through: cached without a read
    assert cache.read_states("c", ["k", "none"]) == {"k": b"1"}
    assert stats(cache) == (1, 1)
    assert cache.read_states("c", ["k", "none"]) == {"k": b"1"}
    assert stats(cache) == (3, 1)
    assert cache.statistics().hit_ratio == 0.75


def test_pending_windows_stay_beyond_capacity_and_join_the_lru_when_their_last_timer_goes():
    cache = CachedStore(MemoryStore(), capacity=2)
    seq = cache.claim("c", 0)
    cache.commit([Write("c", 0, seq, "window", b"w", [("end", 60, "watermark")])])
    cache.commit([Write("c", 0, seq, k, b"x") for k in ("a", "b", "c")])
    s = cache.statistics()
    assert (s.hot_keys, s.pending_window_keys, s.evictions) == (2, 1, 1)
    cache.read_states("c", ["window", "b", "c"])
    assert stats(cache) == (3, 0)
    cache.read_states("c", ["a"])                         # the coldest was evicted: read once more
    assert stats(cache) == (3, 1)
    cache.commit([Write("c", 0, seq, "window", KEEP, [], ["end"])])
    s = cache.statistics()
    assert (s.hot_keys, s.pending_window_keys) == (2, 0)


def test_timers_loaded_at_takeover_pin_their_keys():
    inner = MemoryStore()
    seq = inner.claim("c", 3)
    inner.commit([Write("c", 3, seq, "w", b"w", [("t", 5, "watermark")])])
    cache = CachedStore(inner, capacity=1)
    cache.claim("c", 3)
    assert cache.read_timers("c", [3]) == [("w", "t", 5, "watermark")]
    cache.read_states("c", ["w"])
    cache.read_states("c", ["x", "y"])
    assert cache.statistics().pending_window_keys == 1
    cache.read_states("c", ["w"])
    assert stats(cache) == (1, 3)


def test_claiming_an_interval_again_drops_what_another_worker_may_have_changed():
    inner = MemoryStore()
    mine = CachedStore(inner)
    seq = mine.claim("c", 2)
    mine.commit([Write("c", 2, seq, "k", b"mine")])
    other_seq = inner.claim("c", 2)                       # another worker takes the interval and writes
    inner.commit([Write("c", 2, other_seq, "k", b"theirs")])
    assert mine.read_states("c", ["k"]) == {"k": b"mine"}  # what this worker last wrote, still cached
    mine.claim("c", 2)                                      # the interval comes back to this worker
    assert mine.read_states("c", ["k"]) == {"k": b"theirs"}
    assert mine.statistics().invalidations == 1


def test_a_refused_commit_drops_the_lost_interval():
    inner = MemoryStore()
    mine = CachedStore(inner)
    seq = mine.claim("c", 2)
    other = mine.claim("c", 4)
    mine.commit([Write("c", 2, seq, "k", b"mine"), Write("c", 4, other, "j", b"kept")])
    newer = inner.claim("c", 2)
    inner.commit([Write("c", 2, newer, "k", b"theirs")])
    with pytest.raises(StaleSequencer):
        mine.commit([Write("c", 2, seq, "k", b"zombie")])
    assert mine.read_states("c", ["k", "j"]) == {"k": b"theirs", "j": b"kept"}
    assert stats(mine) == (1, 1)


class PausedReads(MemoryStore):
    """Reads the store, then waits before answering: a commit can land in between."""

    def __init__(self) -> None:
        super().__init__()
        self.read, self.release = threading.Event(), threading.Event()

    def read_states(self, computation, keys):
        out = super().read_states(computation, keys)
        self.read.set()
        assert self.release.wait(30)
        return out


@pytest.mark.timeout(30)
def test_a_read_overlapping_a_commit_of_the_same_key_does_not_fill_the_cache_with_the_old_value():
    inner = PausedReads()
    cache = CachedStore(inner)
    seq = cache.claim("c", 0)
    inner.release.set()
    inner.commit([Write("c", 0, seq, "k", b"old")])
    inner.release.clear()
    got: list = []
    t = threading.Thread(target=lambda: got.append(cache.read_states("c", ["k"])), daemon=True)
    t.start()
    try:
        assert inner.read.wait(30)
        cache.commit([Write("c", 0, seq, "k", b"new")])
    finally:
        inner.release.set()
        t.join(30)
    assert got == [{"k": b"old"}]                           # that read began before the commit
    assert cache.read_states("c", ["k"]) == {"k": b"new"}
