"""Each click's first region: a region joins the clicks a hash of the id gives it at once and holds another
region's back for an adaptive grace, joining them only if the lookup then still finds them unjoined."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from dispatcher._share import PROBE_EVERY, RegionShare
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


def test_the_grace_grows_when_the_owner_was_later_than_it_shrinks_when_in_time_and_stays_in_bounds():
    s = share()
    assert s.hold_us(0) == 0 and s.hold_us(1) == 200 * MS
    s.wasted(1, 1)
    assert s.hold_us(1) == 305 * MS
    s.still_unjoined(1, 2)                               # first lookup: the owner was later than the grace
    assert s.hold_us(1) == 462_500
    s.still_unjoined(1, 2)                               # another click of the same answer: one fact, once
    s.still_unjoined(1, 3, first_lookup=False)           # a later lookup of a click: no second growth
    assert s.hold_us(1) == 462_500
    s.found_present(1, 2)                                # present in an answer that also grew it: no shrink
    assert s.hold_us(1) == 462_500
    for t in range(500):
        s.found_present(1, 10 + t)
    assert s.hold_us(1) == 20 * MS                       # the floor
    s.found_present(1, 1000, first_lookup=False)         # found only at a later lookup: no shrinking
    assert s.hold_us(1) == 20 * MS
    for t in range(50):
        s.wasted(1, 2000 + t)
    assert s.hold_us(1) == 2000 * MS                     # the ceiling


def test_an_owner_that_keeps_joining_is_waited_for_however_far_behind_it_is():
    s = share()
    t = 0
    for k in range(100):                                 # 10 s of held clicks found unjoined, progress between
        t += 100 * MS
        hold, down = s.still_unjoined(1, t, first_lookup=False)
        assert hold == s.statistics().grace_ms[1] * MS and not down
        s.found_present(1, t + MS, first_lookup=False)
    st_ = s.statistics()
    assert st_.down == (False, False) and st_.held_again == 100 and st_.judged_down == 0


def test_a_silent_owner_is_judged_down_after_its_patience_probed_and_back_on_progress():
    s = RegionShare(["a", "b"], "a", 200 * MS, 20 * MS, 2000 * MS, down_after_us=1000 * MS)
    s.found_present(1, 0, first_lookup=False)
    assert s.still_unjoined(1, 100 * MS, first_lookup=False) == (200 * MS, False)   # silent from here
    assert s.still_unjoined(1, 500 * MS, first_lookup=False) == (200 * MS, False)   # a grace: 600 < 1100
    assert s.still_unjoined(1, 1000 * MS, first_lookup=False) == (100 * MS, False)  # until the patience ends
    assert s.still_unjoined(1, 1099 * MS, first_lookup=False) == (20 * MS, False)   # (never below the minimum)
    assert s.still_unjoined(1, 1100 * MS, first_lookup=False) == (0, True)          # patience over: down
    assert s.statistics().down == (False, True) and s.statistics().judged_down == 1
    assert s.still_unjoined(1, 1200 * MS, first_lookup=False) == (0, False)         # down: join at once
    holds = [s.hold_us(1) for _ in range(4 * PROBE_EVERY)]
    assert holds.count(0) == len(holds) - 4 and len(set(holds)) == 2          # probes only, held one grace
    s.found_present(1, 20_000 * MS)
    assert s.statistics().down == (False, False) and s.hold_us(1) > 0
    # the patience is the grace when that is longer than down_after
    for t in range(50):
        s.wasted(1, 20_000 * MS + t)
    assert s.patience_us(1) == 2000 * MS
    assert s.still_unjoined(1, 21_000 * MS, first_lookup=False) == (2000 * MS, False)
    assert s.still_unjoined(1, 22_999 * MS, first_lookup=False) == (20 * MS, False)
    assert s.still_unjoined(1, 23_000 * MS, first_lookup=False) == (0, True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["present", "unjoined", "joined", "wasted"]), max_size=200))
def test_the_grace_never_leaves_its_bounds(facts):
    s = share()
    for t, f in enumerate(facts):
        if f == "present":
            s.found_present(1, t * MS)
        elif f == "unjoined":
            s.still_unjoined(1, t * MS)
        elif f == "joined":
            s.joined(1, t * MS)
        else:
            s.wasted(1, t * MS)
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
    # the owner joined all but two: those are held again (it is progressing), the rest resolved with no join
    late = [cid(theirs[0]), cid(theirs[1])]
    present = [i not in late for i in lk2.ids]
    assert of(st_.handle(LookupAnswered(lk2.batch_id, present, clock.advance(MS))), SendBatch) == []
    grace_b = st_.statistics().share_grace_ms["b"]
    assert grace_b > 200                                  # two were later than the grace: it grew
    again = []
    for _ in range(20):                                    # looked up again about one (grown) grace later
        again += of(st_.handle(TimePassed(clock.advance(50 * MS))), Lookup)
    assert sorted(i for lk3 in again for i in lk3.ids) == sorted(late)
    for lk3 in again:                                      # the owner caught up
        st_.handle(LookupAnswered(lk3.batch_id, [True] * len(lk3.ids), clock.advance(MS)))
    s = st_.statistics()
    assert (s.held_for_owner, s.held_found_present, s.held_joined, s.held_wasted, s.held_again) == (
        len(theirs), len(theirs), 0, 0, 2)
    assert s.wasted_joins == 0 and s.joined == len(mine) and st_.unresolved_ids() == set()


def test_an_owner_gone_silent_has_its_held_clicks_joined_here_after_the_grace_and_its_patience():
    clock = FakeClock()
    sh = RegionShare(["a", "b"], "a", 200 * MS, 20 * MS, 2000 * MS, down_after_us=300 * MS)
    st_ = state(lookups=True, share=sh)
    _, theirs = _owned_and_not(sh, 80)
    first, second = theirs[: len(theirs) // 2], theirs[len(theirs) // 2:]
    t0 = clock.now_us()
    for part in (first, second):                           # two reads 150 ms apart; the owner never joins
        for lk in of(st_.handle(LinesRead([chunk([line(k) for k in part], start=part[0] * 1000)], clock.now_us())),
                     Lookup):
            st_.handle(LookupAnswered(lk.batch_id, [False] * len(lk.ids), clock.now_us()))
        clock.advance(150 * MS)
    joined_at: dict[str, int] = {}
    for _ in range(400):                                   # every lookup says unjoined; joins succeed here
        todo = st_.handle(TimePassed(clock.advance(5 * MS)))
        while todo:
            cmd = todo.pop()
            if isinstance(cmd, Lookup):
                todo += st_.handle(LookupAnswered(cmd.batch_id, [False] * len(cmd.ids), clock.now_us()))
            elif isinstance(cmd, SendBatch):
                todo += st_.handle(JoinAnswered(cmd.batch_id, bytearray([Outcome.JOINED]) * len(cmd.ids),
                                                clock.now_us()))
                joined_at.update(dict.fromkeys(cmd.ids, clock.now_us()))
        if all(cid(k) in joined_at for k in theirs):
            break
    assert all(cid(k) in joined_at for k in theirs)        # nothing lost: the silent owner's share joined here
    s = st_.statistics()
    assert s.share_down == ["b"] and s.share_judged_down == 1 and s.held_joined == len(theirs)
    # silent from the first lookup (t0 + 305 ms, the first step past the grace), which grew the grace to
    # 305 ms; judged down at the lookup held again until the patience (305 ms, the grace) ran out
    # (t0 + 610 ms), when every click of it still held was joined at once
    assert max(joined_at[cid(k)] - t0 for k in theirs) <= (305 + 305 + 5) * MS
    assert len(set(joined_at.values())) == 1


def test_without_a_registry_lookup_nothing_is_held():
    clock = FakeClock()
    st_ = state(lookups=False, share=share("a"))
    [send] = of(st_.handle(LinesRead([chunk([line(k) for k in range(20)])], clock.now_us())), SendBatch)
    assert len(send.ids) == 20


def test_a_click_far_behind_the_owners_lag_is_joined_here_while_the_owner_keeps_progressing():
    s = RegionShare(["a", "b"], "a", 200 * MS, 20 * MS, 2000 * MS, down_after_us=1000 * MS)
    s.found_present(1, 10_000 * MS, first_lookup=False, waited_us=300 * MS)   # the owner is 300 ms behind
    # a click waiting no longer than the lag plus the patience is held again
    assert s.still_unjoined(1, 10_001 * MS, first_lookup=False, waited_us=1300 * MS) == (200 * MS, False)
    s.found_present(1, 10_002 * MS, first_lookup=False, waited_us=300 * MS)
    # one waiting longer while the owner progresses (it may have judged itself not the owner): joined here,
    # the owner is not judged down
    assert s.still_unjoined(1, 10_003 * MS, first_lookup=False, waited_us=1301 * MS) == (0, False)
    st_ = s.statistics()
    assert st_.late == 1 and st_.down == (False, False) and st_.judged_down == 0


def test_the_region_of_the_registry_leader_owns_its_fraction_of_the_clicks_and_the_hash_picks_otherwise():
    from dispatcher._leader import leaders_region
    by_address = {"10.0.0.1:1": "a", "10.0.0.1:2": "a", "10.0.0.2:1": "b", "10.0.0.3:1": "c"}
    assert leaders_region({0: "10.0.0.1:1", 1: "10.0.0.1:2"}, by_address) == "a"
    assert leaders_region({0: "10.0.0.1:1", 1: "10.0.0.2:1"}, by_address) is None     # several regions
    assert leaders_region({0: "10.9.9.9:1"}, by_address) is None                       # unknown address
    assert leaders_region({}, by_address) is None
    a, b = share("a"), share("b")
    ids = [cid(n) for n in range(200)]
    hashed = [a.owner(i) for i in ids]
    for s in (a, b):
        s.follow_leader("b")
    owners = [a.owner(i) for i in ids]
    assert owners == [b.owner(i) for i in ids]
    assert 0.65 < owners.count(1) / len(ids) < 0.85          # leader_fraction 0.75 to the leader's region
    assert a.hold_us(1) > 0 and b.hold_us(1) == 0 and a.statistics().leader_region == "b"
    alone = RegionShare(["a", "b", "c"], "a", 200 * MS, 20 * MS, 2000 * MS, leader_fraction=1.0)
    alone.follow_leader("c")
    assert {alone.owner(i) for i in ids} == {2}
    alone.follow_leader("d")                                  # not a pipeline region: the hash picks
    assert {alone.owner(i) for i in ids} == {0, 1, 2}
    for s in (a, b):
        s.follow_leader("c")                               # a registry-only region: the hash picks
    assert [a.owner(i) for i in ids] == [b.owner(i) for i in ids] == hashed
    a.follow_leader(None)
    assert [a.owner(i) for i in ids] == hashed and a.statistics().leader_region == ""


def test_the_leader_follower_tells_the_share_the_leaders_region_and_keeps_it_when_the_registry_fails():
    from dispatcher._leader import LeaderFollower
    from photon import wait_until

    class Registry:                                        # FAKE: the registry client's leaders() answer
        def __init__(self):
            self.answer, self.calls = {0: "10.0.0.2:1"}, 0

        def leaders(self):
            self.calls += 1
            if self.answer is None:
                raise ConnectionError("registry unreachable")
            return dict(self.answer)

    registry, sh = Registry(), share("a")
    follower = LeaderFollower(sh, registry, {"10.0.0.1:1": "a", "10.0.0.2:1": "b"}, "test", interval_s=0.01).start()
    try:
        wait_until(lambda: sh.statistics().leader_region == "b", 10, message="the leader's region followed")
        registry.answer = None
        failed_from = registry.calls
        wait_until(lambda: registry.calls >= failed_from + 3, 10, message="three failed asks")
        assert sh.statistics().leader_region == "b"        # the last answer stays
        registry.answer = {0: "10.0.0.1:1"}
        wait_until(lambda: sh.statistics().leader_region == "a", 10, message="a new leader's region followed")
    finally:
        follower.stop()
