"""Each click's first region: a region joins the clicks a hash of the id gives it at once and holds another
region's back for an adaptive grace, joining them only if the lookup then still finds them unjoined."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from dispatcher._share import DOWN_AFTER, PROBE_EVERY, RegionShare
from dispatcher._state import JoinAnswered, LinesRead, Lookup, LookupAnswered, SendBatch, TimePassed
from photon import FakeClock, Outcome

from test_dispatcher_state import chunk, cid, line, of, state

MS = 1000


def share(me="a", regions=("a", "b")):
    return RegionShare(list(regions), me, 200 * MS, 20 * MS, 2000 * MS)


def test_every_region_computes_the_same_owner_and_the_shares_are_even():
    a, b = share("a"), share("b")
    ids = [cid(n) for n in range(4000)]
    assert [a.owner(i) for i in ids] == [b.owner(i) for i in ids]
    counts = Counter(a.owner(i) for i in ids)
    assert set(counts) == {0, 1} and min(counts.values()) > 1800


def test_the_grace_grows_on_a_wasted_join_shrinks_when_the_owner_was_in_time_and_stays_in_bounds():
    s = share()
    assert s.hold_us(0) == 0 and s.hold_us(1) == 200 * MS
    s.wasted(1)
    assert s.hold_us(1) == 305 * MS
    for _ in range(500):
        s.found_present(1, 0)
    assert s.hold_us(1) == 20 * MS                       # the floor
    for _ in range(50):
        s.wasted(1)
    assert s.hold_us(1) == 2000 * MS                     # the ceiling


def test_an_owner_that_does_not_join_is_judged_down_probed_and_back_when_a_probe_finds_it():
    s = share()
    s.found_present(1, 0)                                # alive at t=0 ...
    s.joined(1, 500 * MS)                                # ... so a click joined here soon after is a race:
    assert s.statistics().down == (False, False) and s.hold_us(1) == 299 * MS   # (196 after the present) grows
    for k in range(DOWN_AFTER):                          # long after the owner was last seen: it is down
        assert s.hold_us(1) > 0
        s.joined(1, 10_000 * MS + k)
    assert s.statistics().down == (False, True)
    holds = [s.hold_us(1) for _ in range(4 * PROBE_EVERY)]
    assert holds.count(0) == len(holds) - 4 and len(set(holds)) == 2          # probes only, held one grace
    s.found_present(1, 20_000 * MS)
    assert s.statistics().down == (False, False) and s.hold_us(1) > 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["present", "joined", "wasted"]), max_size=200))
def test_the_grace_never_leaves_its_bounds(facts):
    s = share()
    for f in facts:
        if f == "present":
            s.found_present(1, 0)
        elif f == "joined":
            s.joined(1, 0)
        else:
            s.wasted(1)
        g = s.statistics().grace_ms[1]
        assert 20 <= g <= 2000


def _owned_and_not(sh, n=40):
    mine = [k for k in range(n) if sh.owner(cid(k)) == sh.me]
    theirs = [k for k in range(n) if sh.owner(cid(k)) != sh.me]
    return mine, theirs


def test_a_dispatcher_looks_its_own_clicks_up_at_once_and_another_regions_after_the_grace():
    clock = FakeClock()
    sh = share("a")
    st_ = state(lookups=True, share=sh)
    mine, theirs = _owned_and_not(sh)
    cmds = st_.handle(LinesRead([chunk([line(k) for k in range(40)])], clock.now_us()))
    [lk] = of(cmds, Lookup)
    assert sorted(lk.ids) == sorted(cid(k) for k in mine)
    [send] = of(st_.handle(LookupAnswered(lk.batch_id, [False] * len(lk.ids), clock.advance(MS))), SendBatch)
    st_.handle(JoinAnswered(send.batch_id, bytearray([Outcome.JOINED]) * len(send.ids), clock.advance(MS)))
    assert of(st_.handle(TimePassed(clock.advance(100 * MS))), Lookup) == []        # still held
    [lk2] = of(st_.handle(TimePassed(clock.advance(100 * MS))), Lookup)            # the grace is over
    assert sorted(lk2.ids) == sorted(cid(k) for k in theirs)
    # the owner joined all but two: those are joined here (no waste), the rest resolved with no join
    present = [i not in (cid(theirs[0]), cid(theirs[1])) for i in lk2.ids]
    [send2] = of(st_.handle(LookupAnswered(lk2.batch_id, present, clock.advance(MS))), SendBatch)
    assert sorted(send2.ids) == sorted([cid(theirs[0]), cid(theirs[1])])
    st_.handle(JoinAnswered(send2.batch_id, bytearray([Outcome.JOINED, Outcome.ALREADY_REGISTERED]),
                            clock.advance(MS)))
    s = st_.statistics()
    assert (s.held_for_owner, s.held_found_present, s.held_joined, s.held_wasted) == (len(theirs), len(theirs) - 2, 1, 1)
    assert s.wasted_joins == 1 and s.joined == len(mine) + 1 and st_.unresolved_ids() == set()
    assert s.share_grace_ms["b"] > 200                  # the wasted join made it grow


def test_without_a_registry_lookup_nothing_is_held():
    clock = FakeClock()
    st_ = state(lookups=False, share=share("a"))
    [send] = of(st_.handle(LinesRead([chunk([line(k) for k in range(20)])], clock.now_us())), SendBatch)
    assert len(send.ids) == 20
