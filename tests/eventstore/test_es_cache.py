"""The byte-bounded LRU of blocks and the in-process twin."""
from __future__ import annotations

import gc
import tracemalloc

import orjson
import pytest

from eventstore import InMemoryEventStore
from eventstore._state import BLOCKS_PER_CACHE, ENTRY_OVERHEAD_BYTES, EventCache, entry_size

from es_helpers import query_id, query_line


def test_lookup_returns_one_result_per_id_in_order():
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(1), query_line(1)), (query_id(2), query_line(2))])
    assert cache.lookup([query_id(2), query_id(9), query_id(1), query_id(2)]) == [
        query_line(2), None, query_line(1), query_line(2)]
    s = cache.statistics()
    assert (s.entries, s.lookups, s.lookup_ids, s.hits, s.misses) == (2, 1, 4, 3, 1)


def test_byte_bound_is_respected_and_least_recently_used_go_first():
    raw = query_line(0)
    per_entry = entry_size(raw)
    cache = EventCache(10 * per_entry)
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
    assert cache.statistics().bytes == entry_size(b'{"v":22}')


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


def test_charged_overhead_covers_what_an_event_really_costs():
    """ENTRY_OVERHEAD_BYTES must not understate the memory an event takes, or the byte bound is a lie."""
    n, per_put = 50_000, 5_000
    cache = EventCache(1 << 34)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        raw_bytes = 0
        for lo in range(0, n, per_put):   # fresh id strings and exact-size line bytes, as the reader makes
            lines = [b'{"query_id":"%s","q":"shoes %06d"}' % (query_id(k).encode(), k)
                     for k in range(lo, lo + per_put)]
            events = [(orjson.loads(line)["query_id"], line) for line in lines]
            raw_bytes += sum(len(line) for line in lines)
            cache.put_many(events)
            del lines, events
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    per_event = (used - raw_bytes) / n
    assert per_event <= ENTRY_OVERHEAD_BYTES, f"an event costs {per_event:.0f} bytes beyond its line"
    assert cache.statistics().bytes == raw_bytes + n * ENTRY_OVERHEAD_BYTES


def test_events_put_together_are_evicted_together_and_a_hit_keeps_its_block():
    line = query_line(0)
    cache = EventCache(entry_size(line) * BLOCKS_PER_CACHE * 4)   # blocks of 4 events
    per_block = 4
    assert cache._block_bytes // entry_size(line) == per_block
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
    assert s.entries == 10 and s.bytes == sum(entry_size(r) for r in expected.values())
    cache.put_many([(query_id(k), b"{}") for k in range(10)])          # the first block empties: gone
    assert cache.statistics().bytes == 10 * entry_size(b"{}") == cache._lru.currsize
