"""A command's keys run and land in bulk: :meth:`KeyRunner.run_all` against :meth:`KeyRunner.run` key by key
(with the worker's per-key :class:`KeyFailed`), and an interval core's bulk answer to a run (every key's
productions encoded in one call, the keys without timers applied in one pass) against the per-key form it
replaced, on random records, user code, failures and landings."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import WALL, WATERMARK, Computation, Record
from millwheel._interval import (_HANDLERS, CheckpointCommitted, Commit, IntervalCore, IntervalGranted,
                                 IntervalSettings, KeyFailed, RecordsDelivered, RunUserCode, TimePassed,
                                 UserCodeRan, Write, encode_all)
from millwheel._interval_events import KeyWork
from millwheel._model import Delivery
from millwheel._runner import KeyRunner, UserCodeFailed

pytestmark = pytest.mark.timeout(240)


class _User(Computation):
    """Reads, sets or clears state, sets and deletes timers, produces, and raises, by what each record asks
    for; logs what it saw (a shared context would show in the log)."""

    def __init__(self) -> None:
        self.seen: list = []

    def process_record(self, ctx, record):
        v = record.value
        self.seen.append((ctx.key, record.id, record.is_late, ctx.input_watermark_us, ctx.now_us))
        if v.get("fail"):
            raise ValueError(f"no {record.id}")
        if v.get("clear"):
            ctx.state = None
        elif v.get("read"):
            _ = ctx.state
        else:
            ctx.state = [ctx.key, (ctx.state or [None, 0])[1] + 1]
        for tag, ts, domain in v.get("timers", []):
            ctx.set_timer(tag, ts, domain)
        for tag in v.get("delete", []):
            ctx.delete_timer(tag)
        for n in range(v.get("emit", 0)):
            ctx.produce("out", {"n": n, "id": record.id}, key=None if n % 2 else f"{ctx.key}-{n}")

    def process_timer(self, ctx, timer):
        self.seen.append((ctx.key, "timer", timer.tag, timer.timestamp_us))
        ctx.produce("out", {"timer": timer.tag})


_TAGS = st.sampled_from(["a", "b", "c"])
_VALUES = st.fixed_dictionaries({}, optional={
    "fail": st.sampled_from([False, False, True]), "clear": st.booleans(), "read": st.booleans(),
    "emit": st.integers(0, 3),
    "timers": st.lists(st.tuples(_TAGS, st.integers(0, 200), st.sampled_from([WATERMARK, WALL])), max_size=2),
    "delete": st.lists(_TAGS, max_size=2)})
_KEYS = st.lists(st.tuples(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 200), _VALUES), max_size=5),   # (id, ts, value)
    st.sampled_from([None, b'["x", 3]', b"[null, 0]"]),                                  # state
    st.booleans(),                                                                       # read from the store
    st.dictionaries(_TAGS, st.tuples(st.integers(0, 200), st.sampled_from([WATERMARK, WALL])), max_size=3)),
    max_size=8)


@settings(max_examples=250, deadline=None)
@given(_KEYS, st.sets(st.integers(0, 12).map(lambda i: f"r{i}")), st.integers(0, 200), st.integers(0, 200),
       st.booleans())
def test_run_all_gives_what_run_gives_key_by_key_failures_included(keys, dups, wm, now, exactly_once):
    """Every key's result (state, timers set, moved and deleted, productions, ids processed, counts), each
    failure (key, record, error text) and what user code saw, in order, equal :meth:`KeyRunner.run` called
    key by key with the worker's ``KeyFailed`` for a :class:`UserCodeFailed`."""
    works, states = [], {}
    for n, (rows, state, read, timers) in enumerate(keys):
        key = f"k{n}"
        records = [Record(key, value, ts, id=f"r{i}", sender="up", produced_at_us=i) for i, ts, value in rows]
        works.append(KeyWork(key, records, dict(timers), None if read else state, read))
        if read and state is not None:
            states[key] = state
    bulk, one = _User(), _User()
    bulk.exactly_once = one.exactly_once = exactly_once
    got = KeyRunner(bulk, "c", ("out",), set(dups), wm, now).run_all(works, states)
    run = KeyRunner(one, "c", ("out",), set(dups), wm, now).run
    want = []
    for w in works:
        try:
            want.append(run(w.key, w.records, states.get(w.key) if w.read else w.state, w.timers))
        except UserCodeFailed as e:
            want.append(KeyFailed(w.key, e.record_id, e.error))
    assert got == want
    assert bulk.seen == one.seen


def _apply_one_by_one(core: IntervalCore, ev: CheckpointCommitted, out: list) -> None:
    """:meth:`IntervalCore._on_committed` as it was, with ``_apply`` key by key."""
    run = core._commits.get(ev.commit_id)
    if run is None:
        return IntervalCore._on_committed(core, ev, out)
    saved = core._apply_all
    core._apply_all = lambda results, works: [core._apply(res, works[res.key].timers) for res in results]
    try:
        IntervalCore._on_committed(core, ev, out)
    finally:
        core._apply_all = saved


