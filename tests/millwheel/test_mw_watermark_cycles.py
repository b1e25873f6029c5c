"""Low watermarks on cycles: the authority's strongly connected components and its epoch cuts (pure),
with the shells' part (tracking windows) played by TimestampBags as the tracker keeps them."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from millwheel._interval import IntervalCore, IntervalSettings
from millwheel._interval_events import EpochAnnounced, IntervalGranted, WorkObserved
from millwheel._watermarks import (END_OF_TIME, EpochDecided, IntervalAssigned, TimestampBag, WatermarkAuthority,
                                   WatermarkReported, cyclic_components, interval_low)

CYCLE = {"a": ["inj", "b"], "b": ["a"], "down": ["b"]}


class Member:
    """One interval of a computation on a cycle, as its worker keeps it: the work it holds (a bag with a
    tracking window), the epoch it has seen and the window that ended when it saw it."""

    def __init__(self, name: str, interval: int = 0, seq: int = 1) -> None:
        self.name, self.interval, self.seq = name, interval, seq
        self.work = TimestampBag()
        self.epoch = 0
        self.prev: int | None = None

    def see(self, epoch: int) -> None:
        if epoch > self.epoch:
            ended = self.work.mark()
            self.prev, self.epoch = ended, epoch

    def report(self, input_us: int) -> WatermarkReported:
        oldest = self.work.min()
        lows = [v for v in (self.prev, self.work.window_low()) if v is not None]
        return WatermarkReported(self.name, self.interval, self.seq, interval_low(oldest, input_us), input_us,
                                 oldest, self.epoch, min(lows) if lows else None)


def cycle_authority(*members: Member, restored=None) -> WatermarkAuthority:
    auth = WatermarkAuthority()
    auth.restore(restored or {})
    auth.handle(IntervalAssigned("inj", 0, 1), IntervalAssigned("down", 0, 1))
    auth.handle(*(IntervalAssigned(m.name, m.interval, m.seq) for m in members))
    return auth


def round_(auth, members, estimate=100, producers=CYCLE):
    """Every member sees the announced epoch and reports; the injector and ``down`` report too."""
    pub = auth.publish(producers)
    for m in members:
        m.see(pub.epochs[m.name])
    auth.handle(WatermarkReported("inj", 0, 1, estimate),
                *(m.report(pub.inputs[m.name]) for m in members),
                WatermarkReported("down", 0, 1, interval_low(None, pub.inputs["down"]), pub.inputs["down"]))
    return auth.publish(producers)


def test_components_are_the_cycles_of_the_topology():
    assert cyclic_components({"a": ["inj"], "b": ["a"], "c": ["b"]}) == []
    assert cyclic_components({"a": ["a"], "b": ["a"]}) == [frozenset({"a"})]
    comps = cyclic_components({"a": ["inj", "c"], "b": ["a"], "c": ["b"], "d": ["c", "e"], "e": ["d"],
                               "f": ["e"]})
    assert sorted(map(sorted, comps)) == [["a", "b", "c"], ["d", "e"]]
    # deep chains do not hit a recursion limit
    chain = {f"n{i}": [f"n{i - 1}"] for i in range(1, 5000)}
    chain["n0"] = ["n4999"]
    assert cyclic_components(chain) == [frozenset(chain)]


def test_a_two_computation_cycle_advances_to_its_input_and_holds_at_work_inside():
    a, b = Member("a"), Member("b")
    auth = cycle_authority(a, b)
    pubs = [round_(auth, [a, b]) for _ in range(4)]
    assert pubs[-1].lows["a"] == pubs[-1].lows["b"] == 100 and pubs[-1].inputs["down"] == 100
    assert pubs[-1].epochs["a"] == pubs[-1].epochs["b"] >= 2 and "down" not in pubs[-1].epochs
    b.work.add(130)                        # a pending timer (or a record) at 130 inside the cycle
    for _ in range(4):
        pub = round_(auth, [a, b], estimate=200)
    assert pub.lows["a"] == pub.lows["b"] == 130 and pub.inputs["down"] == 130
    b.work.remove(130)
    for _ in range(4):
        pub = round_(auth, [a, b], estimate=END_OF_TIME)
    assert pub.lows["a"] == pub.lows["b"] == pub.inputs["down"] == END_OF_TIME
    assert pub.settled and auth.statistics().cycles == 1 and auth.statistics().cuts_published >= 3


def test_a_record_in_flight_between_members_holds_the_cycle():
    """The race a cut must see: b holds a record at 30; a reports under epoch E holding nothing; then the
    record goes from b to a (a receives it before b's ack removes it) and b, seeing E only now, holds
    nothing. b's window started when it first saw E - 1, while it still held the record: the cut is 30."""
    a, b = Member("a"), Member("b")
    auth = cycle_authority(a, b)
    for _ in range(3):
        pub = round_(auth, [a, b])
    assert pub.lows["a"] == 100
    b.work.add(140)                         # b holds a record at 140
    pub = round_(auth, [a, b], estimate=200)
    epoch = pub.epochs["a"]
    a.see(epoch)
    auth.handle(a.report(pub.inputs["a"]), WatermarkReported("inj", 0, 1, 200))
    a.work.add(140)                         # a received the record (b's production until a acks)
    b.work.remove(140)                      # b's production acked: it is a's work now
    b.see(epoch)
    auth.handle(b.report(pub.inputs["b"]))
    assert b.report(0).oldest_us is None and b.report(0).cut_us == 140   # b holds nothing, but did
    pub = auth.publish(CYCLE)
    assert pub.lows["a"] == pub.lows["b"] == 140 and pub.inputs["down"] == 140
    for _ in range(3):
        pub = round_(auth, [a, b], estimate=200)
    assert pub.lows["a"] == 140             # a still holds it
    a.work.remove(140)
    for _ in range(3):
        pub = round_(auth, [a, b], estimate=200)
    assert pub.lows["a"] == pub.lows["b"] == 200


def test_reports_without_an_epoch_never_complete_a_cut():
    auth = cycle_authority(Member("a"), Member("b"), restored={"a": 7, "b": 7})
    for _ in range(5):
        auth.publish(CYCLE)
        auth.handle(WatermarkReported("inj", 0, 1, 100), WatermarkReported("a", 0, 1, 100, 100),
                    WatermarkReported("b", 0, 1, 100, 100))
    assert auth.publish(CYCLE).lows["a"] == 7


def test_a_stale_sequencer_report_is_ignored_on_a_cycle():
    a, b = Member("a"), Member("b", seq=2)
    auth = cycle_authority(a, b)
    b.work.add(50)
    for _ in range(4):
        pub = round_(auth, [a, b])
    assert pub.lows["b"] == 50
    zombie = Member("b", seq=1)             # the fenced owner of b's interval, holding nothing
    zombie.see(pub.epochs["b"])
    before = auth.publish(CYCLE)
    auth.handle(zombie.report(100))
    for _ in range(3):
        auth.handle(zombie.report(100))
        pub = auth.publish(CYCLE)
        assert pub.lows == before.lows
    assert auth.statistics().reports_stale >= 1


def test_a_moved_interval_holds_the_cycle_at_its_last_value_until_a_cut_after_the_move():
    """b's interval 1 moves while an epoch is open. Its new owner loads a timer at 80 from the store,
    fires it and hands the result to a, after a reported under the epoch and before the new owner first
    saw it: no report of that epoch holds 80 though a does now. The new owner did not report the epoch
    before, so the cut is refused and the cycle holds at its last value; the next cut holds 80 (a's window
    starts when it saw the open epoch); once a is done the cycle moves on."""
    a, b0, b1 = Member("a"), Member("b", 0), Member("b", 1)
    auth = cycle_authority(a, b0, b1)
    b1.work.add(60)
    for _ in range(4):
        pub = round_(auth, [a, b0, b1])
    assert pub.lows["a"] == pub.lows["b"] == 60
    b1.work.remove(60)                       # the timer at 60 fired and set one at 80
    b1.work.add(80)
    auth.handle(b1.report(pub.inputs["b"]), WatermarkReported("inj", 0, 1, 300))
    pub = auth.publish(CYCLE)                # 80 may be reached: an epoch opens
    for m in (a, b0):
        m.see(pub.epochs[m.name])
    auth.handle(a.report(pub.inputs["a"]), b0.report(pub.inputs["b"]))
    auth.handle(IntervalAssigned("b", 1, 2))
    moved = Member("b", 1, seq=2)
    b1.work.remove(80)                       # the fenced owner's cores are gone
    moved.work.add(80)                       # loaded by the new owner
    a.work.add(80)                           # the timer's production reached a
    moved.work.remove(80)                    # and is acked
    moved.see(pub.epochs["b"])
    auth.handle(moved.report(pub.inputs["b"]))
    pub = auth.publish(CYCLE)
    assert pub.lows["a"] == pub.lows["b"] == 60 and auth.statistics().cuts_refused == 1
    pub = round_(auth, [a, b0, moved], estimate=300)
    assert pub.lows["a"] == pub.lows["b"] == 80   # a's window since the open epoch holds 80
    a.work.remove(80)
    for _ in range(3):
        pub = round_(auth, [a, b0, moved], estimate=300)
    assert pub.lows["a"] == pub.lows["b"] == 300


def test_an_unreported_interval_holds_the_cycle():
    a, b = Member("a"), Member("b")
    auth = cycle_authority(a, b, restored={"a": 5, "b": 5})
    for _ in range(4):
        pub = auth.publish(CYCLE)
        a.see(pub.epochs["a"])
        auth.handle(WatermarkReported("inj", 0, 1, 100), a.report(pub.inputs["a"]))
    assert auth.publish(CYCLE).lows["a"] == 5 and not auth.publish(CYCLE).settled


def test_authorities_sharing_a_store_propose_epochs_and_adopt_the_one_decided():
    """Two processes' authorities over the same reports: neither announces an epoch itself; each proposes
    the next one, one proposal per step is taken (the store's advance_epoch), and both adopt it."""
    a, b = Member("a"), Member("b")
    auths = [WatermarkAuthority(decide_epochs=False) for _ in range(2)]
    decided: dict[str, EpochDecided] = {}
    for auth in auths:
        auth.handle(IntervalAssigned("inj", 0, 1), IntervalAssigned("down", 0, 1), IntervalAssigned("a", 0, 1),
                    IntervalAssigned("b", 0, 1))
    for _ in range(6):
        pubs = []
        for n, auth in enumerate(auths):
            auth.handle(*decided.values())
            pub = auth.publish(CYCLE)
            pubs.append(pub)
            for p in pub.proposals:               # the store's compare-and-set: the first of a step wins
                if p.epoch == decided.get(p.component, EpochDecided(p.component, 1, 0, ())).epoch + 1:
                    decided[p.component] = p
        for m in (a, b):
            m.see(pubs[0].epochs[m.name])
        reports = [WatermarkReported("inj", 0, 1, 100), a.report(pubs[0].inputs["a"]), b.report(pubs[0].inputs["b"]),
                   WatermarkReported("down", 0, 1, interval_low(None, pubs[0].inputs["down"]), pubs[0].inputs["down"])]
        for auth in auths:
            auth.handle(*reports)
    assert set(decided) == {"a/b"}
    for auth in auths:
        auth.handle(*decided.values())
        pub = auth.publish(CYCLE)
        assert pub.lows["a"] == pub.lows["b"] == 100 and pub.epochs["a"] == decided["a/b"].epoch


def test_the_interval_core_reports_the_oldest_work_held_since_it_saw_the_previous_epoch():
    core = IntervalCore(IntervalSettings("a", 0))
    core.handle(IntervalGranted(3, [("k", "t", 70, "watermark")], {}, []))
    core.handle(EpochAnnounced(4, None))
    (out,) = core.handle(WorkObserved(None, None))
    assert (out.report.epoch, out.report.cut_us, out.report.oldest_us) == (4, 70, 70)
    core.handle(EpochAnnounced(5, 90))       # the shell's window had a record at 90 since epoch 4
    (out,) = core.handle(WorkObserved(None, 95))
    assert (out.report.epoch, out.report.cut_us) == (5, 70)   # the timer is still held
    assert core.handle(EpochAnnounced(5, 10)) == [] and core.epoch == 5   # an epoch seen already


names = st.sampled_from(["a", "b"])
event = st.one_of(
    st.tuples(st.just("report"), names, st.integers(0, 1), st.integers(0, 3), st.integers(0, 6),
              st.one_of(st.none(), st.integers(0, 10**6)), st.one_of(st.none(), st.integers(0, 10**6))),
    st.tuples(st.just("assign"), names, st.integers(0, 1), st.integers(0, 3)),
    st.tuples(st.just("inject"), st.integers(0, 10**6)),
    st.tuples(st.just("publish")))


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=80), st.dictionaries(st.sampled_from(["a", "b", "down"]), st.integers(0, 10**6)))
def test_a_cycle_never_moves_back_and_stale_reports_change_nothing(events, restored):
    auth = WatermarkAuthority()
    auth.restore(restored)
    last = auth.publish(CYCLE).lows
    for ev in events:
        if ev[0] == "report":
            _, name, interval, seq, epoch, cut, oldest = ev
            known = auth.sequencer(name, interval)
            before = auth.publish(CYCLE)
            auth.handle(WatermarkReported(name, interval, seq, 0 if cut is None else cut, 0, oldest, epoch, cut))
            if known is not None and seq < known:
                assert auth.publish(CYCLE) == before
        elif ev[0] == "assign":
            auth.handle(IntervalAssigned(ev[1], ev[2], ev[3]))
        elif ev[0] == "inject":
            auth.handle(WatermarkReported("inj", 0, 1, ev[1]))
        pub = auth.publish(CYCLE)
        for name, wm in last.items():
            assert pub.lows[name] >= wm
        assert pub.lows.get("a") == pub.lows.get("b") or {"a", "b"} & set(restored)
        last = pub.lows


