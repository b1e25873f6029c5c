"""The byte-bounded LRU and the in-process twin."""
from __future__ import annotations

import pytest

from eventstore import InMemoryEventStore
from eventstore._state import EventCache, entry_size

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
