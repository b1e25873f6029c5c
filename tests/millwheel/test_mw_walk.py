"""``millwheel run`` as a data engineer meets it with a computation of their own over Photon's joined output,
each time the installed command as a process on its embedded PostgreSQL (or the session's server): the
embedded server SIGKILLed mid-run, with one process and with worker processes; a worker process SIGKILLed
when it is the only one; records set aside shown in the run's summary; a second run on the same ``--out``
and a store that cannot be reached, each a one-line message. Each run's windows equal the batch answer,
each window once."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from photon import wait_until

from mw_cluster import check_windows, stop_run
from mw_helpers import read_windows, write_joined

MILLWHEEL = str(Path(sys.executable).parent / "millwheel")

SLOW_MODULE = '''
import os, time
from millwheel.examples import ad_windows
from millwheel.examples.ad_windows import ClickWindows


class SlowWindows(ClickWindows):
    def process_record(self, ctx, record):
        if os.path.exists(os.environ["SLOW_WHILE"]):   # slow until the test has done its fault (Run.fast)
            time.sleep(float(os.environ.get("SLOW_S", "0.004")))
        if record.value["click_id"] == os.environ.get("POISON_CLICK"):
            raise ValueError("no advertiser for " + record.value["click_id"])
        super().process_record(ctx, record)


def build(input, out):
    return ad_windows.build(input, out, echo=False, windows=SlowWindows)
'''


class Run:
    """``millwheel run slow_windows`` over ``n_clicks`` joined clicks, as a child process. Its computation
    takes ``SLOW_S`` (4 ms) per record while the file ``slow`` is in its folder (from the start, so that a
    fault lands while the run goes on), at full speed once the test has called :meth:`fast` (after its
    fault: the rest of the input need not crawl)."""

    def __init__(self, tmp: Path, *args: str, n_clicks: int = 3000, env: dict | None = None) -> None:
        self.tmp, self.out = tmp, tmp / "out"
        (tmp / "slow_windows.py").write_text(SLOW_MODULE)
        (tmp / "slow").touch()
        if not (tmp / "in").exists():
            self.events = write_joined(tmp / "in", n_clicks, 6)
        self.log_path = tmp / f"run-{len(list(tmp.glob('run-*.log')))}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([MILLWHEEL, "run", "slow_windows", "--input", str(tmp / "in"), "--out",
                                      str(self.out), "--until-idle", "--option", "injector_batch=100", *args],
                                     cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "SLOW_WHILE": str(tmp / "slow"), **(env or {})})

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"millwheel run still running after {timeout} s; its log ends:\n"
                                 f"{self.text()[-3000:]}") from None

    def fast(self) -> None:
        """From now on the computation takes no extra time per record (every run in this folder)."""
        (self.tmp / "slow").unlink(missing_ok=True)

    def close(self) -> None:
        stop_run(self.proc)
        self.log.close()

    def check(self, events: list[dict]) -> None:
        check_windows(read_windows(self.out / "windows.jsonl"), events)

    def committing(self) -> tuple[Path, str]:
        """Waits until the run's embedded server runs and the windows computation has committed 200 records,
        the run still going; returns the server's pid file and URL."""
        pidfile = self.out / ".millwheel" / "pg" / "postmaster.pid"
        wait_until(lambda: pidfile.exists() and len(pidfile.read_text().splitlines()) >= 8
                   or self.proc.poll() is not None, 240, message="the embedded server")
        url = _embedded_url(self.out)
        wait_until(lambda: _processed(url) >= 200 or self.proc.poll() is not None, 240, message="records committed")
        assert self.proc.poll() is None, self.text()[-3000:]
        return pidfile, url


@pytest.fixture
def runs():
    started: list[Run] = []
    try:
        yield started
    finally:
        for r in started:
            r.close()


def _processed(url: str) -> int:
    """Click ids the windows computation has committed (0 while the store does not answer)."""
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute("SELECT count(*) FROM millwheel.dedup WHERE computation = 'windows'").fetchone()[0]
    except psycopg.Error:
        return 0


def _embedded_url(out: Path) -> str:
    lines = (out / ".millwheel" / "pg" / "postmaster.pid").read_text().splitlines()
    return f"postgresql://postgres@127.0.0.1:{lines[3].strip()}/postgres"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "workers"])
def test_the_embedded_postgres_killed_mid_run_is_started_again_and_nothing_is_lost_or_doubled(
        reachable_tmp, runs, workers):
    """Before, nothing started the command's own server again: the one-process run failed with the store's
    traceback after 60 s, and with ``--workers`` every worker exited after 60 s and the run waited for ever."""
    run = Run(reachable_tmp, *(["--workers", str(workers)] if workers else []))
    runs.append(run)
    pidfile, _ = run.committing()
    pid = int(pidfile.read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)
    run.fast()
    assert run.wait(240) == 0, run.text()[-3000:]
    assert "the embedded PostgreSQL is running again" in run.text()
    run.check(run.events)


