"""A batch of ids checked and parsed at once (``split_ids``: the tails sliced and joined once, the timestamps
read as one JSON array in C) answers exactly as checking (``photon.is_event_id``) and parsing (``split_id``)
each id alone: the same ids refused, the same prefixes and timestamps, leading zeros included; and what is
built on it (``pack_ids``, the client's packed commit request, ``ShardState.lookup``) agrees with the
per-id forms. No cluster needed."""
from __future__ import annotations

from itertools import groupby

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from photon import BadEventId, is_event_id
from idregistry._client import _commit_request
from idregistry._state import (OP_COMMIT, ShardState, pack_ids, run_ids, runs_of, split_checked, split_id,
                               split_ids, stamps_of_tails, validate_ids)

pytestmark = pytest.mark.timeout(120)

PREFIXES = st.sampled_from(["10.0.0.1:1", "10.0.0.1:22", "fe80::1:7", "a:0", "host-x:123"])
STAMPS = st.one_of(st.integers(0, 10**16 - 1), st.integers(0, 999),                 # leading zeros
                   st.integers(1_763_712_000_000_000, 1_763_712_000_100_000),
                   st.sampled_from([10**15 - 1, 10**15, 2**53 - 1, 2**53, 10**16 - 1]))
GOOD = st.tuples(PREFIXES, STAMPS).map(lambda p: f"{p[0]}:{p[1]:016d}")
BAD = st.one_of(
    st.sampled_from(["", ":", "not-an-id", "10.0.0.1:1:12", "10.0.0.1:1:1763712000000000\n", ":1:1763712000000000",
                     "10.0.0.1:x:1763712000000000", "10.0.0.1:1:17637120000000000", "10.0.0.1:1:176371200000000a",
                     "10.0.0.1:1:17637120000000\u0663\u0663", "10.0.0.1:1:\uff11763712000000000", "10.0.0.1:1;1763712000000000",
                     "10.0.0.1\n:1:1763712000000000", "1:1763712000000000", "x:1:+763712000000000",
                     "x:1:-763712000000000", "x:1: 763712000000000"]),
    st.text(max_size=25),
    st.sampled_from([7, None, b"10.0.0.1:1:1763712000000000"]))
IDS = st.lists(st.one_of(GOOD, GOOD, GOOD, BAD), max_size=40)


def _one_by_one(ids):
    if not all(type(i) is str and is_event_id(i) for i in ids):
        return None
    pairs = [split_id(i) for i in ids]
    return [p for p, _ in pairs], [t for _, t in pairs]


@settings(max_examples=600, deadline=None)
@given(IDS)
@example(["10.0.0.1:1:0000000000000000", "10.0.0.1:1:0000000000000001"])
@example(["10.0.0.1:1:1763712000000000", "10.0.0.1:1:0763712000000000"])
@example(["10.0.0.1:1:1763712000000000", 7])
def test_a_batch_is_split_as_each_id_alone(ids):
    want = _one_by_one(ids)
    got = split_ids(ids)
    if want is None:
        assert got is None
        with pytest.raises(BadEventId) as whole:
            split_checked(ids)
        with pytest.raises(BadEventId) as alone:
            validate_ids(ids)
        assert str(whole.value) == str(alone.value)
        return
    assert got == (want[0], want[1]) and split_checked(ids) == got
    assert all(type(t) is int for t in got[1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 10**16 - 1), max_size=50))
def test_joined_tails_parse_as_int_of_each(stamps):
    assert stamps_of_tails("".join(f":{t:016d}" for t in stamps)) == stamps


@settings(max_examples=300, deadline=None)
@given(st.lists(GOOD, min_size=1, max_size=40))
def test_packing_a_split_batch_is_packing_each_id(ids):
    """Runs of consecutive ids of one process, timestamps as int64s, in order: as packing id by id would."""
    want = []
    for prefix, group in groupby(ids, key=lambda i: i[:-17]):
        stamps = [int(i[-16:]) for i in group]
        want.append((prefix, b"".join(t.to_bytes(8, "little", signed=True) for t in stamps)))
    import sys
    if sys.byteorder == "little":
        assert list(pack_ids(ids)) == want
    assert runs_of(*split_ids(ids)) == pack_ids(ids)
    assert run_ids(pack_ids(ids)) == ids
    request = _commit_request(ids, "t", runs_of(*split_ids(ids)))
    assert request == _commit_request(ids, "t")


@settings(max_examples=200, deadline=None)
@given(st.lists(GOOD, max_size=30), st.lists(st.one_of(GOOD, GOOD, BAD), max_size=30))
def test_a_checking_lookup_answers_as_each_id_alone_and_refuses_as_validate(held, asked):
    s = ShardState(bucket_us=3_600_000_000)
    s.apply([(OP_COMMIT, "tok", sorted(held, key=lambda i: (i[:-17], i[-16:])), 0)])
    if _one_by_one(asked) is None:
        with pytest.raises(BadEventId) as whole:
            s.lookup(asked)
        with pytest.raises(BadEventId) as alone:
            validate_ids(asked)
        assert str(whole.value) == str(alone.value)
        return
    assert s.lookup(asked) == [s.contains(i) for i in asked] == [i in set(held) for i in asked]
