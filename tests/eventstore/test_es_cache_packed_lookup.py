"""A cache lookup packs every asked id's timestamp at once (``_packed_tails``: their tails joined and checked
in C, one ``bytes.fromhex``) when all end in ``:`` and 16 ASCII digits, instead of an ``int`` per id. Held
to the lookup before (each id's tail checked and read alone, kept below) and to the latest line put per id,
on random caches (one writer's chunks in order, reversed, repeated, several writers, kept ids, overlapping
blocks, evictions) and random requests: all well-formed Photon ids, or with ids that only look alike (other
digits, no ``:``, short, non-ASCII digits) among them."""
from __future__ import annotations

import random
from bisect import bisect_left, bisect_right

import pytest

from eventstore._packed import packed_times
from eventstore._state import _LOW, _SHIFT, _TS, ENTRY_OVERHEAD_BYTES, EventCache, _packed_tails
from photon import format_event_id

from es_helpers import query_line

pytestmark = pytest.mark.timeout(300)
T0 = 1_763_712_000_000_000


def _lookup_each(cache: EventCache, ids: list[str]) -> list:
    """``EventCache.lookup`` as it was (without its LRU touch and counters): each id's tail read alone."""
    out = []
    for event_id in ids:
        timeline = cache._timelines.get(event_id[:-_TS - 1])
        found = None
        if timeline is not None and not timeline.overlap:
            text = event_id[-_TS:]
            if event_id[-_TS - 1] == ":" and text.isdigit() and text.isascii():
                ts = int(text, 16)
                i = bisect_right(timeline.starts, ts)
                if i:
                    block = timeline.blocks[i - 1]
                    j = bisect_left(block.tss, ts)
                    if j < len(block.tss) and block.tss[j] == ts and (block.replaced is None
                                                                      or j not in block.replaced):
                        offs = block.offs
                        skip = offs[0] + j * ENTRY_OVERHEAD_BYTES
                        out.append(block.blob[offs[j] - skip:offs[j + 1] - ENTRY_OVERHEAD_BYTES - skip])
                        continue
        elif timeline is not None:
            found = cache._find_timed(event_id)
        if found is None:
            ref = cache._where.get(event_id) if cache._where else None
            if ref is None:
                out.append(None)
                continue
            found = cache._keyed[ref >> _SHIFT], ref & _LOW
        block, j = found
        out.append(block.line(j))
    return out


WRITERS = [("10.0.0.1", 4242), ("10.0.0.2", 7), ("10.0.0.10", 12)]


def _id(rng: random.Random, k: int) -> str:
    ip, pid = rng.choice(WRITERS)
    return format_event_id(ip, pid, T0 + k)


def _look_alike(rng: random.Random, k: int) -> str:
    good = format_event_id("10.0.0.1", 4242, T0 + k)
    ts = good[-16:]
    return rng.choice([good[:-17] + ";" + ts, good[:-1], good + "0", ts, "", f"q-{k:08d}",
                       good[:-16] + ts.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
                       good[:-17] + ":" + ts[:8] + ":" + ts[9:], ":" * 17])


@pytest.mark.parametrize("evicting", [False, True])
def test_a_lookup_with_the_timestamps_packed_at_once_answers_as_each_id_alone(evicting):
    rng = random.Random(14 + evicting)
    cache = EventCache(96 << 10 if evicting else 1 << 30)
    latest: dict[str, bytes] = {}
    photon_ids: list[str] = []                          # the Photon ids put (latest also has kept ones)
    fast_requests = 0
    for step in range(300):
        ip, pid = rng.choice(WRITERS)
        lo = rng.randrange(0, 3000)
        ks = list(range(lo, lo + rng.randrange(1, 400)))
        if rng.random() < 0.15:
            ks.reverse()                                   # not in time order: kept by id
        if rng.random() < 0.1:
            ks += rng.sample(ks, min(len(ks), 3))
        if rng.random() < 0.1:
            events = [(f"q-{k:08d}", query_line(k, step=step)) for k in ks]
        else:
            events = [(format_event_id(ip, pid, T0 + k), query_line(k, step=step)) for k in ks]
            photon_ids += [e[0] for e in events]
        cache.put_many(events)
        latest.update(events)
        for _ in range(3):
            asked = [_id(rng, rng.randrange(0, 3500)) for _ in range(rng.choice([0, 1, 5, 200, 1500]))]
            asked += rng.sample(photon_ids, min(len(photon_ids), rng.randrange(0, 300)))
            if rng.random() < 0.3:
                asked += [_look_alike(rng, rng.randrange(0, 3500)) for _ in range(rng.randrange(1, 4))]
            rng.shuffle(asked)
            if rng.random() < 0.3:
                asked.sort()
            fast_requests += _packed_tails(asked) is not None
            before = _lookup_each(cache, asked)
            got = cache.lookup(asked)
            assert got == before, step
            assert all(r is None or r == latest[i] for i, r in zip(asked, got))
            if not evicting:
                assert got == [latest.get(i) for i in asked]
    assert fast_requests > 300 and any(t.overlap for t in cache._timelines.values()) or evicting


def test_packed_tails_are_each_ids_int_of_its_digits_or_none():
    rng = random.Random(3)
    for _ in range(300):
        ids = [_id(rng, rng.randrange(10**9)) for _ in range(rng.randrange(0, 50))]
        if rng.random() < 0.5 and ids:
            ids[rng.randrange(len(ids))] = _look_alike(rng, rng.randrange(10**6))
        each_good = all(len(i) > _TS and i[-_TS - 1] == ":" and i[-_TS:].isascii() and i[-_TS:].isdigit()
                        for i in ids)
        packed = _packed_tails(ids)
        if not ids:
            assert not packed                          # (nothing to pack: either form)
        elif each_good:
            assert list(packed) == [int(i[-_TS:], 16) for i in ids] == list(packed_times("".join(i[-16:] for i in ids)))
        else:
            assert packed is None
    assert _packed_tails([1, 2]) is None
