"""The byte-bounded LRU of blocks and the in-process twin."""
from __future__ import annotations

import gc
import tracemalloc

import orjson
import pytest

from eventstore import InMemoryEventStore
from eventstore._state import BLOCK_OVERHEAD_BYTES, BLOCKS_PER_CACHE, EventCache, entry_size, index_primary_lines
from photon import LogChunk

from es_helpers import query_id, query_line


def test_lookup_returns_one_result_per_id_in_order():
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(1), query_line(1)), (query_id(2), query_line(2))])
    assert cache.lookup([query_id(2), query_id(9), query_id(1), query_id(2)]) == [
        query_line(2), None, query_line(1), query_line(2)]
    s = cache.statistics()
    assert (s.entries, s.lookups, s.lookup_ids, s.hits, s.misses) == (2, 1, 4, 3, 1)


@pytest.mark.parametrize("id_field", [None, "query_id"])
def test_byte_bound_is_respected_and_least_recently_used_go_first(id_field):
    raw = query_line(0)
    per_entry = entry_size(raw, None if id_field else query_id(0)) + BLOCK_OVERHEAD_BYTES   # a put: a block of one
    cache = EventCache(10 * per_entry, id_field)
    for n in range(100):
        cache.put(query_id(n), query_line(n))
        # touch event 0 after every insert: it stays while everything else old falls out
        assert cache.lookup([query_id(0)]) == [query_line(0)]
        s = cache.statistics()
        assert s.bytes <= s.max_bytes
    s = cache.statistics()
    assert s.entries == 10 and s.evictions == 90
    held = cache.lookup([query_id(n) for n in range(100)])
    assert [n for n, r in enumerate(held) if r is not None] == [0, *range(91, 100)]


def test_event_larger_than_the_cache_is_not_stored():
    cache = EventCache(1000)
    cache.put(query_id(1), b"{" + b" " * 2000 + b"}")
    assert cache.lookup([query_id(1)]) == [None]
    assert cache.statistics().too_large == 1


def test_putting_an_id_again_replaces_its_bytes():
    cache = EventCache(1 << 20)
    cache.put(query_id(1), b'{"v":1}')
    cache.put(query_id(1), b'{"v":22}')
    assert cache.lookup([query_id(1)]) == [b'{"v":22}']
    assert cache.statistics().bytes == entry_size(b'{"v":22}', query_id(1)) + BLOCK_OVERHEAD_BYTES
    assert cache.statistics().entries == 1


def test_zero_sized_cache_is_refused():
    with pytest.raises(ValueError, match="cache size"):
        EventCache(0)


def test_in_memory_twin_puts_and_looks_up():
    store = InMemoryEventStore()
    store.put(query_id(1), query_line(1))
    assert store.lookup([query_id(1), query_id(2)]) == [query_line(1), None]
    assert store.lookup([]) == []
    assert store.status()["entries"] == 1
    store.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("evicting", [False, True])
def test_counted_bytes_are_what_the_cache_really_holds_and_at_most_1_5x_the_lines(evicting):
    """The cache's own byte count (what ``cache_mb`` bounds) is within 10% of the memory it really keeps
    (tracemalloc: lines, offsets, hashes, the id index, blocks, the LRU), never below it by more than 2%,
    and that memory is at most 1.5x the raw lines held (lines of about 105 bytes, as the generator's)."""
    n, per_chunk = 60_000, 2_000
    line = b'{"query_id":"%s","advertiser_id":"adv-%02d","text":"query %016x-%d"}'
    cache = EventCache(4 << 20 if evicting else 1 << 34, "query_id")
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for lo in range(0, n, per_chunk):     # fresh id strings and exact-size line bytes, as the reader makes
            lines = [line % (query_id(k).encode(), k % 50, k * 7919, k % 97) for k in range(lo, lo + per_chunk)]
            good, bad = index_primary_lines(LogChunk("q.jsonl", list(range(len(lines))), lines, 0), "query_id")
            assert not bad
            cache.put_many(good)
            del lines, good
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    s = cache.statistics()
    held = cache.lookup([query_id(k) for k in range(n)])
    raw = sum(len(r) for r in held if r is not None)
    assert len(held) - held.count(None) == s.entries and (s.evictions > 0) == evicting
    print(f"counted/used {s.bytes / used:.3f}, used/raw {used / raw:.3f}, {used / s.entries:.1f} bytes per query")
    assert 0.98 * used <= s.bytes <= 1.1 * used, f"counted {s.bytes} bytes, holds {used}"
    assert used <= 1.5 * raw, f"{used / s.entries:.1f} bytes per cached query, lines of {raw / s.entries:.1f}"


