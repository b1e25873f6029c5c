"""MillWheel as processes for real: three master replicas, worker processes and the session's PostgreSQL
server, records between workers over gRPC. A worker is SIGKILLed mid-stream, SIGSTOPped past its lease,
the master's leader is killed; each time the windows equal the batch answer, each window once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from mw_cluster import START_S, ClusterRun
from mw_helpers import write_joined

from millwheel import END_OF_TIME, MasterClient, open_store
from millwheel._cluster import ClusterFile, cluster_status, worker_status
from photon import GEN0_THRESHOLD, id_timestamp_us, scrape, wait_until

pytestmark = pytest.mark.timeout(600)



def Run(tmp: Path, pg_url: str, workers: int, n_clicks: int, files: int, **kw) -> ClusterRun:
    """``millwheel run examples.ad_windows --workers N`` on the session's PostgreSQL."""
    return ClusterRun(tmp, pg_url, workers=workers, n_clicks=n_clicks, files=files, **kw)


@pytest.fixture
def run_factory(reachable_tmp, pg_url, cluster_runs):
    def make(workers: int = 2, n_clicks: int = 4000, files: int = 8) -> ClusterRun:
        r = Run(reachable_tmp, pg_url, workers, n_clicks, files)
        cluster_runs.append(r)
        return r
    return make


def test_two_worker_processes_exchange_records_over_grpc_and_equal_the_batch(run_factory):
    run = run_factory(workers=2)
    run.wait_idle()
    run.check()
    st = cluster_status(run.cluster, run.client)
    assert st["leader"] in run.cluster.masters
    assert len(st["workers"]) == 2 and all(w["pid"] > 0 for w in st["workers"])
    assert {iv["worker"] for iv in st["intervals"]} == {w["worker"] for w in st["workers"]}, \
        "intervals spread over both processes"
    assert sum(w["transport"]["records_sent"] for w in st["workers"]) > 0, "records crossed processes"
    # the windows above equal the batch with commits carried out by the commit threads (whenever the
    # worker thread was idle)
    assert sum(w["acks"]["landed_on_commit_thread"] for w in st["workers"]) > 0
    assert st["watermarks"]["windows"]["low_watermark_us"] > 0


def test_a_worker_sigkilled_mid_stream_its_intervals_move_and_each_window_is_written_once(run_factory):
    run = run_factory(workers=2, n_clicks=6000, files=12)
    wait_until(lambda: sum(w["computations"].get("windows", {}).get("records", 0) for w in run.workers()) > 500,
               START_S, message="records flowing")
    victim = max(run.workers(), key=lambda w: len(w["intervals"]))
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: all(iv.worker and iv.worker != victim["worker"] for iv in run.client.interval_map()),
               30, message="the killed worker's intervals moved")
    run.wait_idle()
    run.check()


def test_a_worker_stopped_past_its_lease_loses_its_intervals_and_carries_on(run_factory):
    run = run_factory(workers=2, n_clicks=6000, files=12)
    wait_until(lambda: sum(w["computations"].get("windows", {}).get("records", 0) for w in run.workers()) > 500,
               START_S, message="records flowing")
    victim = max(run.workers(), key=lambda w: len(w["intervals"]))
    expired = _expired_workers(run.client)
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        # past its lease: the master expired it (its intervals may also have moved before, by rebalancing,
        # which alone does not make it register again)
        wait_until(lambda: _expired_workers(run.client) > expired, 60, message="the stopped worker's lease expired")
        wait_until(lambda: all(iv.worker != victim["worker"] or iv.sequencer not in
                               {h["sequencer"] for h in victim["intervals"]} for iv in run.client.interval_map()),
                   30, message="the stopped worker's intervals moved")
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    # it learns it lost them: a new incarnation, and it holds (and processes) what it is given again
    wait_until(lambda: (worker_status(victim["address"]).get("counters", {}).get("lost_incarnations", 0)
                        + worker_status(victim["address"]).get("counters", {}).get("fenced_commits", 0)) > 0,
               30, message="the resumed worker learned it lost its intervals")
    run.wait_idle()
    run.check()
    assert worker_status(victim["address"])["incarnation"] > victim["incarnation"]


def _expired_workers(client: MasterClient) -> int:
    """Workers whose lease the master has let expire so far (every replica applies the same log)."""
    return max((r.get("expired_workers", 0) for r in client.status()), default=0)


def test_the_masters_leader_killed_assignment_and_watermarks_go_on(run_factory):
    run = run_factory(workers=2, n_clicks=4000, files=8)
    leader = cluster_status(run.cluster, run.client)["leader"]
    pids = _master_pids(run.cluster, leader)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    wait_until(lambda: cluster_status(run.cluster, run.client)["leader"] not in (None, leader), 60,
               message="a new master leader")
    run.wait_idle()
    run.check()


