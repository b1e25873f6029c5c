"""Low watermarks: the per-interval arithmetic and the authority (paper §7.2), with Hypothesis properties
(published watermarks never go back, stale reports never change anything)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import Computation, ListInjector, Topology
from millwheel._master_facts import Interval
from millwheel._process import assigned_in
from millwheel._routing import IntervalMap
from millwheel._watermarks import (END_OF_TIME, NO_WATERMARK, IntervalAssigned, TimestampBag, WatermarkAuthority,
                                   WatermarkReported, input_watermark, interval_low, is_late, new_grants,
                                   reports_to_write)

CHAIN = {"a": ["inj"], "b": ["a"], "c": ["b"]}


def authority(intervals=2, names=("a", "b", "c")) -> WatermarkAuthority:
    auth = WatermarkAuthority()
    auth.handle(IntervalAssigned("inj", 0, 1))
    auth.handle(*(IntervalAssigned(n, i, 1) for n in names for i in range(intervals)))
    return auth


def report_chain(auth, oldest: dict, estimate: int, rounds: int = 4):
    """Let every interval report against the last publication, ``rounds`` times (the workers' loop)."""
    auth.handle(WatermarkReported("inj", 0, 1, interval_low(oldest.get(("inj", 0)), estimate)))
    pub = auth.publish(CHAIN)
    for _ in range(rounds):
        for name in CHAIN:
            for i in range(2):
                auth.handle(WatermarkReported(name, i, 1, interval_low(oldest.get((name, i)), pub.inputs[name]),
                                              pub.inputs[name]))
        pub = auth.publish(CHAIN)
    return pub


def test_chain_takes_min_of_oldest_work_and_upstream():
    pub = report_chain(authority(), {("a", 1): 50, ("c", 0): 70}, 100)
    assert pub.lows == {"inj": 100, "a": 50, "b": 50, "c": 50}
    assert pub.inputs == {"a": 100, "b": 50, "c": 50}
    assert pub.settled


def test_injector_is_held_by_its_unacked_productions():
    pub = report_chain(authority(), {("inj", 0): 40}, 100)
    assert pub.lows["inj"] == 40 and pub.lows["c"] == 40


def test_no_producers_means_no_watermark_and_input_complete_means_end_of_time():
    assert input_watermark([], {"x": 5}) == NO_WATERMARK
    assert interval_low(None, END_OF_TIME) == END_OF_TIME and interval_low(None, None) == END_OF_TIME
    pub = report_chain(authority(), {}, END_OF_TIME)
    assert pub.lows["c"] == END_OF_TIME


def test_an_unreported_interval_holds_its_computation_and_a_moved_one_keeps_its_last_value():
    auth = authority()
    auth.restore({"a": 10})
    auth.handle(WatermarkReported("inj", 0, 1, 100), WatermarkReported("a", 0, 1, 100, 100))
    pub = auth.publish(CHAIN)
    assert pub.lows["a"] == 10 and not pub.settled   # interval 1 never reported: held at the restored value
    auth.handle(WatermarkReported("a", 1, 1, 60, 100))
    assert auth.publish(CHAIN).lows["a"] == 60
    auth.handle(IntervalAssigned("a", 1, 2))                # moved: the new owner has not reported yet
    auth.handle(WatermarkReported("a", 0, 1, 200, 200), WatermarkReported("inj", 0, 1, 200))
    assert auth.publish(CHAIN).lows["a"] == 60           # its last value holds the computation
    auth.handle(WatermarkReported("a", 1, 1, 500, 200))  # the old owner, fenced: ignored
    assert auth.publish(CHAIN).lows["a"] == 60 and auth.statistics().reports_stale == 1
    auth.handle(WatermarkReported("a", 1, 2, 150, 200))  # the new owner
    assert auth.publish(CHAIN).lows["a"] == 150


def test_a_late_report_does_not_move_the_watermark_back_and_late_records_are_flagged():
    auth = authority()
    pub = report_chain(auth, {}, 100)
    assert pub.lows["a"] == 100
    pub = report_chain(auth, {("a", 0): 20}, 100)   # a late record entered a's work
    assert pub.lows["a"] == 100
    assert is_late(20, pub.inputs["a"]) and not is_late(100, pub.inputs["a"])


def test_a_cycle_whose_members_report_under_no_epoch_holds_at_the_value_it_started_with():
    """Reports that carry no epoch never complete a cut of the cycle (test_mw_watermark_cycles.py shows the
    cycle advancing once its members report under the announced epochs)."""
    producers = {"a": ["inj", "b"], "b": ["a"]}
    auth = WatermarkAuthority()
    auth.restore({"a": 7, "b": 7})
    auth.handle(IntervalAssigned("inj", 0, 1), IntervalAssigned("a", 0, 1), IntervalAssigned("b", 0, 1))
    pub = auth.publish(producers)
    for _ in range(5):
        auth.handle(WatermarkReported("inj", 0, 1, 100),
                    WatermarkReported("a", 0, 1, interval_low(None, pub.inputs["a"]), pub.inputs["a"]),
                    WatermarkReported("b", 0, 1, interval_low(None, pub.inputs["b"]), pub.inputs["b"]))
        pub = auth.publish(producers)
    assert pub.lows["a"] == 7 and pub.lows["b"] == 7 and pub.lows["inj"] == 100


def test_the_authority_never_leads_work_in_flight_between_two_reports():
    """b reported before a's production reached it; a then reports no work. b's old report is bounded by
    the input it used, so c's input cannot pass the production now held by b."""
    auth = authority(intervals=1)
    auth.handle(WatermarkReported("inj", 0, 1, 100))
    auth.handle(WatermarkReported("a", 0, 1, 30, 100))       # a holds a production at 30
    pub = auth.publish(CHAIN)
    auth.handle(WatermarkReported("b", 0, 1, interval_low(None, pub.inputs["b"]), pub.inputs["b"]))
    auth.handle(WatermarkReported("c", 0, 1, interval_low(None, 30), 30))
    auth.publish(CHAIN)
    auth.handle(WatermarkReported("a", 0, 1, 100, 100))      # b took it (its production at 30 is b's now)
    pub = auth.publish(CHAIN)
    assert pub.lows["a"] == 100 and pub.lows["b"] == 30 and pub.inputs["c"] == 30


names = st.sampled_from(["inj", "a", "b", "c"])
event = st.one_of(
    st.tuples(st.just("report"), names, st.integers(0, 1), st.integers(0, 4), st.integers(0, 10**6),
              st.integers(0, 10**6)),
    st.tuples(st.just("assign"), names, st.integers(0, 1), st.integers(0, 4)),
    st.tuples(st.just("publish")))


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=60), st.dictionaries(names, st.integers(0, 10**6)))
def test_published_watermarks_never_move_back_and_stale_reports_change_nothing(events, restored):
    auth = WatermarkAuthority()
    auth.restore(restored)
    last = auth.publish(CHAIN).lows
    assert all(last[n] >= wm for n, wm in restored.items())
    for ev in events:
        if ev[0] == "report":
            _, name, interval, seq, low, used = ev
            known = auth.sequencer(name, interval)
            before = auth.publish(CHAIN)
            auth.handle(WatermarkReported(name, interval, seq, low, None if name == "inj" else used))
            if known is not None and seq < known:
                assert auth.publish(CHAIN) == before   # a stale report is ignored
        elif ev[0] == "assign":
            auth.handle(IntervalAssigned(ev[1], ev[2], ev[3]))
        pub = auth.publish(CHAIN)
        for name, wm in last.items():
            assert pub.lows[name] >= wm
        assert all(pub.inputs[c] == input_watermark(ps, pub.lows) for c, ps in CHAIN.items())
        last = pub.lows


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


