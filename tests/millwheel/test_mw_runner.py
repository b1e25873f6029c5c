"""The pure key runner: dedup, timer order, late flags, state changes, productions."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millwheel import WALL, WATERMARK, Computation, Record
from millwheel._runner import KeyInput, UndeclaredStream, run_key
from millwheel._store import KEEP


class Recorder(Computation):
    """Counts records in state, logs what it saw, sets the timers records ask for."""

    def __init__(self) -> None:
        self.seen: list = []

    def process_record(self, ctx, record):
        self.seen.append(("record", record.id, record.is_late))
        ctx.state = (ctx.state or 0) + 1
        for tag, ts, domain in record.value.get("timers", []):
            ctx.set_timer(tag, ts, domain)
        if record.value.get("emit"):
            ctx.produce("out", {"from": record.id})

    def process_timer(self, ctx, timer):
        self.seen.append(("timer", timer.tag, timer.timestamp_us))
        if timer.tag == "chain":
            ctx.set_timer("chained", timer.timestamp_us - 5)  # already due: fires in this same call
        ctx.produce("out", {"timer": timer.tag})


def rec(i: str, ts: int = 100, **value) -> Record:
    return Record("k", value, ts, id=i, sender="up", produced_at_us=1)


def inp(records, state=None, timers=None, dups=(), wm=0, now=0) -> KeyInput:
    return KeyInput("c", "k", records, state, dict(timers or {}), set(dups), wm, now, ("out",))


def test_same_record_twice_changes_state_once():
    comp = Recorder()
    res = run_key(comp, inp([rec("r1"), rec("r1"), rec("r2")]))
    assert res.state == b"2" and res.duplicates_dropped == 1
    assert [p[0] for p in res.processed] == ["r1", "r2"]
    again = run_key(comp, inp([rec("r1")], state=res.state, dups={"r1"}))
    assert again.state is KEEP and again.duplicates_dropped == 1 and again.processed == []


def test_exactly_once_off_lets_duplicates_through():
    comp = Recorder()
    comp.exactly_once = False
    res = run_key(comp, inp([rec("r1"), rec("r1")], dups={"r1"}))
    assert res.state == b"2" and res.processed == []


def test_timers_fire_in_increasing_order_including_ones_set_while_firing():
    comp = Recorder()
    timers = {"late": (90, WATERMARK), "early": (10, WATERMARK), "chain": (50, WATERMARK),
              "future": (500, WATERMARK), "wall": (20, WALL)}
    res = run_key(comp, inp([], state=b"0", timers=timers, wm=100, now=30))
    assert [s[1] for s in comp.seen] == ["early", "wall", "chain", "chained", "late"]
    # pending timers fire in timestamp order; one set in the past while firing fires right after
    assert [t.timestamp_us for t in res.fired] == [10, 20, 50, 45, 90]
    assert res.timers == {"future": (500, WATERMARK)}
    assert sorted(res.timers_deleted) == ["chain", "early", "late", "wall"]
    assert res.timers_set == []


def test_late_records_are_flagged_not_dropped():
    comp = Recorder()
    res = run_key(comp, inp([rec("old", ts=10), rec("new", ts=200)], wm=100))
    assert comp.seen == [("record", "old", True), ("record", "new", False)]
    assert res.late_records == 1 and res.records_processed == 2


def test_productions_get_deterministic_ids_and_default_timestamps():
    a = run_key(Recorder(), inp([rec("r1", ts=70, emit=True)]))
    b = run_key(Recorder(), inp([rec("r1", ts=70, emit=True)]))
    assert [p.id for p in a.productions] == [p.id for p in b.productions] == ["r1/0"]
    assert a.productions[0].timestamp_us == 70 and a.productions[0].key == "k"


def test_undeclared_stream_is_refused():
    class Bad(Recorder):
        def process_record(self, ctx, record):
            ctx.produce("elsewhere", 1)
    with pytest.raises(UndeclaredStream, match="elsewhere"):
        run_key(Bad(), inp([rec("r")]))


def test_unchanged_state_is_not_rewritten_and_none_deletes():
    class Reader(Recorder):
        def process_record(self, ctx, record):
            if record.value.get("clear"):
                ctx.state = None
            else:
                _ = ctx.state
    assert run_key(Reader(), inp([rec("r")], state=b"5")).state is KEEP
    assert run_key(Reader(), inp([rec("r", clear=True)], state=b"5")).state is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=12), max_size=15))
def test_any_mix_of_repeats_changes_state_once_per_id(batches):
    """Batches of deliveries with arbitrary repeats, each run against what earlier batches committed
    (the store's dedup truth): the count equals the number of distinct ids."""
    comp, state, committed = Recorder(), None, set()
    for batch in batches:
        res = run_key(comp, inp([rec(f"r{i}") for i in batch], state=state, dups=set(committed)))
        if res.state is not KEEP:
            state = res.state
        committed.update(rid for rid, _, _ in res.processed)
    distinct = len({i for b in batches for i in b})
    assert (int(state) if state is not None else 0) == distinct == len(committed)


class _Mixed(Recorder):
    """Reads or clears state, sets, moves and deletes timers, produces to its stream and re-keys, by what
    each record asks for: enough to tell one key's leftovers in a shared context from a fresh one's."""

    def process_record(self, ctx, record):
        v = record.value
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
            ctx.produce("out", {"n": n, "timers": sorted(ctx.timers())}, key=None if n % 2 else f"{ctx.key}-{n}")


_TAGS = st.sampled_from(["a", "b", "chain"])
_VALUES = st.fixed_dictionaries({}, optional={
    "clear": st.booleans(), "read": st.booleans(), "emit": st.integers(0, 3),
    "timers": st.lists(st.tuples(_TAGS, st.integers(0, 200), st.sampled_from([WATERMARK, WALL])), max_size=2),
    "delete": st.lists(_TAGS, max_size=2)})
_KEYS = st.lists(st.tuples(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 200), _VALUES), max_size=6),   # (id, ts, value)
    st.sampled_from([None, b'["x", 3]', b"[null, 0]"]),                                  # stored state
    st.dictionaries(_TAGS, st.tuples(st.integers(0, 200), st.sampled_from([WATERMARK, WALL])), max_size=3)),
    max_size=8)


