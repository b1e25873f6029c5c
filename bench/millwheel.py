"""MillWheel paper §8.1-§8.3 in miniature, on real stores (an embedded PostgreSQL server, SQLite).

* Record delay: numbers injected at a steady rate (timestamped at injection) go through one stage that
  buckets and re-keys them; a final consumer measures now - timestamp. Once with exactly-once and strong
  productions off (weak productions, no dedup), once with both on. Median and p95 in ms.
  (Paper, 200 CPUs: 3.6 / 30 ms off, 33.7 / 93.8 ms on.)
* Throughput: records/s through the same pipeline with both guarantees on, injecting as fast as it goes.
* Watermark lag: a three-stage pipeline; median of now - low watermark of each stage, sampled while it
  runs. (Paper: 1.8 s at the first stage, then under 200 ms per stage.)
* Per store in ``--store`` (§8.3): the throughput run again, with the framework cache's hit ratio. The
  delay and lag figures are measured on the first store listed.

    python -m bench.millwheel [--json] [--store postgres,sqlite] [--rate 1000] [--seconds 6]
                              [--records 30000] [--threads 2]

With ``--workers 1,2,4`` it runs as processes instead (``bench/_mw_cluster.py``): the two-stage shuffle of
``bench/millwheel_shuffle.py`` (the paper's bucket-and-sort) on three master replicas and each listed number
of worker processes (``--threads`` each, default 1). Per store and worker count: records/s with both
guarantees on (injected as fast as it goes), record delay p50 / p95 / p99 with both on and both off (at
``--rate`` records/s for ``--seconds``), each stage's watermark lag while injecting, the framework cache's
hit ratio and the store server's CPU seconds; CPU per 1,000 records (store server / worker processes) and
records per ``Exchange`` call both at full speed and in each delay run (at ``--rate``, where the per-batch
costs show), and the workers' CPU per 1,000 records by kind of thread (from each worker's status). SQLite serves one process only, so it is measured with one
worker and reported as not applicable for more. Each run first injects warm-up records at
``--warmup-rate`` (default ``--rate``; not measured) until the master's placement has settled (every worker
holds intervals, no change for 4.5 s: longer than the master waits on a lasting imbalance), so that the figures are a running cluster's, not its start's.
``--profile DIR`` records every worker process with py-spy (``--profile-gil``: only the thread holding the GIL).
"""
from __future__ import annotations

import argparse
import statistics as stats
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._common import percentile
from bench.millwheel_shuffle import BUCKETS, RateInjector
from millwheel import (STRONG, WEAK, CacheStatistics, Computation, EmbeddedPostgres, Runtime,
                       RuntimeConfig, Topology)
from photon import SystemClock

STORES = ("postgres", "sqlite")


class Stores:
    """A fresh store URL per run: a file per run for SQLite, a schema per run on one embedded server."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.tmp, self.kind = tmp, kind
        self.server = EmbeddedPostgres(tmp / "pg").start() if kind == "postgres" else None

    def url(self, name: str) -> str:
        if self.server is not None:
            return f"{self.server.url}?schema={name.replace('-', '_')}"
        return f"sqlite:///{self.tmp / f'{name}.db'}"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def bucket_stage(exactly_once: bool, productions: str, out: str) -> type[Computation]:
    class Bucket(Computation):
        """Counts numbers per key and re-keys each number to its bucket."""

        def process_record(self, ctx, record):
            ctx.state = (ctx.state or 0) + 1
            ctx.produce(out, record.value, key=str(record.value["n"] % BUCKETS))

        def process_timer(self, ctx, timer):
            pass
    Bucket.exactly_once, Bucket.productions = exactly_once, productions
    return Bucket


class Measure(Computation):
    """Notes each record's delay (no state, no dedup: measuring must not add to what is measured)."""
    exactly_once = False
    productions = WEAK

    def __init__(self, delays: list, clock: SystemClock) -> None:
        self.delays, self.clock = delays, clock

    def process_record(self, ctx, record):
        self.delays.append(self.clock.now_us() - record.timestamp_us)

    def process_timer(self, ctx, timer):
        pass


def run_delay(stores: Stores, guarantees: bool, rate: int, total: int,
              threads: int) -> tuple[list[int], float, CacheStatistics]:
    clock = SystemClock()
    delays: list[int] = []
    t = Topology()
    t.add_injector("numbers", RateInjector(rate, total), produces="numbers")
    t.add_computation("bucket", bucket_stage(guarantees, STRONG if guarantees else WEAK, "buckets"),
                      consumes=["numbers"], produces=["buckets"])
    measure = Measure(delays, clock)
    t.add_computation("measure", measure, consumes=["buckets"])
    name = "on" if guarantees else "off"
    rt = Runtime(t, RuntimeConfig(store=stores.url(f"delay-{name}-{rate}"), threads=threads), clock).start()
    start = time.monotonic()
    try:
        rt.run_until_idle(600)
    finally:
        rt.stop()
    return delays, time.monotonic() - start, rt.store.statistics()


