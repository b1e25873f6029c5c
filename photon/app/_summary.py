"""The run summary: what each region's dispatcher read and resolved, quarantined records, latencies, and the
clicks lost.

*Already registered* (``already_registered``) counts events the dispatcher resolved because the registry
already held their id (its lookup found it, or a joiner's commit did: those joins are *wasted*). That is all
the dispatcher can know: it is not a count of prevented duplicates, since a registered id need not be in any
output (its joiner died between commit and write, its write failed, a commit whose outcome stayed unknown
took it, or a stopping joiner could record it nowhere).

*Joined* (``joined``) counts the region's joined output as the output contract has it (published files and
the committed lines of open ones, both tables): every click this region's joiners joined, in this run and
before it. ``joined_answered`` is the dispatcher's own count, the clicks it saw answered JOINED: fewer after
a run stopped by a signal (the dispatcher stops first; the joiners finish the requests it had out, and their
lines are output it never heard of, shown as *already registered* when the next run reads them again), or
after a crash between a joiner's commit and the dispatcher's checkpoint.

*Lost*: in a run's summary (``since_us`` given), the clicks lost in that run (``lost_in_run``). When the run
caught up (``--until-caught-up``) the launcher reconciled the registry with the output
(:mod:`photon.app._reconcile`): ids this run's joiners registered that are in no region's output. Without a
reconciliation (stopped, timed out, or the export failed): the ids its lost-ids ledgers recorded during the
run and found in no pipeline region's joined output readable here (recovery may have joined them since) plus the joiners' ``unrecorded_ids`` (registered ids a stopping joiner could neither write nor put into
its ledger). Either way, a region's unrecorded ids are never shown as less. Outside a run (``photon
status``): the distinct ids of the lost-ids ledgers (*lost, awaiting recovery*, :func:`joiner.read_lost`;
the ledger is never edited, so the count stays after a recovery job re-joined them) plus unrecorded ids.
"""
from __future__ import annotations

import json
from pathlib import Path

import orjson

import dispatcher
import joiner
from photon import LatencyHistogram, PhotonConfig

