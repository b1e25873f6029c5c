"""The registry exports verify and recover leave under ``[verify].out_dir`` (photon.app._exports): a finished
run's export carries its report, the newest ``keep_exports`` finished ones stay, older ones go; an export a
run holds (running, or read through ``--export``) and one whose run ended without a report are never
removed, the latter named. Real processes hold the locks; the command-line test runs real verify and recover
processes against a real pipeline's registry."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from photon import load_config, wait_until
from photon.app import _exports


def _export(out: Path, name: str, finished_at_us: int | None = None) -> Path:
    folder = out / name
    folder.mkdir(parents=True)
    (folder / "_export.json").write_text("{}")
    (folder / "shard-0.parquet").write_bytes(b"x" * 1000)
    if finished_at_us is not None:
        (folder / _exports.REPORT).write_text(json.dumps({"finished_at_us": finished_at_us, "report": {}}))
    return folder


def _hold(procs, folder: Path) -> subprocess.Popen:
    """Another process holding ``folder`` as a run does (its in-use lock) until its stdin closes."""
    p = procs.python("-c", "import sys; from pathlib import Path; from photon.app._exports import using\n"
                     "with using(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()",
                     str(folder), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"held"
    return p


@pytest.mark.timeout(60)
def test_older_finished_exports_go_and_held_or_unfinished_ones_stay(tmp_path, procs):
    out = tmp_path / "verify"
    old1, old2 = _export(out, "export-old1", 1_000), _export(out, "export-old2", 2_000)
    read = _export(out, "export-read", 3_000)                # finished, read now by a --export run
    crashed = _export(out, "export-crashed")                 # its run ended without a report
    running = _export(out, "export-running")                 # its run is still going
    current = _export(out, "export-current", 4_000)
    (out / "recoverable").mkdir()
    (out / "export-a-file").write_text("not an export")
    reader, runner = _hold(procs, read), _hold(procs, running)

    pruned = _exports.prune(out, keep=1, current=current)
    assert sorted(pruned.removed) == [str(old1), str(old2)]
    assert pruned.kept == (str(current.absolute()),)
    assert sorted(pruned.in_use) == [str(read), str(running)]
    assert pruned.unfinished == (str(crashed),) and pruned.unfinished_bytes >= 1000
    assert {p.name for p in out.iterdir()} == {"export-read", "export-crashed", "export-running", "export-current",
                                              "recoverable", "export-a-file"}

    reader.stdin.close()
    reader.wait(timeout=10)
    pruned = _exports.prune(out, keep=1, current=current)
    assert pruned.removed == (str(read),) and not read.exists()
    runner.stdin.close()
    runner.wait(timeout=10)
    pruned = _exports.prune(out, keep=1, current=current)   # its run ended without a report: kept, named
    assert pruned.removed == () and running.exists() and set(pruned.unfinished) == {str(crashed), str(running)}
    with pytest.raises(_exports.ExportGone):
        with _exports.using(read):
            pytest.fail("a removed export was held")


@pytest.mark.timeout(60)
def test_keep_exports_counts_this_runs_export_and_zero_keeps_every_one(tmp_path):
    out = tmp_path / "verify"
    older = [_export(out, f"export-{k}", 1_000 * k) for k in range(1, 5)]
    current = _export(out, "export-now", 9_000)
    assert _exports.prune(out, keep=0, current=current).removed == ()
    pruned = _exports.prune(out, keep=3, current=current)
    assert sorted(pruned.removed) == [str(older[0]), str(older[1])]
    assert pruned.kept == (str(current.absolute()), str(older[3]), str(older[2]))
    pruned = _exports.prune(out, keep=1)                    # no export of this run's (an --export elsewhere)
    assert sorted(pruned.removed) == [str(older[2]), str(older[3])] and pruned.kept == (str(current),)


def _job_pids(out: Path) -> list[int]:
    try:
        state = json.loads((out / "job-registry" / "processes.json").read_text())
    except (OSError, ValueError):
        return []
    return [p["pid"] for p in state["processes"].values() if p.get("pid")]


def _replicas_running(pids: list[int]) -> list[str]:
    """Those of ``pids`` that are still a running registry replica, described. A replica that has exited but
    is not yet reaped (a zombie: its parent was killed, and whoever adopted it reaps when it will) has
    exited; a pid now used by another program is not the replica."""
    running = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            status, argv = proc.status(), proc.cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if status != psutil.STATUS_ZOMBIE and "idregistry.main" in argv:
            running.append(f"pid {pid} ({status}, {len(proc.threads())} threads)")
    return running


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "photon.app.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(480)
def test_verify_and_recover_keep_the_last_reports_export_and_the_crashed_runs(tmp_path):
    """Real processes: a pipeline run, a verify, a verify SIGKILLed after its export, a recover --dry-run.
    The first verify's export goes when the recover finishes; the killed run's stays and is named; the
    recover's export holds its report, the one the report names."""
    r = _cli("gen", "--out", str(tmp_path), "--queries", "300", timeout=60)
    assert r.returncode == 0, r.stderr
    config = str(tmp_path / "photon.toml")
    r = _cli("run", "--config", config, "--until-caught-up", "--timeout", "120")
    assert r.returncode == 0, r.stderr[-2000:]
    out = load_config(config).verify_dir

    r = _cli("verify", "--config", config, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    (first_export,) = out.glob("export-*")
    marker = json.loads((first_export / _exports.REPORT).read_text())["report"]
    assert {k: marker[k] for k in first} == first and marker["export_dir"] == str(first_export), marker

    log = tmp_path / "killed.err"
    with open(log, "w") as err:
        p = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "verify", "--config", config],
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            wait_until(lambda: any((d / "_export.json").exists() for d in out.glob("export-*") if d != first_export)
                       or p.poll() is not None, 120, message="the second verify's export")
            assert p.poll() is None, log.read_text()[-2000:]
            os.killpg(p.pid, signal.SIGKILL)            # the run and its registry replicas, if it started any
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    try:
        wait_until(lambda: not _replicas_running(_job_pids(out)), 60, interval=0.1)
    except TimeoutError:
        pytest.fail(f"the killed run's registry replicas did not exit within 60 s of its death (they stop on "
                    f"SIGTERM from the kernel when it dies): {_replicas_running(_job_pids(out))}")
    killed = [d for d in out.glob("export-*") if d != first_export]
    assert len(killed) == 1 and not (killed[0] / _exports.REPORT).exists()

    r = _cli("recover", "--config", config, "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    left = {d.name for d in out.glob("export-*")}
    assert first_export.name not in left and killed[0].name in left and len(left) == 2, (left, r.stderr[-2000:])
    (last,) = [out / n for n in left if n != killed[0].name]
    assert json.loads((last / _exports.REPORT).read_text())["report"]["export_dir"] == str(last)
    assert str(killed[0]) in r.stderr and "no finished run's report names" in r.stderr, r.stderr[-2000:]
