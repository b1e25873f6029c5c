"""A worker's transactions run on its own two threads, the one that took the step running it while the other
steps: one transaction at a time, in order, with the counts of one record at a time."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter

import orjson
import pytest
from test_mw_runtime import QueueInjector, topo

from millwheel import Runtime, RuntimeConfig
from millwheel._store import SQLiteStore
from millwheel._transport import Inbox
from photon import wait_until


class SlowCommits(SQLiteStore):
    """Commits of the workers' computations take a random while; notes the thread that ran each and the most
    of them running at once."""

    def __init__(self, path, seed):
        super().__init__(path)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.threads: Counter = Counter()

    def commit(self, writes):
        if not any(w.computation in ("count", "collect") for w in writes):
            return super().commit(writes)         # the injector's position
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            t = threading.current_thread()
            self.threads[(t.name, t.ident)] += 1
            pause = self.rng.choice([0, 0, 0.001, 0.004, 0.015])
        try:
            time.sleep(pause)
            return super().commit(writes)
        finally:
            with self.lock:
                self.running -= 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [2, 7, 19])
def test_transactions_on_the_workers_two_threads_give_the_counts_of_one_record_at_a_time(tmp_path, seed):
    """Random keys in random small batches with random pauses, commits of random length: every key's state
    and every report are what counting the records one by one gives, nothing was counted twice, no two
    transactions of the worker ran at once, every one ran on one of the worker's own two threads (both ran
    some), steps were taken while a transaction ran, and no commit thread exists."""
    rng = random.Random(seed)
    store = SlowCommits(str(tmp_path / "s.db"), seed)
    inj = QueueInjector()
    rt = Runtime(topo(inj), RuntimeConfig(threads=1, intervals=2), store=store).start()
    try:
        expected: Counter = Counter()
        i = 0
        for _ in range(80):
            batch = []
            for _ in range(rng.randint(1, 4)):
                key = f"k{rng.randrange(7)}"
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
        assert store.most == 1
        names = {name for name, _ in store.threads}
        assert names == {"millwheel-worker-0"}
        assert len({ident for _, ident in store.threads}) == 2
        assert worker.steps_grouped > 0
        assert not [t for t in threading.enumerate() if "commit" in t.name]
        inj.push([], estimate=10_000_000)     # the timers fire: one report per key, with its whole count
        wait_until(lambda: store.read_states("collect", ["all"]).get("all") is not None
                   and len(orjson.loads(store.read_states("collect", ["all"])["all"])) == len(expected), 30,
                   message="every key's report collected")
        reports = orjson.loads(store.read_states("collect", ["all"])["all"])
        assert {r["key"]: r["n"] for r in reports} == dict(expected)
        assert store.most == 1
    finally:
        rt.stop()


@pytest.mark.timeout(30)
def test_a_put_while_a_thread_has_its_turn_wakes_nobody_and_ending_the_turn_hands_it_over():
    """Two threads taking from one inbox in turns: while one has its turn, a put leaves the waiting one
    asleep (the one with the turn looks again); ending the turn with ``hand_over`` wakes it, and it gets the
    turn and the items, in the order put. Without a turn held a put wakes the waiting thread at once."""
    inbox = Inbox()
    inbox.put_many([0])
    assert inbox.turn(10.0, 10.0) and inbox.take_now(10) == [0]   # this thread has the turn at once
    got: list = []
    woke = threading.Event()

    def waiter():
        if inbox.turn(20.0, 20.0):
            got.extend(inbox.take_now(100))
            inbox.end_turn(hand_over=False)
        woke.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    wait_until(lambda: len(inbox.cond._waiters) == 1, 5, message="the other thread waits")
    inbox.put_many([1, 2])
    inbox.put_many([3])
    assert not woke.wait(0.3)                     # the turn is held here: nobody woken
    inbox.end_turn(hand_over=True)
    assert woke.wait(5)
    assert got == [1, 2, 3]
    t.join(5)
    woke.clear()
    got.clear()
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    wait_until(lambda: len(inbox.cond._waiters) == 1, 5, message="the other thread waits")
    inbox.put_many([4])                           # no turn held: wakes it at once (its tick is 20 s away)
    assert woke.wait(5)
    assert got == [4]