def _ran_one_by_one(core: IntervalCore, ev: UserCodeRan, out: list) -> None:
    """:meth:`IntervalCore._on_ran` as it was: each state read put in the cache, each key's productions
    encoded on their own, results and failures split by ``isinstance``."""
    run = core._runs.pop(ev.run_id)
    for key, value in ev.states_read.items():
        core.cache.put(key, value)
    weak = core.s.weak
    run.results = [r for r in ev.results if not isinstance(r, KeyFailed)]
    core._failed([r for r in ev.results if isinstance(r, KeyFailed)], run)
    for res in run.results:
        prods = encode_all(res.productions)
        run.prods[res.key] = prods
        aside = core._set_aside(run.aside[res.key]) if run.aside and res.key in run.aside else []
        processed = res.processed + [(r.id, r.sender, r.produced_at_us) for r in aside] \
            if aside and core.s.exactly_once else res.processed
        run.writes[res.key] = Write(core.name, core.interval, core.sequencer, res.key, res.state,
                                    res.timers_set, res.timers_deleted, processed,
                                    [] if weak else prods, set_aside=aside)
    if not run.writes:
        return
    if not weak:
        core._commit(run, list(run.writes.values()), out)
        return
    # the weak tail is the same code in both forms: hand over to it with the writes made
    sent = [p for ps in run.prods.values() for p in ps]
    from millwheel._interval import SendProductions
    if sent:
        out.append(SendProductions(core.name, core.interval, sent, False))
    run.deadline_us = ev.now_us + core.s.weak_checkpoint_delay_us
    core._weak.append(run)


class _OneByOne(IntervalCore):
    """The core with the per-key forms of the run's answer and of the landing."""

    def handle(self, *events):
        out: list = []
        for ev in events:
            kind = type(ev)
            if kind is UserCodeRan:
                _ran_one_by_one(self, ev, out)
            elif kind is CheckpointCommitted:
                _apply_one_by_one(self, ev, out)
            else:
                _HANDLERS[kind](self, ev, out)
        return out


def _state(core: IntervalCore) -> tuple:
    return (dict(core.timers), {d: sorted(h) for d, h in core._heaps.items()}, dict(core._holds._counts),
            set(core.locked), dict(core.cache._d), bytes(core._bloom._array) if core._bloom else None,
            [d.record.id for d in core._incoming], dict(core._attempts), sorted(core._commits))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cache_keys", [0, 3])
def test_a_core_answers_runs_and_landings_in_bulk_as_key_by_key(seed, cache_keys):
    """Two cores of one interval fed the same random steps (records with repeats, late ones, timers set,
    moved and deleted, productions, user code raising until records are set aside, commits landing one or
    two steps later): the bulk core and the per-key one give the same commands (writes, productions sent,
    acks, counts) and keep the same timers, heaps, watermark holds, locks, cache, Bloom bits, waiting
    records and failure counts after every event."""
    rnd = random.Random(seed)
    settings_ = IntervalSettings("c", 0, exactly_once=True, cache_keys=cache_keys, max_attempts=2)
    cores = [IntervalCore(settings_), _OneByOne(settings_)]
    users = [_User(), _User()]
    granted = IntervalGranted(7, [("k1", "a", 50, WATERMARK), ("k2", "b", 400, WALL)], {"up": 3}, ["r-old"])
    for core in cores:
        assert core.handle(granted) == []
    landing: list[list] = [[], []]
    seen = {"failed": 0, "aside": 0, "timers": 0, "sent": 0, "dropped": 0}
    now, n_ids = 100, 0
    for step in range(60):
        now += rnd.randint(1, 40)
        ds = []
        for _ in range(rnd.randint(0, 12)):
            n_ids += 1
            rid = f"r{rnd.randint(0, n_ids)}" if rnd.random() < 0.2 else f"r{n_ids}"
            value = {"emit": rnd.randint(0, 2)}
            if rnd.random() < 0.08:
                value["fail"] = True
            if rnd.random() < 0.3:
                value["timers"] = [(rnd.choice("abc"), now + rnd.randint(-60, 80), rnd.choice([WATERMARK, WALL]))]
            if rnd.random() < 0.15:
                value["delete"] = [rnd.choice("abc")]
            if rnd.random() < 0.1:
                value["clear"] = True
            ds.append(Delivery("c", 0, Record(f"k{rnd.randint(0, 9)}", value, now + rnd.randint(-80, 20), rid,
                                              "s", "up", rnd.randint(0, 300))))
        outs = []
        for core, user, pending in zip(cores, users, landing):
            out = core.handle(RecordsDelivered(list(ds)), TimePassed(now))
            for cmd in list(out):
                if type(cmd) is RunUserCode:
                    states = {k: (None if int(k[1:]) % 3 else b'["s", 1]') for k in cmd.read_states}
                    results = KeyRunner(user, "c", ("out",), set(cmd.duplicates), cmd.input_watermark_us,
                                        cmd.now_us).run_all(cmd.keys, states)
                    out += core.handle(UserCodeRan(cmd.run_id, results, states, cmd.now_us))
                    seen["failed"] += sum(type(r) is KeyFailed for r in results)
                    seen["dropped"] += sum(r.duplicates_dropped for r in results if type(r) is not KeyFailed)
            for cmd in out:
                if type(cmd) is Commit:
                    seen["aside"] += sum(len(w.set_aside) for w in cmd.writes)
                    seen["timers"] += sum(len(w.timers_set) + len(w.timers_deleted) for w in cmd.writes)
                    seen["sent"] += sum(len(w.productions) for w in cmd.writes)
            pending.extend(c.commit_id for c in out if type(c) is Commit)
            outs.append((out, _state(core)))
        assert outs[0] == outs[1]
        land = rnd.random() < 0.6      # the commits pending land now or a step or more later
        for core, pending in zip(cores, landing):
            if land:
                landed = [core.handle(CheckpointCommitted(cid)) for cid in pending]
                pending.clear()
                outs.append((landed, _state(core)))
        if land:
            assert outs[2] == outs[3]
    assert users[0].seen == users[1].seen
    # the steps went through every branch compared: failures, set-asides, timers, productions, repeats
    assert seen["failed"] and seen["aside"] and seen["timers"] and seen["sent"] and seen["dropped"]
