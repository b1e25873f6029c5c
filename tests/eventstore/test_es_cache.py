"""The byte-bounded LRU of blocks and the in-process twin."""
from __future__ import annotations

import gc
import random
import tracemalloc

import orjson
import pytest

from eventstore import InMemoryEventStore
from eventstore._state import BLOCK_OVERHEAD_BYTES, BLOCKS_PER_CACHE, EventCache, entry_size, index_primary_lines
from photon import LogChunk, format_event_id

from es_helpers import query_id, query_line


def test_lookup_returns_one_result_per_id_in_order():
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(1), query_line(1)), (query_id(2), query_line(2))])
    assert cache.lookup([query_id(2), query_id(9), query_id(1), query_id(2)]) == [
        query_line(2), None, query_line(1), query_line(2)]
    s = cache.statistics()
    assert (s.entries, s.lookups, s.lookup_ids, s.hits, s.misses) == (2, 1, 4, 3, 1)


def other_id(n: int) -> str:
    """An id that is not a Photon id (as custom primary ids are): kept by id."""
    return f"q-{n:08d}"


@pytest.mark.parametrize("make_id", [query_id, other_id])
def test_byte_bound_is_respected_and_least_recently_used_go_first(make_id):
    raw = query_line(0)
    kept = None if make_id is query_id else make_id(0)
    per_entry = entry_size(raw, kept) + BLOCK_OVERHEAD_BYTES     # a single put is a block of one
    cache = EventCache(10 * per_entry)
    for n in range(100):
        cache.put(make_id(n), query_line(n))
        # touch event 0 after every insert: it stays while everything else old falls out
        assert cache.lookup([make_id(0)]) == [query_line(0)]
        s = cache.statistics()
        assert s.bytes <= s.max_bytes
    s = cache.statistics()
    assert s.entries == 10 and s.evictions == 90
    held = cache.lookup([make_id(n) for n in range(100)])
    assert [n for n, r in enumerate(held) if r is not None] == [0, *range(91, 100)]


def test_event_larger_than_the_cache_is_not_stored():
    cache = EventCache(1000)
    cache.put(query_id(1), b"{" + b" " * 2000 + b"}")
    assert cache.lookup([query_id(1)]) == [None]
    assert cache.statistics().too_large == 1


def test_an_event_whose_kept_id_makes_it_larger_than_the_cache_is_not_stored():
    line = b'{"v":"' + b"x" * 100 + b'"}'
    cache = EventCache(entry_size(line) + BLOCK_OVERHEAD_BYTES)        # a timed event fits, a kept one not
    cache.put_many([(query_id(1), line), ("not-a-photon-id", line)])
    assert cache.lookup([query_id(1), "not-a-photon-id"]) == [line, None]
    assert cache.statistics().too_large == 1


def test_putting_an_id_again_replaces_its_bytes():
    cache = EventCache(1 << 20)
    cache.put(query_id(1), b'{"v":1}')
    cache.put(query_id(1), b'{"v":22}')
    assert cache.lookup([query_id(1)]) == [b'{"v":22}']
    assert cache.statistics().bytes == entry_size(b'{"v":22}') + BLOCK_OVERHEAD_BYTES
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
    cache = EventCache(4 << 20 if evicting else 1 << 34)
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


def test_events_put_together_are_evicted_together_and_a_hit_keeps_its_block():
    line = query_line(0)
    size = entry_size(line)
    cache = EventCache((size * 4 + BLOCK_OVERHEAD_BYTES) * BLOCKS_PER_CACHE)   # blocks of 4 events
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
    cache.put_many([(query_id(k), query_line(k)) for k in range(10)])          # one writer in time order
    cache.put_many([(query_id(k), query_line(k, v=2)) for k in range(5)] + [(query_id(3), b'{"v":3}')])   # not
    expected = {k: query_line(k, v=2) for k in range(5)} | {k: query_line(k) for k in range(5, 10)}
    expected[3] = b'{"v":3}'
    assert cache.lookup([query_id(k) for k in range(10)]) == [expected[k] for k in range(10)]
    s = cache.statistics()
    assert s.entries == 10
    assert s.bytes == (sum(entry_size(expected[k]) for k in range(5, 10))
                       + sum(entry_size(expected[k], query_id(k)) for k in range(5)) + 2 * BLOCK_OVERHEAD_BYTES)
    cache.put_many([(query_id(k), b"{}") for k in range(10)])          # both older blocks empty: gone
    assert cache.statistics().bytes == 10 * entry_size(b"{}") + BLOCK_OVERHEAD_BYTES
    assert cache.statistics().bytes == cache._lru.currsize and cache.statistics().entries == 10
    assert cache.lookup([query_id(k) for k in range(10)]) == [b"{}"] * 10


def test_an_id_is_exactly_its_key_and_timestamp():
    """Timed blocks match by key and timestamp: ids of other keys with the same timestamps, a timestamp
    written with other digits or of another length, and ids that only look alike are misses."""
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(k), query_line(k)) for k in range(0, 20, 2)])
    ts = query_id(4).rsplit(":", 1)[1]
    assert cache.lookup([query_id(4), query_id(5), f"10.0.0.2:4242:{ts}", f"10.0.0.1:4243:{ts}",
                         f"10.0.0.1:4242:{int(ts)}0", f"10.0.0.1:4242:{ts[1:]}",
                         "10.0.0.1:4242:" + ts.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
                         f"10.0.0.1:4242;{ts}", ts, "", ":" * 17]) == [query_line(4)] + [None] * 10


