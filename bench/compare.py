"""Photon against Spark Structured Streaming on one workload: ``python -m bench.compare [--queries N] [--json]``.

One workload is generated (``photon gen``, one region, ``--queries`` queries and about 0.15 clicks per query,
2% unjoinable, 1% duplicated click lines, bad lines) and copied once per system, so each starts cold on the
same files; the systems run one after the other, not at once (each gets the whole machine).

* **Photon**: ``photon run`` on the generated config, from process start.
* **Spark**: a Structured Streaming stream-stream join in its own process (``local[2]``): both streams read
  as JSON files with their schema given, event time taken from the ids' timestamps, a 10-minute watermark
  on each side, ``dropDuplicatesWithinWatermark`` on the ids, an inner join on the query id with the time
  bound ``query_time <= click_time <= query_time + 10 minutes``, appended to a Parquet sink.

For each system, from its process start: seconds to the first joined click that a reader can see (Photon:
the output contract, :class:`photon.OutputTailer`; Spark: a file listed in the sink's ``_spark_metadata``
log), seconds until every joinable click of the backlog is visible, joined clicks/s over that whole time
(``cold_joined_per_s``) and after the first join (``after_first_per_s``: the joinable clicks that became
visible after the first look that saw any, ``first_join_clicks`` of them seen then, over the time from that look
until the whole backlog is visible; ``null`` when the first visible output already held the whole backlog, as a
Spark micro-batch over the whole backlog does, and the ratio then left out). Then ``--probes`` live probes of
``--probe-clicks`` clicks each (their queries then their clicks, each probe as new files renamed into
place, which both systems pick up): visible latency p50/p90 from the click file's rename to the click being
visible. CPU-seconds of every process of the system (sampled with psutil every 0.2 s, also per process kind,
and per million input lines), and peak RSS per process kind. With ``--timeline MS``, a finer look at where the
wall time goes (see :class:`Timeline`): every process's CPU and run-queue time, the machine's idle time and the
dispatcher's counters every MS milliseconds, folded into per-phase figures. Both outputs are checked against the
generator's truth (every joinable click once, nothing else); a mismatch is printed and the exit code is 1.
Ratios Photon/Spark last.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench._common import emit, percentile, stop_groups
from bench._output import OutputFollower
from bench._profile import Profiler, summarize
from photon import format_event_id, wait_until

ROOT = Path(__file__).resolve().parent.parent
WATERMARK = "10 minutes"


# ---- measuring a process tree ------------------------------------------------------------------------

def process_kind(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if cmd and "java" in os.path.basename(cmd[0]):
        return "spark-jvm"
    if "-m" in cmd:
        mod = cmd[cmd.index("-m") + 1]
        if mod == "photon.app._forkserver":     # the fork server, or a service it forked (named by its room)
            try:
                name = proc.name()
            except psutil.Error:
                return "?"
            return "forkserver" if name.startswith("python") else name
        return {"photon.app.cli": "launcher", "bench.compare": "spark-driver"}.get(mod, mod.split(".")[0])
    if any(c.endswith(("pyspark.daemon", "pyspark.worker")) for c in cmd):
        return "spark-python-worker"
    return os.path.basename(cmd[0]) if cmd else "?"


def _is_python(proc: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(proc.exe())
    except psutil.Error:
        return False


class TreeSampler(threading.Thread):
    """Samples CPU time and RSS of a process and all its descendants every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 0.2, on_new=None) -> None:
        super().__init__(daemon=True)
        self.on_new = on_new             # called with (pid, kind) for each new Python process
        self.root, self.interval, self.stopped = pid, interval, threading.Event()
        self.cpu: dict[int, float] = {}        # pid -> latest user+system seconds
        self.kind: dict[int, str] = {}
        self.peak_rss: dict[str, int] = {}    # kind -> the largest RSS of one process of that kind
        self._procs: dict[int, psutil.Process] = {}
        self.lock = threading.Lock()

    def sample(self) -> None:
        try:
            root = self._procs.setdefault(self.root, psutil.Process(self.root))
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            p = self._procs.setdefault(p.pid, p)
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss = p.memory_info().rss
            except psutil.Error:
                continue
            with self.lock:
                was = self.kind.get(p.pid)
                # a launcher script may exec the JVM in place, and a child caught between fork and exec still
                # shows its parent's command line (the launcher's): both are classified again until they settle;
                # so is a service the fork server forked, until it has named itself
                if was in (None, "?", "spark-python-worker", "bash", "forkserver") or (
                        was == "launcher" and p.pid != self.root):
                    self.kind[p.pid] = process_kind(p)
                    settled = self.kind[p.pid] not in ("?", "spark-jvm", "bash", "forkserver") and not (
                        self.kind[p.pid] == "launcher" and p.pid != self.root)
                    if self.on_new and self.kind[p.pid] != was and settled and _is_python(p):
                        self.on_new(p.pid, self.kind[p.pid])
                kind = self.kind[p.pid]
                # the fork server's reaped children are the services, sampled on their own
                reaped = 0.0 if kind == "forkserver" else t.children_user + t.children_system
                self.cpu[p.pid] = t.user + t.system + reaped
                self.peak_rss[kind] = max(self.peak_rss.get(kind, 0), rss)

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.sample()

    def cpu_by_kind(self) -> dict[str, float]:
        self.sample()
        out: dict[str, float] = {}
        with self.lock:
            for pid, cpu in self.cpu.items():
                out[self.kind[pid]] = out.get(self.kind[pid], 0.0) + cpu
        return out


