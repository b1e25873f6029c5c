"""A worker's second transaction in flight: checkpoints that write none of the rows of the commit in flight
go out beside it (on a second commit thread and store connection) instead of waiting for it to land; the
others wait as before. Every key's state, every production and every ack end as with one transaction at a
time, on the real PostgreSQL store."""
from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import orjson
import pytest
from test_mw_commit_overlap import GatedCommits, Seen, _rec
from test_mw_runtime import QueueInjector, topo

from millwheel import Computation, Runtime, RuntimeConfig, Topology
from millwheel._pgstore import PostgresStore
from photon import wait_until

INTERVALS = 2


class Forward(Computation):
    """Counts records per key and forwards each, keyed anew, to ``tally`` (strong, exactly once)."""

    def process_record(self, ctx, record):
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("fwd", {"i": record.value["i"]}, key=f"t{record.value['i'] % 5}")

    def process_timer(self, ctx, timer):
        pass


class Tally(Computation):
    def process_record(self, ctx, record):
        ctx.state = sorted((ctx.state or []) + [record.value["i"]])

    def process_timer(self, ctx, timer):
        pass


def _topology(inj) -> Topology:
    t = Topology()
    t.add_injector("in", inj, produces="nums")
    t.add_computation("forward", Forward, consumes=["nums"], produces=["fwd"])
    t.add_computation("tally", Tally, consumes=["fwd"])
    return t


class SlowLandings(PostgresStore):
    """Each transaction's answer comes back a random while after it committed (its bookkeeping of the
    production rows lands only then), so that transactions overlap in every order."""

    def __init__(self, *a, seed: int, **kw) -> None:
        super().__init__(*a, **kw)
        self._rng, self._rng_lock = random.Random(seed), threading.Lock()

    def _commit(self, conn, attempt, net):
        landed = super()._commit(conn, attempt, net)
        with self._rng_lock:
            pause = self._rng.choice([0, 0, 0.002, 0.005, 0.01, 0.02])
        time.sleep(pause)
        return landed


def _run(url: str, seed: int, in_flight: int) -> dict:
    """Random keys in random small batches with random pauses through ``forward`` and ``tally``; what the
    store and the runtime hold once every record is acked."""
    rng = random.Random(seed)
    base = PostgresStore.from_url(url)
    store = SlowLandings(base.conninfo, schema=base.schema, seed=seed)
    base.close()
    inj = QueueInjector()
    rt = Runtime(_topology(inj), RuntimeConfig(threads=1, intervals=INTERVALS, commits_in_flight=in_flight),
                 store=store).start()
    try:
        expected: Counter = Counter()
        n = 0
        for _ in range(80):
            batch = []
            for _ in range(rng.randint(1, 4)):
                key = f"k{rng.randrange(8)}"
                batch.append((key, {"i": n}, 1_000_000 + n * 10))
                expected[key] += 1
                n += 1
            inj.push(batch, estimate=0)
            time.sleep(rng.choice([0, 0.001, 0.005, 0.02]))
        worker = rt.workers[0]
        wait_until(lambda: rt.statistics().computations["tally"].records_processed == n, 60,
                   message="every record tallied")
        wait_until(lambda: rt.tracker.in_flight == 0 and rt.tracker.outstanding_count("in") == 0
                   and rt.tracker.outstanding_count("forward") == 0 and not worker.busy, 60,
                   message="every record and production acked")
        stats = rt.statistics().computations
        with store._conn() as conn:
            rows = conn.execute("SELECT count(*) FROM production_batches").fetchone()[0]
        return {
            "forward": {k: orjson.loads(v) for k, v in store.read_states("forward", list(expected)).items()},
            "tally": {k: orjson.loads(v) for k, v in store.read_states("tally", [f"t{j}" for j in range(5)]).items()},
            "expected": dict(expected),
            "processed": {c: (stats[c].records_processed, stats[c].duplicates_dropped) for c in ("forward", "tally")},
            "pending": {(s, i): [p.id for p in store.pending_productions(s, i)]
                        for s in ("in", "forward") for i in range(INTERVALS)},
            "rows": rows,
            "beside": worker.commits_beside,
        }
    finally:
        rt.stop()
        store.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [2, 7, 13])
def test_transactions_beside_each_other_end_as_one_at_a_time(pg_server, seed):
    """The same random input with two transactions in flight and with one: the same states of both
    computations (each what counting the records one by one gives), every record processed once, every
    production acked and its row deleted, and some transactions went out beside another."""
    urls = [f"{pg_server.url}?schema=t_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    one = _run(urls[0], seed, 1)
    two = _run(urls[1], seed, 2)
    assert one["beside"] == 0
    assert two["beside"] > 0
    for got in (one, two):
        assert got["forward"] == got["expected"]
        assert sorted(i for v in got["tally"].values() for i in v) == list(range(sum(got["expected"].values())))
        assert got["processed"] == {"forward": (sum(got["expected"].values()), 0),
                                    "tally": (sum(got["expected"].values()), 0)}
        assert all(not ids for ids in got["pending"].values())
    assert two["forward"] == one["forward"]
    assert two["tally"] == one["tally"]
    assert two["processed"] == one["processed"]
    assert two["pending"] == one["pending"]
    assert two["rows"] == one["rows"] == 0


@pytest.mark.timeout(60)
def test_a_checkpoint_of_other_keys_lands_beside_a_commit_held_in_flight(tmp_path):
    """k0's checkpoint is held by the store; k1's, stepped meanwhile, writes none of its rows: it goes out
    beside it, lands, and k1's record is counted and acked while k0's commit is still held; k0's record is
    acked only after its own commit lands."""
    Seen.ran = []
    store = GatedCommits(str(tmp_path / "s.db"))
    inj = QueueInjector()
    rt = Runtime(topo(inj, Seen), RuntimeConfig(threads=1, intervals=1, commits_in_flight=2), store=store).start()
    try:
        inj.push([_rec("k0", 0)], estimate=0)
        assert store.entered.wait(30)          # k0's checkpoint is in flight, held by the store
        inj.push([_rec("k1", 1)])
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 1, 30,
                   message="k1 counted (its commit landed) while k0's is held")
        worker = rt.workers[0]
        assert worker.commits_beside >= 1
        assert worker.busy                     # k0's commit is still in flight
        assert rt.tracker.in_flight > 0        # k0's record is not acked before its commit lands
        assert orjson.loads(store.read_states("count", ["k1"])["k1"])["n"] == 1
        assert store.read_states("count", ["k0"]) == {}
        store.release.set()
        wait_until(lambda: rt.statistics().computations["count"].records_processed == 2, 30, message="k0 counted")
        wait_until(lambda: rt.tracker.in_flight == 0 and not worker.busy, 30, message="acked after the landing")
        assert orjson.loads(store.read_states("count", ["k0"])["k0"])["n"] == 1
    finally:
        store.release.set()
        rt.stop()