def test_blocks_read_again_out_of_order_replace_what_they_repeat():
    """A writer's lines put again (a file read twice, two files of one writer read out of order): every id
    keeps its latest line once, lookups still find each, and the timeline is simple again once the
    overlapping blocks have gone."""
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(k), query_line(k)) for k in range(100, 200)])
    cache.put_many([(query_id(k), query_line(k)) for k in range(0, 50)])                  # earlier, apart
    cache.put_many([(query_id(k), query_line(k, v=2)) for k in range(150, 250)])          # overlaps
    cache.put_many([(query_id(k), query_line(k, v=3)) for k in range(40, 45)])            # inside one block
    expected = {k: query_line(k) for k in [*range(0, 50), *range(100, 150)]}
    expected |= {k: query_line(k, v=2) for k in range(150, 250)} | {k: query_line(k, v=3) for k in range(40, 45)}
    ids = [query_id(k) for k in range(300)]
    assert cache.lookup(ids) == [expected.get(k) for k in range(300)]
    s = cache.statistics()
    assert s.entries == len(expected)
    assert s.bytes == sum(map(entry_size, expected.values())) + 4 * BLOCK_OVERHEAD_BYTES
    cache.put_many([(query_id(k), query_line(k, v=4)) for k in range(0, 250)])            # all of them again
    assert cache.lookup(ids) == [query_line(k, v=4) if k < 250 else None for k in range(300)]
    assert cache.statistics().entries == 250 and not cache._timelines[query_id(0)[:-17]].overlap


def test_an_id_moves_between_kept_and_timed_blocks():
    cache = EventCache(1 << 20)
    cache.put_many([(query_id(3), b'{"a":1}'), (query_id(1), b'{"a":2}')])      # not in time order: kept
    cache.put_many([(query_id(k), query_line(k)) for k in range(5)])           # timed: replaces both
    assert cache.lookup([query_id(k) for k in range(5)]) == [query_line(k) for k in range(5)]
    cache.put_many([(query_id(2), b'{"b":1}'), (other_id(1), b'{"b":2}')])     # kept: replaces a timed one
    assert cache.lookup([query_id(2), other_id(1), query_id(1)]) == [b'{"b":1}', b'{"b":2}', query_line(1)]
    assert cache.statistics().entries == 6
    assert cache.statistics().bytes == (sum(entry_size(query_line(k)) for k in (0, 1, 3, 4))
                                        + entry_size(b'{"b":1}', query_id(2)) + entry_size(b'{"b":2}', other_id(1))
                                        + 2 * BLOCK_OVERHEAD_BYTES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("evicting", [False, True])
def test_random_puts_always_find_the_latest_line_of_an_id(evicting):
    """Chunks of one writer in order, reversed, with repeats, of other writers and other ids, put again
    and again: a lookup gives the latest line put for the id or (evicting) nothing, never another."""
    rng = random.Random(11)
    cache = EventCache(64 << 10 if evicting else 1 << 30)
    latest: dict[str, bytes] = {}
    makers = [query_id, other_id, lambda k: format_event_id("10.0.0.9", 7, 1_763_712_000_000_000 + k)]
    for step in range(400):
        make = rng.choice(makers)
        lo = rng.randrange(0, 3000)
        ks = list(range(lo, lo + rng.randrange(1, 300)))
        if rng.random() < 0.2:
            ks.reverse()
        if rng.random() < 0.1:
            ks += rng.sample(ks, min(len(ks), 3))
        events = [(make(k), query_line(k, step=step)) for k in ks]
        cache.put_many(events)
        latest.update(events)
        if step % 20 == 0 or step == 399:
            ids = list(latest)
            held = cache.lookup(ids)
            assert all(r is None or r == latest[i] for i, r in zip(ids, held))
            s = cache.statistics()
            assert s.entries == len(held) - held.count(None) and s.bytes <= s.max_bytes
            assert (s.entries == len(ids)) != evicting
    assert cache.statistics().bytes == cache._lru.currsize - cache._dead_bytes


def test_an_id_the_line_writes_with_json_escapes_is_found():
    import json
    cache = EventCache(1 << 20)
    events = [{"query_id": f"q-{n}-ü\"x", "n": n} for n in range(5)]
    cache.put_many([(e["query_id"], json.dumps(e).encode()) for e in events])      # ü as \u00fc, " as \"
    got = cache.lookup([e["query_id"] for e in events] + ["q-1-ü"])
    assert [orjson.loads(g)["n"] if g else None for g in got] == [0, 1, 2, 3, 4, None]


def test_the_twin_keeps_ids_that_are_not_in_their_lines():
    store = InMemoryEventStore(1 << 20)
    store.put("a", b'{"v":1}')
    store.put("b", b'{"v":2}')
    store.put("a", b'{"v":3}')
    assert store.lookup(["a", "b", "c"]) == [b'{"v":3}', b'{"v":2}', None]
    assert store.status()["entries"] == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make_id, per_put", [(query_id, 1), (other_id, 1), (other_id, 1000)])
def test_blocks_of_one_and_kept_ids_are_charged_at_least_what_they_hold(make_id, per_put):
    """The worst cases of the byte count: single puts (a block of one event each) and ids kept in the
    dict. The count may overstate (by at most a third) but never understate the memory held."""
    n = 6_000
    cache = EventCache(1 << 34)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for lo in range(0, n, per_put):
            cache.put_many([(make_id(k), query_line(k)) for k in range(lo, lo + per_put)])
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    counted = cache.statistics().bytes
    assert 0.98 * used <= counted <= 1.35 * used, f"counted {counted} bytes, holds {used}"