class Timeline(threading.Thread):
    """Every ``interval`` seconds: each pipeline process's time on a CPU and waiting for one (all its threads,
    from ``/proc/<pid>/task/*/schedstat``, nanoseconds), the dispatchers' status counters, and the clicks
    visible so far. :meth:`report` folds the samples into ``bucket``-second rows and per-phase figures."""

    STATUS_KEYS = ("events_read", "joined", "queued", "in_flight", "requests_in_flight", "waiting_for_store",
                   "ahead_of_store", "retry_queue")

    def __init__(self, sampler: TreeSampler, root: Path, visible, interval: float, t0: float) -> None:
        super().__init__(daemon=True)
        self.sampler, self.root, self.visible, self.interval, self.t0 = sampler, root, visible, interval, t0
        self.stopped = threading.Event()
        self.rows: list[tuple] = []        # (t, {kind: (cpu_ns, wait_ns)}, status dict, visible count, idle s)
        self._status = list(root.rglob("dispatcher/status.json"))

    @staticmethod
    def _schedstat(pid: int) -> tuple[int, int]:
        cpu = wait = 0
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return 0, 0
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    a, b, _ = f.read().split()
            except (OSError, ValueError):
                continue
            cpu, wait = cpu + int(a), wait + int(b)
        return cpu, wait

    def _read_status(self) -> dict:
        import orjson
        if not self._status and len(self.rows) % 20 == 0:     # looked for now and then until one is written
            self._status = list(self.root.rglob("dispatcher/status.json"))
        out: dict = {}
        for path in self._status:
            try:
                s = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            for k in self.STATUS_KEYS:
                out[k] = out.get(k, 0) + int(s.get(k, 0))
        return out

    @staticmethod
    def _machine_idle_s() -> float:
        """Seconds every CPU of the machine has spent idle (idle + iowait) since boot."""
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.sampler.lock:
                kinds = dict(self.sampler.kind)
            per: dict[str, list[int]] = {}
            for pid, kind in kinds.items():
                if kind in ("?", "bash"):
                    continue
                cpu, wait = self._schedstat(pid)
                acc = per.setdefault(kind, [0, 0])
                acc[0] += cpu
                acc[1] += wait
            self.rows.append((time.monotonic() - self.t0, {k: tuple(v) for k, v in per.items()},
                              self._read_status(), len(self.visible()), self._machine_idle_s()))

    def report(self, first_s: float | None, done_s: float, bucket: float, show_rows: bool, joinable: int = 0) -> dict:
        """Rows of ``bucket`` seconds (printed when ``show_rows``) and per-phase figures: cores used, cores'
        worth of time waiting for a CPU, by kind, before the first join and from it to the backlog's end."""
        rows = [r for r in self.rows if r[0] <= done_s + bucket]
        if len(rows) < 2:
            return {}
        kinds = sorted({k for r in rows for k in r[1]})
        out: dict = {}

        def delta(a, b, kind, i):
            return (b[1].get(kind, (0, 0))[i] - a[1].get(kind, (0, 0))[i]) / 1e9

        # the last sample with clicks held back for the event store: about when it had read its backlog; the
        # clicks joined by then were joined while it read (the rest waited for it, or for the joining after it)
        held = [r for r in rows if r[2].get("ahead_of_store", 0) > 0]
        if held and joinable:
            out["timeline_store_read_s"] = round(held[-1][0], 2)
            out["timeline_joined_share_while_store_read"] = round(held[-1][2].get("joined", 0) / joinable, 3)
        phases = [("start", 0.0, first_s or done_s), ("backlog", first_s or done_s, done_s)]
        for name, lo, hi in phases:
            sel = [r for r in rows if lo <= r[0] <= hi]
            if len(sel) < 2:
                continue
            wall = sel[-1][0] - sel[0][0]
            cpu = {k: delta(sel[0], sel[-1], k, 0) for k in kinds}
            wait = {k: delta(sel[0], sel[-1], k, 1) for k in kinds}
            out[f"timeline_{name}_s"] = round(wall, 2)
            out[f"timeline_{name}_cores_used"] = round(sum(cpu.values()) / wall, 2)
            out[f"timeline_{name}_cores_waiting"] = round(sum(wait.values()) / wall, 2)
            # the machine's CPUs idle meanwhile (a pipeline waiting on itself, not on other work)
            out[f"timeline_{name}_machine_cores_idle"] = round((sel[-1][4] - sel[0][4]) / wall, 2)
            for k in kinds:
                out[f"timeline_{name}_cores_{k}"] = round(cpu[k] / wall, 2)
            # intervals where less than a core and a half was busy and nobody waited for a CPU: time not bound by CPU
            idle = 0.0
            for a, b in zip(sel, sel[1:]):
                dt = b[0] - a[0]
                used = sum(delta(a, b, k, 0) for k in kinds) / dt
                waited = sum(delta(a, b, k, 1) for k in kinds) / dt
                if used < 1.5 and waited < 0.2:
                    idle += dt
            out[f"timeline_{name}_s_under_1.5_cores"] = round(idle, 2)
        if show_rows:
            short = {"dispatcher": "disp", "eventstore": "store", "idregistry": "reg", "joiner": "join",
                     "launcher": "launch", "forkserver": "fork"}
            head = " ".join(f"{short.get(k, k)[:6]:>6}" for k in kinds)
            print(f"{'t_s':>5} {head} {'runq':>5} | {'read':>7} {'joined':>7} {'queued':>6} {'infl':>5} "
                  f"{'reqs':>4} {'store':>5} {'ahead':>5} {'retry':>5} | {'visible':>7} {'idle':>5}", file=sys.stderr)
            last = rows[0]
            for r in rows[1:]:
                if r[0] - last[0] < bucket and r is not rows[-1]:
                    continue
                dt = r[0] - last[0]
                cols = " ".join(f"{delta(last, r, k, 0) / dt:6.2f}" for k in kinds)
                runq = sum(delta(last, r, k, 1) for k in kinds) / dt
                s = r[2]
                print(f"{r[0]:5.2f} {cols} {runq:5.2f} | {s.get('events_read', 0):7d} {s.get('joined', 0):7d} "
                      f"{s.get('queued', 0):6d} {s.get('in_flight', 0):5d} {s.get('requests_in_flight', 0):4d} "
                      f"{s.get('waiting_for_store', 0):5d} {s.get('ahead_of_store', 0):5d} "
                      f"{s.get('retry_queue', 0):5d} | {r[3]:7d} {(r[4] - last[4]) / dt:5.2f}", file=sys.stderr)
                last = r
        return out


