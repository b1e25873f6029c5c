"""What ``millwheel run``'s summary and ``millwheel status`` count, the installed command as a process: a record an
injector set aside (a joined line the key extractor raises on) counted by the worker process that set it aside,
in ``millwheel status`` and in the summary alike; and the input lines quarantined, in this run and in all,
with the quarantine file named (one process and ``--workers 2``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from photon import wait_until

from mw_cluster import check_windows, stop_run
from mw_helpers import read_windows, write_joined

MILLWHEEL = str(Path(sys.executable).parent / "millwheel")


def _status(out: Path) -> str:
    r = subprocess.run([MILLWHEEL, "status", "--out", str(out)], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


@pytest.mark.timeout(400)
def test_a_record_an_injector_set_aside_is_counted_by_its_worker_in_status_and_summary(reachable_tmp):
    """Before: ``millwheel status`` said ``set aside: 0 by the running workers, 1 in the store`` (a worker process
    counted only what its computations set aside), and so did the run's summary (``0 record(s) set aside in this
    run``)."""
    events = write_joined(reachable_tmp / "in", 1500, 4)
    bad = dict(events[10], click_id=events[10]["click_id"][:-3] + "999", query={"text": "no advertiser"})
    (f,) = sorted((reachable_tmp / "in" / "joined").glob("*/*0001.jsonl"))
    with open(f, "ab") as w:
        w.write(json.dumps(bad).encode() + b"\n")
    out = reachable_tmp / "out"
    log_path = reachable_tmp / "run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([MILLWHEEL, "run", "examples.ad_windows", "--input", str(reachable_tmp / "in"),
                                 "--out", str(out), "--workers", "2", "--option", "injector_batch=100"],
                                cwd=reachable_tmp, stdout=log, stderr=subprocess.STDOUT)
        try:
            seen = {"text": ""}

            def status_says(part: str) -> bool:
                assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
                seen["text"] = _status(out) if (out / ".millwheel" / "cluster.json").exists() else ""
                return part in seen["text"]
            wait_until(lambda: status_says(", 1 in the store"), 240, message="the record set aside in the store")
            wait_until(lambda: status_says("set aside: 1 by the running workers, 1 in the store"), 30,
                       message=f"status counting the injector's set-aside record; it said:\n{seen['text']}")
            assert f"  set aside: windows key {bad['click_id']!r} record joined/" in seen["text"], seen["text"]
        finally:
            stop_run(proc)
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "millwheel: 1 record(s) set aside in this run, 1 in the store" in text, text[-3000:]


@pytest.mark.timeout(500)
@pytest.mark.parametrize("workers", [None, 2], ids=["one-process", "workers"])
def test_the_summary_says_how_many_input_lines_were_quarantined_and_where(reachable_tmp, workers):
    """Before: the summary did not mention the bad lines; they were only to be found in ``<out>/.quarantine/``."""
    events = write_joined(reachable_tmp / "in", 1500, 4, bad_every=100)
    out = reachable_tmp / "out"
    argv = [MILLWHEEL, "run", "examples.ad_windows", "--input", str(reachable_tmp / "in"), "--out", str(out),
            "--until-idle", "--option", "injector_batch=100", *(["--workers", str(workers)] if workers else [])]
    quarantine = out / ".quarantine" / "millwheel-injector.jsonl"
    for this_run in (15, 0):       # the second run reads nothing new
        r = subprocess.run(argv, capture_output=True, text=True, timeout=400, cwd=reachable_tmp,
                           env={**os.environ})
        assert r.returncode == 0, r.stderr[-3000:]
        assert (f"millwheel: {this_run} input line(s) quarantined in this run, 15 in all: {quarantine} (lines that "
                "are not JSON or lack a field the injector needs" in r.stderr), r.stderr[-3000:]
        assert len(quarantine.read_bytes().splitlines()) == 15
        check_windows(read_windows(out / "windows.jsonl"), events)


@pytest.mark.timeout(400)
def test_a_password_in_the_store_url_is_never_printed(reachable_tmp, pg_url):
    """libpq's ``password=`` parameter: before, the ``--workers`` run's first line printed it (only a
    ``user:password@`` was left out), and so did the message for a store that cannot be reached."""
    from photon import free_port
    (reachable_tmp / "in").mkdir()
    url = f"{pg_url}&password=secret"
    r = subprocess.run([MILLWHEEL, "run", "examples.ad_windows", "--input", "in", "--out", "out", "--workers", "1",
                        "--until-idle", "--store", url], capture_output=True, text=True, timeout=300, cwd=reachable_tmp)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"workers; store {pg_url}&password=***\n" in r.stderr, r.stderr[-3000:]
    assert "secret" not in r.stderr + r.stdout, r.stderr[-3000:]
    port = free_port("127.0.0.1")
    url = f"postgresql://nobody:other@127.0.0.1:{port}/nowhere?password=secret&retry_s=1"
    r = subprocess.run([MILLWHEEL, "run", "examples.ad_windows", "--input", "in", "--out", "out2", "--until-idle",
                        "--store", url], capture_output=True, text=True, timeout=60, cwd=reachable_tmp)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.startswith(f"millwheel: --store postgresql://nobody:***@127.0.0.1:{port}/nowhere"
                               "?password=***&retry_s=1 cannot be reached"), r.stderr
    assert "secret" not in r.stderr and "other" not in r.stderr, r.stderr