COUNTERS = ("events_read", "joined", "already_registered", "wasted_joins", "unjoinable", "lost",
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


def unrecorded_ids(region, since_us: int = 0) -> int:
    """The ``unrecorded_ids`` of a region's joiner status files written at or after ``since_us``."""
    return sum(int(st.get("unrecorded_ids", 0)) for st in joiner.read_status(region.state_dir).values()
               if int(st.get("written_at_us", 0)) >= since_us)


def _lost_in_run(region, since_us: int, unrecorded: int, reconciliation, not_in_output) -> int:
    if reconciliation is not None and not reconciliation.error:
        return max(reconciliation.lost_by_region.get(region.name, 0), unrecorded)
    return len(not_in_output(lost_ids(region, since_us))) + unrecorded


def _not_in_output(config: PhotonConfig):
    """``f(ids) -> the ids of ``ids`` in no pipeline region's joined output readable here``: a ledger id
    that recovery (or another joiner) has joined since is not lost. The output is read once, and only when
    some ledger id asks."""
    seen = []

    def not_in_output(ids: set[str]) -> set[str]:
        if not ids:
            return ids
        if not seen:
            from photon.app._reconcile import output_ids
            seen.append(output_ids(config)[0])
        import pyarrow as pa
        import pyarrow.compute as pc
        asked = pa.array(sorted(ids), pa.string())
        found = pc.is_in(asked, value_set=seen[0].combine_chunks() if seen[0].num_chunks else pa.array([], pa.string()))
        return {i for i, f in zip(asked.to_pylist(), found.to_pylist()) if not f}
    return not_in_output


def build_summary(config: PhotonConfig, elapsed_s: float, regions=None, *, since_us: int | None = None,
                  reconciliation=None) -> dict:
    """Per pipeline region (all, or ``regions``) and in total: ``joined``, the clicks in the region's joined
    output (``joined_output_lines`` too; the dispatcher's JOINED answers: ``joined_answered``; see the module
    docstring), the dispatcher's counters (``already_registered``,
    ``wasted_joins``: events that reached a joiner whose commit found the id registered, almost always by
    another region first), quarantined records, joined output lines, join latency, the lost-ids ledgers
    (``lost_awaiting_recovery``) and ``unrecorded_ids``. For a run (``since_us``: when it started) also
    ``lost_in_run`` (see the module docstring) and, given a :class:`~photon.app._reconcile.Reconciliation`,
    its figures under ``"reconciliation"``."""
    out = {"elapsed_s": round(elapsed_s, 2), "regions": {}}
    extra = ["joined_answered", "quarantined", "joined_output_lines", "lost_awaiting_recovery", "unrecorded_ids"]
    if since_us is not None:
        extra.append("lost_in_run")
    totals = dict.fromkeys([*COUNTERS, *extra], 0)
    hists: list[LatencyHistogram] = []
    not_in_output = _not_in_output(config)
    for region in config.pipeline_regions_of(regions):
        status = dispatcher.read_status(region.state_dir) or {}
        entry = {k: int(status.get(k, 0)) for k in COUNTERS}
        entry["joined_answered"] = entry["joined"]
        entry["quarantined"] = count_quarantined(region)
        entry["joined_output_lines"] = entry["joined"] = region.output_reader("joined", config.s3).count()
        entry["lost_awaiting_recovery"] = len(lost_ids(region))
        entry["unrecorded_ids"] = unrecorded_ids(region, since_us or 0)
        if since_us is not None:
            entry["lost_in_run"] = _lost_in_run(region, since_us, entry["unrecorded_ids"], reconciliation,
                                                not_in_output)
        hist = LatencyHistogram.from_json(status.get("join_latency_hist"))
        hists.append(hist)
        # every join of the run (the dispatcher's mergeable histogram); an older status: its recent joins
        entry["join_latency_ms"] = hist.percentiles_ms() or status.get("join_latency_ms", {})
        out["regions"][region.name] = entry
        for k in totals:
            totals[k] += entry[k]
    out["total"] = totals
    if reconciliation is not None:
        out["reconciliation"] = reconciliation.as_dict()
    merged = LatencyHistogram()
    for hist in hists:
        merged.merge(hist)
    if merged.total:      # over all regions' joins of the whole run, not the max of the regions' figures
        out["total"]["join_latency_ms"] = merged.percentiles_ms()
    return out


def lost_shown(entry: dict) -> int:
    """The summary's *lost* column: the run's lost clicks, or outside a run the ledgers' plus unrecorded."""
    if "lost_in_run" in entry:
        return entry["lost_in_run"]
    return entry["lost_awaiting_recovery"] + entry.get("unrecorded_ids", 0)


def format_summary(summary: dict) -> str:
    lines = [f"Photon run summary ({summary['elapsed_s']} s)"]
    header = f"{'region':<8}{'read':>10}{'joined':>10}{'unjoin.':>9}{'bad':>7}{'already reg.':>14}{'wasted':>8}" \
             f"{'lost':>7}{'p50 ms':>9}{'p90 ms':>9}"
    lines.append(header)
    rows = list(summary["regions"].items())
    if len(rows) > 1:
        rows.append(("total", summary["total"]))
    for name, e in rows:
        lat = e.get("join_latency_ms") or {}
        lines.append(f"{name:<8}{e['events_read']:>10}{e['joined']:>10}{e['unjoinable']:>9}"
                     f"{e['quarantined']:>7}{e['already_registered']:>14}{e.get('wasted_joins', 0):>8}"
                     f"{lost_shown(e):>7}"
                     f"{lat.get('p50', 0):>9.1f}{lat.get('p90', 0):>9.1f}")
    t = summary["total"]
    lines.append(f"joined lines in output: {t['joined_output_lines']}; still waiting for retry: "
                 f"{t['retry_queue']}; quarantined bad records: {t['quarantined']}")
    rec = summary.get("reconciliation")
    if rec and rec.get("error"):
        lines.append(f"not reconciled with the output ({rec['error']}): lost counts the ids the lost-ids "
                     f"ledgers recorded in this run and the unrecorded ids only")
    elif rec:
        line = (f"reconciled with the output: {rec['registered']} id(s) registered by this run's joiners, "
                f"{rec['lost']} of them in no region's output")
        if rec["lost"]:
            line += (f": LOST (e.g. {' '.join(rec['lost_sample'][:3])}; all in {rec['lost_file']}); "
                     f"`photon verify` finds them and `photon recover` re-joins them")
        lines.append(line)
    if t.get("unrecorded_ids"):
        lines.append(f"unrecorded: {t['unrecorded_ids']} registered id(s) neither written nor in a lost-ids ledger "
                     f"(a joiner stopped while its output and its ledger failed; its log names them): lost")
    if t["lost_awaiting_recovery"]:
        # the ledgers are never edited: after a recovery re-joined them the ids stay, so this says what they
        # hold and who tells whether any is still missing, not that all of them still are
        lines.append(f"lost-ids ledgers: {t['lost_awaiting_recovery']} click(s) (registered, output write failed "
                     f"or commit outcome unknown; ids in <state_dir>/lost/*.jsonl; kept after a recovery): "
                     f"`photon verify` reports those still missing from the output, `photon recover` re-joins "
                     f"them")
    if t.get("lost_in_run"):
        lines.append(f"lost in this run: {t['lost_in_run']} click(s)")
    return "\n".join(lines)


def dumps(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)
