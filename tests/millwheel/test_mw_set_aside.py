"""A record on which user code keeps failing is set aside after ``max_attempts`` tries, with its key, error
and attempts, in the store and in the same atomic write as the key's other changes; the runtime goes on
and every other record (of that key too) is processed once. A record that fails fewer times is processed
normally. One process, on SQLite and on the session's PostgreSQL."""
from __future__ import annotations

import threading
from collections import Counter

import orjson
import pytest

from millwheel import (WEAK, Computation, ListInjector, MillWheelConfigError, Runtime, RuntimeConfig,
                       SetAsideRecord, Topology)

pytestmark = pytest.mark.timeout(120)

POISON = 13          # user code always raises on this record
FLAKY = 21           # ... and on this one twice, then not
KEYS = 5
N = 200

_tries: Counter = Counter()
_tries_lock = threading.Lock()


class Picky(Computation):
    """Sums values per key and produces every record it took; changes its state before it raises, so a
    failed attempt that left anything behind would show."""

    def process_record(self, ctx, record):
        st = ctx.state or {"sum": 0, "n": 0}
        st["sum"] += record.value["i"]
        st["n"] += 1
        ctx.state = st
        ctx.produce("taken", {"i": record.value["i"]}, key="all")
        i = record.value["i"]
        if i == POISON:
            raise ValueError(f"cannot take record {i}")
        if i == FLAKY:
            with _tries_lock:
                _tries[i] += 1
                if _tries[i] <= 2:
                    raise ConnectionError("flaky dependency")

    def process_timer(self, ctx, timer):
        pass


class WeakPicky(Picky):
    productions = WEAK


class Collect(Computation):
    def process_record(self, ctx, record):
        ctx.state = (ctx.state or []) + [record.value["i"]]

    def process_timer(self, ctx, timer):
        pass


def _records():
    return [(f"k{i % KEYS}", {"i": i}, 1_000_000 + i * 10) for i in range(N)]


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    return request.getfixturevalue("pg_url")


@pytest.mark.parametrize("picky", [Picky, WeakPicky], ids=["strong", "weak"])
def test_a_record_user_code_keeps_failing_on_is_set_aside_and_the_others_go_on(store_url, picky):
    _tries.clear()
    t = Topology()
    t.add_injector("in", ListInjector(_records()), produces="nums")
    t.add_computation("picky", picky, consumes=["nums"], produces=["taken"])
    t.add_computation("collect", Collect, consumes=["taken"])
    rt = Runtime(t, RuntimeConfig(store=store_url, threads=2, intervals=4, max_attempts=3)).start()
    try:
        rt.run_until_idle(timeout_s=60)
        stats = rt.statistics()
        good = [i for i in range(N) if i != POISON]
        want = {f"k{k}": {"sum": sum(i for i in good if i % KEYS == k), "n": sum(1 for i in good if i % KEYS == k)}
                for k in range(KEYS)}
        states = rt.store.read_states("picky", list(want))
        assert {k: orjson.loads(v) for k, v in states.items()} == want
        taken = orjson.loads(rt.store.read_states("collect", ["all"])["all"])
        assert sorted(taken) == good, "each record but the poisoned one once, nothing of a failed attempt"
        aside = rt.store.set_aside_records()
        assert len(aside) == 1
        rec = aside[0]
        assert isinstance(rec, SetAsideRecord)
        assert (rec.computation, rec.key, rec.attempts) == ("picky", f"k{POISON % KEYS}", 3)
        assert rec.error == f"ValueError: cannot take record {POISON}"
        assert orjson.loads(rec.value) == {"i": POISON} and rec.sender == "in"
        assert rt.store.set_aside_records("collect") == []
        assert stats.computations["picky"].records_set_aside == 1
        assert stats.computations["picky"].records_processed == N - 1
        assert _tries[FLAKY] == 3, "the flaky record failed twice, then was processed"
    finally:
        rt.stop()


