"""Faults under worker processes (``millwheel run --workers 2``: three master replicas, two worker
processes, records between them over gRPC, state in a real PostgreSQL): a record user code keeps failing
on is set aside; PostgreSQL is restarted mid-stream; dedup ids are garbage-collected across processes,
also when a worker is SIGKILLed. Each time the windows equal the batch answer, each window once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from millwheel import EmbeddedPostgres, MasterClient, open_store
from millwheel._cluster import ClusterFile, cluster_path, known_workers, wait_cluster_idle, worker_status
from photon import wait_until

from mw_helpers import batch_windows, read_windows, write_joined

pytestmark = pytest.mark.timeout(600)

START_S = 240
"""Deadline for a cluster to start and records to flow (24 s at load 25 on the 2-core machine, more than 90 s
at load 30-44)."""

HERE = Path(__file__).resolve().parent
SLOTS = 16
GC = ["dedup_retention_us=1000000", "gc_interval_us=300000"]


class Cluster:
    """``millwheel run MODULE --workers N`` as a child process, with its cluster file and a master client."""

    def __init__(self, tmp: Path, store: str, *, workers: int = 2, n_clicks: int = 4000, files: int = 8,
                 module: str = "examples.ad_windows", options: tuple = (), poison: int | None = None) -> None:
        """``poison``: the index of the click ``mw_poison_windows`` raises on (not in the expected output)."""
        self.input, self.out = tmp / "in", tmp / "out"
        self.events = write_joined(self.input, n_clicks, files)
        self.poison = None if poison is None else self.events[poison]
        self.expected = [e for e in self.events if e is not self.poison]
        self.module = module
        argv = [sys.executable, "-m", "millwheel.cli", "run", module, "--input", str(self.input), "--out",
                str(self.out), "--workers", str(workers), "--store", store, "--master-option", "lease_us=2000000",
                "--option", "retry_delay_us=500000", "--option", "injector_batch=200"]
        for o in options:
            argv += ["--option", o]
        child_env = dict(os.environ)
        if self.poison is not None:
            child_env["MW_POISON_CLICK"] = self.poison["click_id"]
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p)
        self.log = open(tmp / "run.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=child_env)
        self.client = None
        try:
            wait_until(lambda: cluster_path(self.out).exists() or self.proc.poll() is not None, START_S,
                       message="the cluster file")
            self.cluster = ClusterFile.load(cluster_path(self.out))
            self.client = MasterClient(self.cluster.masters, retry_timeout_s=30.0)
            wait_until(lambda: len(self.workers()) == workers, START_S, message=f"{workers} workers answering")
        except BaseException:
            self.close()      # the run and everything it started stop, also when it did not start
            raise

    def workers(self) -> list[dict]:
        return [s for s in (worker_status(a) for a in known_workers(self.out, None)) if "unreachable" not in s]

    def processed(self, computation: str = "windows") -> int:
        return sum(w["computations"].get(computation, {}).get("records", 0) for w in self.workers())

    def wait_idle(self, timeout: float = 300) -> None:
        sys.path.insert(0, str(HERE))
        try:
            module = __import__(self.module) if "." not in self.module else \
                __import__(f"millwheel.{self.module}", fromlist=["build"])
        finally:
            sys.path.remove(str(HERE))
        try:
            wait_cluster_idle(module.build(str(self.input), str(self.out)), self.out, self.client,
                              threading.Event(), timeout)
        except TimeoutError:
            raise TimeoutError(f"not idle after {timeout} s: {self.why_busy()}") from None

    def why_busy(self) -> str:
        """What the workers and the master say, for a run that does not get idle."""
        workers = [{k: w.get(k) for k in ("worker", "busy", "injectors", "counters", "error", "in_flight",
                                          "outstanding", "low_watermarks_us", "computations")}
                   | {"intervals": [(iv["computation"], iv["lo"], iv["sequencer"]) for iv in w["intervals"]]}
                   for w in self.workers()]
        owners = [(iv.computation, iv.lo, iv.worker, iv.sequencer) for iv in self.client.interval_map()]
        return json.dumps({"workers": workers, "map": owners})

    def check(self) -> None:
        got = read_windows(self.out / "windows.jsonl")
        keys = [(w["advertiser_id"], w["window_start_us"]) for w in got]
        assert len(keys) == len(set(keys)), "a window written twice"
        assert {(w["advertiser_id"], w["window_start_us"]): w["clicks"] for w in got} == batch_windows(self.expected)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def cluster(reachable_tmp):
    runs: list[Cluster] = []

    def make(store: str, **kw) -> Cluster:
        r = Cluster(reachable_tmp, store, **kw)
        runs.append(r)
        return r
    try:
        yield make
    finally:
        for r in runs:
            r.close()
        for r in runs:
            assert r.proc.poll() is not None


@pytest.fixture
def own_pg(reachable_tmp):
    """A server of the test's own, free to crash and start again (the session's server is shared)."""
    server = EmbeddedPostgres(reachable_tmp / "pg")
    try:
        yield server.start()
    finally:
        server.stop()


def _dedup_rows(url: str) -> int:
    store = open_store(url)
    try:
        return sum(len(store.dedup_ids(c, range(SLOTS))) for c in ("windows", "window-sink", "spikes", "anomaly-sink"))
    finally:
        store.close()


def test_a_record_user_code_keeps_failing_on_is_set_aside_by_a_worker_process(cluster, pg_url):
    run = cluster(pg_url, module="mw_poison_windows", poison=1234)
    run.wait_idle()
    run.check()
    store = open_store(pg_url)
    try:
        aside = store.set_aside_records()
    finally:
        store.close()
    bad = run.poison
    assert [(r.computation, r.key, r.attempts) for r in aside] == [("windows", bad["query"]["advertiser_id"], 5)]
    assert aside[0].error == f"ValueError: poisoned click {bad['click_id']}"
    assert json.loads(aside[0].value)["click_id"] == bad["click_id"]
    def status() -> dict:
        out = subprocess.run([sys.executable, "-m", "millwheel.cli", "status", "--out", str(run.out), "--json"],
                             capture_output=True, timeout=60, check=True)
        return json.loads(out.stdout)
    # the running workers' count sums what every worker answers (a worker slow to answer, under load, is
    # listed as unreachable); the store's count does not depend on that
    st = status()
    assert st["set_aside_stored"] == 1
    wait_until(lambda: status()["set_aside"] == 1, 120, message="the workers counting the record set aside")
    assert st["set_aside_records"] == [{"computation": "windows", "key": bad["query"]["advertiser_id"],
                                        "id": aside[0].id, "error": aside[0].error, "attempts": 5}]
    text = subprocess.run([sys.executable, "-m", "millwheel.cli", "status", "--out", str(run.out)],
                          capture_output=True, timeout=60, check=True).stdout.decode()
    assert "set aside: 1 by the running workers, 1 in the store" in text
    assert f"record {aside[0].id} after 5 attempts: ValueError: poisoned click" in text


def test_postgres_restarted_mid_stream_workers_retry_and_nothing_is_lost_or_doubled(cluster, own_pg):
    run = cluster(own_pg.url, n_clicks=6000, files=12)
    wait_until(lambda: run.processed() > 500, START_S, message="records flowing")
    before = sum(w["store"].get("retries", 0) for w in run.workers())
    at_crash = run.processed()
    own_pg.crash()          # as a power cut: the next start replays the WAL
    try:
        wait_until(lambda: sum(w["store"].get("retries", 0) for w in run.workers()) >= before + 4, 60,
                   message="the workers retrying against the stopped server")
    finally:
        own_pg.start()      # the same data directory and port
    run.wait_idle()
    run.check()
    assert at_crash < len(run.events), "the server went away mid-stream"


def test_dedup_ids_are_collected_across_worker_processes(cluster, pg_url):
    run = cluster(pg_url, options=GC)
    run.wait_idle()
    run.check()
    # every id is deleted once its sender's floor passes it: nothing is left a retention after idle
    wait_until(lambda: _dedup_rows(pg_url) == 0, 60, message="every dedup id collected")
    st = run.workers()
    assert sum(w["dedup_gc"]["deleted"] for w in st) >= len(run.events)
    assert all(w["dedup_gc"]["rounds"] > 0 for w in st), "both processes collected"
    store = open_store(pg_url)
    try:
        assert store.gc_floors("windows")["joined"] > 0
    finally:
        store.close()


def test_a_worker_sigkilled_with_dedup_gc_on_each_window_is_written_once(cluster, pg_url):
    run = cluster(pg_url, n_clicks=6000, files=12, options=GC)
    wait_until(lambda: run.processed() > 500, START_S, message="records flowing")
    wait_until(lambda: sum(w["dedup_gc"]["deleted"] for w in run.workers()) > 0, 60,
               message="dedup ids collected before the kill")
    victim = max(run.workers(), key=lambda w: len(w["intervals"]))
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: all(iv.worker and iv.worker != victim["worker"] for iv in run.client.interval_map()),
               30, message="the killed worker's intervals moved")
    run.wait_idle()
    run.check()
    wait_until(lambda: _dedup_rows(pg_url) == 0, 60, message="every dedup id collected")
