"""Stopping worker processes and ``millwheel run`` promptly, whatever PostgreSQL is doing.

A worker process asked to stop (SIGTERM) while its PostgreSQL is frozen (every server process SIGSTOPped:
calls in progress hang, connections hang) or stopped (connections refused) exits within a few seconds with
status 0 and a line naming what it gave up; ``millwheel run --until-idle`` stopped with Ctrl-C (SIGINT to
its process group, as a terminal sends it, or to the run alone) stops every process it started."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import psutil
import psycopg
import pytest

from millwheel import MasterClient, MasterUnavailable, open_store
from millwheel import master_pb2_grpc as pb_grpc
from millwheel._cluster import cluster_path, worker_argv, worker_status
from photon import wait_until

from mw_cluster import START_S, ClusterRun

pytestmark = pytest.mark.timeout(600)

STOP_S = 8.0
"""A stop must take less than this (the parent's SIGKILL comes after 20 s; a stop takes 3-5 s at most by
design, the rest is slack for a loaded 2-core machine)."""


def _ss(*flt: str) -> list[list[str]]:
    """``ss``'s established TCP sockets matching the filter, split into columns (Recv-Q, Send-Q, local,
    peer[, process]). (Not psutil's connections: pysyncobj replaces ``socket.inet_ntop`` process-wide.)"""
    out = subprocess.run(["ss", "-Htnp", "state", "established", *flt], capture_output=True, text=True,
                         check=False).stdout
    return [line.split() for line in out.splitlines()]


def _connections_to(pid: int, port: int) -> set[int]:
    """Local ports of ``pid``'s established TCP connections to ``port``."""
    return {int(row[2].rsplit(":", 1)[1]) for row in _ss(f"( dport = :{port} )")
            if len(row) > 4 and f"pid={pid}," in row[4]}


def _calls_waiting_in(server_port: int, pid: int) -> int:
    """How many of ``pid``'s connections to the server have bytes the server has not read (its side's
    receive queue, from ``ss``): calls a frozen server will never answer."""
    ours = _connections_to(pid, server_port)
    waiting = 0
    for recv_q, _, _, peer, *_ in _ss(f"( sport = :{server_port} )"):
        if int(recv_q) > 0 and int(peer.rsplit(":", 1)[1]) in ours:
            waiting += 1
    return waiting


def _server_processes(server) -> list[psutil.Process]:
    root = psutil.Process(server.pid)
    return [root, *root.children(recursive=True)]


def _freeze(server) -> list[psutil.Process]:
    """SIGSTOP every process of the server: calls in progress and new connections hang (not refused)."""
    procs = _server_processes(server)
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    return procs


def _thaw(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url.split("?")[0], connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


class _Worker:
    """One more ``millwheel worker`` of a running cluster, a child of the test (its exit status is ours to
    see); killed at teardown if still running."""

    def __init__(self, out: Path, log: Path) -> None:
        self.log_path = log
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(worker_argv(cluster_path(out)), stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        assert line.startswith("millwheel worker serving on "), line
        self.address = line.split()[-1]

    def status(self) -> dict:
        return worker_status(self.address)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.log.close()

    def text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")


@pytest.mark.parametrize("fault", ["frozen", "stopped"])
def test_a_worker_stops_within_seconds_when_postgres_does_not_answer(fault, reachable_tmp, cluster_runs, own_pg):
    run = ClusterRun(reachable_tmp, own_pg.url, workers=1, n_clicks=6000, files=12)
    cluster_runs.append(run)
    wait_until(lambda: run.processed() > 200, START_S, message="records flowing")
    w = _Worker(run.out, reachable_tmp / "worker.log")
    frozen: list[psutil.Process] = []
    try:
        wait_until(lambda: len(w.status().get("intervals", ())) > 0, 60, message="the new worker holding intervals")
        if fault == "frozen":
            frozen = _freeze(own_pg)
            assert not _answers(own_pg.url)
            # the worker's coordinator (a store round every 20-100 ms) and heartbeat send their next calls
            wait_until(lambda: _calls_waiting_in(own_pg.port, w.proc.pid) > 0, 30,
                       message="a store call of the worker waiting in the frozen server")
        else:
            own_pg.stop()
            wait_until(lambda: w.status()["store"]["retries"] >= 3, 60, message="the worker retrying its store")
        t0 = time.monotonic()
        w.proc.send_signal(signal.SIGTERM)
        w.proc.wait(timeout=60)
        took = time.monotonic() - t0
        text = w.text()
        print(f"stop of a worker with its PostgreSQL {fault}: {took:.2f} s, exit {w.proc.returncode}\n{text}")
        assert w.proc.returncode == 0, text
        assert took < STOP_S, text
        assert "millwheel worker: stopped in" in text
        assert "gave up" in text, "what was abandoned is named"
    finally:
        _thaw(frozen)
        w.close()
        if fault == "stopped":
            own_pg.start()


@pytest.mark.parametrize("to, postgres", [("group", "running"), ("run", "stopped")])
def test_ctrl_c_stops_millwheel_run_until_idle_and_everything_it_started(to, postgres, reachable_tmp, cluster_runs,
                                                                         own_pg):
    run = ClusterRun(reachable_tmp, own_pg.url, workers=2, n_clicks=20000, files=16, until_idle=True,
                     new_session=True)
    cluster_runs.append(run)
    children = psutil.Process(run.proc.pid).children(recursive=True)
    pids = {p.pid for p in children}
    assert len(run.workers()) == 2 and {w["pid"] for w in run.workers()} <= pids
    assert len(pids) >= 5, "three master replicas and two workers"
    if postgres == "stopped":
        own_pg.stop()
    t0 = time.monotonic()
    if to == "group":        # a terminal's Ctrl-C: every process of the foreground group gets it
        os.killpg(run.proc.pid, signal.SIGINT)
    else:
        run.proc.send_signal(signal.SIGINT)
    rc = run.proc.wait(timeout=60)
    took = time.monotonic() - t0
    gone, alive = psutil.wait_procs(children, timeout=5)
    text = (reachable_tmp / "run.log").read_text(errors="replace")
    print(f"Ctrl-C ({to}, PostgreSQL {postgres}) to millwheel run --until-idle: {took:.2f} s, exit {rc}\n"
          + "\n".join(line for line in text.splitlines() if "millwheel worker:" in line or "millwheel:" in line))
    assert not alive, f"orphans: {[p.pid for p in alive]}"
    assert rc == 130, text[-3000:]
    assert "stopped before the input was consumed" in text
    assert "millwheel: killed" not in text, "every child ended on its own"
    assert text.count("millwheel worker: stopped in") == 2, text[-3000:]
    assert took < 2 * STOP_S, text[-3000:]
    if postgres == "stopped":
        own_pg.start()


def test_a_stopping_store_gives_up_at_once_and_interrupt_cuts_off_a_call_on_a_frozen_server(own_pg):
    from millwheel._store import StoreAbandoned
    store = open_store(own_pg.url)
    stopping = threading.Event()
    store.give_up_when(stopping)
    frozen = []
    try:
        store.claim("c", 0)
        frozen = _freeze(own_pg)
        outcome: list = []

        def call() -> None:
            try:
                outcome.append(store.read_watermarks())
            except BaseException as e:  # noqa: BLE001
                outcome.append(e)
        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(1.0)
        assert t.is_alive(), "a call to a frozen server hangs"
        stopping.set()
        t.join(1.0)
        assert t.is_alive(), "giving up ends retries, not a call in progress"
        t0 = time.monotonic()
        store.interrupt()
        t.join(5.0)
        assert not t.is_alive() and isinstance(outcome[0], StoreAbandoned), outcome
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(StoreAbandoned):
            store.claim("c", 0)     # refused at once after an interrupt
        assert store.statistics().interrupted == 1
    finally:
        _thaw(frozen)
        store.close()


def test_a_stopping_store_does_not_retry_a_refused_connection(own_pg):
    from millwheel._store import StoreAbandoned
    store = open_store(own_pg.url)
    stopping = threading.Event()
    store.give_up_when(stopping)
    try:
        store.claim("c", 0)
        own_pg.stop()
        outcome: list = []

        def call() -> None:
            try:
                outcome.append(store.claim("c", 0))
            except BaseException as e:  # noqa: BLE001
                outcome.append(e)
        t = threading.Thread(target=call, daemon=True)
        t.start()
        wait_until(lambda: store.statistics().retries >= 2, 30, message="retrying the refused connection")
        assert t.is_alive()
        t0 = time.monotonic()
        stopping.set()
        t.join(5.0)
        assert not t.is_alive() and isinstance(outcome[0], StoreAbandoned), outcome
        assert time.monotonic() - t0 < 0.5, "the wait between attempts ends at once"
        assert store.statistics().abandoned == 1
    finally:
        store.close()
        own_pg.start()


def test_ctrl_c_stops_the_one_process_millwheel_run_with_its_postgres_stopped(reachable_tmp, own_pg):
    from mw_helpers import write_joined
    write_joined(reachable_tmp / "in", 20000, 16)
    url = f"{own_pg.url}?schema=one_process"
    log = open(reachable_tmp / "run.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "millwheel.cli", "run", "examples.ad_windows", "--input",
                             str(reachable_tmp / "in"), "--out", str(reachable_tmp / "out"), "--store", url,
                             "--option", "injector_batch=200"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def claimed() -> bool:
            with psycopg.connect(own_pg.url, connect_timeout=2) as conn:
                if conn.execute("SELECT to_regclass('one_process.state')").fetchone()[0] is None:
                    return False
                return conn.execute("SELECT EXISTS (SELECT 1 FROM one_process.state)").fetchone()[0]
        wait_until(lambda: claimed() or proc.poll() is not None, START_S, message="state written")
        assert proc.poll() is None
        port = own_pg.port
        own_pg.stop()
        # its connections closed by the stopped server: its next store calls reconnect, are refused and retry
        wait_until(lambda: not _connections_to(proc.pid, port), 30, message="the run's connections closed")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
        text = (reachable_tmp / "run.log").read_text(errors="replace")
        print(f"Ctrl-C to the one-process millwheel run, PostgreSQL stopped: {took:.2f} s, exit {rc}\n{text[-2000:]}")
        assert rc == 0, text[-3000:]
        assert "millwheel: stopped; gave up" in text
        assert took < STOP_S, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        if not own_pg.running:
            own_pg.start()


def test_a_runtime_on_its_own_postgres_store_stopped_before_it_started_closes_the_store(pg_url):
    """``millwheel run`` stops its runtime in a ``finally``, also when a signal or an error came while it was
    starting: the stop must not fail on threads never started (hiding the error) and must close the store."""
    from test_mw_runtime import QueueInjector, topo

    from millwheel import Runtime, RuntimeConfig
    rt = Runtime(topo(QueueInjector()), RuntimeConfig(threads=2, intervals=2, store=pg_url))
    assert rt.store.interruptible
    rt.stop()
    with pytest.raises(RuntimeError, match="the store is closed"):
        rt.store.read_watermarks()


class _SilentMaster(pb_grpc.MasterServicer):
    """A master replica that takes every call and never answers it (as one stopping at the same moment may):
    each call waits until its deadline. Records the time each call had left when it came in."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.remaining: list[float] = []

    def Heartbeat(self, request, context):
        self.remaining.append(context.time_remaining())
        while not self.release.is_set() and context.is_active():
            self.release.wait(0.05)
        context.abort(grpc.StatusCode.UNAVAILABLE, "released")


@pytest.mark.timeout(120)
def test_a_leave_ends_within_its_budget_when_no_replica_answers():
    """A stopping worker's leave (a heartbeat with ``leaving``) tries the replicas in turn; each call's
    deadline is what is left of the budget, not the client's full call timeout per replica (three replicas
    that do not answer took three times the budget)."""
    release = threading.Event()
    servers, masters = [], []
    try:
        for _ in range(3):
            m = _SilentMaster(release)
            s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            pb_grpc.add_MasterServicer_to_server(m, s)
            port = s.add_insecure_port("127.0.0.1:0")
            s.start()
            servers.append(s)
            masters.append((m, f"127.0.0.1:{port}"))
        budget = 2.0
        client = MasterClient([a for _, a in masters], retry_timeout_s=30.0, rpc_timeout_s=3.0)
        try:
            t0 = time.monotonic()
            with pytest.raises(MasterUnavailable):
                client.heartbeat("w", 1, leaving=True, budget_s=budget)
            took = time.monotonic() - t0
        finally:
            client.close()
        seen = [r for m, _ in masters for r in m.remaining]
        print(f"leave with a budget of {budget} s to three silent replicas: {took:.2f} s, calls' time left "
              f"on arrival {[round(r, 2) for r in seen]}")
        assert seen, "the replicas were called"
        assert all(r is not None and r <= budget for r in seen), seen
        assert sum(seen) <= budget + 0.3, f"the calls share the budget: {seen}"
        assert took < 2 * budget, f"{took:.2f} s"
    finally:
        release.set()
        for s in servers:
            s.stop(None)


def test_a_stopped_process_exits_without_a_thread_that_never_ends(tmp_path):
    """``exit_bounded``: a non-daemon thread still running after the stop (a gRPC handler waiting on a call
    nobody finishes) does not keep the process alive; the exit status is kept and the thread named."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import atexit, sys, threading\n"
        "from millwheel._exit import exit_bounded\n"
        "atexit.register(lambda: print('exit handlers ran', flush=True))\n"
        "if sys.argv[1] == 'hang':\n"
        "    threading.Thread(target=threading.Event().wait, name='never-ends').start()\n"
        "else:\n"
        "    t = threading.Thread(target=threading.Event().wait, args=(0.2,), name='ends-soon')\n"
        "    t.start()\n"
        "print('stopped', flush=True)\n"
        "sys.exit(exit_bounded(3, 'test process', wait_s=1.0))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    hang = subprocess.run([sys.executable, str(script), "hang"], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert hang.returncode == 3, hang.stderr
    assert "stopped" in hang.stdout
    assert "exiting without 1 thread(s) still running" in hang.stderr and "never-ends" in hang.stderr
    ends = subprocess.run([sys.executable, str(script), "ends"], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert ends.returncode == 3, ends.stderr
    assert "exit handlers ran" in ends.stdout, "a normal exit when every thread ended in time"
    assert "exiting without" not in ends.stderr
