"""``python -m bench.eventstore [--mb N] [--seconds S] [--cache-mb C] [--json]``: the event store's figures.

Writes ``--mb`` MB of primary logs (3 writers, one hour of event time, 64 MB files), then measures:
* the first read of that backlog by a cache server (from byte 0): time, and process CPU per query line
  (the whole cache server: reading, indexing, the map, the cache, checkpoints), and the map it writes
  (entries and bytes per GB of primary logs);
* restart to full speed: a stopped cache server started again until it has warmed its cache from the
  recent tail and caught up (read_through_us > 0), with the bytes it read;
* cache lookups/s and p50/p99 per batch of 100 ids over gRPC; logs-store lookups/s and p50/p99 per batch
  of 100 random ids with a warm page cache, and per batch of 10 with the files dropped from the page cache
  before every batch (posix_fadvise DONTNEED);
* the hit ratio of a ``--cache-mb`` cache on clicks whose delay after their query is long-tailed
  (log-normal, median 20 s, a tail of hours), and cache bytes per held event;
* the cache in process (``--cache-queries`` generated query lines, no I/O): memory per cached query
  (tracemalloc, every allocation the cache keeps, divided by the queries held) against the mean raw line,
  the cache's own byte count against that memory, and CPU per query line (``time.process_time``) of
  indexing (``index_lines``), ``put_lines`` and ``lookup`` (batches of 100 ids).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

from bench._common import emit, percentile

import eventstore
from eventstore import EventStoreClient, InMemoryEventStore, index_lines
from photon import LogChunk, format_event_id, list_log_files, parse_config, wait_until

WRITERS = 3
FILE_BYTES = 64 << 20
SPAN_US = 3600 * 10**6


def write_backlog(root: Path, mb: float) -> tuple[int, list[str]]:
    """About ``mb`` MB of query lines; returns (lines, a sample of ids)."""
    target = int(mb * (1 << 20))
    line_bytes = 150
    n = max(WRITERS, target // line_bytes)
    step = max(1, SPAN_US // n)
    start = time.time_ns() // 1000 - SPAN_US - 60 * 10**6
    rng = random.Random(1)
    files = [None] * WRITERS
    sizes = [0] * WRITERS
    seqs = [0] * WRITERS
    sample = []
    bufs = [[] for _ in range(WRITERS)]
    for w in range(WRITERS):
        (root / f"w{w}").mkdir(parents=True, exist_ok=True)
        files[w] = open(root / f"w{w}" / f"q-{0:05d}.jsonl", "ab")
    for i in range(n):
        w = i % WRITERS
        qid = format_event_id(f"10.1.0.{w + 1}", 1000 + w, start + i * step)
        line = (f'{{"query_id":"{qid}","advertiser_id":"adv-{i % 50}","country":"{"ABCDE"[i % 5]}",'
                f'"text":"query {i} {rng.getrandbits(64):016x}"}}\n').encode()
        bufs[w].append(line)
        sizes[w] += len(line)
        if i % 997 == 0:
            sample.append(qid)
        if len(bufs[w]) >= 4096 or sizes[w] >= FILE_BYTES:
            files[w].write(b"".join(bufs[w]))
            bufs[w] = []
            if sizes[w] >= FILE_BYTES:
                files[w].close()
                seqs[w] += 1
                sizes[w] = 0
                files[w] = open(root / f"w{w}" / f"q-{seqs[w]:05d}.jsonl", "ab")
    for w in range(WRITERS):
        files[w].write(b"".join(bufs[w]))
        files[w].close()
    return n, sample


def timed_batches(fn, batches, seconds: float, before=None) -> tuple[float, list[float], int]:
    """Call ``fn(batch)`` over and over for ``seconds``; (ids per second, per-batch ms, ids)."""
    lat, ids = [], 0
    t_end = time.monotonic() + seconds
    t0 = time.monotonic()
    busy = 0.0
    while time.monotonic() < t_end or not lat:
        batch = batches[len(lat) % len(batches)]
        if before:
            before()
        t = time.perf_counter()
        fn(batch)
        dt = time.perf_counter() - t
        busy += dt
        lat.append(dt * 1000)
        ids += len(batch)
    return ids / busy if before else ids / (time.monotonic() - t0), lat, ids


def drop_page_cache(root: Path) -> None:
    for rel in list_log_files(root):
        fd = os.open(root / rel, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def hit_ratio(cache_mb: float, queries: int, seed: int = 3) -> float:
    """Queries arrive one per 10 ms of event time; 10% get a click after a log-normal delay (median 20 s,
    sigma 2: a tail of hours). Each click looks its query up in a cache of ``cache_mb`` fed in time order,
    100 queries (1 s) at a time."""
    rng = random.Random(seed)
    cache = InMemoryEventStore(int(cache_mb * (1 << 20)))
    clicks = []
    for i in range(queries):
        if rng.random() < 0.1:
            clicks.append((i * 10_000 + int(rng.lognormvariate(math.log(20e6), 2.0)), i))
    clicks.sort()
    raw = b'{"query_id":"%s","advertiser_id":"adv-1","text":"query 1 0123456789abcdef"}'
    hits = k = 0
    for lo in range(0, queries, 100):     # put as the reader does: a chunk (here 1 s of queries) at a time
        cache.put_many([(str(i), raw % str(i).encode()) for i in range(lo, min(queries, lo + 100))])
        now = (lo + 99) * 10_000
        while k < len(clicks) and clicks[k][0] <= now:
            hits += cache.lookup([str(clicks[k][1])])[0] is not None
            k += 1
    looked = k
    return hits / looked if looked else 0.0


def _query_chunks(n: int, per_chunk: int = 2000):
    """``n`` query lines like the generator's (about 105 bytes), as chunks of the primary reader."""
    rng = random.Random(5)
    start = 1_763_712_000_000_000
    for lo in range(0, n, per_chunk):
        lines = [(f'{{"query_id":"{format_event_id("10.1.0.7", 31337, start + i * 97)}","advertiser_id":'
                  f'"adv-{rng.randrange(50)}","text":"query {rng.getrandbits(64):016x}-{i % 97}"}}').encode()
                 for i in range(lo, min(n, lo + per_chunk))]
        yield LogChunk("q-00000.jsonl", list(range(lo, lo + len(lines))), lines, 0)


