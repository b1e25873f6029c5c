"""``python -m bench.verify [--sizes 1000000,5000000] [--cold 1000000] [--lost 1000] [--lost-files N] [--json]``

1. Verify throughput: for each size N, one region's N foreign events (plus their joined output, all but
   0.1% of them, and a registry export holding every id) are written to a temporary folder, and
   ``photon verify``'s job runs over them on the configured local Spark (the session's start is not
   counted). Prints events/s (N / job time) and the time spent reading input vs joining. The lost 0.1% are
   every thousandth event, in every input file, or with ``--lost-files N`` as many in the first N files of
   200K lines only (an outage's losses, close in time: the lookup reads only the files holding them).
2. From a cold start (``--cold N``, by default the smallest size; 0 to skip): the same data for N events, and a new Python process that
   imports Photon, starts Spark and runs the job; prints its seconds from launch to the report (Spark's
   start-up included) and, of those, the session's start, the JVM's CPU-seconds (start-up and job; of them,
   the start's), the Spark jobs the run submitted, and whether the driver's class archive was used (a first
   run writes it at its exit: run the bench twice to time a start with it), the job's JVM CPU-seconds by kind of
   thread (JIT compilers, garbage collector, task threads, the rest) and the classes Spark's code generation
   compiled (with Janino) and its milliseconds, and how the driver's JVM was started (``cached``: by the launch
   command kept from an earlier start, photon.app._launch; ``spark-submit``: through Spark's launcher).
   Its timeline, from Spark's status store: the seconds from the session's start to the first job's
   submission (the driver's planning), in the jobs, between them and after the last, and each stage's task
   CPU-seconds (``a/b/c``). For the throughput runs too: the JVM's CPU-seconds of the job (less sensitive to other load than wall time).
3. Recovery end to end (``--lost 0`` skips it): a real pipeline (``photon run``) with ``--lost`` clicks put into the loss window
   (their ids registered under a stopped joiner's token before the dispatcher reads them, so the
   pipeline drops them as already joined); then times verify + recover + the pipeline re-joining them.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bench._common import emit
import idregistry
from photon import IdGenerator, load_config, read_output_lines, wait_until
from photon.app import GenOptions, generate, run_recover, run_verify, spark_session

FILE_LINES = 200_000


def _dead_token() -> str:
    p = subprocess.Popen(["true"])
    p.wait()
    return f"127.0.0.1:1/{p.pid}/{time.time_ns() // 1000 - 10**7}/1"


def prepare(root: Path, n: int, lost_files: int = 0) -> int:
    """One region of ``n`` foreign events, their joined output but every thousandth, and a registry export
    of every id under a stopped joiner's token, in ``root``; returns how many are lost. With ``lost_files``
    the same number of lost events is spread over the first ``lost_files`` files of 200K lines only (an
    outage's losses cluster in time), not over every file."""
    root.mkdir(parents=True)
    (root / "photon.toml").write_text('[[regions]]\nname = "a"\nlog_root = "logs"\noutput_root = "out"\n'
                                      'state_dir = "state"\n')
    gen = IdGenerator("10.1.1.1", 77)
    ids = [gen.next_id() for _ in range(n)]
    clicks, joined = root / "logs/clicks", root / "out/joined"
    clicks.mkdir(parents=True)
    joined.mkdir(parents=True)
    (root / "out/unjoinable").mkdir()
    lost_every = 1000
    expected = (n + lost_every - 1) // lost_every
    span = min(n, lost_files * FILE_LINES)
    lost = set(range(0, span, max(1, span // expected))[:expected]) if lost_files else None
    for k in range(0, n, FILE_LINES):
        part = ids[k:k + FILE_LINES]
        lines = [orjson.dumps({"click_id": i, "query_id": i, "ad": j % 50}) for j, i in enumerate(part)]
        (clicks / f"c-{k:09d}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        out = [line[:-1] + b',"_photon":{"region":"a"}}' for j, line in enumerate(lines)
               if ((k + j) not in lost if lost is not None else (k + j) % lost_every)]
        (joined / f"a-j0-1-{k:09d}.jsonl").write_bytes(b"\n".join(out) + b"\n")
    registry = idregistry.InMemoryRegistry()
    token = _dead_token()
    for k in range(0, n, 50_000):
        registry.commit(ids[k:k + 50_000], token)
    idregistry.export_registry(registry, root / "export")
    return len(lost) if lost is not None else expected


def _checked(report, n: int, expected_lost: int) -> None:
    if report.lost != expected_lost or report.recoverable != expected_lost or report.foreign_events != n \
            or report.duplicates:
        raise SystemExit(f"verify miscounted: {report.as_dict()} (expected {expected_lost} lost of {n})")


def jvm_cpu_s(spark) -> float:
    """CPU-seconds the session's JVM (driver and local executors) has used so far (Linux ``/proc``)."""
    with open(f"/proc/{spark.sparkContext._gateway.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jvm_threads_cpu_s(spark) -> dict:
    """The JVM's CPU-seconds so far by kind of thread (Linux ``/proc/<pid>/task``): ``jit`` (the compiler
    threads), ``gc`` (the collector's and the VM thread), ``tasks`` (Spark's task threads) and ``other``
    (the driver: planning, code generation, py4j, the scheduler). Threads that ended are not counted."""
    pid = spark.sparkContext._gateway.proc.pid
    tick = os.sysconf("SC_CLK_TCK")
    kinds = {"jit": 0.0, "gc": 0.0, "tasks": 0.0, "other": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = "jit" if "CompilerThre" in name else "gc" if name.startswith(("GC ", "G1 ", "VM Thread")) \
            else "tasks" if name.startswith("Executor task") else "other"
        kinds[kind] += (int(fields[11]) + int(fields[12])) / tick
    return kinds


def codegen_figures(spark) -> dict:
    """Spark's own code generation so far (its ``CodegenMetrics``): classes Janino compiled, and the
    milliseconds it took."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    compiled = metrics.METRIC_COMPILATION_TIME()
    return {"codegen_classes": compiled.getCount(),
            "codegen_ms": round(compiled.getSnapshot().getMean() * compiled.getCount())}


def throughput(spark, root: Path, n: int, lost_files: int = 0) -> dict:
    """One region of ``n`` foreign events; returns the job's figures (the session already started)."""
    expected_lost = prepare(root, n, lost_files)
    cpu0, jobs0, t0 = jvm_cpu_s(spark), spark_jobs(spark), time.perf_counter()
    report = run_verify(load_config(root / "photon.toml"), spark, export_dir=root / "export")
    elapsed = time.perf_counter() - t0
    _checked(report, n, expected_lost)
    return {"events_per_s": round(n / elapsed), "read_s": report.timings["read_s"],
            "join_s": report.timings["join_s"], "duplicates": report.duplicates,
            "jvm_cpu_s": round(jvm_cpu_s(spark) - cpu0, 1), "spark_jobs": spark_jobs(spark) - jobs0}


def cold(root: Path, n: int, lost_files: int = 0) -> dict:
    """Seconds from launching a new process to its verify report over ``n`` events (Spark started in it)."""
    expected_lost = prepare(root, n, lost_files)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "bench.verify", "--cold-child", str(root), str(n), str(expected_lost)],
                       capture_output=True, text=True, timeout=900)
    total = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"the cold verify run failed: {r.stderr[-2000:]}")
    child = orjson.loads(r.stdout.strip().splitlines()[-1])
    return {"total_s": round(total, 2), **{k: v for k, v in child.items()}}


def spark_jobs(spark) -> int:
    """Spark jobs the session has run so far (its status store)."""
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


def _scala_list(spark, seq) -> list:
    """A Scala ``Seq`` of the JVM (the status store's answers) as a Python list."""
    return list(spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))


def timeline(spark, ready: float, done: float) -> dict:
    """Where a cold run's job time went, from Spark's status store (wall clock, ``time.time()`` seconds):
    ``before_first_job_s`` from the session's start (``ready``) to the first job's submission (the driver's
    serial work: reading the export's tokens, listing, the counts' plan built through py4j, analysed,
    planned and code-generated), ``spark_jobs_s`` the jobs' own spans, ``between_jobs_s`` the gaps between
    them (the needs read, the lookup's plan), ``after_jobs_s`` from the last job's end to the report
    (``done``); ``stage_task_cpu_s``: the task threads' CPU-seconds of each stage in order, as ``a/b/c``."""
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = sorted((j.submissionTime().get().getTime() / 1000, j.completionTime().get().getTime() / 1000)
                  for j in _scala_list(spark, store.jobsList(None))
                  if j.submissionTime().isDefined() and j.completionTime().isDefined())
    gateway = spark.sparkContext._gateway
    stages = sorted((s.stageId(), s.executorCpuTime() / 1e9) for s in _scala_list(
        spark, store.stageList(None, False, False, gateway.new_array(gateway.jvm.double, 0), None)))
    if not jobs:
        return {"before_first_job_s": round(done - ready, 2), "spark_jobs_s": 0.0, "between_jobs_s": 0.0,
                "after_jobs_s": 0.0, "stage_task_cpu_s": ""}
    return {"before_first_job_s": round(jobs[0][0] - ready, 2),
            "spark_jobs_s": round(sum(end - start for start, end in jobs), 2),
            "between_jobs_s": round(sum(max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(jobs)), 2),
            "after_jobs_s": round(done - jobs[-1][1], 2),
            "stage_task_cpu_s": "/".join(f"{cpu:.2f}" for _, cpu in stages)}


def _class_archive_state(spark, archive) -> str:
    """``used`` (the JVM mapped the driver's class archive), ``written at exit`` (none yet: this run writes
    it), ``refused`` or ``off`` (photon.app._class_archive)."""
    if archive is None:
        return "off"
    if not archive.exists:
        return "written at exit"
    return "used" if archive.mapped_by(spark.sparkContext._gateway.proc.pid) else "refused"


def _launch_kind(spark) -> str:
    """``cached`` (the driver's JVM started by the cached launch command, photon.app._launch) or
    ``spark-submit``."""
    return "spark-submit" if str(spark.sparkContext._gateway.proc.args[0]).endswith("spark-submit") else "cached"


def _cold_child(root: str, n: str, expected_lost: str) -> int:
    from photon.app import class_archive_plan, input_bytes, scanner_jar
    config = load_config(Path(root) / "photon.toml")
    archive = class_archive_plan(config, scanner_jar(config))     # the archive as spark_session plans it
    t0 = time.perf_counter()
    spark = spark_session(config, "bench-verify-cold", input_bytes=input_bytes(config))    # as photon verify
    t1 = time.perf_counter()
    start_cpu, threads0, ready = jvm_cpu_s(spark), jvm_threads_cpu_s(spark), time.time()
    report = run_verify(load_config(Path(root) / "photon.toml"), spark, export_dir=Path(root) / "export")
    t2, done = time.perf_counter(), time.time()
    _checked(report, int(n), int(expected_lost))
    threads = jvm_threads_cpu_s(spark)
    print(orjson.dumps({**{f"job_{k}_cpu_s": round(v - threads0[k], 1) for k, v in threads.items()},
                        **codegen_figures(spark),"spark_start_s": round(t1 - t0, 2), "job_s": round(t2 - t1, 2),
                        "jvm_cpu_s": round(jvm_cpu_s(spark), 1), "jvm_start_cpu_s": round(start_cpu, 1),
                        "spark_jobs": spark_jobs(spark),
                        "class_archive": _class_archive_state(spark, archive),
                        "launch": _launch_kind(spark),
                        "scanner": spark.catalog.functionExists("photon_strict_id"),
                        **timeline(spark, ready, done)}).decode())
    spark.stop()
    return 0


def recovery(spark, root: Path, lost: int, timeout: float) -> dict:
    """Seconds from ``lost`` clicks lost to their being joined: verify + recover + re-joined."""
    root.mkdir(parents=True)
    s = generate(GenOptions(out=str(root), queries=max(2000, int(lost * 12)), unjoinable_fraction=0.0,
                            duplicate_fraction=0.0, bad_line_fraction=0.0, seed=5))
    config = load_config(s.config)
    joinable = set((root / "truth/joinable.txt").read_text().split())
    region = config.regions[0]
    clicks = Path(region.log_root) / config.join.foreign_stream
    # hold the click files back until the lost ids are registered under a stopped joiner's token
    held = root / "held"
    shutil.move(str(clicks), held)
    clicks.mkdir()
    victims = sorted(joinable)[:lost]
    log = open(root / "launcher.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "run", "--config", s.config],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = idregistry.RegistryClient(idregistry.registry_endpoints(config), retry_timeout_s=120)
        wait_until(lambda: (config.registry_data_dir).exists(), 60, message="the registry started")
        client.commit(victims, _dead_token())
        for p in held.iterdir():
            shutil.move(str(p), clicks / p.name)

        def joined_ids():
            return {orjson.loads(x)["click_id"] for x in read_output_lines(region.joined_dir, True)}
        wait_until(lambda: joined_ids() == joinable - set(victims), timeout, interval=0.5,
                   message="every click joined but the lost ones")
        t0 = time.perf_counter()
        report = run_verify(config, spark)
        t_verify = time.perf_counter() - t0
        done = run_recover(config, report.recoverable_path, client=client)
        t_recover = time.perf_counter() - t0 - t_verify
        wait_until(lambda: joined_ids() == joinable, timeout, interval=0.2, message="the lost clicks re-joined")
        total = time.perf_counter() - t0
        ids = [orjson.loads(x)["click_id"] for x in read_output_lines(region.joined_dir, True)]
        client.close()
        return {"lost_clicks": lost, "recovered": done.reinjected, "verify_s": round(t_verify, 2),
                "recover_s": round(t_recover, 2), "recover_end_to_end_s": round(total, 2),
                "duplicates_in_output": len(ids) - len(set(ids))}
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)
        log.close()


def _label(n: int) -> str:
    return f"{n // 1_000_000}m" if n >= 1_000_000 else f"{n // 1000}k" if n >= 1000 else str(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.verify", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000000,5000000", help="foreign events per verify run, comma-separated")
    ap.add_argument("--cold", type=int, default=None,
                    help="events of the run timed from a cold start, Spark's start-up included (default: the "
                         "smallest of --sizes; 0: none)")
    ap.add_argument("--lost", type=int, default=1000, help="lost clicks to recover end to end (0: none)")
    ap.add_argument("--lost-files", type=int, default=0,
                    help="put the verify runs' lost events (one per thousand) in the first N input files of 200K "
                         "lines only (0: spread over every file)")
    ap.add_argument("--cold-child", nargs=3, metavar=("ROOT", "N", "LOST"), help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cold_child:
        return _cold_child(*args.cold_child)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.cold is None:
        args.cold = min(sizes, default=0)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        if args.cold:
            f = cold(Path(tmp) / "cold", args.cold, args.lost_files)
            label = _label(args.cold)
            figures[f"verify_{label}_from_cold_start_s"] = f["total_s"]
            figures[f"verify_{label}_cold_spark_start_s"] = f["spark_start_s"]
            figures[f"verify_{label}_cold_job_s"] = f["job_s"]
            figures[f"verify_{label}_cold_jvm_cpu_s"] = f["jvm_cpu_s"]
            figures[f"verify_{label}_cold_jvm_start_cpu_s"] = f["jvm_start_cpu_s"]
            figures[f"verify_{label}_cold_spark_jobs"] = f["spark_jobs"]
            figures[f"verify_{label}_cold_class_archive"] = f["class_archive"]
            figures[f"verify_{label}_cold_launch"] = f["launch"]
            for key in ("job_jit_cpu_s", "job_gc_cpu_s", "job_tasks_cpu_s", "job_other_cpu_s", "codegen_classes",
                        "codegen_ms", "scanner", "before_first_job_s", "spark_jobs_s", "between_jobs_s", "after_jobs_s",
                        "stage_task_cpu_s"):
                figures[f"verify_{label}_cold_{key}"] = f[key]
            shutil.rmtree(Path(tmp) / "cold")
        spark = spark_session(None, "bench-verify")
        for n in sizes:
            f = throughput(spark, Path(tmp) / f"n{n}", n, args.lost_files)
            label = _label(n)
            figures[f"verify_{label}_events_per_s"] = f["events_per_s"]
            figures[f"verify_{label}_read_s"] = f["read_s"]
            figures[f"verify_{label}_join_s"] = f["join_s"]
            figures[f"verify_{label}_jvm_cpu_s"] = f["jvm_cpu_s"]
            figures[f"verify_{label}_spark_jobs"] = f["spark_jobs"]
            shutil.rmtree(Path(tmp) / f"n{n}")
        if args.lost:
            figures.update(recovery(spark, Path(tmp) / "recover", args.lost, args.timeout))
    emit(figures, args.json, "photon verify / recover")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
