"""The run summary's *joined* column counts the joined output as the output contract has it (published files
and committed lines of open ones), not only the JOINED answers its dispatcher heard: a run stopped by a
signal stops its dispatcher first, and the joiners' answers to the requests it had out reach no one although
their lines are output. The dispatcher's own count stays in the JSON as ``joined_answered``."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import orjson
import pytest

import dispatcher
from photon import RollingWriter, load_config, parse_config, wait_until
from photon.app._summary import build_summary, format_summary


@pytest.mark.timeout(30)
def test_joined_is_what_the_output_holds_and_the_answers_are_kept_beside_it(tmp_path):
    config = parse_config({"regions": [{"name": "a", "log_root": str(tmp_path / "logs"),
                                        "output_root": str(tmp_path / "out"), "state_dir": str(tmp_path / "state")}]},
                          str(tmp_path / "photon.toml"), tmp_path)
    (tmp_path / "state" / "dispatcher").mkdir(parents=True)
    (tmp_path / "state" / "dispatcher" / "status.json").write_bytes(orjson.dumps(
        {"events_read": 9, "joined": 3, "already_registered": 0}))
    published = RollingWriter(config.region("a").joined_dir, "a-j0", commit_interval_s=0.0)
    published.sync(published.write_lines([orjson.dumps({"click_id": f"c{i}"}) for i in range(5)]))
    published.roll()
    still_open = RollingWriter(config.region("a").joined_dir, "a-j1", commit_interval_s=0.0)
    still_open.sync(still_open.write_lines([orjson.dumps({"click_id": f"d{i}"}) for i in range(2)]))
    try:
        s = build_summary(config, 1.0, since_us=0)
    finally:
        still_open.close()
    a = s["regions"]["a"]
    assert (a["joined"], a["joined_answered"], a["joined_output_lines"]) == (7, 3, 7)
    assert s["total"]["joined"] == 7 and s["total"]["joined_answered"] == 3
    row = format_summary(s).splitlines()[2].split()
    assert row[:3] == ["a", "9", "7"], row


@pytest.mark.timeout(300)
def test_a_run_stopped_by_a_signal_counts_what_its_joiners_joined(tmp_path):
    """Real processes: a 200,000-click backlog (seconds of joining even on a fast, quiet host: a 20,000-click one
    was all joined before the stop there), ``photon run`` SIGTERMed at its first joins; its summary's joined
    equals the lines in the output after it stopped. Then ``--until-caught-up``: joined equals the joinable
    clicks, each in the output once."""
    cli = [sys.executable, "-m", "photon.app.cli"]
    subprocess.run([*cli, "gen", "--out", str(tmp_path), "--queries", "200000", "--clicks-per-query", "1"],
                   check=True, capture_output=True, timeout=120)
    path = str(tmp_path / "photon.toml")
    config = load_config(path)
    region = config.regions[0]
    run = subprocess.Popen([*cli, "run", "--config", path, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_until(lambda: (dispatcher.read_status(region.state_dir) or {}).get("joined", 0) > 0
                   or run.poll() is not None, 120, interval=0.05, message="the first joins")
        assert run.poll() is None, run.stderr.read()[-2000:]
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    lines = region.output_reader("joined", config.s3).count()
    a = summary["regions"]["a"]
    assert a["joined"] == lines > 0 and a["joined_answered"] <= lines, (a, lines)
    truth = set((tmp_path / "truth" / "joinable.txt").read_text().split())
    assert lines < len(truth), "the run was stopped after the backlog was joined: nothing was in flight"

    r = subprocess.run([*cli, "run", "--config", path, "--until-caught-up", "--json", "--timeout", "200"],
                       capture_output=True, text=True, timeout=260)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads(r.stdout.strip().splitlines()[-1])
    ids = [orjson.loads(x)[config.join.foreign_id_field] for x in region.output_reader("joined", config.s3).lines()]
    assert len(ids) == len(set(ids)) and set(ids) == truth
    assert again["regions"]["a"]["joined"] == len(truth), again["regions"]["a"]
