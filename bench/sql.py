"""Output freshness and SQL speed: ``python -m bench.sql [--rates 1000,10000] [--seconds S] [--rows N] [--json]``.

Part 1 (publish latency): a one-region pipeline runs with the default output settings (files roll every
minute, commit record every 50 ms). For each rate, a writer appends queries and their clicks at that many
clicks per second for ``--seconds``; each click line carries the wall time at which it was written whole.
An outside reader follows the output contract (``photon.OutputTailer``: published files plus the committed
prefix of open files, polled every 5 ms) and notes when it first sees each joined click. Published latency
= seen - written (p50/p90); ``after_flush`` = seen - ``_photon.joined_at_us`` (the contract's own share).
Files per joiner-hour: what the roll settings give at the measured output byte rate of the busiest joiner.

Part 2 (history): ``--rows`` joined rows over several past hours, grouped by advertiser with Spark SQL
(``photon sql``'s ``joined`` table) as JSONL, then compacted (``photon compact``) and grouped again as Parquet.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench._common import emit, percentile, stop_groups
from bench.pipeline import ROOT, Writer, write_config
from photon import OutputTailer, load_config, parse_config, wait_until

SQL_SCHEMAS = {"foreign_schema": '"click_id STRING, query_id STRING, cost_micros BIGINT"',
               "primary_schema": '"query_id STRING, advertiser_id STRING"'}
GROUP_BY = ("SELECT query.advertiser_id AS adv, count(*) AS clicks, sum(cost_micros) AS spend FROM joined "
            "GROUP BY query.advertiser_id")


class ContractReader:
    """The outside reader: first-seen wall time of every joined click (µs)."""

    def __init__(self, joined: Path) -> None:
        self.tailer = OutputTailer(joined)
        self.seen: dict[str, tuple[int, int, int]] = {}     # click -> (seen_us, written_us, joined_at_us)

    def poll(self) -> None:
        for chunk in self.tailer.poll():
            now = time.time_ns() // 1000
            for line in chunk.lines:
                e = orjson.loads(line)
                self.seen.setdefault(e["click_id"], (now, e.get("written_at_us", 0), e["_photon"]["joined_at_us"]))


def measure_rate(writer: Writer, reader: ContractReader, rate: int, seconds: float) -> dict:
    first = len(writer.click_ids)
    end = time.monotonic() + seconds
    per_tick = max(1, rate // 100)
    next_t = t0 = time.monotonic()
    next_poll = 0.0
    while time.monotonic() < end:
        writer.batch(per_tick)
        next_t += per_tick / rate
        while True:                     # read the output while waiting for the next tick
            now = time.monotonic()
            if now >= next_poll:
                reader.poll()
                next_poll = now + 0.005
            if now >= next_t:
                break
            time.sleep(min(0.005, max(0.0, next_t - now)))
    written_s = time.monotonic() - t0
    ids = writer.click_ids[first:]
    deadline = time.monotonic() + max(120.0, seconds * 20)
    while time.monotonic() < deadline and not all(c in reader.seen for c in ids):
        reader.poll()
        time.sleep(0.005)
    got = [reader.seen[c] for c in ids if c in reader.seen]
    lat = [(s - w) / 1000 for s, w, _ in got]
    flush = [(s - j) / 1000 for s, _, j in got]
    return {"clicks": len(ids), "seen": len(got), "written_clicks_per_s": round(len(ids) / written_s, 1),
            "p50": round(percentile(lat, 50), 1), "p90": round(percentile(lat, 90), 1),
            "flush_p50": round(percentile(flush, 50), 1), "flush_p90": round(percentile(flush, 90), 1)}


def files_per_joiner_hour(config, joined: Path, elapsed_s: float) -> tuple[float, int]:
    """(files an hour at the busiest joiner's measured byte rate under the roll settings, files made)."""
    sizes: dict[str, int] = {}
    files: dict[str, int] = {}
    for p in joined.rglob("*.jsonl*"):
        if "_committed" in p.parts:
            continue
        name = p.name.lstrip(".").removesuffix(".inprogress")
        joiner = name.rsplit("-", 2)[0]
        sizes[joiner] = sizes.get(joiner, 0) + p.stat().st_size
        files[joiner] = files.get(joiner, 0) + 1
    if not sizes:
        return 0.0, 0
    bytes_per_s = max(sizes.values()) / max(elapsed_s, 1e-9)
    jc = config.joiner
    by_size = bytes_per_s * 3600 / (jc.roll_mb * 2**20)
    return round(max(3600 / jc.roll_interval_s, by_size) + 1, 1), max(files.values())   # +1: the hour's end


def latency_part(rates: list[int], seconds: float) -> dict:
    root = Path(tempfile.mkdtemp(prefix="photon-bench-sql-"))
    cfg_path = write_config(root, 2, {"join": {"unjoinable_after_s": "60"}})
    config = load_config(cfg_path)
    writer = Writer(root)
    log = open(root / "launcher.log", "ab")
    launcher = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "run", "--config", str(cfg_path)],
                                cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    figures: dict = {}
    reader = ContractReader(root / "out" / "joined")
    try:
        writer.batch(1)
        wait_until(lambda: reader.poll() or reader.seen, 180, interval=0.01, message="the pipeline up")
        t0 = time.monotonic()
        for k, rate in enumerate(rates):
            r = measure_rate(writer, reader, rate, seconds)
            suffix = f"_at_{rate}"
            figures.update({f"published_p50_ms{suffix}": r["p50"], f"published_p90_ms{suffix}": r["p90"],
                            f"published_after_flush_p50_ms{suffix}": r["flush_p50"],
                            f"published_after_flush_p90_ms{suffix}": r["flush_p90"],
                            f"written_clicks_per_s{suffix}": r["written_clicks_per_s"],
                            f"clicks_seen{suffix}": f"{r['seen']}/{r['clicks']}"})
            if k == 0:
                figures["published_p50_ms"], figures["published_p90_ms"] = r["p50"], r["p90"]
        fph, made = files_per_joiner_hour(config, root / "out" / "joined", time.monotonic() - t0)
        figures["files_per_joiner_hour"] = fph
        figures["files_made_by_busiest_joiner"] = made
        ids = [c for c in reader.seen]
        figures["duplicates_in_output"] = len(ids) - len(set(ids))
    finally:
        stop_groups([launcher])
        log.close()
    return figures


