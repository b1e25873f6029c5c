"""The hot paths' bulk forms agree with the per-item ones on random inputs: records made slot by slot
(``new_record``) with the frozen dataclass's constructor, ``encode_all`` with ``encode`` per production, a
retry queue's ``push_many`` with ``push`` per id, the acks a receiver hands its tracker with
``request_acks``, and the dedup Bloom filter's bulk calls with its words set and tested id by id."""
from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import worker_pb2 as pb
from millwheel._model import Production, Record, new_record
from millwheel._peer import _ack_pairs, request_acks
from millwheel._routing import encode, encode_all
from millwheel._transport import DueQueue

pytestmark = pytest.mark.timeout(120)

_TEXT = st.text(max_size=12)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                     max_leaves=8)
_INT = st.integers(-2**62, 2**62)


@settings(max_examples=200, deadline=None)
@given(_TEXT, _JSON, _INT, _TEXT, _TEXT, _TEXT, _INT)
def test_a_record_made_slot_by_slot_is_the_frozen_record_its_constructor_makes(key, value, ts, rid, stream, sender, at):
    fast, slow = new_record(key, value, ts, rid, stream, sender, at), Record(key, value, ts, rid, stream, sender, at)
    assert type(fast) is Record
    assert fast == slow and repr(fast) == repr(slow) and fast.is_late is False
    assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
    if not isinstance(value, (list, dict)):
        assert hash(fast) == hash(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.key = "other"          # still frozen
    assert dataclasses.replace(fast, is_late=True) == dataclasses.replace(slow, is_late=True)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT, _TEXT, _JSON, _INT, _INT, _TEXT), max_size=8))
def test_productions_encoded_together_are_encoded_as_one_by_one(rows):
    prods = [Production(*row) for row in rows]
    assert encode_all(prods) == [encode(p) for p in prods]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 4)), max_size=40))
def test_ids_pushed_together_come_out_as_pushed_one_by_one(calls):
    """Each call pushes ``count`` ids at one time (as the tracker's register does per call)."""
    together, single, clock, n = DueQueue(), DueQueue(), 0, 0
    for step, count in calls:
        clock += step
        ids = [f"p{n + i:04d}" for i in range(count)]
        n += count
        together.push_many(clock, ids)
        for i in ids:
            single.push(clock, i)
        assert len(together) == len(single)
        assert together.first() == single.first()
    assert [together.pop() for _ in range(len(together))] == [single.pop() for _ in range(len(single))]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=6), st.lists(st.tuples(_TEXT, _TEXT), max_size=3))
def test_the_acks_a_receiver_hands_its_tracker_are_the_request_acks(packed, single):
    req = pb.ExchangeRequest.FromString(pb.ExchangeRequest(
        reply_to="w:1", packed_acks=orjson.dumps(packed) if packed else b"",
        acks=[pb.WireAck(consumer=c, id=i) for c, i in single]).SerializeToString())
    assert [tuple(p) for p in _ack_pairs(req)] == request_acks(req) == packed + single


@settings(max_examples=100, deadline=None)
@given(st.lists(_TEXT, max_size=30), st.lists(_TEXT, max_size=30), st.integers(1, 5000),
       st.sampled_from([0.2, 0.01, 0.0001]))
def test_a_bloom_filter_sets_and_tests_the_bits_of_its_words(added, probed, capacity, rate):
    """``add_many``, ``add``, ``might_contain`` and ``might_contain_many`` make an id's mask from a table
    of 12-bit fields; the words are those of ``_word_and_mask`` (one 6-bit field after the other) as set
    and tested one id at a time, and no id added is ever missed."""
    from millwheel._bloom import BloomFilter

    together, single, ref = (BloomFilter(capacity, rate) for _ in range(3))
    together.add_many(added)
    for item in added:
        single.add(item)
        word, mask = ref._word_and_mask(item)
        assert bin(mask).count("1") <= ref.hashes
        ref._words[word] |= mask
    assert together._words == single._words == ref._words
    assert together.count == single.count == len(added)
    items = added + probed
    want = []
    for item in items:
        word, mask = ref._word_and_mask(item)
        want.append(ref._words[word] & mask == mask)
    assert [together.might_contain(item) for item in items] == want
    assert together.might_contain_many(items) == want
    assert all(together.might_contain_many(added))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30), st.integers(0, 60)), max_size=40),
       st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 40), max_size=4),
       st.lists(st.integers(0, 60), max_size=30))
