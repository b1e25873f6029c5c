"""Batch lookups decided group by group in C (``ShardState.lookup``, ``_Run.holds``) answer
exactly as asking each id alone (``contains``) and as the plain model of what was committed, deleted and
collected: on random states with several processes and buckets, a GC boundary inside a bucket, emptied runs,
and ids asked in any order, repeated, or sorted as the dispatcher sends them. No cluster needed."""
from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idregistry._state import _SET_SPAN, OP_ADVANCE_GC, OP_COMMIT, OP_DELETE, ShardState, _Run

pytestmark = pytest.mark.timeout(120)

T0 = 1_763_712_000_000_000
WIDTH = 1000                       # bucket width (us): the timestamps below span several buckets
TOP = 2**32 - 1                    # the largest offset a run can hold
PREFIXES = ["10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:7"]
TOKENS = ["a", "b"]

# timestamps in a few narrow ranges around bucket edges, so asked ids collide with held ones
STAMPS = st.one_of(st.integers(0, 40), st.integers(990, 1010), st.integers(2995, 3002), st.integers(0, 5000))
IDS = st.tuples(st.sampled_from(PREFIXES), STAMPS).map(lambda p: f"{p[0]}:{T0 + p[1]:016d}")

STEPS = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(TOKENS), st.lists(IDS, max_size=30)),
    st.tuples(st.just("delete"), st.sampled_from(TOKENS), st.lists(IDS, max_size=5)),
    st.tuples(st.just("gc"), st.just(""), st.integers(0, 3500).map(lambda d: [T0 + d])),
), max_size=12)


def _state_and_model(steps) -> tuple[ShardState, set[str]]:
    """The state after ``steps``, and the ids it must hold by the plain rules."""
    s = ShardState(bucket_us=WIDTH)
    owner: dict[str, str] = {}
    boundary = 0
    for kind, token, arg in steps:
        if kind == "commit":
            s.apply([(OP_COMMIT, token, arg, 0)])
            for event_id in arg:
                if int(event_id[-16:]) >= boundary:
                    owner.setdefault(event_id, token)
        elif kind == "delete":
            for event_id in arg:
                s.apply([(OP_DELETE, event_id, token)])
                if owner.get(event_id) == token:
                    del owner[event_id]
        else:
            boundary = max(boundary, arg[0])
            s.apply([(OP_ADVANCE_GC, arg[0])])
    return s, {i for i in owner if int(i[-16:]) >= boundary}


@settings(max_examples=300, deadline=None)
@given(STEPS, st.lists(IDS, max_size=60), st.data())
def test_a_bulk_lookup_answers_as_each_id_alone_and_as_the_model(steps, asked, data):
    s, model = _state_and_model(steps)
    held_ids = sorted(model)
    if held_ids:        # ask some held ids too (any order, repeated)
        asked = asked + data.draw(st.lists(st.sampled_from(held_ids), max_size=40))
        asked = data.draw(st.permutations(asked))
    expected = [i in model for i in asked]
    assert [s.contains(i) for i in asked] == expected
    assert s.lookup(asked) == expected
    ordered = sorted(asked)              # as the dispatcher sends a request's ids
    assert s.lookup(ordered) == [i in model for i in ordered]


# offsets from narrow ranges and the top of 32 bits, so both a short stretch (a set) and a long one (bisects)
OFFSETS = st.one_of(st.integers(0, 60), st.integers(TOP - 60, TOP), st.integers(100_000, 100_400))


# runs dense enough that a few asked offsets span far more than _SET_SPAN held ids each
HELD = st.one_of(st.lists(OFFSETS, max_size=300, unique=True),
                 st.tuples(st.integers(0, 5), st.integers(1, 400), st.integers(1, 3)).map(
                     lambda t: list(range(t[0], t[0] + t[1] * t[2], t[2]))))
ASKED = st.one_of(st.lists(OFFSETS, max_size=4), st.lists(st.integers(0, 1300), max_size=4),
                  st.lists(OFFSETS, max_size=40))


@settings(max_examples=400, deadline=None)
@given(HELD, ASKED)
def test_run_holds_answers_as_membership_whatever_the_stretch(held, asked):
    run = _Run()
    run.offsets = array("I", sorted(held))
    assert run.holds(asked) == [off in set(held) for off in asked]


def test_run_holds_uses_a_set_for_a_short_stretch_and_bisects_for_a_long_one():
    run = _Run()
    run.offsets = array("I", range(0, 20_000, 2))          # even offsets held
    near = [19_990, 19_991, 19_998, 19_990]                 # a stretch of 4 ids: at most _SET_SPAN per asked one
    spread = [0, 1, 10_000, 10_001, 19_998, 19_999, 5]      # a stretch of the whole run
    assert 10_000 > _SET_SPAN * len(spread)
    assert run.holds(near) == [True, False, True, True]
    assert run.holds(spread) == [True, False, True, False, True, False, False]
    assert run.holds([]) == []
    assert _Run().holds([0, 5]) == [False, False]          # an emptied run holds nothing
