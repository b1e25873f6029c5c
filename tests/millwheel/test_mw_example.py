"""The ad_windows example through the real command line: batch-equal output, and SIGKILL at random
points with restarts."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter

import orjson
import pytest

from mw_helpers import batch_windows, read_windows, write_joined
from photon import wait_until



def run_argv(inp, out):
    return ["-m", "millwheel.cli", "run", "examples.ad_windows", "--input", str(inp), "--out", str(out),
            "--until-idle"]


def as_counts(windows: list[dict]) -> dict:
    keys = Counter((w["advertiser_id"], w["window_start_us"]) for w in windows)
    twice = [k for k, n in keys.items() if n > 1]
    assert twice == [], f"windows written more than once: {twice[:5]}"
    return {(w["advertiser_id"], w["window_start_us"]): w["clicks"] for w in windows}


@pytest.mark.timeout(90)
def test_run_until_idle_prints_and_writes_every_window_once(tmp_path, reachable_tmp, procs):
    events = write_joined(tmp_path / "in", 3000, 8, bad_every=500)
    out = reachable_tmp / "out"  # the embedded server's data directory is under it
    p = procs.python(*run_argv(tmp_path / "in", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 0, stderr.decode()
    assert b"windows: 3000 processed, 0 duplicates, 0 late" in stderr, stderr.decode()
    written = read_windows(out / "windows.jsonl")
    assert as_counts(written) == batch_windows(events)
    printed = [orjson.loads(line) for line in stdout.splitlines() if line.startswith(b"{")]
    assert sorted(map(orjson.dumps, printed)) == sorted(map(orjson.dumps, written))
    quarantined = (out / ".quarantine" / "millwheel-injector.jsonl").read_bytes().splitlines()
    assert len(quarantined) == 3000 // 499
    again = procs.python(*run_argv(tmp_path / "in", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = again.communicate(timeout=60)
    assert again.returncode == 0, stderr.decode()
    assert read_windows(out / "windows.jsonl") == written  # a finished run resumed adds nothing


@pytest.mark.timeout(150)
def test_sigkill_at_random_points_then_restart_matches_batch(tmp_path, reachable_tmp, procs):
    events = write_joined(tmp_path / "in", 40000, 60, minutes=15)
    expected = batch_windows(events)
    out = reachable_tmp / "out"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    kills, finished = 0, False
    for attempt in range(12):
        p = procs.python(*run_argv(tmp_path / "in", out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        kill_at = time.monotonic() + rng.uniform(0.2, 1.2)
        wait_until(lambda: p.poll() is not None or time.monotonic() >= kill_at, 60, message="kill point")
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
            p.stderr.close()
            kills += 1
            # whatever is on disk now may hold an uncommitted tail, but never a wrong window
            for (adv, start), clicks in as_counts(read_windows(out / "windows.jsonl")).items():
                assert expected[(adv, start)] == clicks, (adv, start)
            if kills >= 5:
                break
        else:
            err = p.stderr.read().decode()
            p.stderr.close()
            assert p.returncode == 0, err
            finished = True
            break
    assert kills >= 2, f"only {kills} kill(s) landed before the run finished"
    if not finished:
        p = procs.python(*run_argv(tmp_path / "in", out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err.decode()
    assert as_counts(read_windows(out / "windows.jsonl")) == expected
    alerts = Counter((a["advertiser_id"], a["window_start_us"]) for a in read_windows(out / "anomalies.jsonl"))
    assert alerts and max(alerts.values()) == 1


def server_pid(out) -> int | None:
    """The pid of the PostgreSQL server on ``<out>/.millwheel/pg`` once it accepts connections."""
    try:
        lines = (out / ".millwheel" / "pg" / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    return int(lines[0]) if len(lines) >= 8 and lines[7].strip() == "ready" else None


def gone(pid: int) -> bool:
    import psutil
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(90)
def test_default_store_is_an_embedded_postgres_stopped_on_sigint_and_when_the_command_is_killed(
        tmp_path, reachable_tmp, procs):
    write_joined(tmp_path / "in", 500, 2)
    out = reachable_tmp / "out"
    argv = run_argv(tmp_path / "in", out)[:-1]  # no --until-idle: runs until stopped
    p = procs.python(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until(lambda: server_pid(out) is not None or p.poll() is not None, 60, message="the embedded server")
    pid = server_pid(out)
    assert pid is not None, p.stderr.read().decode()
    wait_until(lambda: (out / "windows.jsonl").exists(), 60, message="windows written")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert b"state cache hit ratio" in err
    assert gone(pid)
    again = procs.python(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until(lambda: server_pid(out) not in (None, pid) or again.poll() is not None, 60, message="restart")
    pid = server_pid(out)
    assert pid is not None and again.poll() is None
    os.kill(again.pid, signal.SIGKILL)  # the command alone, not its process group
    again.wait(timeout=10)
    again.stderr.close()
    wait_until(lambda: gone(pid), 30, message="the server shutting down after its parent died")


@pytest.mark.timeout(90)
def test_sqlite_store_by_url_still_works_and_starts_no_server(tmp_path, procs):
    events = write_joined(tmp_path / "in", 1000, 4)
    out = tmp_path / "out"
    argv = run_argv(tmp_path / "in", out) + ["--store", f"sqlite:///{tmp_path / 'state.db'}"]
    p = procs.python(*argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err.decode()
    assert as_counts(read_windows(out / "windows.jsonl")) == batch_windows(events)
    assert (tmp_path / "state.db").exists() and not (out / ".millwheel" / "pg").exists()
