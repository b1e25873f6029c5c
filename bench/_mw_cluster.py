"""The process benchmark of ``bench.millwheel --workers``: the two-stage shuffle of
:mod:`bench.millwheel_shuffle` on three master replicas and N worker processes (``millwheel worker``),
state in an embedded PostgreSQL server (or a SQLite file, for one worker process only).

One :func:`run_cluster` is one run on a fresh schema (or file): start the master and the workers, wait
for the injector to finish and the cluster to go idle, read every worker's status (cache) and the
delays the ``sort`` stage wrote, stop everything. While it runs it samples each stage's watermark lag
(now - the published low watermark) from the workers' status RPC, and the CPU time of the store server
(the postmaster and its backends) and of the worker processes, from /proc, at the end of the warm-up (else
at the start) and at the end: per 1,000 measured records, these are the figures a loaded machine disturbs
least (the few warm-up records still in flight at the end of the warm-up are counted in the CPU, not in
the records).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench import millwheel_shuffle as shuffle
from bench._common import percentile
from millwheel import (
    ClusterFile,
    MasterClient,
    MasterSpec,
    PlacementPolicy,
    Processes,
    RuntimeConfig,
    cluster_path,
    known_workers,
    new_specs,
    open_store,
    wait_cluster_idle,
    worker_argv,
    worker_status,
)
from photon import wait_until

STAGES = ("numbers", "bucket", "sort")
POLICY = {"cooldown_us": 1_000_000}
"""The master's placement here is ``millwheel run``'s: its defaults with a short cooldown, so that intervals
spread within seconds of the start. A move by load needs a large (``move_ratio``, with hysteresis) and
lasting (``move_after_us``) imbalance, and one interval is moved by load at most once per ``move_gap_us``:
at a steady, even load nothing moves while measuring (the figure ``placement while measuring``)."""
REPO = Path(__file__).resolve().parents[1]


@dataclass
class ClusterRun:
    records: int = 0
    records_per_s: float = 0.0
    delay_ms: dict = field(default_factory=dict)           # p50 / p95 / p99
    lag_ms: dict = field(default_factory=dict)             # median lag per stage while injecting
    cache_hits: int = 0
    cache_misses: int = 0
    store_cpu_s: float | None = None                       # from the end of the warm-up (else the start) to idle
    worker_cpu_s: float | None = None                      # the worker processes' CPU seconds (see store_cpu_s)
    wall_s: float = 0.0
    transport: dict = field(default_factory=dict)          # summed over the workers: calls, records_sent, ...
    warmup_s: float = 0.0                                  # warm-up before the measured records
    settled: bool | None = None                            # the placement settled within the warm-up's limit
    placement: dict = field(default_factory=dict)          # moves / splits / merges while measuring
    ack_delays: dict = field(default_factory=dict)         # productions acked, by delay (first send -> ack)
    events: dict = field(default_factory=dict)             # calls, calls without records, store commits while measuring
    thread_cpu_ms: dict = field(default_factory=dict)      # the worker processes' CPU by thread kind (see store_cpu_s)
    total: int = 0                                         # measured records injected
    guarantees: bool = True                                # exactly-once and strong productions on
    records_missing: int = 0                               # measured records with no delay sample
    duplicate_samples: int = 0                             # samples of a record already sampled
    store_shortfall: int | None = None                     # records injected less those the store's sort state counts
    killed_at_stop: int = 0                                # processes killed after their stop's timeout
    records_after_idle: int = 0                            # measured records that reached sort after idle was told

    def cpu_ms_per_1000(self, seconds: float | None) -> float | None:
        """CPU milliseconds (``store_cpu_s`` or ``worker_cpu_s``) per 1,000 measured records."""
        return round(1e6 * seconds / self.records, 1) if seconds and self.records else None

    @property
    def cache_hit_ratio(self) -> float:
        looked = self.cache_hits + self.cache_misses
        return self.cache_hits / looked if looked else 0.0


def tree_cpu_s(pid: int | None) -> float | None:
    """CPU seconds of ``pid`` and its children: its own, its reaped children's, and the live ones'."""
    if pid is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str] | None:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
    me = stat(pid)
    if me is None:
        return None
    total = sum(int(x) for x in me[11:15])          # utime stime cutime cstime
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != pid:
            st = stat(int(p))
            if st is not None and int(st[1]) == pid:
                total += sum(int(x) for x in st[11:15])
    return total / tick


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


SETTLED_S = 1.5 + PlacementPolicy.from_mapping(POLICY).move_after_us / 1e6
"""The placement is settled when every worker holds intervals and the map has not changed for this long:
longer than the master waits on a lasting imbalance (``move_after_us``) before it moves an interval to a
worker that is not starved, so the last moves of the start's spreading fall in the warm-up."""


