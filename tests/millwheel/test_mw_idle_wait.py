"""A worker with nothing to do waits on its inbox until its earliest processing-time timer is due (at most
``IDLE_WAIT_US``) instead of taking an empty step every ``tick_us``; anything that can give it work wakes
it, and a wake that comes while it is not waiting is not lost."""
from __future__ import annotations

import threading

import pytest
from mw_helpers import GatedCommits
from test_mw_runtime import QueueInjector

from millwheel import WALL, Computation, Runtime, RuntimeConfig, Topology
from millwheel._transport import Inbox
from millwheel._worker import IDLE_WAIT_US, _Comp
from photon import FakeClock, wait_until

TICK_US = 5_000


class Alarm(Computation):
    """Each record sets a processing-time timer ``value["in_us"]`` after the time of its step; the timer
    counts its firing in the key's state."""

    def process_record(self, ctx, record):
        ctx.state = {"fired": (ctx.state or {}).get("fired", 0), "due": ctx.now_us + record.value["in_us"]}
        ctx.set_timer("alarm", ctx.state["due"], WALL)

    def process_timer(self, ctx, timer):
        ctx.state = {**ctx.state, "fired": ctx.state["fired"] + 1}


def _runtime(tmp_path, clock, store=None):
    inj = QueueInjector()
    t = Topology()
    t.add_injector("in", inj, produces="alarms")
    t.add_computation("alarm", Alarm, consumes=["alarms"])
    cfg = RuntimeConfig(store=f"sqlite:///{tmp_path / 'state.db'}", threads=1, intervals=1, tick_us=TICK_US)
    rt = Runtime(t, cfg, clock=clock, **({"store": store} if store is not None else {}))
    return rt, inj


def _idle_wait(worker) -> float:
    with worker._step_lock:
        return worker.idle_wait_s()


def _processed(rt) -> int:
    return rt.statistics().computations["alarm"].records_processed


def _settled(rt, worker, n: int) -> bool:
    return (_processed(rt) == n and not worker.busy and len(worker.inbox) == 0
            and rt.tracker.outstanding_count("in") == 0)


@pytest.mark.timeout(60)
def test_an_idle_workers_wait_is_its_earliest_processing_time_timer_and_the_timer_still_fires(tmp_path):
    clock = FakeClock()
    rt, inj = _runtime(tmp_path, clock)
    worker = rt.workers[0]
    rt.start()
    try:
        wait_until(lambda: not worker.busy and len(worker.inbox) == 0, 10, message="the worker idle")
        assert _idle_wait(worker) == IDLE_WAIT_US / 1e6          # no timer, nothing waiting: the bound
        inj.push([("k", {"in_us": 30_000}, clock.now_us())], estimate=clock.now_us())
        wait_until(lambda: _settled(rt, worker, 1), 10, message="the record processed and committed")
        assert _idle_wait(worker) == 0.03                        # its timer is due 30 ms (of this clock) on
        inj.push([("k2", {"in_us": 1_000}, clock.now_us())])
        wait_until(lambda: _settled(rt, worker, 2), 10, message="the second record processed and committed")
        assert _idle_wait(worker) == TICK_US / 1e6               # due within a tick: the tick
        inj.push([("k2", {"in_us": 10_000_000}, clock.now_us())])   # k2's timer moved 10 s on
        wait_until(lambda: _settled(rt, worker, 3), 10, message="the third record processed and committed")
        # k's timer is the earliest set now; k2's replaced one stays on the heap until its time passes,
        # an early look (the tick here), never a later one
        assert _idle_wait(worker) == TICK_US / 1e6
        clock.advance(30_000)                                    # k's timer is due now
        wait_until(lambda: rt.statistics().computations["alarm"].timers_fired >= 1, 10,
                   message="k's processing-time timer fired while the worker waited idle")
        wait_until(lambda: not worker.busy and len(worker.inbox) == 0, 10, message="the worker idle again")
        state = rt.store.read_states("alarm", ["k"])
        assert state and b'"fired":1' in state["k"]
        assert _idle_wait(worker) <= 10.0 and _idle_wait(worker) <= IDLE_WAIT_US / 1e6
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_a_worker_with_a_commit_in_flight_or_records_waiting_for_their_key_keeps_the_tick(tmp_path):
    """While a checkpoint is in flight (held by the store) the worker keeps its tick; a record for the key
    whose checkpoint is in flight waits in its core and keeps the tick too."""
    clock = FakeClock()
    store = GatedCommits(str(tmp_path / "gated.db"), "alarm", "k")
    rt, inj = _runtime(tmp_path, clock, store)
    worker = rt.workers[0]
    rt.start()
    try:
        wait_until(lambda: not worker.busy and len(worker.inbox) == 0, 10, message="the worker idle")
        inj.push([("k", {"in_us": 60_000_000}, clock.now_us())], estimate=clock.now_us())
        assert store.entered.wait(30)                            # k's checkpoint is in flight, held
        inj.push([("k", {"in_us": 60_000_000}, clock.now_us())])
        core = worker.comps["alarm"].cores[0]
        wait_until(lambda: core.wants_step(clock.now_us()) and len(worker.inbox) == 0, 10,
                   message="k's second record waits in its core")
        assert _idle_wait(worker) == TICK_US / 1e6
        store.release.set()
        wait_until(lambda: _settled(rt, worker, 2), 10, message="both records processed and committed")
        assert _idle_wait(worker) == IDLE_WAIT_US / 1e6          # k's timer is a minute on: the bound
    finally:
        store.release.set()
        rt.stop()


@pytest.mark.timeout(30)
def test_a_wake_while_the_taker_is_not_waiting_ends_its_next_wait():
    inbox = Inbox()
    inbox.wake()                                  # nobody waits yet: the wake is kept
    taken: list = []
    t = threading.Thread(target=lambda: taken.append(inbox.take(10, 60.0)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and taken == [[]]
    t = threading.Thread(target=lambda: taken.append(inbox.take(10, 60.0)), daemon=True)   # used up: waits
    t.start()
    t.join(0.2)
    assert t.is_alive()
    inbox.put_many(["x"])
    t.join(10)
    assert not t.is_alive() and taken[-1] == ["x"]


class _Core:
    """A stand-in core: whether it wants a step, and its earliest processing-time timer."""

    def __init__(self, wants: bool, wall_us: int | None = None) -> None:
        self.wants, self.wall_us = wants, wall_us

    def wants_step(self, now_us: int) -> bool:
        return self.wants

    def next_wall_timer_us(self) -> int | None:
        return self.wall_us


@pytest.mark.timeout(30)
def test_a_core_that_wants_a_step_keeps_the_tick_whatever_its_timers(tmp_path):
    """Weak checkpoints waiting for acks, a watermark timer due, records waiting for a key: any core that
    wants a step with no new item keeps its worker on the tick."""
    clock = FakeClock()
    rt, _ = _runtime(tmp_path, clock)
    worker = rt.workers[0]
    now = clock.now_us()
    worker.comps["x"] = _Comp(None, None, {0: _Core(False, now + 50_000), 1: _Core(False)})
    assert _idle_wait(worker) == 0.05
    worker.comps["x"].cores[2] = _Core(True, now + 10_000_000)
    assert _idle_wait(worker) == TICK_US / 1e6
