"""What the slow commits of a traced ``bench.registry`` phase waited for.

    python -m bench.registry_tail DIR [--slow-ms 15] [--json]

Reads the timing records ``idregistry/_trace.py`` left in ``DIR`` (``python -m bench.registry --trace DIR``),
and for every client commit of the phase at least ``--slow-ms`` long:

* splits its time at the leader's records of the same request (named by its first id): reaching the
  leader's handler (``to_leader``), waiting in the batcher for a free slot (``queued``), replication until a
  majority had it on disk and it was applied, itself split at the acknowledgement that made the majority
  (the last one a follower sent before the leader applied the command) into reaching that follower's
  journal (``to_follower``), that follower's fsync and its Raft thread's wake-up (``follower_fsync_and_wake``)
  and the acknowledgement's way to the leader's apply (``ack_to_applied``), the leader's own fsync after that
  (``leader_fsync``), waking the handler (``wake``), and the answer's way back (``back``); the longest part
  is counted in ``longest_part``;
* lists what every process recorded during it (Raft-thread ticks at least 2 ms outside the poller, with
  whether the thread ran, waited for a core or for the GIL; fsyncs; applies; snapshots, compactions, the
  commit-index record; collections of the cyclic collector; followers' acknowledgements that waited for
  their fsync), each counted once per slow commit it overlapped (``seen``) and the one that overlapped it
  longest counted in ``main_cause`` (acknowledgements left out: their wait is a part above, not a cause;
  ``none`` when nothing of 2 ms or more did);
* counts (``host``) the slow commits during which the host's CPU pressure (some task waiting for a core,
  ``/proc/pressure/cpu``) covered at least half the commit, and those whose client thread or leader's
  handler thread waited 2 ms or more on a run queue.
"""
from __future__ import annotations

import argparse
import bisect
import json
from collections import Counter
from pathlib import Path

from bench._common import percentile

EVENT_MS = {"fsync": 4.0, "ack": 5.0, "gc": 1.0, "apply": 2.0, "tick": 2.0,
            "freeze": 0.0, "snapshot": 0.0, "compact": 0.0, "meta": 2.0, "fsync_path": 2.0}
"""An event is listed against a slow commit when it lasted at least this long (ms)."""