def wait_settled(client: MasterClient, workers: int, timeout_s: float) -> tuple[float, bool]:
    """Wait until each of ``workers`` workers owns an interval and no interval changed owner or sequencer for
    ``SETTLED_S``; returns the seconds waited and whether it settled within ``timeout_s``."""
    start = time.monotonic()
    last, since = None, start
    while time.monotonic() - start < timeout_s:
        try:
            view = sorted((iv.computation, iv.lo, iv.worker, iv.sequencer) for iv in client.interval_map())
        except Exception:  # noqa: BLE001 (a leader change: the next look)
            view = None
        now = time.monotonic()
        if view != last:
            last, since = view, now
        elif view and len({w for *_, w, _ in view if w}) >= workers and now - since >= SETTLED_S:
            return now - start, True
        time.sleep(0.1)
    return time.monotonic() - start, False


PLACEMENT = ("moves", "splits", "merges")


def placement_counts(client: MasterClient) -> dict[str, int]:
    """The master's placement changes so far (the largest count over the replicas that answer: a follower
    may lag the leader)."""
    replies = [r for r in client.status() if "error" not in r]
    return {k: max((r.get(k, 0) for r in replies), default=0) for k in PLACEMENT}


def run_cluster(folder: Path, url: str, workers: int, guarantees: bool, rate: int, total: int,
                store_pid: int | None = None, options: dict | None = None, profiler=None,
                timeout_s: float = 600.0, warmup_rate: int = 0, settle_timeout_s: float = 30.0) -> ClusterRun:
    """One run; with ``warmup_rate``, warm-up records at that rate until the placement has settled (see
    :func:`wait_settled`), then the measured ones (the figures count those only)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    out.mkdir(exist_ok=True)
    spec = folder / "shuffle.json"
    go = folder / "go"
    body = {"total": total, "rate": rate, "guarantees": guarantees}
    if warmup_rate:
        body.update(go=str(go), warmup_rate=warmup_rate)
    spec.write_text(json.dumps(body))
    topology = shuffle.build(str(spec), str(out))
    opts = {"threads": 1, "store": url, **(options or {})}
    config = RuntimeConfig.from_mapping(opts)
    policy = PlacementPolicy.from_mapping(POLICY)
    specs = new_specs(out, topology, config.intervals, policy)
    cf = ClusterFile("bench.millwheel_shuffle", str(spec), str(out), url, opts, specs, workers)
    path = cluster_path(out)
    cf.save(path)
    procs = Processes()
    run = ClusterRun()
    lags: dict[str, list[int]] = {s: [] for s in STAGES}
    stop = threading.Event()
    started = time.monotonic()
    cpu0 = tree_cpu_s(store_pid)
    worker_pids: list[int] = []
    wcpu0: list = []
    threads0: dict[str, float] = {}
    log = open(folder / "processes.log", "ab")
    try:
        for text in specs:
            procs.start(MasterSpec.from_json(text).argv(), "millwheel master serving on ", stderr=log)
        for _ in range(workers):
            p, _ = procs.start(worker_argv(path), "millwheel worker serving on ", env=_env(), stderr=log)
            worker_pids.append(p.pid)
            if profiler is not None:
                profiler.attach(p.pid, f"worker-w{workers}")
        client = MasterClient(cf.masters, retry_timeout_s=30.0)
        if warmup_rate:
            run.warmup_s, run.settled = wait_settled(client, workers, settle_timeout_s)
            cpu0, wcpu0 = tree_cpu_s(store_pid), [tree_cpu_s(p) for p in worker_pids]
            statuses0 = [worker_status(a, thread_cpu=True) for a in known_workers(out, client)]
            threads0, events0 = _thread_cpu(statuses0), _events(statuses0)
            go.touch()
        placed0 = placement_counts(client)
        sampler = threading.Thread(target=_sample_lags, args=(out, lags, stop), daemon=True)
        sampler.start()
        try:
            wait_cluster_idle(topology, out, client, threading.Event(), timeout_s)
            idle_us = time.time_ns() // 1000
            statuses = [worker_status(a, thread_cpu=True) for a in known_workers(out, client)]
            _wait_samples(out, total)
            placed1 = placement_counts(client)
            run.placement = {k: placed1[k] - placed0[k] for k in placed1}
        finally:
            stop.set()
            sampler.join(timeout=10)
            client.close()
        for s in statuses:
            cache = s.get("cache") or {}
            run.cache_hits += cache.get("hits", 0)
            run.cache_misses += cache.get("misses", 0)
            for k, v in s.get("transport", {}).items():
                run.transport[k] = run.transport.get(k, 0) + v
            for k, v in s.get("acks", {}).get("delays", {}).items():
                run.ack_delays[k] = run.ack_delays.get(k, 0) + v
            dups = sum(c.get("duplicates", 0) for c in s.get("computations", {}).values())
            run.transport["duplicates"] = run.transport.get("duplicates", 0) + dups
            for k in ("stale_routes", "fenced_commits", "given_up", "lost_incarnations", "heartbeats_failed",
                      "stale_grants", "taken_before_claim", "early_dropped"):
                run.transport[k] = run.transport.get(k, 0) + s.get("counters", {}).get(k, 0)
        threads1 = _thread_cpu(statuses)
        run.thread_cpu_ms = {k: round(v - threads0.get(k, 0.0), 1) for k, v in threads1.items()}
        run.events = {k: v - events0.get(k, 0) for k, v in _events(statuses).items()}
        cpu1 = tree_cpu_s(store_pid)
        worker_cpu = [tree_cpu_s(p) for p in worker_pids]
        wcpu0 = wcpu0 or [0.0] * len(worker_pids)
        run.worker_cpu_s = None if None in worker_cpu + wcpu0 else round(sum(worker_cpu) - sum(wcpu0), 2)
        run.store_cpu_s = None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2)
    finally:
        run.killed_at_stop = len(procs.stop())
        log.close()
        if profiler is not None:
            profiler.stop()
    run.wall_s = time.monotonic() - started
    samples = shuffle.read_delays(out)
    pairs = samples.pairs
    run.total, run.records, run.duplicate_samples = total, len(pairs), samples.duplicates
    run.guarantees = guarantees
    run.records_missing = total - len(pairs)
    run.records_after_idle = sum(1 for _, a in pairs if a > idle_us)
    run.store_shortfall = store_shortfall(url)
    if pairs:
        first = min(i for i, _ in pairs)
        last = max(a for _, a in pairs)
        run.records_per_s = round(len(pairs) / max(1e-6, (last - first) / 1e6))
        delays = [a - i for i, a in pairs]
        run.delay_ms = {q: round(percentile(delays, q) / 1000, 2) for q in (50, 95, 99)}
    run.lag_ms = {s: round(sorted(v)[len(v) // 2] / 1000, 1) for s, v in lags.items() if v}
    return run


SAMPLES_S = 10.0
"""How long an idle cluster's samples may take to reach their files (each process flushes its own every
``shuffle.FLUSH_S``; more on a loaded machine)."""


def _wait_samples(out: Path, total: int) -> None:
    """Wait until the delay files hold a sample of each of the ``total`` measured records, at most
    ``SAMPLES_S``: the count checked after the stop tells any shortfall."""
    try:
        wait_until(lambda: len(shuffle.read_delays(out).pairs) >= total, SAMPLES_S, 0.05, "the delay samples")
    except TimeoutError:
        pass


def store_shortfall(url: str) -> int | None:
    """Records the injector committed (warm-up and measured, its stored position) less those the ``sort``
    stage's stored state counts: 0 when the runtime processed every injected record exactly once (with both
    guarantees on), None when the store cannot be read."""
    try:
        store = open_store(url)
    except Exception:  # noqa: BLE001 (the figure is then unknown, not wrong)
        return None
    try:
        raw = store.read_states("numbers", [""]).get("")
        warm, sent = orjson.loads(raw)["position"] if raw is not None else (0, 0)
        states = store.read_states("sort", [str(b) for b in range(shuffle.BUCKETS)])
        return int(warm) + int(sent) - sum(orjson.loads(v)["count"] for v in states.values())
    finally:
        store.close()


IDLE_S = 10.0
"""How long :func:`idle_cpu` measures an idle cluster."""


def idle_cpu(folder: Path, url: str, workers: int, store_pid: int | None = None, seconds: float = IDLE_S,
             threads: int = 1, settle_timeout_s: float = 30.0, options: dict | None = None) -> dict[str, float | None]:
    """The fixed cost of a cluster with no input: start the masters and ``workers`` worker processes with an
    injector that sends nothing (it waits for a ``go`` file that never comes, at a warm-up rate of 0), wait
    until the placement has settled, then measure the CPU of the store server and of each worker process
    over ``seconds``. Returns the share of one core used: ``store`` and ``worker`` (the mean per worker
    process)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "out"
    out.mkdir(exist_ok=True)
    spec = folder / "shuffle.json"
    spec.write_text(json.dumps({"total": 1, "rate": 0, "guarantees": True, "go": str(folder / "go"),
                                "warmup_rate": 0}))
    topology = shuffle.build(str(spec), str(out))
    opts = {"threads": threads, "store": url, **(options or {})}
    config = RuntimeConfig.from_mapping(opts)
    specs = new_specs(out, topology, config.intervals, PlacementPolicy.from_mapping(POLICY))
    cf = ClusterFile("bench.millwheel_shuffle", str(spec), str(out), url, opts, specs, workers)
    path = cluster_path(out)
    cf.save(path)
    procs = Processes()
    with open(folder / "processes.log", "ab") as log:
        try:
            store0, w0, t0, store1, w1, t1 = _measure_idle(procs, log, specs, cf, path, workers, store_pid, seconds,
                                                           settle_timeout_s)
        finally:
            procs.stop()
    wall = t1 - t0
    worker = None if None in w0 + w1 else round((sum(w1) - sum(w0)) / wall / workers, 4)
    store = None if store0 is None or store1 is None else round((store1 - store0) / wall, 4)
    return {"store": store, "worker": worker}


