"""A window sink's old owner, held inside user code past its lease check, SIGSTOPped past its lease and
resumed after the other worker took the sink over and wrote every window: real worker processes of
``millwheel run`` (three master replicas, two workers) on the session's PostgreSQL."""
from __future__ import annotations

import os
import signal

import orjson
import pytest

from millwheel._cluster import worker_status
from photon import wait_until

from mw_cluster import START_S, ClusterRun
from mw_helpers import batch_windows
from test_mw_watermark_moves import LEASE_S, _connect, _end_sessions

pytestmark = pytest.mark.timeout(600)


def _sink_committed(db) -> int:
    row = db.execute("SELECT value FROM state WHERE computation = 'window-sink' AND key = 'sink'").fetchone()
    return orjson.loads(bytes(row[0]))["bytes"] if row else 0


def test_an_old_sink_owner_resumed_after_the_new_one_wrote_every_window_changes_nothing_in_the_file(
        reachable_tmp, pg_url, cluster_runs, stopped, monkeypatch):
    """The worker holding the window sink is held inside ``FileSink.process_record`` (``mw_held_sink``: its
    lease checked, its batch taken, its committed length above 0), SIGSTOPped past its lease and its store
    sessions ended; the master gives its intervals to the other worker, which writes and commits every
    window. Then the old owner goes on with its batch. Before the sink's writes were fenced it cut the file
    back to the length it had committed and wrote its batch's lines there: the windows after them were lost
    (what the refused-claim test once found under load). Now its write is refused by the fence (its commit
    is refused by the store) and the file holds every window once, equal to the batch."""
    hold = reachable_tmp / "hold"
    hold.touch()
    monkeypatch.setenv("MW_HOLD_SINK", str(hold))
    run = ClusterRun(reachable_tmp, pg_url, workers=2, n_clicks=4000, files=8, module="mw_held_sink",
                     master_options=(f"lease_us={LEASE_S * 1_000_000}",))
    cluster_runs.append(run)
    held = lambda: [p for p in reachable_tmp.glob("hold.*") if p.name.split(".")[1].isdigit()  # noqa: E731
                    and not p.name.endswith(".done")]
    wait_until(held, START_S, message="a sink record held in its owner")
    pid = int(held()[0].name.split(".")[1])
    old = next(w for w in run.workers() if w["pid"] == pid)
    expected = batch_windows(run.expected)
    total = sum(len(orjson.dumps({"advertiser_id": a, "window_start_us": s, "clicks": c})) + 1
                for (a, s), c in expected.items())
    with _connect(pg_url) as db:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
        _end_sessions(db, pg_url, pid)
        wait_until(lambda: _sink_committed(db) == total, 240,
                   message="the other worker took the sink over and committed every window")
    assert len(run.windows()) == len(expected)
    hold.unlink()
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: (reachable_tmp / f"hold.{pid}.done").exists(), 60, message="the held record's write done")
    wait_until(lambda: worker_status(old["address"]).get("incarnation", 0) > old["incarnation"], 60,
               message="the resumed worker learned it lost its intervals and registered again")
    run.wait_idle()
    run.check()