def run_lag(stores: Stores, rate: int, seconds: float, threads: int) -> dict[str, float]:
    clock = SystemClock()
    t = Topology()
    t.add_injector("numbers", RateInjector(rate, int(rate * seconds)), produces="s0")
    for i in (1, 2, 3):
        t.add_computation(f"stage{i}", bucket_stage(True, STRONG, f"s{i}"), consumes=[f"s{i - 1}"],
                          produces=[f"s{i}"])
    rt = Runtime(t, RuntimeConfig(store=stores.url("lag"), threads=threads), clock).start()
    lags: dict[str, list[int]] = {f"stage{i}": [] for i in (1, 2, 3)}
    done = threading.Event()
    try:
        deadline = time.monotonic() + seconds
        time.sleep(min(1.0, seconds / 4))  # let the pipeline fill before sampling
        while time.monotonic() < deadline and rt.error is None:
            now = clock.now_us()
            comps = rt.statistics().computations
            for name in lags:
                lags[name].append(now - comps[name].low_watermark_us)
            done.wait(0.05)
        rt.run_until_idle(600)
    finally:
        rt.stop()
    return {name: stats.median(v) / 1000 for name, v in lags.items()}


def first_store_figures(stores: Stores, args: argparse.Namespace, figures: dict[str, float]) -> None:
    for guarantees, tag in ((False, "eo_off"), (True, "eo_on")):
        delays, _, _ = run_delay(stores, guarantees, args.rate, int(args.rate * args.seconds), args.threads)
        figures[f"delay_p50_ms_{tag}"] = round(percentile(delays, 50) / 1000, 2)
        figures[f"delay_p95_ms_{tag}"] = round(percentile(delays, 95) / 1000, 2)
        print(f"  record delay, exactly-once + strong productions {tag[3:]}: median "
              f"{figures[f'delay_p50_ms_{tag}']} ms, p95 {figures[f'delay_p95_ms_{tag}']} ms "
              f"({len(delays)} records at {args.rate}/s)")
    lags = run_lag(stores, args.rate, args.seconds, args.threads)
    for name, lag in lags.items():
        figures[f"{name}_watermark_lag_ms"] = round(lag, 1)
    print("  low-watermark lag (median), three-stage pipeline: "
          + ", ".join(f"{n} {v:.1f} ms" for n, v in lags.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object on the last line")
    ap.add_argument("--rate", type=int, default=1000, help="records/s injected for the delay runs")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each delay and lag run")
    ap.add_argument("--records", type=int, default=30000, help="records for the throughput run")
    ap.add_argument("--threads", type=int, default=2, help="worker threads")
    ap.add_argument("--store", default=",".join(STORES),
                    help="comma-separated stores to measure (postgres: an embedded server; sqlite: a file)")
    ap.add_argument("--workers", help="comma-separated worker process counts (e.g. 1,2,4): the process benchmark")
    ap.add_argument("--profile", help="with --workers: py-spy profiles of the worker processes into this folder")
    ap.add_argument("--profile-gil", action="store_true",
                    help="with --profile: sample only the thread holding the GIL (where the interpreter's time goes)")
    ap.add_argument("--warmup-rate", type=int, default=None,
                    help="with --workers: records/s injected (not measured) until the master's placement has "
                         "settled, before each run's measured records (default: --rate; 0: no warm-up)")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.store.split(",") if k.strip()]
    if not kinds or set(kinds) - set(STORES):
        ap.error(f"--store takes a comma-separated list of {', '.join(STORES)}")
    if args.workers:
        try:
            counts = [int(w) for w in args.workers.split(",") if w.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) <= 0:
            ap.error("--workers takes a comma-separated list of positive counts, e.g. 1,2,4")
        from bench._mw_cluster import cluster_main
        return cluster_main(args, kinds, counts)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="millwheel-bench-") as d:
        for n, kind in enumerate(kinds):
            stores = Stores(Path(d) / kind, kind)
            try:
                if n == 0:
                    print(f"delay and watermark lag on {kind}:")
                    first_store_figures(stores, args, figures)
                delays, elapsed, cache = run_delay(stores, True, 0, args.records, args.threads)
            finally:
                stores.close()
            figures[f"records_per_s_{kind}"] = round(len(delays) / elapsed)
            figures[f"cache_hit_ratio_{kind}"] = round(cache.hit_ratio, 3)
            if n == 0:
                figures["records_per_s"] = figures[f"records_per_s_{kind}"]
            print(f"{kind}: {figures[f'records_per_s_{kind}']} records/s with exactly-once + strong productions "
                  f"({len(delays)} records in {elapsed:.2f} s); state cache hit ratio "
                  f"{figures[f'cache_hit_ratio_{kind}']} ({cache.hits} hits, {cache.misses} misses)")
    if args.json:
        import json
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