def test_a_set_aside_records_id_is_stored_as_processed(tmp_path):
    """Its id is stored with the key's write (exactly-once), so a copy sent again is dropped as a repeat."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    recs = [("k0", {"i": POISON}, 1_000_000), ("k0", {"i": 1}, 1_000_010)]

    def topo(records):
        t = Topology()
        t.add_injector("in", ListInjector(records), produces="nums")
        t.add_computation("picky", Picky, consumes=["nums"], produces=["taken"])
        t.add_computation("collect", Collect, consumes=["taken"])
        return t
    rt = Runtime(topo(recs), RuntimeConfig(store=url, threads=1, intervals=2, max_attempts=2)).start()
    try:
        rt.run_until_idle(timeout_s=60)
        aside = rt.store.set_aside_records("picky")
        assert [r.attempts for r in aside] == [2]
        assert rt.store.seen("picky", [aside[0].id]) == {aside[0].id}
    finally:
        rt.stop()


@pytest.mark.parametrize("bad", [0, -1, True, "5"])
def test_max_attempts_is_validated(bad):
    with pytest.raises(MillWheelConfigError, match="max_attempts"):
        RuntimeConfig.from_mapping({"max_attempts": bad})


def test_max_attempts_defaults_to_five():
    assert RuntimeConfig().max_attempts == 5


# ---- the pure interval core's part: attempts counted, records back first in line, then set aside -------

def test_the_interval_core_tries_a_failing_record_again_in_order_then_sets_it_aside():
    from millwheel._interval import (AckDeliveries, CheckpointCommitted, Commit, CountResults, IntervalCore,
                                     IntervalGranted, IntervalSettings, KeyFailed, RecordsDelivered, RunUserCode,
                                     TimePassed, UserCodeRan)
    from millwheel._model import Delivery, Record
    from millwheel._runner import KeyInput, run_key

    class Sum(Computation):
        def process_record(self, ctx, record):
            ctx.state = (ctx.state or 0) + record.value["i"]

        def process_timer(self, ctx, timer):
            pass

    core = IntervalCore(IntervalSettings("c", 0, max_attempts=2))
    core.handle(IntervalGranted(1, [], {}, []))
    ds = [Delivery("c", 0, Record("k", {"i": i}, 10 + i, f"r{i}", "s", "in", 50)) for i in (1, 2, 3)]
    (run,) = core.handle(RecordsDelivered(ds), TimePassed(100))
    for attempt in (1, 2):
        assert isinstance(run, RunUserCode) and [r.id for r in run.keys[0].records] == ["r1", "r2", "r3"]
        assert core.handle(UserCodeRan(run.run_id, [KeyFailed("k", "r2", "ValueError: no")], {"k": None}, 100)) == []
        assert "k" not in core.locked and core.wants_step(100)
        (run,) = core.handle(TimePassed(100 + attempt))
    assert [r.id for r in run.keys[0].records] == ["r1", "r3"], "set aside: not run again"
    res = run_key(Sum(), KeyInput("c", "k", run.keys[0].records, None, {}, set(), 0, 102))
    (commit,) = core.handle(UserCodeRan(run.run_id, [res], {}, 102))
    assert isinstance(commit, Commit)
    (write,) = commit.writes
    assert [(r.id, r.key, r.attempts, r.error) for r in write.set_aside] == [("r2", "k", 2, "ValueError: no")]
    assert {p[0] for p in write.processed} == {"r1", "r2", "r3"} and write.state == b"4"
    out = core.handle(CheckpointCommitted(commit.commit_id))
    counted = next(c for c in out if isinstance(c, CountResults))
    assert [r.id for r in counted.set_aside] == ["r2"]
    acked = next(c for c in out if isinstance(c, AckDeliveries))
    assert sorted(d.record.id for d in acked.deliveries) == ["r1", "r2", "r3"]
    assert not core.wants_step(200)