# ---- the workload ------------------------------------------------------------------------------------

def generate_workload(root: Path, queries: int) -> dict:
    from photon.app import GenOptions, generate
    summary = generate(GenOptions(out=str(root), queries=queries, clicks_per_query=0.15, regions=("a",),
                                  span_s=600.0, unjoinable_after_s=5.0))
    joinable = set((root / "truth" / "joinable.txt").read_text().split())
    lines = sum(p.read_bytes().count(b"\n") for p in (root / "logs").rglob("*.jsonl"))
    return {"joinable": joinable, "input_lines": lines, "clicks_lines": summary.clicks_lines,
            "queries": summary.queries}


class Prober:
    """Writes live probes into a copy of the workload: a new queries file, then a new clicks file (each written
    beside the stream as a dot file, then renamed in), and records each click's rename time."""

    def __init__(self, logs: Path, name: str) -> None:
        self.q, self.c = logs / "queries" / "probe", logs / "clicks" / "probe"
        self.q.mkdir(parents=True, exist_ok=True)
        self.c.mkdir(parents=True, exist_ok=True)
        self.seq, self.name = 0, name
        self.written_us: dict[str, int] = {}

    @staticmethod
    def _place(folder: Path, name: str, data: bytes) -> None:
        tmp = folder.parent / f".{name}"
        tmp.write_bytes(data)
        os.rename(tmp, folder / name)

    def probe(self, clicks: int) -> list[str]:
        self.seq += 1
        now = time.time_ns() // 1000
        qids = [format_event_id("10.7.0.1", 7001, now + i) for i in range(clicks)]
        cids = [format_event_id("10.8.0.1", 8001, now + 1000 + i) for i in range(clicks)]
        self._place(self.q, f"queries-{self.seq:05d}.jsonl", b"".join(
            b'{"query_id":"%s","advertiser_id":"adv-1","country":"A","text":"probe"}\n' % q.encode() for q in qids))
        self._place(self.c, f"clicks-{self.seq:05d}.jsonl", b"".join(
            b'{"click_id":"%s","query_id":"%s","ad_id":"ad-1","cost_micros":1000}\n' % (c.encode(), q.encode())
            for c, q in zip(cids, qids)))
        done = time.time_ns() // 1000
        for cid in cids:
            self.written_us[cid] = done
        return cids


