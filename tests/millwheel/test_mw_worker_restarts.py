"""``millwheel run --workers N`` and its worker processes over time, the installed command as a process: a worker
that fails for a lasting reason (its output file on a full tmpfs) is started again with a growing wait and, after
``FAILED_STARTS`` failures in a row for the same reason, the run stops in one line naming the worker and the
cause (exit 1) instead of starting it again for ever; the same command once there is room writes the rest, each
window once. And what worker processes write to their stdout (the example's window echo) reaches the run's
stdout, where before it filled a pipe nobody read and the workers stopped."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mw_cluster import check_windows, stop_run
from mw_helpers import batch_windows, read_windows, write_joined

MILLWHEEL = str(Path(sys.executable).parent / "millwheel")


def _run(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_run(proc)
        out, err = proc.communicate()
        raise AssertionError(f"millwheel run still running after {timeout} s; its stderr ends:\n{err[-3000:]}") \
            from None
    return proc.returncode, out, err


@pytest.mark.timeout(600)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_worker_failing_for_a_lasting_reason_stops_the_run_in_one_line(reachable_tmp, pg_url):
    """``<out>/windows.jsonl`` on a full 8 KiB tmpfs: before, the worker holding the window sink exited, was
    started again every 5 s, and failed the same way, for ever (``--until-idle`` never returned)."""
    events = write_joined(reachable_tmp / "in", 1500, 4)
    out, full = reachable_tmp / "out", reachable_tmp / "full"
    out.mkdir()
    full.mkdir()
    (out / "windows.jsonl").touch()
    argv = [MILLWHEEL, "run", "examples.ad_windows", "--input", str(reachable_tmp / "in"), "--out", str(out),
            "--workers", "2", "--until-idle", "--store", pg_url, "--option", "injector_batch=100"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(full)], check=True)
    try:
        (full / "windows.jsonl").touch()
        subprocess.run(["mount", "--bind", str(full / "windows.jsonl"), str(out / "windows.jsonl")], check=True)
        try:
            code, _, err = _run(argv, reachable_tmp, 420)
            assert code == 1, err[-3000:]
            assert "Traceback" not in err, err[-3000:]
            assert re.search(r"millwheel: stopped: worker pid \d+ failed 5 times in a row, each time with status 1, "
                             rf"saying: millwheel worker: stopped: writing {re.escape(str(out))}/windows\.jsonl "
                             r"failed: No space left on device; not started again", err), err[-3000:]
            subprocess.run(["mount", "-o", "remount,size=1m", str(full)], check=True)
            code, _, err = _run(argv, reachable_tmp, 420)
            assert code == 0, err[-3000:]
            check_windows(read_windows(out / "windows.jsonl"), events)
        finally:
            subprocess.run(["umount", str(out / "windows.jsonl")], check=False)
    finally:
        subprocess.run(["umount", str(full)], check=False)


@pytest.mark.timeout(500)
def test_what_worker_processes_echo_reaches_the_runs_stdout_and_does_not_stop_them(reachable_tmp, pg_url):
    """Over 2,000 windows echoed (about 150 KiB): before, the workers' stdout was a pipe the run read only up to
    their ready line; once it was full each worker blocked in its window sink, its lease ran out and the run
    never ended."""
    events = write_joined(reachable_tmp / "in", 8000, 4, minutes=200)
    assert len(batch_windows(events)) > 2000
    code, out, err = _run([MILLWHEEL, "run", "examples.ad_windows", "--input", str(reachable_tmp / "in"), "--out",
                           str(reachable_tmp / "out"), "--workers", "2", "--until-idle", "--store", pg_url],
                          reachable_tmp, 420)
    assert code == 0, err[-3000:]
    windows = read_windows(reachable_tmp / "out" / "windows.jsonl")
    check_windows(windows, events)
    echoed = [line for line in out.splitlines() if line.startswith('{"advertiser_id"')]
    # every window echoed (one taken again after an interval moved may be echoed twice: user code ran twice)
    assert set(echoed) == {line.decode() for line in (reachable_tmp / "out" / "windows.jsonl").read_bytes().splitlines()}