@pytest.mark.timeout(400)
def test_the_only_worker_process_killed_is_started_again_and_the_run_ends(reachable_tmp, runs):
    """``--workers 1`` and its worker SIGKILLed mid-run: before, nothing started another and the run waited
    for ever for a cluster with no worker (also when every worker of several exited, e.g. on a store lost for
    longer than its retries)."""
    run = Run(reachable_tmp, "--workers", "1")
    runs.append(run)
    run.committing()
    (announce,) = (run.out / ".millwheel" / "workers").glob("*.json")
    pid = json.loads(announce.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    run.fast()
    assert run.wait(300) == 0, run.text()[-3000:]
    assert f"millwheel: worker pid {pid} exited with signal SIGKILL; started pid" in run.text()
    run.check(run.events)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "workers"])
def test_the_runs_summary_names_the_records_set_aside(reachable_tmp, runs, workers):
    """A click the computation always raises on: before, the summary counted the others as processed and said
    nothing of the one left out (exit 0), and a run without ``--workers`` has no ``millwheel status``; now it
    says how many were set aside and lists each with its key, error and attempts."""
    events = write_joined(reachable_tmp / "in", 1500, 4)
    bad = events[321]
    run = Run(reachable_tmp, *(["--workers", str(workers)] if workers else []),
              env={"POISON_CLICK": bad["click_id"], "SLOW_S": "0"})
    runs.append(run)
    assert run.wait(300) == 0, run.text()[-3000:]
    text = run.text()
    assert "millwheel: 1 record(s) set aside in this run, 1 in the store: user code raised on them" in text, \
        text[-3000:]
    assert (f"  set aside: windows key {bad['query']['advertiser_id']!r} record " in text
            and f" after 5 attempts: ValueError: no advertiser for {bad['click_id']}" in text), text[-3000:]
    if not workers:
        assert "windows: 1499 processed, 0 duplicates, 0 late, " in text and ", 1 set aside;" in text, text[-3000:]
    run.check([e for e in events if e is not bad])


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "workers"])
def test_an_input_line_the_key_extractor_raises_on_is_set_aside_not_a_stop_at_every_start(
        reachable_tmp, runs, workers):
    """A joined line with a good click id but no ``query.advertiser_id``: the example's key extractor raises
    on it. Before, the injector had committed it with its position, then routing raised: the run stopped
    with a traceback (``--workers``: the injector's worker exited and the run waited for ever), and every
    start replayed the same stored record and stopped again. Now it is set aside for that consumer in the
    injector's write, and the rest goes on."""
    events = write_joined(reachable_tmp / "in", 1500, 4)
    bad = dict(events[10], click_id=events[10]["click_id"][:-3] + "999", query={"text": "no advertiser"})
    (f,) = sorted((reachable_tmp / "in" / "joined").glob("*/*0001.jsonl"))
    with open(f, "ab") as out:
        out.write(json.dumps(bad).encode() + b"\n")
    run = Run(reachable_tmp, *(["--workers", str(workers)] if workers else []), env={"SLOW_S": "0"})
    runs.append(run)
    assert run.wait(300) == 0, run.text()[-3000:]
    text = run.text()
    assert "Traceback" not in text, text[-3000:]
    assert (f"  set aside: windows key {bad['click_id']!r} record joined/" in text
            and " after 1 attempts: the key extractor of windows for stream clicks raised: KeyError: "
                "'advertiser_id'" in text), text[-3000:]
    run.check(events)
    again = Run(reachable_tmp, *(["--workers", str(workers)] if workers else []))   # the next start: not again
    runs.append(again)
    assert again.wait(300) == 0, again.text()[-3000:]
    again.check(events)


@pytest.mark.timeout(400)
def test_a_second_run_on_the_same_out_is_refused_in_one_line_and_the_first_goes_on(reachable_tmp, runs):
    """Before: a traceback ending in ``EmbeddedPostgresError`` (exit 1)."""
    first = Run(reachable_tmp)
    runs.append(first)
    pidfile = first.out / ".millwheel" / "pg" / "postmaster.pid"
    wait_until(lambda: pidfile.exists() and len(pidfile.read_text().splitlines()) >= 8
               or first.proc.poll() is not None, 240, message="the embedded server")
    second = Run(reachable_tmp)
    runs.append(second)
    assert second.wait(120) == 4, second.text()[-3000:]
    text = second.text()
    assert "Traceback" not in text, text[-3000:]
    assert text.startswith(f"millwheel: a PostgreSQL server (pid {int(pidfile.read_text().split()[0])}) is already "
                           f"running on {first.out / '.millwheel' / 'pg'}"), text
    assert "a second run on the same --out" in text
    first.fast()
    assert first.wait(300) == 0, first.text()[-3000:]
    first.check(first.events)


