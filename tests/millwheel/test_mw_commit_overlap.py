"""A worker's commit runs beside its next steps: other keys are processed meanwhile (the thread does
not wait for the landing; their checkpoints go out together when it lands), the committing key waits,
acks follow the landing, and dedup GC does not pass the productions of a commit in flight."""
from __future__ import annotations

import threading
from typing import ClassVar

import orjson
import pytest
from mw_helpers import GatedCommits
from test_mw_runtime import Count, QueueInjector, topo

from millwheel import Runtime, RuntimeConfig
from millwheel._store import SQLiteStore
from photon import wait_until


class Seen(Count):
    """Count that also notes every (key, i) its user code ran on."""
    ran: ClassVar[list] = []
    lock = threading.Lock()

    def process_record(self, ctx, record):
        with Seen.lock:
            Seen.ran.append((record.key, record.value["i"]))
        super().process_record(ctx, record)


def _rec(key, i):
    return key, {"i": i}, 1_000_000 + i * 10


@pytest.mark.timeout(60)
def test_the_next_step_runs_other_keys_while_a_commit_is_in_flight(tmp_path):
    Seen.ran = []
    store = GatedCommits(str(tmp_path / "s.db"), "count", "k0")
    inj = QueueInjector()
    rt = Runtime(topo(inj, Seen), RuntimeConfig(threads=1, intervals=1), store=store).start()
    try:
        inj.push([_rec("k0", 0)], estimate=0)
        assert store.entered.wait(30)          # k0's checkpoint is in flight, held by the store
        inj.push([_rec("k0", 1), _rec("k1", 2)])
        wait_until(lambda: ("k1", 2) in Seen.ran, 30, message="k1 run while k0's commit is in flight")
        # the worker thread does not wait for the commit in flight after k1's step (group commit): it
        # takes and runs k2, which arrives after that step, while k0's commit is still held
        inj.push([_rec("k2", 3)])
        wait_until(lambda: ("k2", 3) in Seen.ran, 10, message="k2 run while k0's commit is still in flight")
        assert ("k0", 1) not in Seen.ran       # k0 stays locked until its commit lands
        worker = rt.workers[0]
        assert worker.busy
        assert worker.steps_grouped >= 2       # k1's and k2's checkpoints wait beside the commit in flight
        assert rt.statistics().computations["count"].records_processed == 0   # counted at the landing
        assert rt.tracker.in_flight > 0        # nothing acked before its commit landed
        store.release.set()
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 4, 30, message="all counted")
        assert Seen.ran.index(("k0", 0)) < Seen.ran.index(("k0", 1))
        states = {k: orjson.loads(v)["n"] for k, v in store.read_states("count", ["k0", "k1", "k2"]).items()}
        assert states == {"k0": 2, "k1": 1, "k2": 1}
        wait_until(lambda: rt.tracker.in_flight == 0 and not worker.busy, 30, message="acked after the landing")
    finally:
        store.release.set()
        rt.stop()


@pytest.mark.timeout(60)
def test_dedup_gc_never_passes_the_productions_of_a_commit_in_flight(tmp_path):
    """``count``'s timer productions are stamped in one step and registered only when its commit lands,
    after the next step has run: a dedup GC meanwhile must not raise ``collect``'s floor for ``count``
    past them, or their first delivery would be dropped as a repeat."""

    class GatedTimerCommits(SQLiteStore):
        def __init__(self, path):
            super().__init__(path)
            self.entered, self.release = threading.Event(), threading.Event()

        def commit(self, writes):
            if not self.entered.is_set() and any(w.computation == "count" and w.productions for w in writes):
                self.entered.set()
                self.release.wait(30)
            return super().commit(writes)

    store = GatedTimerCommits(str(tmp_path / "s.db"))
    inj = QueueInjector()
    cfg = RuntimeConfig(threads=1, intervals=1, dedup_retention_us=1, gc_interval_us=20_000)
    rt = Runtime(topo(inj), cfg, store=store).start()
    try:
        inj.push([_rec("k0", 0), _rec("k1", 1)], estimate=0)
        inj.push([], estimate=10_000_000)      # the timers fire: their reports are stamped and committed
        assert store.entered.wait(30)
        first = rt._gc_round     # a round started after the productions were stamped has completed:
        wait_until(lambda: rt._gc_round >= first + 2, 30, message="dedup GC rounds during the commit")
        store.release.set()
        wait_until(lambda: store.read_states("collect", ["all"]).get("all") is not None
                   and len(orjson.loads(store.read_states("collect", ["all"])["all"])) == 2, 30,
                   message="both reports collected")
        assert rt.statistics().computations["collect"].duplicates_dropped == 0
    finally:
        store.release.set()
        rt.stop()