def _measure_idle(procs: Processes, log, specs: list[str], cf: ClusterFile, path: Path, workers: int,
                  store_pid: int | None, seconds: float, settle_timeout_s: float) -> tuple:
    """Start the masters and the workers, wait for the placement to settle, then read the CPU of the store
    and of each worker over ``seconds``: (store, workers, time) at the start and at the end."""
    for text in specs:
        procs.start(MasterSpec.from_json(text).argv(), "millwheel master serving on ", stderr=log)
    pids = [procs.start(worker_argv(path), "millwheel worker serving on ", env=_env(), stderr=log)[0].pid
            for _ in range(workers)]
    client = MasterClient(cf.masters, retry_timeout_s=30.0)
    try:
        wait_settled(client, workers, settle_timeout_s)
    finally:
        client.close()
    store0, w0, t0 = tree_cpu_s(store_pid), [tree_cpu_s(p) for p in pids], time.monotonic()
    time.sleep(seconds)     # the measured span itself: nothing to wait for
    return store0, w0, t0, tree_cpu_s(store_pid), [tree_cpu_s(p) for p in pids], time.monotonic()


def _events(statuses: list[dict]) -> dict[str, int]:
    """The workers' calls to their peers (all, and those that carried no record), store commits and commits
    landed by the commit threads (the worker thread idle) so far, summed: read at the same two moments as
    the CPU by thread, their differences are the measured span's."""
    out = {"calls": 0, "calls_without_records": 0, "store_commits": 0, "landed_on_commit_thread": 0}
    for s in statuses:
        t = s.get("transport", {})
        out["calls"] += t.get("calls", 0)
        out["calls_without_records"] += t.get("calls_without_records", 0)
        out["store_commits"] += (s.get("store") or {}).get("commits", 0)
        acks = s.get("acks", {})
        out["landed_on_commit_thread"] += acks.get("landed_on_commit_thread", 0)
    return out


