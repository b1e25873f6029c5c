"""Photon's joined output as a live input: ``ad_windows`` over a running two-region ``photon run`` (its config
as the input) closes every window while the joiners' files are still open, from the joined horizon, and its
windows equal a batch count of the joined output."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from mw_helpers import batch_windows, read_windows
from photon import load_config, read_output_lines, wait_until


def _photon(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "photon.app.cli", *args], check=True, capture_output=True, timeout=120)


def _dispatcher_caught_up(state_dir: Path, since_us: int) -> bool:
    try:
        st = orjson.loads((state_dir / "dispatcher" / "status.json").read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return False
    return bool(st.get("caught_up")) and st.get("scan_at_us", 0) > since_us and not st.get("oldest_unresolved_us")


@pytest.mark.timeout(300)
def test_ad_windows_over_a_live_two_region_run_close_from_the_horizon_and_equal_the_batch(tmp_path, procs):
    _photon("gen", "--out", str(tmp_path), "--queries", "20000", "--regions", "a,b", "--seed", "5",
            "--unjoinable", "0")
    config_path = tmp_path / "photon.toml"
    text = config_path.read_text()                 # files stay open (unpublished) for the whole test
    text = (text.replace("[joiner]\n", "[joiner]\nroll_interval_s = 600\n", 1) if "[joiner]\n" in text
            else text + "\n[joiner]\nroll_interval_s = 600\n")
    config_path.write_text(text)
    config = load_config(config_path)
    started_us = time.time_ns() // 1000
    run = procs.python("-m", "photon.app.cli", "run", "--config", str(config_path),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: all(_dispatcher_caught_up(Path(r.state_dir), started_us) for r in config.pipeline_regions),
               180, interval=0.5, message="both regions caught up")
    assert any(list(Path(r.joined_dir).rglob(".*.inprogress")) for r in config.pipeline_regions), \
        "the joiners' files are still open"
    out = tmp_path / "windows"
    mw = procs.python("-m", "millwheel.cli", "run", "examples.ad_windows", "--input", str(config_path),
                      "--out", str(out), "--store", f"sqlite:///{out / 'state.db'}", "--until-idle",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, stderr = mw.communicate(timeout=90)       # every due window closes with the files still open
    done_us = time.time_ns() // 1000
    assert mw.returncode == 0, stderr.decode()[-3000:]
    assert run.poll() is None, "the pipeline is still running"
    joined = [orjson.loads(line) for r in config.pipeline_regions for line in read_output_lines(r.joined_dir)]
    assert joined, "nothing joined"
    windows = read_windows(out / "windows.jsonl")
    got = {(w["advertiser_id"], w["window_start_us"]): w["clicks"] for w in windows}
    assert len(got) == len(windows), "a window written twice"
    batch = batch_windows(joined)
    assert all(batch.get(k) == n for k, n in got.items()), "a window differs from the batch count"
    # every window that ended before the horizon (now less the 2 s log delay, and a second of slack) closed:
    # not only once files roll (600 s here)
    due = {k: n for k, n in batch.items() if k[1] + 60_000_000 <= done_us - 3_000_000}
    assert due and {k: got.get(k) for k in due} == due
    assert set(got) - set(due) <= {k for k in batch if k[1] + 60_000_000 > done_us - 3_000_000}
