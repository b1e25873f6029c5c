"""The pure interval core: events in, commands out, no store, threads or clock. A tiny in-test shell plays
the store and user code; Hypothesis checks exactly-once under any mix of repeats, floors and commits."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import WALL, WEAK, Computation
from millwheel._interval import (AckDeliveries, AcksObserved, CheckpointCommitted, Commit, CommitRefused,
                                 CountResults, FloorsRaised, InputWatermarkAdvanced, IntervalCore, IntervalGranted,
                                 IntervalRevoked, IntervalSettings, MarkStored, ProductionsAcked, RecordsDelivered,
                                 Relinquish, ReportWatermark, ReturnDeliveries, RunUserCode, SendProductions,
                                 TimePassed, UserCodeRan, WorkObserved)
from millwheel._model import Delivery, Record
from millwheel._routing import ModuloPlacement
from millwheel._runner import KeyInput, run_key
from millwheel._watermarks import END_OF_TIME


class Count(Computation):
    """Counts records per key; a watermark timer at 100 reports the count."""

    def process_record(self, ctx, record):
        ctx.state = (ctx.state or 0) + 1
        ctx.set_timer("t", 100)

    def process_timer(self, ctx, timer):
        ctx.produce("out", {"n": ctx.state})


def delivery(key: str, rid: str, ts: int = 10, sender: str = "in", produced_at: int = 50) -> Delivery:
    return Delivery("c", 0, Record(key, {}, ts, rid, "s", sender, produced_at))


class Shell:
    """Carries out commands like the worker does, against dicts instead of a store."""

    def __init__(self, core: IntervalCore, comp: Computation) -> None:
        self.core, self.comp = core, comp
        self.states: dict[str, bytes] = {}
        self.seen: set[str] = set()
        self.processed: list[str] = []
        self.acked: list[str] = []
        self.sent: list = []
        self.deferred: list = []   # commits held back by ``step(defer=True)``, done by ``flush``

    def run(self, cmd: RunUserCode) -> UserCodeRan:
        dups = set(cmd.duplicates) | (set(cmd.lookup_ids) & self.seen)
        results = [run_key(self.comp, KeyInput(cmd.computation, w.key, w.records,
                                               self.states.get(w.key) if w.read else w.state, w.timers, dups,
                                               cmd.input_watermark_us, cmd.now_us, ("out",)))
                   for w in cmd.keys]
        return UserCodeRan(cmd.run_id, results, {k: self.states.get(k) for k in cmd.read_states}, cmd.now_us)

    def flush(self) -> list:
        held, self.deferred = self.deferred, []
        return self.step(*held)

    def step(self, *events, commit: bool = True, defer: bool = False) -> list:
        """Feed events, run user code, commit (or refuse, or hold back) every Commit; returns every command
        seen. A held-back Commit is carried out by :meth:`flush`."""
        seen, pending = [], []
        for ev in events:
            pending.extend([ev] if isinstance(ev, Commit) else self.core.handle(ev))
        while pending:
            cmd = pending.pop(0)
            seen.append(cmd)
            if isinstance(cmd, RunUserCode):
                pending.extend(self.core.handle(self.run(cmd)))
            elif isinstance(cmd, Commit):
                if defer:
                    self.deferred.append(cmd)
                    continue
                if not commit:
                    pending.extend(self.core.handle(CommitRefused(cmd.commit_id)))
                    continue
                for w in cmd.writes:
                    assert w.sequencer == self.core.sequencer
                    if w.key is not None and w.state is not None and not isinstance(w.state, type(_KEEP)):
                        self.states[w.key] = w.state
                    for rid, _, _ in w.processed:
                        self.seen.add(rid)
                        self.processed.append(rid)
                pending.extend(self.core.handle(CheckpointCommitted(cmd.commit_id)))
            elif isinstance(cmd, AckDeliveries):
                self.acked.extend(d.record.id for d in cmd.deliveries)
            elif isinstance(cmd, SendProductions):
                self.sent.append(cmd)
        return seen


from millwheel._store import KEEP as _KEEP  # noqa: E402


def granted(comp=Count, **kw) -> tuple[IntervalCore, Shell]:
    core = IntervalCore(IntervalSettings("c", 0, weak=comp.productions == WEAK, **kw))
    core.handle(IntervalGranted(7, [], {}, []))
    return core, Shell(core, comp())


def kinds(cmds) -> list[str]:
    return [type(c).__name__ for c in cmds]


def test_a_batch_runs_commits_then_registers_acks_and_sends_in_that_order():
    core, shell = granted()
    cmds = shell.step(RecordsDelivered([delivery("a", "r1"), delivery("b", "r2")]), TimePassed(1000))
    assert kinds(cmds) == ["RunUserCode", "Commit", "CountResults", "AckDeliveries"]
    run = cmds[0]
    assert sorted(run.read_states) == ["a", "b"] and run.lookup_ids == []  # nothing cached, nothing seen yet
    assert {w.key for w in cmds[1].writes} == {"a", "b"} and all(w.sequencer == 7 for w in cmds[1].writes)
    assert sorted(shell.acked) == ["r1", "r2"]
    again = shell.step(RecordsDelivered([delivery("a", "r3")]), TimePassed(1001))[0]
    assert again.read_states == [] and again.keys[0].state == b"1"   # the cache holds what was committed


def test_a_key_with_an_uncommitted_run_waits_and_keeps_its_order():
    core, shell = granted()
    run = core.handle(RecordsDelivered([delivery("a", "r1")]), TimePassed(1))[0]
    commit = core.handle(shell.run(run))[0]
    assert core.locked == {"a"}
    assert core.handle(RecordsDelivered([delivery("a", "r2"), delivery("b", "r3")]), TimePassed(2)) != []
    assert [w.key for w in core.handle(TimePassed(3))] == []            # a still waits, b went
    after = core.handle(CheckpointCommitted(commit.commit_id), TimePassed(4))
    assert [r.records[0].id for c in after if isinstance(c, RunUserCode) for r in c.keys] == ["r2"]


def test_records_before_their_senders_floor_are_repeats_and_seen_ids_are_asked_about():
    core, shell = granted()
    shell.step(RecordsDelivered([delivery("a", "r1", produced_at=50)]), TimePassed(1))
    core.handle(FloorsRaised({"in": 40}), FloorsRaised({"in": 30}))       # floors only rise
    assert core.floors == {"in": 40}
    run = core.handle(RecordsDelivered([delivery("a", "old", produced_at=39), delivery("a", "r1", produced_at=60),
                                        delivery("b", "new", produced_at=60)]), TimePassed(2))[0]
    assert run.duplicates == {"old"} and "r1" in run.lookup_ids
    core.handle(shell.run(run))
    assert shell.processed.count("r1") == 1 and "old" not in shell.processed


def test_watermark_timers_fire_with_the_input_and_hold_the_reported_watermark():
    core, shell = granted()
    shell.step(RecordsDelivered([delivery("a", "r1")]), TimePassed(1))
    (report,) = core.handle(InputWatermarkAdvanced(60), WorkObserved(None))
    assert isinstance(report, ReportWatermark) and report.report.low_us == 60 and report.report.input_us == 60
    assert core.handle(WorkObserved(None)) == []                         # unchanged: not reported again
    assert core.handle(InputWatermarkAdvanced(500), WorkObserved(None))[0].report.low_us == 100  # the timer holds
    assert core.has_due(0)
    cmds = shell.step(TimePassed(2))
    assert kinds(cmds)[:2] == ["RunUserCode", "Commit"] and shell.sent[0].productions[0].timestamp_us == 100
    assert core.handle(WorkObserved(None))[0].report.low_us == 500
    assert core.handle(InputWatermarkAdvanced(400), WorkObserved(30))[0].report.low_us == 30  # input never back


class Remind(Computation):
    def process_record(self, ctx, record):
        ctx.set_timer("w", 5_000, WALL)

    def process_timer(self, ctx, timer):
        ctx.state = "fired"


def test_wall_timers_fire_with_the_time_passed_in():
    core, shell = granted(Remind)
    shell.step(RecordsDelivered([delivery("a", "r1")]), TimePassed(1))
    assert shell.step(TimePassed(4_999)) == [] and not core.has_due(4_999)
    assert core.has_due(5_000) and kinds(shell.step(TimePassed(5_000)))[0] == "RunUserCode"
    assert shell.states["a"] == b'"fired"'


class WeakEcho(Computation):
    productions = WEAK

    def process_record(self, ctx, record):
        ctx.produce("out", {})

    def process_timer(self, ctx, timer):
        pass


def test_weak_productions_go_out_first_and_the_checkpoint_waits_for_acks_or_the_delay():
    core, shell = granted(WeakEcho, weak_checkpoint_delay_us=100)
    cmds = shell.step(RecordsDelivered([delivery("a", "r1")]), TimePassed(1_000))
    assert kinds(cmds) == ["RunUserCode", "SendProductions"] and not cmds[1].stored
    pid = cmds[1].productions[0].id
    assert core.weak_waiting and core.pending_weak_ids() == [pid]
    assert shell.step(AcksObserved(frozenset({pid}), 1_050)) == []      # unacked, before the delay
    cmds = shell.step(AcksObserved(frozenset({pid}), 1_100))              # the delay passed
    assert kinds(cmds) == ["Commit", "CountResults", "MarkStored", "AckDeliveries"]
    assert [p.id for p in cmds[0].writes[0].productions] == [pid] and cmds[2].ids == [pid]
    assert not core.weak_waiting and core.locked == set()
    cmds = shell.step(RecordsDelivered([delivery("b", "r2")]), TimePassed(2_000))
    assert kinds(shell.step(AcksObserved(frozenset(), 2_001))) == ["Commit", "CountResults", "AckDeliveries"]


def test_acked_productions_are_deleted_under_the_current_sequencer():
    core, _ = granted()
    (commit,) = core.handle(ProductionsAcked(("p1", "p2")))
    assert commit.writes[0].productions_done == ["p1", "p2"] and commit.writes[0].sequencer == 7


def test_a_refused_commit_relinquishes_the_interval():
    core, shell = granted()
    cmds = shell.step(RecordsDelivered([delivery("a", "r1")]), TimePassed(1), commit=False)
    assert isinstance(cmds[-1], Relinquish) and not core.held
    assert shell.acked == [] and core.handle(RecordsDelivered([delivery("a", "r2")]), TimePassed(2)) == []
    assert core.handle(WorkObserved(None)) == []


def test_a_revoked_interval_hands_back_what_it_did_not_commit():
    core, shell = granted()
    core.handle(RecordsDelivered([delivery("a", "r1")]), TimePassed(1))  # run sent, never answered
    core.handle(RecordsDelivered([delivery("a", "r2")]))
    (back,) = core.handle(IntervalRevoked())
    assert isinstance(back, ReturnDeliveries) and sorted(d.record.id for d in back.deliveries) == ["r1", "r2"]
    assert not core.held and core.timers == {}


def test_a_regrant_loads_timers_and_dedup_ids_from_the_store():
    core = IntervalCore(IntervalSettings("c", 0))
    core.handle(IntervalGranted(3, [("a", "t", 100, "watermark")], {"in": 5}, ["r1"]))
    assert core.oldest_timer_us() == 100 and core.floors == {"in": 5}
    run = core.handle(RecordsDelivered([delivery("b", "r1")]), TimePassed(1))[0]
    assert run.lookup_ids == ["r1"]        # the Bloom filter knows it: ask the store
    assert core.handle(InputWatermarkAdvanced(END_OF_TIME), WorkObserved(None))[0].report.low_us == 100


def test_modulo_placement_gives_every_interval_one_owner():
    p = ModuloPlacement(3, 16)
    owned = [p.intervals_of("c", w) for w in range(3)]
    assert sorted(i for o in owned for i in o) == list(range(16))
    assert all(p.owner("c", i) == w for w, o in enumerate(owned) for i in o)


step = st.one_of(
    st.tuples(st.just("deliver"), st.lists(st.tuples(st.integers(0, 12), st.integers(0, 100)), max_size=6)),
    st.tuples(st.just("floor"), st.integers(0, 60)),
    st.tuples(st.just("tick"), st.booleans()),
    st.tuples(st.just("flush"), st.none()))


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=25))
def test_any_mix_of_repeats_floors_and_commit_order_processes_each_id_once(steps):
    """Every delivered id is processed at most once and every delivery is acked in the end (repeats
    too), whatever the floors and however late commits land (a key waits while its run is uncommitted)."""
    core, shell = granted()
    produced_at: dict[str, int] = {}
    delivered: list[str] = []
    floor = 0
    for kind, arg in steps:
        if kind == "deliver":
            ds = []
            for n, at in arg:
                rid = f"r{n}"                          # one id, one key: the extractor is a function
                at = produced_at.setdefault(rid, at)   # a repeat carries its first production time
                ds.append(Delivery("c", 0, Record("abc"[n % 3], {}, 10, rid, "s", "in", at)))
            delivered.extend(d.record.id for d in ds)
            shell.step(RecordsDelivered(ds), TimePassed(1), defer=len(ds) % 2 == 1)  # some commits come late
        elif kind == "floor":
            floor = max(floor, arg)
            core.handle(FloorsRaised({"in": arg}))
        elif kind == "flush":
            shell.flush()
        else:
            shell.step(TimePassed(2), defer=arg)
    while shell.deferred or core.locked or core.wants_step(3):
        shell.flush()
        shell.step(TimePassed(3))
    assert len(shell.processed) == len(set(shell.processed))
    assert set(shell.processed) <= set(delivered)
    assert sorted(shell.acked) == sorted(delivered)           # everything taken is acked, repeats too
    assert core.locked == set()


def test_count_results_follow_the_commit():
    core, shell = granted()
    cmds = shell.step(RecordsDelivered([delivery("a", "r1"), delivery("a", "r1")]), TimePassed(1))
    (counted,) = [c for c in cmds if isinstance(c, CountResults)]
    assert counted.results[0].records_processed == 1 and counted.results[0].duplicates_dropped == 1
    assert not any(isinstance(c, MarkStored) for c in cmds)
