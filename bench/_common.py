"""Helpers shared by the benchmark programs: percentiles, the one-JSON-line ``--json`` output, stopping
the process groups a benchmark started."""
from __future__ import annotations

import json
import os
import signal
import statistics
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


def percentile(values, q: int) -> float:
    """The ``q``-th percentile (0..100: 0 the least value, 100 the greatest) of ``values``, interpolated between
    the nearest samples as :func:`statistics.quantiles`' inclusive method (numpy's default) does; 0.0 for no
    values."""
    if not 0 <= q <= 100 or q != int(q):
        raise ValueError(f"percentile {q}: must be a whole number 0..100")
    if not values:
        return 0.0
    if q in (0, 100) or len(values) == 1:
        return float(min(values) if q == 0 else max(values) if q == 100 else values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1])


def emit(figures: dict, as_json: bool, title: str) -> None:
    """Print the figures for a reader, then (with ``--json``) one JSON object as the last line."""
    print(title)
    for key, value in figures.items():
        print(f"  {key:<32} {value}")
    if as_json:
        print(json.dumps(figures, sort_keys=True), flush=True)