@pytest.mark.timeout(200)
def test_a_store_that_cannot_be_reached_is_named_within_seconds(reachable_tmp):
    """Before: 60 s of silence, then a traceback ending in psycopg's ``OperationalError`` (exit 1)."""
    from photon import free_port
    url = f"postgresql://nobody:secret@127.0.0.1:{free_port('127.0.0.1')}/nowhere"
    (reachable_tmp / "in").mkdir()
    # the three commands side by side (each waits its 5 s for the store), each with an --out of its own
    argvs = (["run", "examples.ad_windows", "--input", "in", "--out", "out0", "--until-idle", "--store", url],
             ["run", "examples.ad_windows", "--input", "in", "--out", "out1", "--workers", "1", "--store", url],
             ["worker", "examples.ad_windows", "--input", "in", "--out", "out2", "--store", url,
              "--master", "127.0.0.1:1"])
    started = [subprocess.Popen([MILLWHEEL, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=reachable_tmp) for argv in argvs]
    try:
        errs = [p.communicate(timeout=45)[1] for p in started]
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=10)
    for argv, p, stderr in zip(argvs, started, errs):
        assert p.returncode == 2, (argv, p.returncode, stderr[-2000:])
        assert "Traceback" not in stderr and "secret" not in stderr, stderr[-2000:]
        assert stderr.startswith(f"millwheel: --store {url.replace('secret', '***')} cannot be reached "
                                 "(tried for 5 s): connection failed"), stderr


@pytest.mark.timeout(400)
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_full_disk_for_the_output_stops_the_run_in_one_line_and_the_next_run_writes_the_rest(
        reachable_tmp, runs, pg_url):
    """``--out`` on an 8 KiB tmpfs: before, each window that did not fit was tried 5 times and set aside
    (re-running every window of the sink's batch each time, echoing them again), so the run spun for minutes
    and left the windows out of the output. Now :class:`FileSink` raises ``OutputFailed``, the run stops at
    once saying which file could not be written, and once there is room the same command writes the rest:
    every window once, equal to the batch."""
    out = reachable_tmp / "out"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(out)], check=True)
    try:
        run = Run(reachable_tmp, "--store", pg_url, env={"SLOW_S": "0"})
        runs.append(run)
        assert run.wait(120) == 1, run.text()[-3000:]
        text = run.text()
        assert "Traceback" not in text and "set aside" not in text, text[-3000:]
        assert re.search(rf"millwheel: stopped: writing {re.escape(str(out))}/(windows|anomalies)\.jsonl failed: "
                         "No space left on device; what was committed stays", text), text[-3000:]
        subprocess.run(["mount", "-o", "remount,size=1m", str(out)], check=True)
        again = Run(reachable_tmp, "--store", pg_url, env={"SLOW_S": "0"})
        runs.append(again)
        assert again.wait(300) == 0, again.text()[-3000:]
        again.check(run.events)
    finally:
        for r in runs:
            r.close()
        subprocess.run(["umount", str(out)], check=False)


@pytest.mark.timeout(400)
def test_a_master_port_in_use_and_no_master_are_named_not_a_traceback(reachable_tmp, pg_url):
    """A second ``--workers`` run on an ``--out`` reuses its master's ports; one taken by another program meanwhile
    made the master say so and then ``millwheel run`` end in a ``RuntimeError`` traceback. ``millwheel worker``
    given a ``--master`` that does not answer ended in a ``MasterUnavailable`` traceback."""
    import socket
    (reachable_tmp / "in").mkdir()
    argv = [MILLWHEEL, "run", "examples.ad_windows", "--input", "in", "--out", "out", "--workers", "1", "--until-idle",
            "--store", pg_url]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=reachable_tmp)
    assert first.returncode == 0, first.stderr[-3000:]
    spec = json.loads(json.loads((reachable_tmp / "out" / ".millwheel" / "cluster.json").read_text())["specs"][0])
    host, port = spec["grpc_peers"][0].rsplit(":", 1)
    with socket.socket() as taken:
        taken.bind((host, int(port)))
        taken.listen()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=reachable_tmp)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"cannot bind {host}:{port}" in r.stderr, r.stderr[-3000:]
    assert re.search(r"millwheel: stopped: a millwheel master process \(pid \d+\) did not start \(exit 2\); its own "
                     r"message is above", r.stderr), r.stderr[-3000:]
    from photon import free_port
    w = subprocess.run([MILLWHEEL, "worker", "examples.ad_windows", "--input", "in", "--out", "out2", "--store", pg_url,
                        "--master", f"127.0.0.1:{free_port('127.0.0.1')}"],
                       capture_output=True, text=True, timeout=200, cwd=reachable_tmp)
    assert w.returncode == 1, w.stderr[-3000:]
    assert "Traceback" not in w.stderr, w.stderr[-3000:]
    assert "millwheel: stopped: no master leader answered" in w.stderr, w.stderr[-3000:]