def _thread_cpu(statuses: list[dict]) -> dict[str, float]:
    """The workers' CPU milliseconds so far by thread kind (``thread_cpu_ms`` of their status), summed.
    A worker that started after the first reading counts from its start."""
    total: dict[str, float] = {}
    for s in statuses:
        for k, v in (s.get("thread_cpu_ms") or {}).items():
            total[k] = total.get(k, 0.0) + v
    return total


def _sample_lags(out: Path, lags: dict[str, list[int]], stop: threading.Event) -> None:
    """Each stage's lag behind the wall clock, every 100 ms, from the moment the injector's watermark moved
    until it caught up (after that the lag only measures idleness)."""
    while not stop.wait(0.1):
        try:
            statuses = [s for s in (worker_status(a, 1.0) for a in known_workers(out, None)) if "unreachable" not in s]
        except Exception:  # noqa: BLE001, S112  (a worker going away mid-read: the next sample)
            continue
        if not statuses:
            continue
        injecting = [i for s in statuses for i in s.get("injectors", {}).values()]
        lows: dict[str, int] = {}
        for s in statuses:
            for n, v in s.get("low_watermarks_us", {}).items():
                lows[n] = max(v, lows.get(n, 0))
        if lows.get("numbers", 0) <= 0 or not injecting or all(i["caught_up"] for i in injecting):
            continue
        now = time.time_ns() // 1000
        for n in STAGES:
            if lows.get(n, 0) > 0:
                lags[n].append(now - lows[n])



