"""Low-watermark arithmetic: definitions, cycles, and monotonicity under arbitrary work (Hypothesis)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel._watermarks import END_OF_TIME, NO_WATERMARK, TimestampBag, compute_watermarks, is_late

CHAIN = {"a": ["inj"], "b": ["a"], "c": ["b"]}


def test_chain_takes_min_of_oldest_work_and_upstream():
    inputs, low = compute_watermarks(CHAIN, {"inj": None, "a": 50, "b": None, "c": 70}, {"inj": 100}, {})
    assert low == {"inj": 100, "a": 50, "b": 50, "c": 50}
    assert inputs == {"a": 100, "b": 50, "c": 50}


def test_injector_is_held_by_its_unacked_productions():
    _, low = compute_watermarks(CHAIN, {"inj": 40}, {"inj": 100}, {})
    assert low["inj"] == 40 and low["c"] == 40


def test_no_producers_means_no_watermark_and_input_complete_means_end_of_time():
    inputs, low = compute_watermarks({"lonely": [], "a": ["inj"]}, {}, {"inj": END_OF_TIME}, {})
    assert inputs["lonely"] == NO_WATERMARK and low["lonely"] == NO_WATERMARK
    assert low["a"] == END_OF_TIME


def test_cycle_takes_greatest_fixpoint():
    producers = {"a": ["inj", "b"], "b": ["a"]}
    _, low = compute_watermarks(producers, {"a": None, "b": 30}, {"inj": 100}, {})
    assert low["a"] == 30 and low["b"] == 30
    _, low = compute_watermarks(producers, {}, {"inj": 100}, {})
    assert low["a"] == 100 and low["b"] == 100


def test_late_record_does_not_move_watermark_back():
    prev = {"inj": 100, "a": 100}
    inputs, low = compute_watermarks({"a": ["inj"]}, {"a": 20}, {"inj": 100}, prev)
    assert low["a"] == 100
    assert is_late(20, inputs["a"]) and not is_late(100, inputs["a"])


work = st.dictionaries(st.sampled_from(["inj", "a", "b", "c"]), st.one_of(st.none(), st.integers(0, 10**6)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(work, st.integers(0, 10**6)), min_size=1, max_size=20))
def test_published_watermarks_never_move_back(steps):
    prev: dict[str, int] = {}
    for oldest, estimate in steps:
        _, low = compute_watermarks(CHAIN | {"a": ["inj", "c"]}, oldest, {"inj": estimate}, prev)
        for name, wm in prev.items():
            assert low[name] >= wm
        prev = low


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=200))
def test_timestamp_bag_min_matches_a_list(ops):
    bag, model = TimestampBag(), []
    for add, ts in ops:
        if add or ts not in model:
            bag.add(ts)
            model.append(ts)
        else:
            bag.remove(ts)
            model.remove(ts)
        assert bag.min() == (min(model) if model else None)
        assert len(bag) == len(model)