def _master_pids(cluster: ClusterFile, address: str) -> list[int]:
    port = address.rsplit(":", 1)[1]
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"millwheel.master" in cmd and any(f'"grpc_address": "127.0.0.1:{port}"'.encode() in c
                                              or f"127.0.0.1:{port}".encode() in c for c in cmd):
            spec = json.loads(cmd[cmd.index(b"--spec") + 1])
            if spec["grpc_peers"][spec["replica"]] == address:
                out.append(int(pid))
    return out


def test_millwheel_status_json_lists_leader_workers_owners_and_watermarks(run_factory):
    run = run_factory(workers=2, n_clicks=2000, files=4)
    run.wait_idle()
    st = {}

    def status_with_a_leader() -> bool:
        # (an election under way, e.g. a follower's timeout on a loaded host, shows no leader for a moment)
        nonlocal st
        out = subprocess.run([sys.executable, "-m", "millwheel.cli", "status", "--out", str(run.out), "--json"],
                             capture_output=True, timeout=60, check=True)
        st = json.loads(out.stdout)
        return st["leader"] is not None
    wait_until(status_with_a_leader, 60, interval=1.0, message="millwheel status naming a master leader")
    assert st["leader"] in run.cluster.masters
    assert sorted(w["pid"] for w in st["workers"]) == sorted(w["pid"] for w in run.workers())
    assert all(isinstance(w["intervals"], list) for w in st["workers"])
    assert {iv["computation"] for iv in st["intervals"]} >= {"windows", "window-sink", "joined"}
    assert set(st["watermarks"]) >= {"windows", "joined"} and "lag_s" in st["watermarks"]["windows"]
    text = subprocess.run([sys.executable, "-m", "millwheel.cli", "status", "--out", str(run.out)],
                          capture_output=True, timeout=60, check=True).stdout.decode()
    assert "master leader:" in text and "watermark windows" in text
    assert all(f"metrics at {w['metrics']}" in text for w in st["workers"]), text
    # every worker serves its Prometheus metrics (a free port by default, named in the status); they count
    # what its status counts
    for w in run.workers():
        metrics = scrape(w["metrics"], timeout_s=5.0)
        assert metrics is not None, f"no metrics at {w['metrics']}"
        assert metrics["photon_up"] == 1.0 and metrics["photon_millwheel_worker_idle"] in (0.0, 1.0)
        for comp, counts in w["computations"].items():
            assert metrics[f'photon_millwheel_worker_records_total{{computation="{comp}"}}'] == counts["records"]
        for comp, low in w["low_watermarks_us"].items():   # read after the status: as far or further
            seconds = metrics[f'photon_millwheel_worker_low_watermark_seconds{{computation="{comp}"}}']
            assert seconds == float("inf") if low == END_OF_TIME else low / 1e6 <= seconds <= time.time(), comp
        held = Counter(iv["computation"] for iv in w["intervals"])
        assert {k: v for k, v in metrics.items() if k.startswith("photon_millwheel_worker_intervals{")} == \
            {f'photon_millwheel_worker_intervals{{computation="{c}"}}': float(n) for c, n in held.items()}
    assert sum(sum(c.get("records", 0) for c in w["computations"].values()) for w in run.workers()) > 0
    # so does every master replica: its placement counts and whether it leads
    assert len(st["masters"]) == 3 and all(f"metrics at {r['metrics']}" in text for r in st["masters"]), text
    leaders = 0
    for r in st["masters"]:
        metrics = scrape(r["metrics"], timeout_s=5.0)
        assert metrics is not None, f"no metrics at {r['metrics']}"
        # (not equal to the map read before: an idle pair may be merged meanwhile)
        assert metrics["photon_millwheel_master_intervals"] >= len({iv["computation"] for iv in st["intervals"]})
        assert metrics["photon_millwheel_master_assigns_total"] >= 1
        leaders += metrics["photon_millwheel_master_is_leader"]
    assert leaders <= 1
    # a worker process settles its cyclic collector once it serves (photon/_gc.py)
    for w in run.workers():
        assert w["collector_threshold"][0] == GEN0_THRESHOLD, w["collector_threshold"]


def test_ctrl_c_stops_until_idle_mode(reachable_tmp, pg_url):
    write_joined(reachable_tmp / "in", 2000, 4)
    p = subprocess.Popen([sys.executable, "-m", "millwheel.cli", "run", "examples.ad_windows", "--input",
                          str(reachable_tmp / "in"), "--out", str(reachable_tmp / "out"), "--store", pg_url,
                          "--until-idle", "--option", "injector_batch=10"], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (reachable_tmp / "out" / ".millwheel").exists() or p.poll() is not None, START_S,
                   message="the run started")
        threading.Event().wait(1.0)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) in (0, 130)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        p.stderr.close()