def history_part(rows: int, files: int) -> dict:
    from photon.app import compact, run_query, spark_session

    root = Path(tempfile.mkdtemp(prefix="photon-bench-sqlhist-"))
    config = parse_config({"regions": [{"name": "a", "log_root": str(root / "logs"), "output_root": str(root / "out"),
                                        "state_dir": str(root / "state")}],
                           "sql": {k: v.strip('"') for k, v in SQL_SCHEMAS.items()},
                           "compact": {"close_after_s": 0, "keep_jsonl_s": 0}}, str(root / "photon.toml"), root)
    joined = root / "out" / "joined"
    per_file = max(1, rows // files)
    for f in range(files):
        part = joined / f"date=2024-05-01/hour={f % 24:02d}"
        part.mkdir(parents=True, exist_ok=True)
        n0 = f * per_file
        with open(part / f"a-j0-1-{f:06d}.jsonl", "wb") as out:
            out.write(b"".join(orjson.dumps({
                "click_id": f"10.2.0.1:1:{n:016d}", "query_id": f"10.1.0.1:1:{n:016d}", "cost_micros": n % 997,
                "query": {"query_id": f"10.1.0.1:1:{n:016d}", "advertiser_id": f"adv-{n % 50}"},
                "_photon": {"region": "a", "joiner": "a-j0", "joined_at_us": n}}) + b"\n"
                for n in range(n0, n0 + per_file)))
    total = per_file * files
    jsonl_mb = round(sum(p.stat().st_size for p in joined.rglob("*.jsonl")) / 2**20, 1)
    spark = spark_session(config, "bench-sql")
    run_query(config, spark, "SELECT 1", "csv", False)              # warm the JVM
    t = time.monotonic()
    jsonl = run_query(config, spark, GROUP_BY, "csv", False)
    jsonl_s = time.monotonic() - t
    t = time.monotonic()
    st = compact(config, spark=spark)
    compact_s = time.monotonic() - t
    t = time.monotonic()
    parquet = run_query(config, spark, GROUP_BY, "csv", False)
    parquet_s = time.monotonic() - t
    same = sorted(jsonl.splitlines()) == sorted(parquet.splitlines())
    return {"groupby_rows": total, "groupby_jsonl_s": round(jsonl_s, 2), "groupby_parquet_s": round(parquet_s, 2),
            "groupby_jsonl_rows_per_s": round(total / jsonl_s, 1), "groupby_parquet_rows_per_s": round(total / parquet_s, 1),
            "compact_s": round(compact_s, 2), "compacted_rows": st.lines_compacted, "groupby_results_equal": same,
            "jsonl_mb": jsonl_mb,
            "parquet_mb": round(sum(p.stat().st_size for p in joined.rglob("*.parquet")) / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,10000", help="clicks per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each rate's run")
    ap.add_argument("--rows", type=int, default=1_000_000, help="joined rows for the group-by")
    ap.add_argument("--files", type=int, default=24, help="JSONL files (one per past hour) holding them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",") if r.strip()]
    figures = latency_part(rates, args.seconds)
    figures.update(history_part(args.rows, args.files))
    emit(figures, args.json, "Photon output freshness and SQL over the joined logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