def cluster_main(args, kinds: list[str], counts: list[int]) -> int:
    """``bench.millwheel --workers ...``: every store in ``kinds`` for every count in ``counts``."""
    import tempfile

    from millwheel import EmbeddedPostgres
    profiler = None
    if args.profile:
        from bench._profile import Profiler
        profiler = Profiler(Path(args.profile), gil=getattr(args, "profile_gil", False))
    threads = args.threads if args.threads != 2 else 1
    figures: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="millwheel-bench-") as d:
        for kind in kinds:
            server = EmbeddedPostgres(Path(d) / "pg").start() if kind == "postgres" else None
            try:
                for workers in counts:
                    prefix = f"{kind}_w{workers}"
                    if kind == "sqlite" and workers > 1:
                        print(f"{kind}, {workers} workers: not applicable (SQLite serves one process)")
                        figures[f"{prefix}_records_per_s"] = None
                        continue
                    warmup = args.rate if args.warmup_rate is None else args.warmup_rate
                    if kind == "postgres":
                        idle = idle_cpu(Path(d) / f"{prefix}_idle", f"{server.url}?schema={prefix}_idle", workers,
                                        server.pid, threads=threads)
                        figures[f"{prefix}_idle_store_cpu_share"] = idle["store"]
                        figures[f"{prefix}_idle_worker_cpu_share"] = idle["worker"]
                        print(f"{kind}, {workers} workers, idle for {IDLE_S:.0f} s: idle CPU per process: store "
                              f"{_share(idle['store'])} of a core, each worker {_share(idle['worker'])}", flush=True)
                    runs = _Runs(Path(d), prefix, server, workers, threads, warmup)
                    one = runs.one
                    tput = one(True, 0, args.records, profiler)
                    figures[f"{prefix}_records_per_s"] = tput.records_per_s
                    figures[f"{prefix}_cache_hit_ratio"] = round(tput.cache_hit_ratio, 3)
                    figures[f"{prefix}_store_cpu_s"] = tput.store_cpu_s
                    figures[f"{prefix}_store_cpu_ms_per_1000_records"] = tput.cpu_ms_per_1000(tput.store_cpu_s)
                    figures[f"{prefix}_worker_cpu_ms_per_1000_records"] = tput.cpu_ms_per_1000(tput.worker_cpu_s)
                    for stage, lag in tput.lag_ms.items():
                        figures[f"{prefix}_{stage}_watermark_lag_ms_at_max_rate"] = lag
                    print(f"{kind}, {workers} workers: {tput.records_per_s} records/s with exactly-once + strong "
                          f"productions ({tput.records} records); framework cache hit ratio "
                          f"{tput.cache_hit_ratio:.3f} ({tput.cache_hits} hits, {tput.cache_misses} misses); "
                          f"store CPU {tput.store_cpu_s if tput.store_cpu_s is not None else 'n/a (in process)'} s; "
                          "CPU per 1,000 records measured: store "
                          f"{figures[f'{prefix}_store_cpu_ms_per_1000_records']} ms, workers "
                          f"{figures[f'{prefix}_worker_cpu_ms_per_1000_records']} ms; "
                          "watermark lag " + ", ".join(f"{s} {v} ms" for s, v in tput.lag_ms.items())
                          + f"; {_per_rpc(tput)} records per RPC; {_warm(tput)}transport {tput.transport}; "
                          f"ack delays {tput.ack_delays}",
                          flush=True)
                    figures[f"{prefix}_records_per_rpc"] = _per_rpc(tput)
                    print(f"  workers' CPU per 1,000 records by thread (ms): "
                          f"{_threads(figures, f'{prefix}_', '_at_max_rate', tput)}", flush=True)
                    _count(figures, f"{prefix}_", "_at_max_rate", tput)
                    figures.update({f"{prefix}_{k}_at_max_rate": v for k, v in tput.placement.items()})
                    for guarantees, tag in ((True, "eo_on"), (False, "eo_off")):
                        r = one(guarantees, args.rate, int(args.rate * args.seconds))
                        for q, v in r.delay_ms.items():
                            figures[f"{prefix}_delay_p{q}_ms_{tag}"] = v
                        for stage, lag in r.lag_ms.items():
                            figures[f"{prefix}_{stage}_watermark_lag_ms_{tag}"] = lag
                        figures.update({f"{prefix}_{k}_{tag}": v for k, v in r.placement.items()})
                        cpu = (r.cpu_ms_per_1000(r.store_cpu_s), r.cpu_ms_per_1000(r.worker_cpu_s))
                        figures[f"{prefix}_store_cpu_ms_per_1000_records_{tag}"] = cpu[0]
                        figures[f"{prefix}_worker_cpu_ms_per_1000_records_{tag}"] = cpu[1]
                        figures[f"{prefix}_records_per_rpc_{tag}"] = _per_rpc(r)
                        _count(figures, f"{prefix}_", f"_{tag}", r)
                        print(f"  at {args.rate} records/s, exactly-once + strong productions {tag[3:]}: delay "
                              + " / ".join(f"p{q} {v} ms" for q, v in r.delay_ms.items())
                              + f"; CPU per 1,000 records store {cpu[0]} ms, workers {cpu[1]} ms; "
                              f"{_per_rpc(r)} records per RPC"
                              + "; watermark lag " + ", ".join(f"{s} {v} ms" for s, v in r.lag_ms.items())
                              + f"; {_warm(r)}transport {r.transport}", flush=True)
                        print(f"    workers' CPU per 1,000 records by thread (ms): "
                              f"{_threads(figures, f'{prefix}_', f'_{tag}', r)}", flush=True)
                        per = {k: r.cpu_ms_per_1000(v / 1000) for k, v in r.events.items()}
                        for k, v in per.items():
                            figures[f"{prefix}_{k}_per_1000_records_{tag}"] = v
                        print("    per 1,000 records while measuring: " + ", ".join(f"{k} {v}" for k, v in per.items()),
                              flush=True)
            finally:
                if server is not None:
                    server.stop()
    if profiler is not None:
        from bench._profile import summarize
        for p in sorted(Path(args.profile).glob("*.txt")):
            print(summarize(p))
    if args.json:
        print(json.dumps(figures))
    return 0


