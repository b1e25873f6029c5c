"""Helpers shared by the benchmark programs: percentiles and the one-JSON-line ``--json`` output."""
from __future__ import annotations

import json


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