def _load(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    row["proc"] = path.stem
                    rows.append(row)
    return rows


def _label(row: dict, roles: dict[str, str]) -> str:
    who = roles.get(row["proc"], row["role"])
    kind = row["kind"]
    if kind == "tick":
        busy = row["busy_ms"]
        if row["runq_ms"] >= 0.5 * busy:
            what = "raft thread waiting for a core"
        elif row["cpu_ms"] >= 0.5 * busy:
            what = "raft thread running"
        else:
            what = "raft thread waiting (GIL or a blocking call)"
        return f"{what} ({who})"
    if kind == "gc":
        return f"gc gen {row.get('gen')} ({who})"
    if kind == "ack":
        return f"ack waiting for its fsync ({who})"
    return f"{kind} ({who})"


def attribute(folder, began: float, ended: float, slow_ms: float = 15.0, settle_s: float = 1.2) -> dict:
    """The summary of the commits that began in [began, ended) (host monotonic seconds)."""
    import time
    time.sleep(settle_s)        # every process appends its records every half second
    rows = _load(Path(folder))
    return summarise(rows, began, ended, slow_ms)


def summarise(rows: list[dict], began: float, ended: float, slow_ms: float) -> dict:
    commits = [r for r in rows if r["kind"] == "commit" and began <= r["t0"] < ended]
    requests = {r["first"]: r for r in rows if r["kind"] == "request" and r.get("first")}
    commands = {}
    for r in rows:
        if r["kind"] == "command":
            for first in r["firsts"]:
                if first:
                    commands[first] = r
    leader = next((r["proc"] for r in rows if r["kind"] == "command"), None)
    roles = {}
    for r in rows:
        if r["proc"] not in roles:
            roles[r["proc"]] = ("leader" if r["proc"] == leader else
                                "follower" if r["role"].startswith("replica") else "client")
    events = sorted((r for r in rows if r["kind"] in EVENT_MS and r["t1"] - r["t0"] >= EVENT_MS[r["kind"]] / 1000
                     and r["t1"] >= began - 0.1 and r["t0"] < ended + 0.1), key=lambda r: r["t0"])
    acks = sorted((r for r in rows if r["kind"] == "ack"), key=lambda r: r["t1"])
    ack_ends = [r["t1"] for r in acks]
    lat = [1000 * (c["t1"] - c["t0"]) for c in commits]
    slow = sorted((c for c in commits if 1000 * (c["t1"] - c["t0"]) >= slow_ms), key=lambda c: c["t0"])
    parts, seen, main, host, matched = Counter(), Counter(), Counter(), Counter(), 0
    part_ms: dict[str, list[float]] = {}
    examples = []
    for c in slow:
        t0, t1 = c["t0"], c["t1"]
        split = {}
        req, cmd = requests.get(c["first"]), commands.get(c["first"])
        if req is not None and cmd is not None:
            matched += 1
            split = {"to_leader": req["t0"] - t0, "queued": cmd["t0"] - req["t0"],
                     "replicate": cmd["applied"] - cmd["t0"], "leader_fsync": cmd["t1"] - cmd["applied"],
                     "wake": req["t1"] - cmd["t1"], "back": t1 - req["t1"]}
            # the acknowledgement that made the majority: the last one a follower sent before the leader applied
            k = bisect.bisect_right(ack_ends, cmd["applied"]) - 1
            if k >= 0 and acks[k]["t1"] >= cmd["t0"]:
                ack = acks[k]
                split.update(to_follower=max(0.0, ack["t0"] - cmd["t0"]),
                             follower_fsync_and_wake=ack["t1"] - max(ack["t0"], cmd["t0"]),
                             ack_to_applied=cmd["applied"] - ack["t1"])
                del split["replicate"]
            split = {k: round(1000 * v, 2) for k, v in split.items()}
            parts[max(split, key=split.get)] += 1
            for k, v in split.items():
                part_ms.setdefault(k, []).append(v)
        over: dict[str, float] = {}
        for e in events:
            if e["t0"] > t1:
                break
            overlap = min(t1, e["t1"]) - max(t0, e["t0"])
            if overlap > 0:
                label = _label(e, roles)
                over[label] = max(over.get(label, 0.0), 1000 * overlap)
        for label in over:
            seen[label] += 1
        big = {k: v for k, v in over.items() if v >= 2.0 and not k.startswith("ack ")}
        main[max(big, key=big.get) if big else "none"] += 1
        ms = 1000 * (t1 - t0)
        if c.get("pressure_ms") is not None:
            host[("host cpu pressure >= half the commit" if c["pressure_ms"] >= 0.5 * ms else
                  "host cpu pressure < half the commit")] += 1
            if c.get("runq_ms", 0) >= 2.0:
                host["client thread waited >= 2 ms for a core"] += 1
        if req is not None and req.get("runq_ms", 0) >= 2.0:
            host["leader handler waited >= 2 ms for a core"] += 1
        if len(examples) < 12:
            examples.append({"ms": round(1000 * (t1 - t0), 2), "pressure_ms": c.get("pressure_ms"),
                             "client_runq_ms": c.get("runq_ms"), "handler_runq_ms": req and req.get("runq_ms"), "at_s": round(t0 - began, 3), "parts": split,
                             "overlaps": {k: round(v, 2) for k, v in sorted(over.items(), key=lambda kv: -kv[1])[:6]}})
    try:
        with open("/proc/loadavg") as f:
            load = f.read().split()[0]
    except OSError:
        load = "?"
    return {"commits": len(commits), "p99_ms": round(percentile(lat, 99), 2) if lat else None,
            "slow_ms": slow_ms, "slow": len(slow), "matched_at_leader": matched,
            "longest_part": dict(parts.most_common()),
            "part_ms_mean": {k: round(sum(v) / len(v), 2) for k, v in part_ms.items()},
            "main_cause": dict(main.most_common()), "host": dict(host.most_common()), "seen": dict(seen.most_common(20)),
            "examples": examples, "load_at_end": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.registry_tail", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--slow-ms", type=float, default=15.0)
    parser.add_argument("--began", type=float, default=0.0)
    parser.add_argument("--ended", type=float, default=float("inf"))
    args = parser.parse_args(argv)
    rows = _load(Path(args.folder))
    print(json.dumps(summarise(rows, args.began, args.ended, args.slow_ms), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