@pytest.mark.parametrize("id_field", [None, "query_id"])
def test_events_put_together_are_evicted_together_and_a_hit_keeps_its_block(id_field):
    line = query_line(0)
    size = entry_size(line, None if id_field else query_id(0))
    cache = EventCache((size * 4 + BLOCK_OVERHEAD_BYTES) * BLOCKS_PER_CACHE, id_field)   # blocks of 4 events
    per_block = 4
    assert (cache._block_bytes - BLOCK_OVERHEAD_BYTES) // size == per_block
    cache.put_many([(query_id(k), query_line(k)) for k in range(BLOCKS_PER_CACHE * per_block)])
    assert (cache.statistics().entries, cache.statistics().evictions) == (BLOCKS_PER_CACHE * per_block, 0)
    assert cache.lookup([query_id(1)]) == [query_line(1)]         # block 0 becomes the most recent
    cache.put_many([(query_id(k), query_line(k)) for k in range(1000, 1000 + per_block)])
    held = cache.lookup([query_id(k) for k in range(BLOCKS_PER_CACHE * per_block)])
    assert [k for k, r in enumerate(held) if r is None] == [4, 5, 6, 7]   # block 1 went, whole
    s = cache.statistics()
    assert s.evictions == per_block and s.entries == BLOCKS_PER_CACHE * per_block and s.bytes <= s.max_bytes


def test_replacing_events_keeps_the_accounting_exact():
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(k), query_line(k)) for k in range(10)])
    cache.put_many([(query_id(k), query_line(k, v=2)) for k in range(5)] + [(query_id(3), b'{"v":3}')])
    expected = {k: query_line(k, v=2) for k in range(5)} | {k: query_line(k) for k in range(5, 10)}
    expected[3] = b'{"v":3}'
    assert cache.lookup([query_id(k) for k in range(10)]) == [expected[k] for k in range(10)]
    s = cache.statistics()
    assert s.entries == 10
    assert s.bytes == sum(entry_size(r, query_id(k)) for k, r in expected.items()) + 2 * BLOCK_OVERHEAD_BYTES
    cache.put_many([(query_id(k), b"{}") for k in range(10)])          # both older blocks empty: gone
    assert cache.statistics().bytes == 10 * entry_size(b"{}", query_id(0)) + BLOCK_OVERHEAD_BYTES
    assert cache.statistics().bytes == cache._lru.currsize and cache.statistics().entries == 10
    assert cache.lookup([query_id(k) for k in range(10)]) == [b"{}"] * 10


@pytest.mark.parametrize("id_field", [None, "query_id"])
def test_ids_whose_hashes_collide_are_told_apart_by_their_lines(monkeypatch, id_field):
    """Every id hashes alike (one chain): lookups, replacement and eviction still go by the exact id."""
    import eventstore._state as state
    monkeypatch.setattr(state, "hash", lambda _: 42, raising=False)
    line = query_line(0)
    cache = EventCache((entry_size(line) * 4 + BLOCK_OVERHEAD_BYTES) * BLOCKS_PER_CACHE, id_field)
    cache.put_many([(query_id(k), query_line(k)) for k in range(40)])
    assert cache.lookup([query_id(k) for k in range(41)]) == [query_line(k) for k in range(40)] + [None]
    cache.put_many([(query_id(7), query_line(7, v=2)), (query_id(7), query_line(7, v=3))])
    assert cache.lookup([query_id(7), query_id(6)]) == [query_line(7, v=3), query_line(6)]
    assert cache.statistics().entries == 40
    cache.put_many([(query_id(k), query_line(k)) for k in range(100, 100 + 4 * BLOCKS_PER_CACHE)])
    s = cache.statistics()
    held = cache.lookup([query_id(k) for k in [*range(40), *range(100, 100 + 4 * BLOCKS_PER_CACHE)]])
    assert len(held) - held.count(None) == s.entries and s.evictions > 0 and s.bytes <= s.max_bytes
    assert all(r is None or orjson.loads(r)["query_id"] == i for i, r in zip(
        [query_id(k) for k in [*range(40), *range(100, 100 + 4 * BLOCKS_PER_CACHE)]], held))


def test_an_id_the_line_writes_with_json_escapes_is_found():
    import json
    cache = EventCache(1 << 20, "query_id")
    events = [{"query_id": f"q-{n}-ü\"x", "n": n} for n in range(5)]
    cache.put_many([(e["query_id"], json.dumps(e).encode()) for e in events])      # ü as \u00fc, " as \"
    got = cache.lookup([e["query_id"] for e in events] + ["q-1-ü"])
    assert [orjson.loads(g)["n"] if g else None for g in got] == [0, 1, 2, 3, 4, None]


def test_the_twin_keeps_ids_that_are_not_in_their_lines(monkeypatch):
    import eventstore._state as state
    monkeypatch.setattr(state, "hash", lambda _: 7, raising=False)
    store = InMemoryEventStore(1 << 20)
    store.put("a", b'{"v":1}')
    store.put("b", b'{"v":2}')
    store.put("a", b'{"v":3}')
    assert store.lookup(["a", "b", "c"]) == [b'{"v":3}', b'{"v":2}', None]
    assert store.status()["entries"] == 2
