"""``photon status``: per region and component, up or down and what it is doing, read from the
Prometheus metrics every process serves (addresses from the ``launcher.json`` of every region whose
state dir is visible here), plus each region's run summary counters and lost-ids ledger and unrecorded ids."""
from __future__ import annotations

import json
import time
from pathlib import Path

from photon import PhotonConfig, histogram_quantile, scrape
from photon.app._regions import LAUNCHER_FILE
from photon.app._summary import lost_ids, unrecorded_ids


def _launcher_states(config: PhotonConfig) -> list[dict]:
    seen, out = set(), []
    for region in config.regions:
        path = Path(region.state_dir) / LAUNCHER_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if state.get("launcher_pid") not in seen:
            seen.add(state.get("launcher_pid"))
            out.append(state)
    return out


def collect(config: PhotonConfig) -> dict:
    """``{"processes": [row...], "regions": {name: {...}}, "at": t}``; a row has region, name, role, up
    and the figures of its role."""
    rows, down_regions = [], set()
    for state in _launcher_states(config):
        down_regions |= set(state.get("down_regions", []))
        for name, p in sorted(state["processes"].items()):
            m = scrape(p["metrics"]) if p.get("metrics") else None
            row = {"region": p.get("region", ""), "name": name, "role": p.get("role", ""), "pid": p.get("pid"),
                   "up": m is not None, "metrics": m or {}}
            rows.append(row)
    regions = {r.name: {"visible": (Path(r.state_dir) / LAUNCHER_FILE).exists(), "down": r.name in down_regions,
                        "lost": len(lost_ids(r)) if not r.registry_only else 0,
                        "unrecorded": unrecorded_ids(r) if not r.registry_only else 0}
               for r in config.regions}
    return {"processes": rows, "regions": regions, "at": time.monotonic()}


def _join_latency_ms(m: dict, before: dict | None, q: float) -> float | None:
    """The join latency quantile from the dispatcher's histogram: over the joins since ``before`` (the
    previous refresh) when there were any, else over the whole run."""
    name = "photon_dispatcher_join_latency_seconds"
    value = histogram_quantile(m, name, q, before) if before else None
    if value is None:
        value = histogram_quantile(m, name, q)
    return None if value is None else value * 1000


def _fig(row: dict, before: dict | None, dt: float) -> str:
    m, role = row["metrics"], row["role"]
    if not row["up"]:
        return ""
    serving = "" if m.get("photon_serving", 1.0) else "NOT SERVING  "
    if role == "dispatcher":
        rate = ""
        earlier = before["metrics"] if before and before.get("up") else None
        if earlier is not None and dt > 0:
            rate = f"{(m.get('photon_dispatcher_events_read_total', 0) - earlier.get('photon_dispatcher_events_read_total', 0)) / dt:.0f}"
        p50, p90 = (_join_latency_ms(m, earlier, q) for q in (0.5, 0.9))
        latency = "-/-" if p50 is None else f"{p50:.0f}/{p90:.0f}"
        return (f"lag {m.get('photon_dispatcher_pending_bytes', 0) / 2**20:.1f} MB  events/s {rate or '-'}  "
                f"retry queue {m.get('photon_dispatcher_retry_queue', 0):.0f}  "
                f"join p50/p90 {latency} ms  "
                f"wasted joins {m.get('photon_dispatcher_wasted_joins_total', 0):.0f}")
    if role == "registry":
        cmds = m.get("photon_registry_commands_total", 0)
        batch = m.get("photon_registry_ids_committed_total", 0) / cmds if cmds else 0
        return (f"{serving}{'LEADER' if m.get('photon_registry_is_leader') else 'follower'}  term "
                f"{m.get('photon_registry_term', 0):.0f}  ids held {m.get('photon_registry_ids_held', 0):.0f}  "
                f"ids/command {batch:.1f}  queue {m.get('photon_registry_queued_ids', 0):.0f}")
    if role == "joiner":
        return (f"{serving}joined {m.get('photon_joiner_joined_total', 0):.0f}  "
                f"already registered {m.get('photon_joiner_already_registered_total', 0):.0f}  "
                f"in flight {m.get('photon_joiner_in_flight', 0):.0f}")
    if role == "eventstore":
        hits = m.get("photon_eventstore_hits_total", 0)
        misses = m.get("photon_eventstore_misses_total", 0)
        ratio = hits / (hits + misses) if hits + misses else 0
        return f"{serving}cache hit ratio {ratio:.2f}"
    return serving.strip()


def format_status(now: dict, before: dict | None = None) -> str:
    dt = now["at"] - before["at"] if before else 0.0
    prev = {r["name"]: r for r in before["processes"]} if before else {}
    lines = []
    for name, r in now["regions"].items():
        state = "DOWN (photon region down)" if r["down"] else ("launched here" if r["visible"] else "not launched here")
        lines.append(f"region {name}: {state}; lost awaiting recovery: {r['lost']}"
                     + (f"; UNRECORDED (lost, in no ledger): {r['unrecorded']}" if r.get("unrecorded") else ""))
        for row in (x for x in now["processes"] if x["region"] == name):
            lines.append(f"  {row['name']:<18} {'up' if row['up'] else 'DOWN':<5} pid {row['pid']!s:<8} "
                         f"{_fig(row, prev.get(row['name']), dt)}")
    return "\n".join(lines)


def watch(config: PhotonConfig, every_s: float = 2.0, rounds: int | None = None, out=print) -> None:
    """Refresh the status in place every ``every_s`` (``rounds`` times, or until interrupted)."""
    before = collect(config)
    n = 0
    while rounds is None or n < rounds:
        time.sleep(every_s)
        now = collect(config)
        out("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + "photon status\n" + format_status(now, before))
        before, n = now, n + 1