def _count(figures: dict, prefix: str, suffix: str, run: ClusterRun) -> None:
    """The run's count figures, and a warning on stderr when any measured record is not counted: a shortfall
    is never silent (the figures of such a run are of fewer records than asked)."""
    figures[f"{prefix}records_missing{suffix}"] = run.records_missing
    figures[f"{prefix}store_shortfall{suffix}"] = run.store_shortfall
    figures[f"{prefix}killed_at_stop{suffix}"] = run.killed_at_stop
    figures[f"{prefix}records_after_idle{suffix}"] = run.records_after_idle
    # without the guarantees a record may be processed twice (a negative shortfall), never lost
    short = run.store_shortfall is not None and (run.store_shortfall > 0 or run.guarantees and run.store_shortfall)
    if run.records_missing or short or run.killed_at_stop or run.records_after_idle:
        print(f"WARNING: {run.records_missing} of {run.total} measured records have no delay sample "
              f"({run.duplicate_samples} duplicate samples); the store's sort state counts "
              f"{'?' if run.store_shortfall is None else run.store_shortfall} records fewer than were injected; "
              f"{run.killed_at_stop} processes were killed at the stop; {run.records_after_idle} records reached "
              "sort after the cluster was told idle", file=sys.stderr, flush=True)


def _threads(figures: dict, prefix: str, suffix: str, run: ClusterRun) -> str:
    """The workers' CPU per 1,000 measured records by thread kind, into ``figures`` (keys
    ``<prefix>thread_<kind>_cpu_ms_per_1000_records<suffix>``) and as a line to print, largest first."""
    per = {k: run.cpu_ms_per_1000(v / 1000) or 0.0 for k, v in run.thread_cpu_ms.items()}
    for k, v in per.items():
        figures[f"{prefix}thread_{re.sub(r'[^0-9a-zA-Z]+', '_', k).strip('_').lower()}_cpu_ms_per_1000_records{suffix}"] = v
    return ", ".join(f"{k} {v}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))


def _share(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _warm(run: ClusterRun) -> str:
    placed = "placement while measuring: " + ", ".join(f"{k} {run.placement.get(k, 0)}" for k in PLACEMENT) + "; "
    if run.settled is None:
        return placed
    return (f"warm-up {run.warmup_s:.1f} s ({'placement settled' if run.settled else 'placement NOT settled'}); "
            + placed)


def _per_rpc(run: ClusterRun) -> float | None:
    calls = run.transport.get("calls", 0)
    return round(run.transport.get("records_sent", 0) / calls, 1) if calls else None


class _Runs:
    """Numbered runs of one store and worker count, each on a schema (or file) of its own."""

    def __init__(self, root: Path, prefix: str, server, workers: int, threads: int, warmup_rate: int = 0) -> None:
        self.root, self.prefix, self.server, self.workers, self.threads = root, prefix, server, workers, threads
        self.warmup_rate = warmup_rate
        self.n = 0

    def one(self, guarantees: bool, rate: int, total: int, profiler=None) -> ClusterRun:
        self.n += 1
        name = f"{self.prefix}_{self.n}"
        url = (f"{self.server.url}?schema={name}" if self.server is not None
               else f"sqlite:///{self.root / (name + '.db')}")
        return run_cluster(self.root / name, url, self.workers, guarantees, rate, total,
                           store_pid=self.server.pid if self.server else None,
                           options={"threads": self.threads}, profiler=profiler, warmup_rate=self.warmup_rate)
