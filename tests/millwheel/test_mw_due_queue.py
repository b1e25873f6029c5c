"""The tracker's queue of retry and first-send times: a deque for entries pushed in time order beside a heap
for the others, taken in time order as one heap would give them."""
from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel._transport import DueQueue

pytestmark = pytest.mark.timeout(60)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("push"), st.integers(-50, 50)), st.just(("pop", 0))), max_size=200))
def test_entries_come_out_in_time_order_as_from_one_heap(ops):
    q, ref, clock = DueQueue(), [], 0
    for n, (op, step) in enumerate(ops):
        if op == "push":
            clock += step          # forward, still or back: both halves are used (ids in push order)
            q.push(clock, f"p{n:05d}")
            heapq.heappush(ref, (clock, f"p{n:05d}"))
        elif ref:
            assert q.first() == ref[0]
            assert q.pop() == heapq.heappop(ref)
        assert len(q) == len(ref)
    assert [q.pop() for _ in range(len(q))] == [heapq.heappop(ref) for _ in range(len(ref))]
    assert q.first() is None