def test_a_worker_process_authority_takes_the_masters_sequencers_and_ignores_the_old_owners_late_report():
    """In a worker process the authority reads every interval's stored report each tick, and learns each
    interval's sequencer from the master's map (``assigned_in``), not only from reports. Slot 1 of ``a``
    moved (sequencer 2 -> 5) to an owner that has not reported yet: the old owner's late report, still the
    stored row, is ignored at every tick, and the slot holds its last value until its new owner reports."""
    topology = Topology()
    topology.add_injector("inj", lambda: ListInjector([]), produces="s")
    topology.add_computation("a", Computation, consumes=["s"])

    def iv(name, lo, hi, worker, seq):
        return Interval(name, lo, hi, worker, seq, 0, f"{worker}:1")
    before = IntervalMap([iv("a", "", "0001", "w1", 2), iv("a", "0001", None, "w1", 2), iv("inj", "", None, "w1", 2),
                          iv("other", "", None, "w1", 9)], 2)
    after = IntervalMap([iv("a", "", "0001", "w1", 2), iv("a", "0001", None, "w2", 5), iv("inj", "", None, "w1", 2)], 2)
    assert assigned_in(before, topology) == (IntervalAssigned("a", 0, 2), IntervalAssigned("a", 1, 2),
                                              IntervalAssigned("inj", 0, 2))
    producers = topology.producers()
    auth = WatermarkAuthority(decide_epochs=False)
    auth.handle(*assigned_in(before, topology))
    rows = {("inj", 0): ("inj", 0, 2, 300), ("a", 0): ("a", 0, 2, 100, 300), ("a", 1): ("a", 1, 2, 80, 300)}
    auth.handle(*(WatermarkReported(*r) for r in rows.values()))
    assert auth.publish(producers).lows["a"] == 80
    auth.handle(*assigned_in(after, topology))                 # a map read: slot 1 moved
    rows[("a", 1)] = ("a", 1, 2, 400, 400)                     # the old owner's late report, stored
    rows[("a", 0)] = ("a", 0, 2, 400, 400)
    rows[("inj", 0)] = ("inj", 0, 2, 400)
    for _ in range(3):                                         # read again at every tick
        auth.handle(*(WatermarkReported(*r) for r in rows.values()))
        assert auth.publish(producers).lows["a"] == 80           # slot 1 holds its last value
    assert auth.statistics().reports_stale == 3
    auth.handle(WatermarkReported("a", 1, 5, 350, 400))        # its new owner
    assert auth.publish(producers).lows["a"] == 350


def test_a_process_records_only_newer_grants_and_writes_no_report_below_a_grant_it_has_read():
    """The pure part of the report fence of worker processes: the grants of the maps a process reads go to
    the store once each (only newer ones); a report of an interval it still holds (its heartbeat has not
    given it up yet) under a sequencer a map read since replaced is not written."""
    granted: dict = {}
    assert new_grants(granted, [IntervalAssigned("c", 0, 3), IntervalAssigned("c", 1, 3)]) == [("c", 0, 3),
                                                                                              ("c", 1, 3)]
    assert new_grants(granted, [IntervalAssigned("c", 0, 3), IntervalAssigned("c", 1, 5),
                                IntervalAssigned("c", 1, 4)]) == [("c", 1, 5)]
    rows = [("c", 0, 3, 100, 90, 100), ("c", 1, 3, 200, 190, 200), ("c", 2, 2, 300, 290, 300)]
    held = {("c", 0): 3, ("c", 1): 3, ("c", 2): 1}
    assert reports_to_write(rows, held, granted) == [("c", 0, 3, 100, 90, 100)]
    held[("c", 1)] = 5
    assert reports_to_write([("c", 1, 5, 220, 210, 220)], held, granted) == [("c", 1, 5, 220, 210, 220)]
