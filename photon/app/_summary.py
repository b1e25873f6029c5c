"""The run summary: what each region's dispatcher read and resolved, quarantined records, latencies."""
from __future__ import annotations

import json
from pathlib import Path

import orjson

import dispatcher
from photon import PhotonConfig
from photon._output import count_output_lines as _count_output_lines

COUNTERS = ("events_read", "joined", "already_joined", "duplicates_prevented", "unjoinable", "bad_records",
            "retry_queue", "in_flight")


def count_quarantined(region) -> int:
    """Distinct (file, offset) quarantine entries of a region (a restarted reader may log one twice)."""
    seen = set()
    qdir = Path(region.quarantine_dir)
    for path in sorted(qdir.glob("*.jsonl")) if qdir.is_dir() else []:
        with open(path, "rb") as f:
            for line in f:
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                seen.add((path.stem.split("-")[0], entry.get("file"), entry.get("offset")))
    return len(seen)


def count_output_lines(directory: Path) -> int:
    """Committed lines of an output folder (published, open and compacted; see the output contract)."""
    return _count_output_lines(directory)


def build_summary(config: PhotonConfig, elapsed_s: float, regions=None) -> dict:
    out = {"elapsed_s": round(elapsed_s, 2), "regions": {}}
    totals = dict.fromkeys(COUNTERS, 0)
    totals["quarantined"] = 0
    totals["joined_output_lines"] = 0
    for region in config.regions:
        if regions is not None and region.name not in regions:
            continue
        status = dispatcher.read_status(region.state_dir) or {}
        entry = {k: int(status.get(k, 0)) for k in COUNTERS}
        entry["quarantined"] = count_quarantined(region)
        entry["joined_output_lines"] = count_output_lines(region.joined_dir)
        entry["join_latency_ms"] = status.get("join_latency_ms", {})
        out["regions"][region.name] = entry
        for k in totals:
            totals[k] += entry[k]
    out["total"] = totals
    lat = [e["join_latency_ms"] for e in out["regions"].values() if e["join_latency_ms"]]
    if lat:
        out["total"]["join_latency_ms"] = {q: max(x.get(q, 0) for x in lat) for q in ("p50", "p90", "p99")}
    return out


def format_summary(summary: dict) -> str:
    lines = [f"Photon run summary ({summary['elapsed_s']} s)"]
    header = f"{'region':<8}{'read':>10}{'joined':>10}{'unjoin.':>9}{'bad':>7}{'dups prev.':>12}" \
             f"{'p50 ms':>9}{'p90 ms':>9}"
    lines.append(header)
    rows = list(summary["regions"].items())
    if len(rows) > 1:
        rows.append(("total", summary["total"]))
    for name, e in rows:
        lat = e.get("join_latency_ms") or {}
        lines.append(f"{name:<8}{e['events_read']:>10}{e['joined']:>10}{e['unjoinable']:>9}"
                     f"{e['quarantined']:>7}{e['duplicates_prevented']:>12}"
                     f"{lat.get('p50', 0):>9.1f}{lat.get('p90', 0):>9.1f}")
    t = summary["total"]
    lines.append(f"joined lines in output: {t['joined_output_lines']}; still waiting for retry: "
                 f"{t['retry_queue']}; quarantined bad records: {t['quarantined']}")
    return "\n".join(lines)


def dumps(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)