def test_a_cores_dedup_asks_the_store_about_the_ids_the_filter_may_have_seen_as_one_by_one(rows, floors, seen):
    """``IntervalCore._dedup`` (the filter asked once for all ids above their sender's floor) gives the
    same repeats and the same ids to ask the store about, in order, as a test of each id on its own."""
    from millwheel._interval import IntervalCore, IntervalSettings
    from millwheel._model import Delivery

    core = IntervalCore(IntervalSettings("c", 0))
    core._load_dedup([f"r{i}" for i in seen], floors)
    deliveries = [Delivery("c", 0, Record("k", None, 0, f"r{i}", "s", sender, at)) for sender, at, i in rows]
    dups, maybe = set(), []
    for d in deliveries:
        if d.record.produced_at_us < core.floors.get(d.record.sender, 0):
            dups.add(d.record.id)
        elif core._bloom.might_contain(d.record.id):
            maybe.append(d.record.id)
    assert core._dedup(deliveries) == (dups, maybe)
    seen_ids = {f"r{i}" for i in seen}
    assert all(d.record.id in maybe for d in deliveries
               if d.record.id in seen_ids and d.record.id not in dups)    # no id added is missed


def test_a_bloom_filter_at_its_capacity_keeps_to_the_rate_asked():
    """One word per id takes more bits than a classic filter; sized for it, the share of ids never added
    that it answers "maybe" stays under the rate asked at capacity (1%, as the worker uses it)."""
    from millwheel._bloom import BloomFilter

    for capacity in (1_024, 62_500):
        bloom = BloomFilter(capacity, 0.01)
        bloom.add_many(f"w1:{i:032x}" for i in range(capacity))
        assert bloom.full
        assert all(bloom.might_contain_many([f"w1:{i:032x}" for i in range(capacity)]))
        probes = [f"w2:{i:032x}" for i in range(100_000)]
        assert sum(bloom.might_contain_many(probes)) / len(probes) < 0.01


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.lists(st.integers(0, 9), max_size=4), max_size=4),
       st.dictionaries(st.sampled_from(["a", "c", "e"]), st.just({"t": (5, "watermark")}), max_size=3))
def test_a_core_without_a_cache_makes_each_keys_work_as_a_look_per_key_would(by_ids, timers):
    """The works and reads of a run, for a core whose cache keeps nothing (worker processes' cores): in
    bulk, every key read, the same as looking each key up in the empty cache."""
    from millwheel._interval import IntervalCore, IntervalSettings
    from millwheel._model import Delivery

    cores = [IntervalCore(IntervalSettings("c", 0, cache_keys=0)) for _ in range(2)]
    for core in cores:
        core.timers = dict(timers)
    by_key = {key: [Delivery("c", 0, Record(key, {"i": i}, i, f"{key}{i}", "s", "up", 1)) for i in ids]
              for key, ids in by_ids.items()}
    assert cores[0]._uncached_works(by_key) == cores[1]._cached_works(by_key)
    assert cores[0].cache.misses == cores[1].cache.misses == len(by_key)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["bucket", "sort"]), st.integers(0, 5)), max_size=30),
       st.dictionaries(st.tuples(st.sampled_from(["bucket", "sort"]), st.integers(0, 5)),
                       st.sampled_from([None, "me:1", "other:2", "third:3"])))
def test_a_send_splits_deliveries_by_owner_as_a_look_per_delivery_would(slots, owners):
    """:meth:`GrpcTransport.send` looks each (consumer, slot)'s owner up once per call: the inboxes, peers
    and parked list get the same deliveries in the same order as with a look per delivery."""
    from millwheel._model import Delivery
    from millwheel._peer import GrpcTransport
    from millwheel._transport import Inbox

    looks: list = []

    def owner(consumer, slot):
        looks.append((consumer, slot))
        return owners.get((consumer, slot), "me:1" if slot % 2 else "other:2")

    inboxes = [Inbox(), Inbox()]
    put: dict = {}
    t = GrpcTransport("me:1", owner, lambda: None)
    t.bind(lambda consumer, slot: inboxes[slot % 3 == 0])
    t._peer = lambda address: type("P", (), {"put": lambda self, records=(): put.setdefault(address, []).extend(records)})()
    ds = [Delivery(c, s, Record(f"k{n}", n, n, f"p{n}", "s", "up", 1)) for n, (c, s) in enumerate(slots)]
    t.send(ds)
    want_local: list = [[], []]
    want_remote: dict = {}
    want_parked = []
    for d in ds:
        address = owners.get((d.consumer, d.interval), "me:1" if d.interval % 2 else "other:2")
        if address is None:
            want_parked.append(d)
        elif address == "me:1":
            want_local[d.interval % 3 == 0].append(d)
        else:
            want_remote.setdefault(address, []).append(d)
    assert [list(i._items) for i in inboxes] == want_local
    assert put == want_remote and t._parked == want_parked
    assert len(looks) == len(set(looks)) == len({(d.consumer, d.interval) for d in ds})
