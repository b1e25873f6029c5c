"""The run summary: what each region's dispatcher read and resolved, quarantined records, latencies, and the
clicks lost awaiting recovery.

*Lost, awaiting recovery* counts the distinct ids of a region's lost-ids ledgers (:func:`joiner.read_lost`):
registered by a joiner whose output write then failed (the joiner answers LOST for them, which the
dispatcher counts as ``lost``, never among ``already_registered``), and the candidates of commits whose
outcome stayed unknown (answered THROTTLED and retried: one the registry had taken comes back as a prevented
duplicate too; the verification job tells which are really lost). The ledger is never edited, so the count
stays after a recovery job has re-joined them (the verification job tells which are in the output by now)."""
from __future__ import annotations

import json
from pathlib import Path

import orjson

import dispatcher
import joiner
from photon import LatencyHistogram, PhotonConfig, read_object_lines
from photon._output import count_output_lines

COUNTERS = ("events_read", "joined", "wasted_joins", "already_registered", "unjoinable", "lost",
            "bad_records", "retry_queue", "in_flight")


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


def lost_ids(region, since_us: int = 0) -> set[str]:
    """The distinct ids of a region's lost-ids ledgers recorded at or after ``since_us``."""
    return {e["id"] for e in joiner.read_lost(region.state_dir) if int(e.get("at_us", 0)) >= since_us}


def build_summary(config: PhotonConfig, elapsed_s: float, regions=None) -> dict:
    """Per pipeline region (all, or ``regions``) and in total: the dispatcher's counters, quarantined
    records, joined output lines, join latency, and ``wasted_joins``: events that reached a joiner which
    found them already joined (almost always by another region first; also a click logged twice in one
    region, or retried after its first joiner died, when the lookup did not catch it)."""
    out = {"elapsed_s": round(elapsed_s, 2), "regions": {}}
    totals = dict.fromkeys(COUNTERS, 0)
    totals["quarantined"] = 0
    totals["joined_output_lines"] = 0
    totals["lost_awaiting_recovery"] = 0
    totals["wasted_joins"] = 0
    hists: list[LatencyHistogram] = []
    for region in config.pipeline_regions_of(regions):
        status = dispatcher.read_status(region.state_dir) or {}
        entry = {k: int(status.get(k, 0)) for k in COUNTERS}
        entry["quarantined"] = count_quarantined(region)
        entry["joined_output_lines"] = (len(read_object_lines(region.output_url("joined"), config.s3))
                                        if region.output_on_s3 else count_output_lines(region.joined_dir))
        entry["lost_awaiting_recovery"] = len(lost_ids(region))
        entry["wasted_joins"] = entry["wasted_joins"]
        hist = LatencyHistogram.from_json(status.get("join_latency_hist"))
        hists.append(hist)
        # every join of the run (the dispatcher's mergeable histogram); an older status: its recent joins
        entry["join_latency_ms"] = hist.percentiles_ms() or status.get("join_latency_ms", {})
        out["regions"][region.name] = entry
        for k in totals:
            totals[k] += entry[k]
    out["total"] = totals
    merged = LatencyHistogram()
    for hist in hists:
        merged.merge(hist)
    if merged.total:      # over all regions' joins of the whole run, not the max of the regions' figures
        out["total"]["join_latency_ms"] = merged.percentiles_ms()
    return out


def format_summary(summary: dict) -> str:
    lines = [f"Photon run summary ({summary['elapsed_s']} s)"]
    header = f"{'region':<8}{'read':>10}{'joined':>10}{'unjoin.':>9}{'bad':>7}{'dups prev.':>12}{'wasted':>8}" \
             f"{'lost':>7}{'p50 ms':>9}{'p90 ms':>9}"
    lines.append(header)
    rows = list(summary["regions"].items())
    if len(rows) > 1:
        rows.append(("total", summary["total"]))
    for name, e in rows:
        lat = e.get("join_latency_ms") or {}
        lines.append(f"{name:<8}{e['events_read']:>10}{e['joined']:>10}{e['unjoinable']:>9}"
                     f"{e['quarantined']:>7}{e['already_registered']:>12}{e.get('wasted_joins', 0):>8}"
                     f"{e['lost_awaiting_recovery']:>7}"
                     f"{lat.get('p50', 0):>9.1f}{lat.get('p90', 0):>9.1f}")
    t = summary["total"]
    lines.append(f"joined lines in output: {t['joined_output_lines']}; still waiting for retry: "
                 f"{t['retry_queue']}; quarantined bad records: {t['quarantined']}")
    if t["lost_awaiting_recovery"]:
        lines.append(f"lost, awaiting recovery: {t['lost_awaiting_recovery']} click(s) registered but not written "
                     f"(output write failed; ids in <state_dir>/lost/*.jsonl); run the recovery job")
    return "\n".join(lines)


def dumps(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)