# ---- Spark's side ------------------------------------------------------------------------------------

def spark_child(root: Path) -> None:
    """The Spark Structured Streaming job (runs in its own process until SIGTERM)."""
    from pyspark.sql import SparkSession, functions as F

    quiet = ROOT / "photon" / "app" / "log4j2-quiet.properties"
    spark = (SparkSession.builder.master("local[2]").appName("compare")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{quiet}")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def stream(name: str, schema: str, id_field: str, time_col: str):
        df = (spark.readStream.schema(schema).option("recursiveFileLookup", "true")
              .option("pathGlobFilter", "*.jsonl").json(str(root / "logs" / "a" / name)))
        ts = F.substring_index(F.col(id_field), ":", -1)
        return (df.where(F.col(id_field).rlike(r"^[^:]+:[0-9]+:[0-9]{16}$"))
                .withColumn(time_col, F.timestamp_micros(ts.cast("long")))
                .withWatermark(time_col, WATERMARK).dropDuplicatesWithinWatermark([id_field]))

    clicks = stream("clicks", "click_id STRING, query_id STRING, ad_id STRING, cost_micros BIGINT",
                    "click_id", "click_time").alias("c")
    queries = stream("queries", "query_id STRING, advertiser_id STRING, country STRING, text STRING",
                     "query_id", "query_time").alias("q")
    joined = clicks.join(queries, F.expr(
        "c.query_id = q.query_id AND c.click_time >= q.query_time "
        f"AND c.click_time <= q.query_time + interval {WATERMARK}"))
    out = joined.select("c.click_id", "c.query_id", "c.ad_id", "c.cost_micros", "q.advertiser_id", "q.country",
                        "q.text", "c.click_time")
    query = (out.writeStream.format("parquet").outputMode("append")
             .option("checkpointLocation", str(root / "spark-checkpoint"))
             .start(str(root / "spark-out")))
    print("spark query started", flush=True)
    query.awaitTermination()


class SparkSinkFollower:
    """Reads the Parquet sink as Spark's own readers do: only files listed in ``_spark_metadata``."""

    def __init__(self, out: Path) -> None:
        self.out, self.done_batches = out, set()
        self.seen_us: dict[str, int] = {}
        self.seen_order: list[str] = []      # the ids of seen_us in the order they were seen
        self.rows = 0

    def poll(self) -> int:
        import json
        import pyarrow.parquet as pq
        meta = self.out / "_spark_metadata"
        try:
            names = [n for n in os.listdir(meta) if n.isdigit()]
        except FileNotFoundError:
            return 0
        new = 0
        for n in sorted(names, key=int):
            if n in self.done_batches:
                continue
            try:
                lines = (meta / n).read_text().splitlines()
            except FileNotFoundError:
                continue
            now = time.time_ns() // 1000
            self.done_batches.add(n)
            for line in lines[1:]:
                path = json.loads(line)["path"]
                if path.startswith("file:"):
                    path = path[5:]
                ids = pq.read_table(path, columns=["click_id"]).column("click_id").to_pylist()
                self.rows += len(ids)
                new += len(ids)
                for cid in ids:
                    if cid not in self.seen_us:
                        self.seen_us[cid] = now
                        self.seen_order.append(cid)
        return new


# ---- one system's run --------------------------------------------------------------------------------

def after_first_rate(joinable: int, at_first: int, seconds: float) -> float | None:
    """Joined clicks/s after the first join: the ``joinable - at_first`` clicks that became visible after the
    first look that saw any, over the ``seconds`` from that look until the whole backlog was visible; None when
    that first look already held the whole backlog (nothing after it to measure)."""
    if at_first >= joinable or seconds <= 0:
        return None
    return round((joinable - at_first) / seconds, 1)


def run_system(name: str, root: Path, cmd: list[str], follower, visible_of, work: dict, args,
               order_of) -> dict:
    """Start ``cmd`` in ``root``, follow its output until the backlog is visible, then probe it.
    ``visible_of(follower)``: id -> when it became visible; ``order_of(follower)``: the same ids in the order
    they became visible (a list that only grows), so each poll counts only the ids new since the last."""
    log = open(root / f"{name}.log", "ab")
    profiler = Profiler(Path(args.profile) / name, gil=args.profile_gil) if args.profile else None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    sampler = TreeSampler(proc.pid, on_new=profiler.attach if profiler else None)
    sampler.start()
    timeline = None
    if args.timeline:
        timeline = Timeline(sampler, root, lambda: visible_of(follower), args.timeline / 1000, t0)
        timeline.start()
    figures: dict = {}
    joinable = work["joinable"]
    try:
        first, at_first = None, 0
        counted, visible = 0, 0         # ids of order_of(follower) looked at; of those, joinable ones
        def backlog_visible() -> bool:
            nonlocal first, at_first, counted, visible
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited with {proc.returncode}; see {root / (name + '.log')}")
            follower.poll()
            seen = visible_of(follower)
            order = order_of(follower)  # only the ids that became visible since the last poll
            visible += sum(map(joinable.__contains__, order[counted:]))
            counted = len(order)
            if first is None and seen:
                first, at_first = time.monotonic(), visible
            return visible >= len(joinable)
        wait_until(backlog_visible, timeout=args.timeout, interval=0.02, message=f"{name}: backlog visible")
        done = time.monotonic()
        cpu_backlog = sampler.cpu_by_kind()
        total = done - t0
        figures.update({"first_join_s": round(first - t0, 2), "backlog_s": round(total, 2),
                        "cold_joined_per_s": round(len(joinable) / total, 1),
                        "first_join_clicks": at_first,
                        "after_first_per_s": after_first_rate(len(joinable), at_first, done - first),
                        "backlog_cpu_s": round(sum(cpu_backlog.values()), 1),
                        "cpu_us_per_input_line": round(sum(cpu_backlog.values()) / work["input_lines"] * 1e6, 2)})
        for kind, cpu in sorted(cpu_backlog.items()):
            figures[f"cpu_s_per_m_lines_{kind}"] = round(cpu / work["input_lines"] * 1e6, 2)
        if timeline:
            timeline.stopped.set()
            timeline.join()
            figures.update(timeline.report(first - t0, total, args.timeline_bucket, args.timeline_rows,
                                           len(joinable)))
        figures.update(dispatcher_attempts(root))
        prober = Prober(root / "logs" / "a", name)
        lat = []
        timed_out = 0
        for _ in range(args.probes):
            cids = prober.probe(args.probe_clicks)
            try:
                wait_until(lambda: follower.poll() >= 0 and all(c in visible_of(follower) for c in cids),
                           timeout=args.probe_timeout, interval=0.002, message=f"{name}: probe visible")
            except TimeoutError:
                timed_out += 1      # counted, and its clicks count as missing below unless they appear later
            seen = visible_of(follower)
            lat += [(seen[c] - prober.written_us[c]) / 1000 for c in cids if c in seen]
        figures["probes_timed_out"] = timed_out
        follower.poll()
        figures.update({"visible_p50_ms": round(percentile(lat, 50), 1),
                        "visible_p90_ms": round(percentile(lat, 90), 1)})
        expected = joinable | set(prober.written_us)
        seen = visible_of(follower)
        figures["wrong_ids"] = len(set(seen) - expected)
        figures["missing_ids"] = len(expected - set(seen))
        figures["cpu_s_total"] = round(sum(sampler.cpu_by_kind().values()), 1)
    finally:
        sampler.stopped.set()
        if profiler:
            profiler.stop()
        stop_groups([proc])
        log.close()
    for kind, rss in sorted(sampler.peak_rss.items()):
        figures[f"peak_rss_mb_{kind.replace('-', '_')}"] = round(rss / 2**20, 1)
    return figures


def dispatcher_attempts(root: Path) -> dict:
    """Joiner requests per click read (``attempts_per_click``) from the dispatchers' status files (Photon
    only; empty for a system without them): above 1 is work done again (retries); of those, the attempts the
    joiners answered THROTTLED because their event store had not read the query yet, per click read."""
    import orjson
    attempts = read = held = behind = requests = 0
    waits = {"store_wait_us": 0, "commit_wait_us": 0, "write_wait_us": 0}
    for status in root.rglob("dispatcher/status.json"):
        try:
            s = orjson.loads(status.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        attempts, read = attempts + s.get("attempts", 0), read + s.get("events_read", 0)
        held += s.get("held_for_store", 0)
    for status in root.rglob("joiners/*.json"):
        try:
            joiner = orjson.loads(status.read_bytes())
            behind += joiner.get("not_found_store_behind", 0)
            requests += joiner.get("requests", 0)
            for k in waits:
                waits[k] += joiner.get(k, 0)
        except (OSError, orjson.JSONDecodeError, AttributeError):
            continue
    if not read:
        return {}
    # store_behind_per_click: attempts answered THROTTLED because the event store had not read the query yet
    # (retried); held_for_store_per_click: clicks the dispatcher held back for the store instead of sending
    return {"attempts_per_click": round(attempts / read, 3), "store_behind_per_click": round(behind / read, 3),
            "held_for_store_per_click": round(held / read, 3),
            # joiner requests (each a store lookup and a registry commit) per thousand clicks read, as of the
            # joiners' latest status files (rewritten about once a second: a lower bound)
            "joiner_requests_per_k_clicks": round(requests / read * 1000, 2),
            # where a joiner request's wall time went, ms per request on average: the event store lookup, the
            # registry commit, the output write (the rest: parsing, the adapter, gRPC)
            **{f"joiner_{k[:-8]}_ms_per_request": round(v / 1000 / max(1, requests), 1) for k, v in waits.items()}}


def add_settings(config: Path, items: list[str]) -> None:
    """Append ``SECTION.KEY=VALUE`` options to a generated config (sections it does not have yet)."""
    sections: dict[str, list[str]] = {}
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    text = config.read_text()
    head, sep, regions = text.partition("[[regions]]")
    extra = "".join(f"[{s}]\n" + "\n".join(v) + "\n\n" for s, v in sections.items())
    config.write_text(head + extra + sep + regions)


def photon_visible(f: OutputFollower) -> dict:
    return f.published_us


def spark_visible(f: SparkSinkFollower) -> dict:
    return f.seen_us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--probe-clicks", type=int, default=10)
    ap.add_argument("--systems", default="photon,spark")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for the backlog")
    ap.add_argument("--probe-timeout", type=float, default=120.0, help="seconds allowed for one probe")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra photon.toml option for Photon, e.g. dispatcher.max_in_flight=8 (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--profile", metavar="DIR", help="py-spy record every Python process into DIR (slows them)")
    ap.add_argument("--profile-gil", action="store_true",
                    help="with --profile: sample only the thread holding the GIL (where the interpreter's time goes)")
    ap.add_argument("--timeline", type=float, default=0.0, metavar="MS",
                    help="sample every Photon process's CPU and run-queue time and the dispatchers' counters every "
                         "MS milliseconds until the backlog is visible; prints per-phase figures (timeline_*)")
    ap.add_argument("--timeline-bucket", type=float, default=0.1, metavar="S",
                    help="with --timeline-rows: seconds per printed row")
    ap.add_argument("--timeline-rows", action="store_true",
                    help="with --timeline: print the timeline's rows on stderr")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--spark-child", metavar="ROOT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.spark_child:
        spark_child(Path(args.spark_child))
        return 0
    base = Path(tempfile.mkdtemp(prefix="photon-compare-"))
    figures: dict = {"load_average_at_start": round(os.getloadavg()[0], 2)}
    try:
        gen = base / "gen"
        work = generate_workload(gen, args.queries)
        figures.update({"queries": work["queries"], "click_lines": work["clicks_lines"],
                        "joinable_clicks": len(work["joinable"]), "input_lines": work["input_lines"]})
        results = {}
        for system in args.systems.split(","):
            root = base / system
            shutil.copytree(gen, root)
            if system == "photon":
                add_settings(root / "photon.toml", args.set)
                cmd = [sys.executable, "-m", "photon.app.cli", "run", "--config", str(root / "photon.toml")]
                follower = OutputFollower(root / "out" / "a" / "joined", seen=False)
                results[system] = run_system(system, root, cmd, follower, photon_visible, work, args,
                                             order_of=lambda f: f.published_order)
            else:
                cmd = [sys.executable, "-m", "bench.compare", "--spark-child", str(root)]
                results[system] = run_system(system, root, cmd, SparkSinkFollower(root / "spark-out"),
                                             spark_visible, work, args, order_of=lambda f: f.seen_order)
            for key, value in results[system].items():
                figures[f"{system}_{key}"] = value
        if "photon" in results and "spark" in results:
            p, s = results["photon"], results["spark"]
            figures["ratio_cold_joined_per_s"] = round(p["cold_joined_per_s"] / s["cold_joined_per_s"], 2)
            if p["after_first_per_s"] is not None and s["after_first_per_s"]:
                figures["ratio_after_first_per_s"] = round(p["after_first_per_s"] / s["after_first_per_s"], 2)
            figures["ratio_visible_p50"] = round(s["visible_p50_ms"] / max(1e-3, p["visible_p50_ms"]), 2)
            figures["ratio_cpu"] = round(s["backlog_cpu_s"] / max(1e-3, p["backlog_cpu_s"]), 2)
        figures["load_average_at_end"] = round(os.getloadavg()[0], 2)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    if args.profile:
        for p in sorted(Path(args.profile).rglob("*.txt")):
            print(summarize(p))
    emit(figures, args.json, f"Photon vs Spark Structured Streaming ({base})")
    bad = [k for k, v in figures.items() if k.endswith(("wrong_ids", "missing_ids")) and v]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