def test_a_quiet_worker_process_exchanges_watermarks_every_100_ms_and_their_watermarks_still_follow_the_input(run_factory):
    """Once nothing waits on a watermark (no record waiting, unacked or in flight, no timer set), a
    process's coordinator writes and reads the watermark reports every ``QUIET_EXCHANGE_S``, not every
    20 ms tick; the output equals the batch, and every process's watermarks still follow the input's."""
    from millwheel._process import COORDINATOR_TICK_S, QUIET_EXCHANGE_S
    run = run_factory(workers=2, n_clicks=2000, files=4)
    run.wait_idle()
    run.check()
    before = {w["worker"]: w["counters"].get("quiet_ticks", 0) for w in run.workers()}
    skips = int(QUIET_EXCHANGE_S / COORDINATOR_TICK_S) - 2     # ticks skipped per exchange, at least
    wait_until(lambda: all(w["counters"].get("quiet_ticks", 0) >= before[w["worker"]] + 3 * skips
                           for w in run.workers()), 10, message="quiet ticks on every worker process")
    first = max(w["low_watermarks_us"]["joined"] for w in run.workers())

    def moving_and_close() -> bool:
        """The input's watermark follows the clock: while quiet, every process's publication still moves
        with it, and the processes' publications of each computation stay within a few exchanges."""
        lows = [w["low_watermarks_us"] for w in run.workers()]
        names = set(lows[0])
        return (all(set(x) == names for x in lows) and all(x["joined"] > first + 300_000 for x in lows)
                and all(max(x[n] for x in lows) - min(x[n] for x in lows) < 500_000 for n in names))
    wait_until(moving_and_close, 10, message="every process's watermarks moving and close to the others'")


def test_with_records_flowing_and_no_timer_set_a_process_exchanges_watermarks_every_50_ms(reachable_tmp, pg_url,
                                                                                           cluster_runs):
    """While records flow through a process and none of its workers has a timer set, its coordinator writes
    and reads the watermark reports every ``FLOWING_EXCHANGE_S`` instead of every tick (counted as
    ``flowing_ticks``); both stages still count every click once, and every process publishes each
    computation's watermark past the last click once idle."""
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=4000, files=8, module="mw_flow_counts",
                     options=("injector_batch=50",))
    cluster_runs.append(run)
    run.wait_idle()
    expected = Counter(str(e["query"]["advertiser_id"]) for e in run.expected)
    store = open_store(pg_url)
    try:
        for stage in ("counts", "totals"):
            got = {k: orjson.loads(v) for k, v in store.read_states(stage, list(expected)).items()}
            assert got == dict(expected), stage
    finally:
        store.close()
    workers = run.workers()
    assert all(sum(c.get("records", 0) for c in w["computations"].values()) > 0 for w in workers), \
        "the clicks flowed through both processes"
    assert all(w["counters"].get("flowing_ticks", 0) > 0 for w in workers), [w["counters"] for w in workers]
    last = max(id_timestamp_us(e["click_id"]) for e in run.expected)
    # idle says no record or timer waits; the publication past the last click follows within an exchange or
    # two (each process reads the others' reports of their last work before it publishes)
    seen: list[dict] = []

    def all_past_last() -> bool:
        seen[:] = [w["low_watermarks_us"] for w in run.workers()]
        return all(x[n] > last for x in seen for n in ("joined", "counts", "totals"))
    wait_until(all_past_last, 10, message=lambda: f"every process's watermarks past {last}; last seen: {seen}")
    assert all("thread_cpu_ms" not in w for w in workers)      # only when asked: it reads /proc per thread
    threads = worker_status(workers[0]["address"], thread_cpu=True)["thread_cpu_ms"]
    assert threads["millwheel-worker"] > 0 and threads["millwheel-process-coordinator"] > 0, threads


def test_the_exchange_period_is_every_tick_while_a_timer_or_a_cycle_waits_on_a_watermark():
    """Quiet: ``QUIET_EXCHANGE_S``; records flowing with no timer set: ``FLOWING_EXCHANGE_S``; a timer set or
    a cycle in the topology (a timer fires, a cut epoch advances, on published watermarks): every tick."""
    from millwheel import _process as p
    assert p.exchange_period(quiet=True, timers_set=False, cyclic=False) == p.QUIET_EXCHANGE_S
    assert p.exchange_period(quiet=True, timers_set=False, cyclic=True) == p.QUIET_EXCHANGE_S
    assert p.exchange_period(quiet=False, timers_set=False, cyclic=False) == p.FLOWING_EXCHANGE_S
    assert p.exchange_period(quiet=False, timers_set=True, cyclic=False) == p.EVERY_TICK
    assert p.exchange_period(quiet=False, timers_set=False, cyclic=True) == p.EVERY_TICK
    assert p.EVERY_TICK < p.COORDINATOR_TICK_S < p.FLOWING_EXCHANGE_S < p.QUIET_EXCHANGE_S