def cache_in_process(n: int) -> dict:
    """Memory and CPU of the cache alone over ``n`` query lines (see the module docstring)."""
    cache = InMemoryEventStore(1 << 34)
    raw_bytes = held = 0
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for chunk in _query_chunks(n):
            found = index_lines(chunk, "query_id")
            raw_bytes += sum(map(len, found.lines))
            held += len(found.ids)
            cache.put_lines(found.ids, found.lines, found.timed)
            del found, chunk
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    counted = cache.status()["bytes"]
    del cache
    index_s = put_s = 0.0
    cache = InMemoryEventStore(1 << 34)
    ids = []
    for chunk in _query_chunks(n):
        t = time.process_time()
        found = index_lines(chunk, "query_id", [])
        t1 = time.process_time()
        cache.put_lines(found.ids, found.lines, found.timed)
        put_s += time.process_time() - t1
        index_s += t1 - t
        ids += found.ids[::7]
    rng = random.Random(6)
    batches = [[rng.choice(ids) for _ in range(100)] for _ in range(max(1, n // 100))]
    t = time.process_time()
    for batch in batches:
        cache.lookup(batch)
    lookup_s = time.process_time() - t
    assert cache.status()["hits"] == 100 * len(batches), "a cached query was not found"
    raw = raw_bytes / held
    return {"cache_queries": held, "raw_line_bytes": round(raw, 1),
            "cache_bytes_per_query": round(used / held, 1), "cache_to_raw_ratio": round(used / held / raw, 3),
            "cache_counted_to_measured": round(counted / used, 3),
            "index_cpu_us_per_line": round(index_s / held * 1e6, 3),
            "put_cpu_us_per_line": round(put_s / held * 1e6, 3),
            "lookup_cpu_us_per_id": round(lookup_s / (100 * len(batches)) * 1e6, 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.eventstore", description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=1024, help="MB of primary logs to write and read")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each lookup measurement")
    p.add_argument("--cache-mb", type=float, default=64, help="cache size of the hit-ratio run")
    p.add_argument("--hit-queries", type=int, default=2_000_000, help="queries of the hit-ratio run")
    p.add_argument("--cache-queries", type=int, default=100_000, help="queries of the in-process cache run")
    p.add_argument("--cache-only", action="store_true", help="only the in-process cache run (no logs, no servers)")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.cache_only:
        emit(cache_in_process(args.cache_queries), args.json, "event store cache, in process")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-es-", dir=args.dir) as tmp:
        return run(Path(tmp), args)


def run(tmp: Path, args) -> int:
    root = tmp / "logs" / "queries"
    t = time.monotonic()
    lines, sample = write_backlog(root, args.mb)
    primary_bytes = sum(os.path.getsize(root / r) for r in list_log_files(root))
    print(f"wrote {lines} queries, {primary_bytes / 2**20:.0f} MB in {time.monotonic() - t:.1f} s", flush=True)
    config = parse_config({"eventstore": {"cache_mb": 256.0, "warm_tail_s": 300.0},
                           "regions": [{"name": "a", "log_root": str(tmp / "logs"), "output_root": str(tmp / "out"),
                                        "state_dir": str(tmp / "state")}]}, "bench.toml", tmp)
    t, cpu = time.monotonic(), time.process_time()
    cache = eventstore.serve(config, "a")
    wait_until(lambda: cache.statistics().read_through_us > 0, 3600, interval=0.05, message="backlog read")
    full_read_s, full_read_cpu_s = time.monotonic() - t, time.process_time() - cpu
    cache.stop()
    entries, _ = eventstore.read_map(eventstore.map_dir(tmp / "state"))
    map_bytes = sum(f.stat().st_size for f in eventstore.map_dir(tmp / "state").rglob("*") if f.is_file())
    gb = primary_bytes / (1 << 30)
    t = time.monotonic()
    cache = eventstore.serve(config, "a")
    wait_until(lambda: cache.statistics().read_through_us > 0, 3600, interval=0.01, message="restart caught up")
    restart_s = time.monotonic() - t
    st = cache.statistics()
    logs = eventstore.serve_logs(config, "a")
    try:
        rng = random.Random(2)
        with EventStoreClient(cache.address) as c, EventStoreClient(logs.address) as lc:
            held = [i for i, r in zip(sample, c.lookup(sample)) if r is not None] or sample
            batches = [[rng.choice(held) for _ in range(100)] for _ in range(50)]
            cache_rate, cache_lat, _ = timed_batches(c.lookup, batches, args.seconds)
            wait_until(lambda: logs.statistics().map_entries >= len(entries), 60, message="logs store map loaded")
            lbatches = [[rng.choice(sample) for _ in range(100)] for _ in range(50)]
            assert None not in lc.lookup(lbatches[0]), "logs store missed a query of the backlog"
            logs_rate, logs_lat, _ = timed_batches(lc.lookup, lbatches, args.seconds)
            cbatches = [[rng.choice(sample) for _ in range(10)] for _ in range(50)]
            cold_rate, cold_lat, _ = timed_batches(lc.lookup, cbatches, args.seconds, before=lambda: drop_page_cache(root))
    finally:
        logs.stop()
        cache.stop()
    ratio = hit_ratio(args.cache_mb, args.hit_queries)
    figures = {
        "primary_mb": round(primary_bytes / 2**20, 1), "primary_lines": lines,
        "full_read_s": round(full_read_s, 2), "full_read_mb_per_s": round(primary_bytes / 2**20 / full_read_s, 1),
        "full_read_cpu_us_per_line": round(full_read_cpu_s / lines * 1e6, 3),
        "restart_to_full_speed_s": round(restart_s, 2), "restart_warm_mb": round(st.warm_bytes / 2**20, 1),
        "restart_bytes_reread": st.bytes_read,
        "map_entries_per_gb": round(len(entries) / gb), "map_bytes_per_gb": round(map_bytes / gb),
        "cache_lookups_per_s": round(cache_rate), "cache_batch100_p50_ms": round(percentile(cache_lat, 50), 3),
        "cache_batch100_p99_ms": round(percentile(cache_lat, 99), 3),
        "logs_warm_lookups_per_s": round(logs_rate), "logs_warm_batch100_p50_ms": round(percentile(logs_lat, 50), 3),
        "logs_warm_batch100_p99_ms": round(percentile(logs_lat, 99), 3),
        "logs_cold_lookups_per_s": round(cold_rate), "logs_cold_batch10_p50_ms": round(percentile(cold_lat, 50), 3),
        "logs_cold_batch10_p99_ms": round(percentile(cold_lat, 99), 3),
        "hit_ratio": round(ratio, 4), "hit_ratio_cache_mb": args.cache_mb,
        "cache_bytes_per_event": round(st.bytes / st.entries, 1) if st.entries else 0,
        **cache_in_process(args.cache_queries),
    }
    emit(figures, args.json, f"event store benchmark ({figures['primary_mb']} MB of primary logs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