op = st.one_of(
    st.tuples(st.just("enter"), st.integers(0, 1), st.integers(0, 50)),
    st.tuples(st.just("move"), st.integers(0, 1), st.integers(0, 10)),
    st.tuples(st.just("derive"), st.integers(0, 1), st.integers(0, 10), st.integers(0, 20)),
    st.tuples(st.just("finish"), st.integers(0, 1), st.integers(0, 10)),
    st.tuples(st.just("see"), st.integers(0, 1)),
    st.tuples(st.just("report"), st.integers(0, 1)),
    st.tuples(st.just("sync"), st.integers(0, 1)),
    st.tuples(st.just("inj"), st.integers(0, 30)),
    st.tuples(st.just("publish")))


# the race a sampled report (or a window starting only when the epoch is seen) misses: the record at 100
# goes b → a between a's report and b's, twice, so that no report of the epoch shows it
RACE = [("enter", 1, 0), ("inj", 0), ("publish",), ("sync", 0), ("sync", 1), ("publish",), ("sync", 0),
        ("sync", 1), ("publish",), ("inj", 50), ("sync", 0), ("move", 1, 0), ("sync", 1), ("publish",),
        ("sync", 1), ("move", 0, 0), ("sync", 0), ("publish",)]


@settings(max_examples=600, deadline=None)
@given(st.lists(op, max_size=200))
@example(RACE)
def test_the_published_watermark_of_a_cycle_never_passes_work_held_in_it(ops):
    """Records enter the cycle (no older than the input's watermark), move between the members (the
    receiver holds one before the sender lets go), are replaced by later work or finish; the members
    see epochs and report at any moment, in any order. Whatever the interleaving, the cycle's published
    watermark is never above the timestamp of work it holds."""
    members = [Member("a"), Member("b")]
    held: list[list[int]] = [[], []]
    auth = cycle_authority(*members)
    ext = 100
    pub = auth.publish(CYCLE)

    def take(m: int, pick: int) -> int | None:
        return held[m].pop(pick % len(held[m])) if held[m] else None

    for ev in ops:
        kind = ev[0]
        if kind == "enter":
            held[ev[1]].append(ext + ev[2])
            members[ev[1]].work.add(ext + ev[2])
        elif kind in ("move", "derive", "finish"):
            m = ev[1]
            ts = take(m, ev[2])
            if ts is None:
                continue
            if kind == "move":
                held[1 - m].append(ts)
                members[1 - m].work.add(ts)
            elif kind == "derive":
                held[m].append(ts + ev[3])
                members[m].work.add(ts + ev[3])
            members[m].work.remove(ts)
        elif kind == "see":
            members[ev[1]].see(pub.epochs[members[ev[1]].name])
        elif kind == "report":
            m = members[ev[1]]
            auth.handle(m.report(pub.inputs[m.name]))
        elif kind == "sync":                  # sees the announced epoch and reports at once
            m = members[ev[1]]
            m.see(pub.epochs[m.name])
            auth.handle(m.report(pub.inputs[m.name]))
        elif kind == "inj":                   # the input's watermark rises: nothing older enters after
            ext += ev[1]
            auth.handle(WatermarkReported("inj", 0, 1, ext))
        else:
            pub = auth.publish(CYCLE)
            work = held[0] + held[1]
            assert pub.lows["a"] == pub.lows["b"]
            assert not work or pub.lows["a"] <= min(work), (pub.lows, sorted(work))
