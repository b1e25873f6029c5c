"""``millwheel`` as a new user meets it: a topology module that is not there, fails on import or defines no
``build``, a module in the current folder, a mistyped ``--input`` with ``--until-idle``, and ``status`` /
``worker`` pointed at a folder with no cluster: each a one-line message naming what is wrong and exit 2,
never a traceback (the installed ``millwheel`` command, run as a process)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MILLWHEEL = str(Path(sys.executable).parent / "millwheel")


def millwheel(*args, cwd, timeout=60):
    return subprocess.run([MILLWHEEL, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _refused(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    for w in words:
        assert w in r.stderr, (w, r.stderr)


@pytest.mark.timeout(120)
def test_a_bad_module_is_named_not_a_traceback(tmp_path):
    (tmp_path / "boom.py").write_text('raise RuntimeError("boom at import")\n')
    (tmp_path / "needs.py").write_text("import no_such_package_here\n")
    (tmp_path / "nobuild.py").write_text("x = 1\n")
    (tmp_path / "notopo.py").write_text("def build(input, out):\n    return 42\n")
    (tmp_path / "buildfails.py").write_text("def build(input, out):\n    raise ValueError('no such table')\n")
    (tmp_path / "in").mkdir()
    common = ["--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--until-idle"]
    _refused(millwheel("run", "examples.nope", *common, cwd=tmp_path), "no module 'examples.nope'")
    _refused(millwheel("run", "boom", *common, cwd=tmp_path),
             "module 'boom' failed on import: RuntimeError: boom at import", "boom.py, line 1")
    _refused(millwheel("run", "needs", *common, cwd=tmp_path), "module 'needs' failed on import",
             "no_such_package_here")
    _refused(millwheel("run", "nobuild", *common, cwd=tmp_path), "defines no build(input, out)")
    _refused(millwheel("run", "notopo", *common, cwd=tmp_path), "returned int, not a millwheel.Topology")
    _refused(millwheel("run", "buildfails", *common, cwd=tmp_path), "ValueError: no such table")
    _refused(millwheel("worker", "boom", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                       "--store", "sqlite:///x.db", "--master", "127.0.0.1:1", cwd=tmp_path), "boom at import")


@pytest.mark.timeout(120)
def test_a_module_in_the_current_folder_is_found(tmp_path):
    """The console script does not put the current folder on the import path as ``python -m`` does; the
    command adds it, so ``millwheel run mymodule`` works where ``mymodule.py`` is (here: it fails in build,
    which shows it was imported)."""
    (tmp_path / "mine.py").write_text("def build(input, out):\n    raise ValueError('imported from here')\n")
    (tmp_path / "in").mkdir()
    r = millwheel("run", "mine", "--input", "in", "--out", "out", "--until-idle", cwd=tmp_path)
    _refused(r, "imported from here")


@pytest.mark.timeout(120)
def test_a_missing_input_or_cluster_is_named(tmp_path):
    r = millwheel("run", "examples.ad_windows", "--input", str(tmp_path / "typo"), "--out", str(tmp_path / "out"),
                  "--until-idle", cwd=tmp_path)
    _refused(r, f"--input {tmp_path / 'typo'} does not exist")
    assert not (tmp_path / "out").exists()              # refused before any store was made
    _refused(millwheel("status", "--out", str(tmp_path / "out"), cwd=tmp_path), "no cluster file",
             "cluster.json")
    (tmp_path / "junk.json").write_text("not json\n")
    _refused(millwheel("worker", "--cluster", str(tmp_path / "junk.json"), cwd=tmp_path),
             "cannot be read")


@pytest.mark.timeout(120)
def test_threads_and_workers_below_one_are_refused(tmp_path):
    """``--workers -1`` started a master waiting for ever for no worker; ``--threads 0`` ran with the default."""
    (tmp_path / "in").mkdir()
    for option in (["--workers", "-1"], ["--workers", "0"], ["--threads", "0"]):
        r = millwheel("run", "examples.ad_windows", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                      "--until-idle", *option, cwd=tmp_path, timeout=60)
        _refused(r, f"argument {option[0]}: must be at least 1")


@pytest.mark.timeout(60)
def test_a_metrics_port_out_of_range_is_refused(tmp_path):
    for port in ("-1", "65536", "http"):
        r = millwheel("worker", "--out", str(tmp_path / "out"), "--metrics-port", port, cwd=tmp_path, timeout=60)
        _refused(r, "argument --metrics-port:", "is not a port number")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("to_group", [False, True], ids=["sigterm-to-the-command", "ctrl-c-to-the-group"])
def test_a_cluster_running_for_ever_stopped_exits_0_as_one_process_does(tmp_path, to_group):
    """Without ``--until-idle`` a stop is the normal end: the one-process runtime exits 0 with its summary, and
    so does ``--workers N`` (it exited 130 saying the input was not consumed), also when a terminal's Ctrl-C
    reaches the masters and workers too (the final counts are then left out, never a traceback)."""
    import os
    import signal
    from photon import wait_until
    (tmp_path / "in").mkdir()
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        p = subprocess.Popen([MILLWHEEL, "run", "examples.ad_windows", "--input", str(tmp_path / "in"), "--out",
                              str(tmp_path / "out"), "--workers", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=f, start_new_session=True)
        try:
            wait_until(lambda: "workers; store" in err.read_text() or p.poll() is not None, 120,
                       message="the cluster to start")
            assert p.poll() is None, err.read_text()[-2000:]
            if to_group:
                os.killpg(p.pid, signal.SIGINT)
            else:
                p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=90) == 0, err.read_text()[-2000:]
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    text = err.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert ("1 workers" in text) or (to_group and "no final counts" in text), text[-2000:]
