"""The worker thread's stretch from records delivered to their keys' checkpoints, in one process and without a
store or network: records delivered to one interval core (``RecordsDelivered`` + ``TimePassed``), its
``RunUserCode`` carried out by ``Worker._run_user_code`` (the benchmark's ``Bucket`` or ``Sort`` user code,
no dedup hits, every state read and absent), ``UserCodeRan``, then ``CheckpointCommitted`` for its commits.
A core whose cache keeps nothing, as in worker processes, and the C heap kept (``keep_heap``) as there.

    python -m bench.millwheel_stretch bucket|sort [--per 200] [--steps 200] [--calls]

prints CPU per record (``process_time``) of each part (the core's start of the run, the run, the core's
answer, the landing) or, with ``--calls``, Python calls per record (cProfile's count, which does not depend
on the machine's load). Run it from two copies of the code alternately to compare them.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from types import SimpleNamespace

from bench.millwheel_shuffle import Bucket, Sort
from millwheel._interval import (CheckpointCommitted, Commit, IntervalCore, IntervalGranted, IntervalSettings,
                                 RecordsDelivered, RunUserCode, TimePassed)
from millwheel._malloc import keep_heap
from millwheel._model import Delivery, new_record
from millwheel._worker import Worker, _Comp

KEYS = 64     # sort's keys (the benchmark's buckets)


class _NoStore:
    def seen(self, computation, ids):
        return set()

    def read_states(self, computation, keys):
        return {}


def _worker(stage: str) -> tuple[Worker, IntervalCore]:
    comp = (Bucket if stage == "bucket" else Sort)()
    comp.exactly_once = True
    core = IntervalCore(IntervalSettings(stage, 0, exactly_once=True, cache_keys=0))
    core.handle(IntervalGranted(1, [], {}, []))
    w = Worker.__new__(Worker)        # only what _run_user_code reads
    w.comps = {stage: _Comp(SimpleNamespace(name=stage, produces=("buckets",) if stage == "bucket" else ()),
                            comp, {0: core})}
    w.store, w.dedup_store_lookups, w.user_code_failures = _NoStore(), 0, 0
    return w, core


def _batch(stage: str, base: int, n: int) -> list[Delivery]:
    if stage == "bucket":      # one record per key
        return [Delivery("bucket", 0, new_record(str(base + i), {"n": base + i}, 1000 + i, f"numbers:{base + i}",
                                                 "numbers", "numbers", 5)) for i in range(n)]
    return [Delivery("sort", 0, new_record(str((base + i) % KEYS), {"n": base + i, "w": 1}, 1000 + i,
                                           f"bucket:{base + i}", "buckets", "bucket", 5)) for i in range(n)]


def _step(w: Worker, core: IntervalCore, ds: list, now: int, parts: list[float] | None = None) -> None:
    clock = time.process_time
    t0 = clock()
    runs = [(core, c) for c in core.handle(RecordsDelivered(ds), TimePassed(now)) if type(c) is RunUserCode]
    t1 = clock()
    ran = w._run_user_code(runs)
    t2 = clock()
    commits = [x for c, r in ran for x in c.handle(r) if type(x) is Commit]
    t3 = clock()
    for c in commits:
        core.handle(CheckpointCommitted(c.commit_id))
    t4 = clock()
    if parts is not None:
        for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[i] += dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=["bucket", "sort"])
    ap.add_argument("--per", type=int, default=200, help="records per step")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--calls", action="store_true", help="Python calls per record instead of CPU")
    args = ap.parse_args()
    keep_heap()
    w, core = _worker(args.stage)
    data = [_batch(args.stage, s * args.per, args.per) for s in range(args.steps)]
    for s in range(5):         # warm up on other ids
        _step(w, core, _batch(args.stage, 10**9 + s * args.per, args.per), 10 + s)
    n = args.per * args.steps
    if args.calls:
        prof = cProfile.Profile()
        prof.enable()
        for s, ds in enumerate(data):
            _step(w, core, ds, 100 + s)
        prof.disable()
        calls = sum(v[1] for v in pstats.Stats(prof).stats.values())
        print(f"{args.stage}: {calls / n:.2f} calls per record")
        return
    parts = [0.0] * 4
    for s, ds in enumerate(data):
        _step(w, core, ds, 100 + s, parts)
    start, run, answer, landing = (p / n * 1e6 for p in parts)
    print(f"{args.stage}: start {start:.2f} / run {run:.2f} / answer {answer:.2f} / landing {landing:.2f} µs per "
          f"record (run + answer + landing {run + answer + landing:.2f})")


if __name__ == "__main__":
    main()
