"""A commit that lands while its worker thread is idle is carried out on the commit thread (cores told,
senders acked, strong productions sent, watermarks reported) instead of waking the worker thread for it;
records that waited for their key's checkpoint still run at once after such a landing."""
from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter

import orjson
import pytest
from mw_helpers import GatedCommits
from test_mw_commit_overlap import Seen, _rec
from test_mw_runtime import QueueInjector, topo

from millwheel import Runtime, RuntimeConfig
from millwheel._store import SQLiteStore
from photon import wait_until


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [3, 11])
def test_landings_on_the_commit_thread_give_the_counts_of_one_record_at_a_time(tmp_path, seed):
    """Random keys in random small batches with random pauses (so that commits land both with the worker
    thread idle and at work): every key's state, every report and every ack are what counting the records
    one by one gives, and some landings were carried out on the commit thread."""
    rng = random.Random(seed)
    store = SQLiteStore(str(tmp_path / "s.db"))
    inj = QueueInjector()
    rt = Runtime(topo(inj), RuntimeConfig(threads=1, intervals=2), store=store).start()
    try:
        expected: Counter = Counter()
        i = 0
        for _ in range(60):
            batch = []
            for _ in range(rng.randint(1, 4)):
                key = f"k{rng.randrange(6)}"
                batch.append((key, {"i": i}, 1_000_000 + i * 10))
                expected[key] += 1
                i += 1
            inj.push(batch, estimate=0)
            time.sleep(rng.choice([0, 0.001, 0.005, 0.02]))
        worker = rt.workers[0]
        wait_until(lambda: rt.statistics().computations["count"].records_processed == i, 60, message="all counted")
        wait_until(lambda: rt.tracker.in_flight == 0 and rt.tracker.outstanding_count("in") == 0
                   and not worker.busy, 30, message="every record acked")
        states = {k: orjson.loads(v)["n"] for k, v in store.read_states("count", list(expected)).items()}
        assert states == dict(expected)
        assert rt.statistics().computations["count"].duplicates_dropped == 0
        assert worker.landed_on_commit_thread > 0
        inj.push([], estimate=10_000_000)     # the timers fire: one report per key, with its whole count
        wait_until(lambda: store.read_states("collect", ["all"]).get("all") is not None
                   and len(orjson.loads(store.read_states("collect", ["all"])["all"])) == len(expected), 30,
                   message="every key's report collected")
        reports = orjson.loads(store.read_states("collect", ["all"])["all"])
        assert {r["key"]: r["n"] for r in reports} == dict(expected)
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_records_waiting_for_their_keys_checkpoint_run_when_the_commit_thread_lands_it(tmp_path):
    """k0's second record waits in its core while k0's first checkpoint is in flight; the worker thread is
    idle when the commit lands (and its tick is far off), so the landing, carried out on the commit
    thread, must wake the worker thread for the record that waited."""
    Seen.ran = []
    store = GatedCommits(str(tmp_path / "s.db"), "count", "k0")
    inj = QueueInjector()
    rt = Runtime(topo(inj, Seen), RuntimeConfig(threads=1, intervals=1), store=store)
    worker = rt.workers[0]
    worker.config = dataclasses.replace(worker.config, tick_us=20_000_000)   # no step by the tick meanwhile
    rt.start()
    try:
        inj.push([_rec("k0", 0)], estimate=0)
        assert store.entered.wait(30)          # k0's first checkpoint is in flight, held by the store
        inj.push([_rec("k0", 1)])
        core = worker.comps["count"].cores[0]
        wait_until(lambda: core.wants_step(0) and len(worker.inbox) == 0 and not worker._step_lock.locked(), 10,
                   message="k0's second record waits in its core, the worker thread idle")
        assert ("k0", 1) not in Seen.ran
        store.release.set()
        wait_until(lambda: ("k0", 1) in Seen.ran, 2, message="the waiting record run after the landing")
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 2, 10, message="both counted")
        assert orjson.loads(store.read_states("count", ["k0"])["k0"])["n"] == 2
    finally:
        store.release.set()
        rt.stop()
