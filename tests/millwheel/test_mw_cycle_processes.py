"""A topology with a cycle over worker processes on a real PostgreSQL: the cut epochs of the cycle's
watermark are decided in the store and shared by every process; the windows after the cycle close with
the batch answer, each window once, and no record is late; also when a worker is SIGKILLed mid-stream."""
from __future__ import annotations

import os
import signal

import pytest

from photon import wait_until
from millwheel._cluster import cluster_status
from millwheel.examples.ad_windows import WINDOW_US

from mw_cluster import START_S, ClusterRun
from mw_cycle_windows import HOPS

pytestmark = pytest.mark.timeout(600)


def test_windows_after_a_cycle_close_over_two_worker_processes(reachable_tmp, pg_url, cluster_runs):
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=2000, files=4, module="mw_cycle_windows")
    cluster_runs.append(run)
    run.wait_idle()
    run.check()
    st = cluster_status(run.cluster, run.client)
    assert {iv["worker"] for iv in st["intervals"]} == {w["worker"] for w in st["workers"]}, \
        "intervals spread over both processes"
    per: dict = {}
    for w in st["workers"]:
        for name, c in w["computations"].items():
            for k, v in c.items():
                per.setdefault(name, {}).setdefault(k, 0)
                per[name][k] += v
    assert per["ping"]["records"] == 2000 * (HOPS + 1) and per["pong"]["records"] == 2000 * HOPS
    assert all(c.get("late", 0) == 0 for c in per.values()), per
    # the joined input's watermark follows the clock: the cycle's is one value, past every window's end
    last_end = max(w["window_start_us"] for w in run.windows()) + WINDOW_US
    wms = {n: v["low_watermark_us"] for n, v in st["watermarks"].items()}
    assert wms["ping"] == wms["pong"] and wms["ping"] >= last_end, wms
    assert all(w["watermark_authority"]["cycles"] == 1 and w["watermark_authority"]["cuts_published"] > 0
               for w in st["workers"])
    # every process's authority adopts the same epochs; one may publish a tick or two after another
    wait_until(lambda: all(w["input_watermarks_us"]["windows"] >= last_end for w in run.workers()), 60,
               message="every process past the last window")


def test_a_worker_sigkilled_while_records_go_round_the_cycle_its_intervals_move_and_windows_close_once(
        reachable_tmp, pg_url, cluster_runs):
    """The killed worker's intervals of ping and pong move: the cuts their new owners were not in are
    refused, the records it held come back from the store and the senders' retries, and the windows
    still close once with the batch answer (a watermark that passed them would make them late)."""
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=4000, files=8, module="mw_cycle_windows")
    cluster_runs.append(run)
    wait_until(lambda: run.processed("pong") > 1500, START_S, message="records going round the cycle")
    victim = max(run.workers(), key=lambda w: len(w["intervals"]))
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: all(iv.worker and iv.worker != victim["worker"] for iv in run.client.interval_map()),
               60, message="the killed worker's intervals moved")
    run.wait_idle()
    run.check()
    st = cluster_status(run.cluster, run.client)
    wms = {n: v["low_watermark_us"] for n, v in st["watermarks"].items()}
    assert wms["ping"] == wms["pong"] >= max(w["window_start_us"] for w in run.windows()) + WINDOW_US, wms
