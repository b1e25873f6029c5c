"""Helpers shared by the benchmark programs: percentiles, the one-JSON-line ``--json`` output, stopping
the process groups a benchmark started."""
from __future__ import annotations

import json
import os
import signal
import subprocess


def stop_groups(procs, grace_s: float = 60.0) -> None:
    """SIGTERM the process group of every process in ``procs`` (started with ``start_new_session``), wait
    up to ``grace_s`` for each, then SIGKILL the group of any still running."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def percentile(values, q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return float(s[k])


def emit(figures: dict, as_json: bool, title: str) -> None:
    """Print the figures for a reader, then (with ``--json``) one JSON object as the last line."""
    print(title)
    for key, value in figures.items():
        print(f"  {key:<32} {value}")
    if as_json:
        print(json.dumps(figures, sort_keys=True), flush=True)
