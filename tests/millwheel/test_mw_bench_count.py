"""The process benchmark counts every measured record exactly: the ``sort`` stage's delay samples reach
their file while the process runs (a worker killed after its stop's timeout runs no exit handler), each
record is counted once however often its user code ran, and a run on real worker processes reports no
record missing, none short in the store, none processed after the cluster was told idle, none killed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

from bench import _mw_cluster
from bench import millwheel_shuffle as shuffle
from photon import wait_until

pytestmark = pytest.mark.timeout(300)

NOTER = """
import sys, threading
from pathlib import Path
from bench import millwheel_shuffle as shuffle
shuffle.DELAYS.path = Path(sys.argv[1])
for n in range(int(sys.argv[2])):
    shuffle.DELAYS.note(n, 1_000_000 + n)
print("noted", flush=True)
threading.Event().wait()
"""


def test_samples_noted_by_a_process_reach_its_file_before_it_is_killed(tmp_path):
    """A process notes 700 samples (fewer than any batch) and is SIGKILLed: no exit handler runs, and every
    sample is in its file all the same."""
    out = tmp_path / "out"
    out.mkdir()
    path = out / "delays-1.bin"
    p = subprocess.Popen([sys.executable, "-c", NOTER, str(path), "700"], stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])})
    try:
        assert p.stdout.readline() == b"noted\n"
        wait_until(lambda: path.exists() and path.stat().st_size >= 700 * 3 * 8, 10.0, message="the samples' file")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        p.stdout.close()
    assert p.returncode == -signal.SIGKILL
    samples = shuffle.read_delays(out)
    assert sorted(i for i, _ in samples.pairs) == [1_000_000 + n for n in range(700)]
    assert samples.duplicates == 0


def test_each_record_is_counted_once_and_its_repeats_are_told(tmp_path):
    """Two processes sampled record 2 (its user code ran twice): three records, one duplicate, the earlier
    arrival kept; a write cut short by a kill is read up to its last whole sample."""
    a = array("q", [1, 10, 15, 2, 20, 30])
    b = array("q", [2, 20, 25, 3, 30, 31, 4, 40])        # the last sample cut short
    (tmp_path / "delays-1.bin").write_bytes(a.tobytes())
    (tmp_path / "delays-2.bin").write_bytes(b.tobytes())
    samples = shuffle.read_delays(tmp_path)
    assert sorted(samples.pairs) == [(10, 15), (20, 25), (30, 31)]
    assert samples.duplicates == 1


def test_a_run_on_four_worker_processes_counts_every_measured_record(tmp_path, pg_server):
    """Four worker processes, both guarantees on, a short warm-up: each measured record has one sample,
    the store's sort state counts every injected record once, no process is killed at the stop."""
    url = f"{pg_server.url}?schema=t_count_{os.getpid()}"
    run = _mw_cluster.run_cluster(tmp_path / "run", url, 4, True, 1000, 1500, store_pid=pg_server.pid,
                                  warmup_rate=500, timeout_s=240.0, settle_timeout_s=20.0)
    assert (run.total, run.records, run.records_missing) == (1500, 1500, 0), run
    assert run.store_shortfall == 0, run
    assert run.killed_at_stop == 0, run
    assert run.records_after_idle == 0, run     # idle was told once every record had been processed