@settings(max_examples=200, deadline=None)
@given(_KEYS, st.sets(st.integers(0, 12).map(lambda i: f"r{i}")), st.integers(0, 200), st.integers(0, 200),
       st.booleans())
def test_a_key_runner_over_many_keys_gives_what_run_key_gives_key_by_key(keys, dups, wm, now, exactly_once):
    """:class:`KeyRunner` runs every key of a command from their shared input: each key's result (state, timers,
    productions, counts, what user code saw) equals a fresh :func:`run_key` of that key alone."""
    from millwheel._runner import KeyRunner

    def records(key, rows):
        return [Record(key, value, ts, id=f"r{i}", sender="up", produced_at_us=1) for i, ts, value in rows]

    shared, fresh = _Mixed(), _Mixed()
    shared.exactly_once = fresh.exactly_once = exactly_once
    runner = KeyRunner(shared, "c", ("out",), set(dups), wm, now)
    for n, (rows, state, timers) in enumerate(keys):
        key = f"k{n}"
        got = runner.run(key, records(key, rows), state, dict(timers))
        want = run_key(fresh, KeyInput("c", key, records(key, rows), state, dict(timers), set(dups), wm, now,
                                       ("out",)))
        assert got == want
        assert shared.seen == fresh.seen


def test_a_context_kept_past_its_call_never_sees_a_later_key():
    """Each key of a :class:`KeyRunner` gets a context of its own: one user code kept (against the
    protocol) still names its own key and productions after later keys ran."""
    from millwheel._runner import KeyRunner

    kept = []

    class Keeper(Computation):
        name = "c"
        produces = ("out",)

        def process_record(self, ctx, record):
            kept.append(ctx)
            ctx.produce("out", record.value)

    runner = KeyRunner(Keeper(), "c", ("out",), set(), 0, 1)
    first = runner.run("k1", [Record("k1", 1, 5, id="r1", sender="up", produced_at_us=1)], None, {})
    runner.run("k2", [Record("k2", 2, 5, id="r2", sender="up", produced_at_us=1)], None, {})
    assert kept[0] is not kept[1]
    assert kept[0].key == "k1" and [p.value for p in kept[0].productions] == [1] == [p.value for p in first.productions]
