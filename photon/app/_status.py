"""``photon status``: every process of a deployment, reached over the network from any machine holding
the config, and whether the whole deployment is SERVING (the command's exit code, for probes).

Where the processes are: from the config alone when every region has a ``port_base``
(:func:`photon.app._deployment.planned_processes`), else from the ``launcher.json`` of every region whose
state dir is visible here. Each process is asked three ways, over mutual TLS when ``[tls]`` is on:

* its gRPC health service (``grpc.health.v1``, which follows the process's real state) for every process
  that serves gRPC, and its Prometheus metrics for every process (the dispatcher serves only those);
* the registry's status RPC, for each shard's leader, term and ids held (replicas of shards a reshard
  added are found there too);
* each region launcher's control endpoint (:mod:`photon.app._control`) when the config authenticates
  it, for a region taken down on purpose, pids and the lost-ids ledger; else the region's state dir
  when it is on this machine.

A process is healthy when it answers SERVING (its health, or for the dispatcher its metrics with
``photon_serving`` not 0); :func:`Status.ok` is true only when every process is.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import idregistry
from photon import PhotonConfig, histogram_quantile, lock_holder, scrape
from photon.app._deployment import addresses_from_config, planned_processes
from photon.app._regions import LAUNCHER_FILE, LOCK_FILE
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


def _targets(config: PhotonConfig) -> tuple[list[dict], str]:
    """Every process to ask (``name, region, role, address, metrics, pid``) and where the list came from."""
    specs = planned_processes(config)
    if specs is not None:
        return [{"name": s.name, "region": s.region, "role": s.role, "address": s.address,
                 "metrics_address": s.metrics_address, "pid": None} for s in specs], "config"
    rows = []
    for state in _launcher_states(config):
        for name, p in sorted(state["processes"].items()):
            rows.append({"name": name, "region": p.get("region", ""), "role": p.get("role", ""),
                         "address": p.get("address", ""), "metrics_address": p.get("metrics", ""),
                         "pid": p.get("pid")})
    return rows, "launcher.json"


def health_check(address: str, timeout_s: float) -> tuple[str, str]:
    """``(status, error)`` of the standard gRPC health check of ``address`` (over mutual TLS when this
    process has ``[tls]`` files): ``("SERVING", "")``, ``("NOT_SERVING", "")``, or ``("", why)`` when it
    did not answer."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from photon.rpc import open_channel
    try:
        channel = open_channel(address, [])
    except OSError as e:
        return "", str(e)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), ""
    except grpc.RpcError as e:
        return "", f"{e.code().name}: {e.details()}"
    finally:
        channel.close()


def _probe(row: dict, timeout_s: float) -> dict:
    metrics = scrape(row["metrics_address"], timeout_s) if row["metrics_address"] else None
    health, error = health_check(row["address"], timeout_s) if row["address"] else ("", "")
    row = {**row, "metrics": metrics or {}, "up": metrics is not None or health != "", "health": health}
    if row["address"]:
        serving = health == "SERVING"
        why = "" if serving else (f"health NOT_SERVING at {row['address']}" if health else
                                  f"not answering at {row['address']} ({error})")
    else:
        serving = metrics is not None and metrics.get("photon_serving", 1.0) != 0
        why = "" if serving else (f"metrics at {row['metrics_address']} not answering" if metrics is None
                                  else "NOT_SERVING (metrics)")
    if row["pid"] is None and metrics:
        pid = next((v for k, v in metrics.items() if k.startswith("photon_") and k.endswith("_pid")), None)
        row["pid"] = int(pid) if pid else None
    return {**row, "serving": serving, "why": why}


def _registry_rows(config: PhotonConfig, rows: list[dict], timeout_s: float) -> tuple[list[dict], str]:
    """The registry's status RPC (one dict per replica of every shard), or ``([], why)``."""
    endpoints = [r["address"] for r in rows if r["role"] == "registry" and r["address"]]
    if not endpoints:
        return [], "no registry replica is known"
    client = idregistry.RegistryClient(endpoints, retry_timeout_s=timeout_s, rpc_timeout_s=timeout_s)
    try:
        return client.status(), ""
    except Exception as e:  # noqa: BLE001  (no replica answers: said in the status)
        return [], f"{type(e).__name__}: {e}"
    finally:
        client.close()


def _launchers(config: PhotonConfig, timeout_s: float) -> dict[str, dict]:
    """Per region, what its launcher says (``{"source": "control" | "local" | "", "down", "lost",
    "unrecorded", "processes", "error"}``): over its control endpoint when the config authenticates it,
    else from the region's state dir when it is on this machine."""
    from photon.app._control import ControlError, auth_kind, region_status_remote
    out = {}
    local = {}
    for state in _launcher_states(config):
        for name in {p.get("region") for p in state["processes"].values()}:
            local[name] = state
    remote = auth_kind(config)

    def one(region) -> tuple[str, dict]:
        info = {"source": "", "down": False, "lost": None, "unrecorded": None, "processes": {}, "error": ""}
        if region.port_base and remote:
            try:
                answer = region_status_remote(config, region, timeout_s)["regions"].get(region.name, {})
                return region.name, {**info, **answer, "source": "control"}
            except ControlError as e:
                info["error"] = str(e)
        if Path(region.state_dir).is_dir():
            state = local.get(region.name, {})
            info.update(source="local", down=region.name in state.get("down_regions", []),
                        lost=0 if region.registry_only else len(lost_ids(region)),
                        unrecorded=0 if region.registry_only else unrecorded_ids(region),
                        processes={n: p for n, p in state.get("processes", {}).items() if p.get("region") == region.name},
                        visible=(Path(region.state_dir) / LAUNCHER_FILE).exists(),
                        held_by=_holder(Path(region.state_dir) / LOCK_FILE))
        return region.name, info

    with ThreadPoolExecutor(max_workers=max(1, len(config.regions))) as pool:
        out = dict(pool.map(one, config.regions))
    for name, info in out.items():
        info.setdefault("visible", (Path(config.region(name).state_dir) / LAUNCHER_FILE).exists())
    return out


def _holder(lock: Path) -> str:
    """Who holds a region's launcher lock here (``photon run (pid 7)``), or ""."""
    held = lock_holder(lock)
    return held.describe() if held is not None else ""


def collect(config: PhotonConfig, timeout_s: float = 1.0) -> dict:
    """One sample of the deployment: ``{"processes": [row...], "registry": [...], "launchers": {...},
    "source", "at"}``; a row has region, name, role, address, pid, up, serving, why and its metrics."""
    targets, source = _targets(config)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        rows = list(pool.map(lambda r: _probe(r, timeout_s), targets))
    registry, registry_error = _registry_rows(config, rows, max(timeout_s, 2.0))
    known = {r["address"] for r in rows}
    extra = [{"name": f"registry-s{r['shard']}-r{r['replica']}", "region": r.get("region", ""), "role": "registry",
              "address": r["address"], "metrics_address": "", "pid": r.get("pid")}
             for r in registry if r.get("address") and r["address"] not in known]
    rows += [_probe(r, timeout_s) for r in extra]            # replicas of shards a reshard added
    launchers = _launchers(config, timeout_s)
    for row in rows:
        launcher = launchers.get(row["region"], {})
        pid = (launcher.get("processes", {}).get(row["name"]) or {}).get("pid")
        if pid:
            row["pid"] = pid
        if launcher.get("down") and not row["serving"]:
            row["why"] = "region taken down (photon region down)"
    return {"processes": rows, "registry": registry, "registry_error": registry_error, "launchers": launchers,
            "source": source, "at": time.monotonic()}


def _rate(now: dict, before: dict | None, key: str, dt: float) -> float | None:
    if before is None or dt <= 0 or not before.get("up") or key not in now["metrics"]:
        return None
    return max(0.0, now["metrics"][key] - before["metrics"].get(key, 0.0)) / dt


def _join_latency_ms(m: dict, before: dict | None, q: float) -> float | None:
    """The join latency quantile from the dispatcher's histogram: over the joins since ``before`` (the
    previous refresh) when there were any, else over the whole run."""
    name = "photon_dispatcher_join_latency_seconds"
    value = histogram_quantile(m, name, q, before) if before else None
    if value is None:
        value = histogram_quantile(m, name, q)
    return None if value is None else value * 1000


@dataclass
class Status:
    """``photon status`` as data: :meth:`as_dict` is what ``--json`` prints; :attr:`ok` its exit code."""
    regions: dict = field(default_factory=dict)
    processes: list = field(default_factory=list)
    registry: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    leaders: dict = field(default_factory=dict)     # {shard: {"address", "region", "term"}}
    source: str = ""
    headline: str = ""     # when nothing runs (no process answers, no launcher reached or holding a region here)

    @property
    def nothing_runs(self) -> bool:
        return bool(self.headline)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"ok": self.ok, "problems": self.problems, "source": self.source, "regions": self.regions,
                "leaders": self.leaders, "processes": self.processes, "registry": self.registry,
                "nothing_runs": self.nothing_runs}


def _headline(config: PhotonConfig, now: dict, judged: list, only: list | None) -> str:
    """``nothing runs: ...`` when none of the judged processes answers and no launcher of theirs is reached
    over its control endpoint, holds its region's lock here or has taken its region down; else ""."""
    launchers = [now["launchers"].get(r) or {} for r in (only or [r.name for r in config.regions])]
    if not judged or any(r["up"] for r in judged) or any(
            info.get("source") == "control" or info.get("held_by") or info.get("down") for info in launchers):
        return ""
    of = "this config" if only is None else f"region(s) {', '.join(only)}"
    return (f"nothing runs: none of the {len(judged)} processes of {of} answers, and no launcher is reached or "
            f"holds a region on this machine (photon run starts them); each one's reason follows")


def summarize(config: PhotonConfig, now: dict, before: dict | None = None, only: list | None = None) -> Status:
    """Per region: state, leader(s), lag, rates, lost-ids ledger; and every reason the deployment (or, with
    ``only``, those regions' processes) is not wholly SERVING."""
    dt = now["at"] - before["at"] if before else 0.0
    prev = {r["name"]: r for r in before["processes"]} if before else {}
    problems, regions, processes = [], {}, []
    judged = [r for r in now["processes"] if only is None or r["region"] in only]
    for row in judged:
        if not row["serving"]:
            problems.append(f"{row['name']} (region {row['region']}): {row['why']}")
    if not judged:
        problems.append("no process of the config can be located: no port_base in every region and no "
                        "launcher.json on this machine" if only is None else f"no process of region(s) {only} is known")
    leaders, region_of = {}, {r["address"]: r["region"] for r in now["processes"] if r["address"]}
    for r in now["registry"]:
        if r.get("is_leader"):
            leaders[r["shard"]] = {"address": r["address"], "region": region_of.get(r["address"], ""),
                                   "term": r.get("term")}
    for shard in sorted({r["shard"] for r in now["registry"]} - set(leaders)):
        problems.append(f"registry shard {shard}: no leader")
    if now.get("registry_error") and only is None:
        problems.append(f"registry status: {now['registry_error']}")
    for region in config.regions:
        mine = [r for r in now["processes"] if r["region"] == region.name]
        launcher = now["launchers"].get(region.name, {})
        serving = sum(r["serving"] for r in mine)
        state = ("down (photon region down)" if launcher.get("down") else "up" if mine and serving == len(mine)
                 else "DOWN" if not serving else "DEGRADED")
        info = {"state": state, "serving": serving, "processes": len(mine), "launcher": launcher.get("source", ""),
                "launcher_error": launcher.get("error", ""), "visible_here": bool(launcher.get("visible")),
                "lost": launcher.get("lost"), "unrecorded": launcher.get("unrecorded"),
                "leader_of_shards": sorted(s for s, lead in leaders.items() if lead["region"] == region.name)}
        dispatchers = [r for r in mine if r["role"] == "dispatcher" and r["up"]]
        if dispatchers:
            d = dispatchers[0]
            m = d["metrics"]
            earlier = prev.get(d["name"])
            info.update(lag_bytes=m.get("photon_dispatcher_pending_bytes", 0.0),
                        retry_queue=m.get("photon_dispatcher_retry_queue", 0.0),
                        events_read=m.get("photon_dispatcher_events_read_total", 0.0),
                        joined=m.get("photon_dispatcher_joined_total", 0.0),
                        wasted_joins=m.get("photon_dispatcher_wasted_joins_total", 0.0),
                        events_per_s=_rate(d, earlier, "photon_dispatcher_events_read_total", dt),
                        joined_per_s=_rate(d, earlier, "photon_dispatcher_joined_total", dt),
                        join_p50_ms=_join_latency_ms(m, earlier["metrics"] if earlier and earlier["up"] else None, 0.5))
        regions[region.name] = info
    for row in now["processes"]:
        processes.append({k: row[k] for k in ("name", "region", "role", "address", "metrics_address", "pid", "up",
                                              "serving", "health", "why")})
    return Status(regions=regions, processes=processes, registry=now["registry"], problems=problems,
                  leaders={str(s): lead for s, lead in sorted(leaders.items())}, source=now["source"],
                  headline=_headline(config, now, judged, only))


def _fig(row: dict, before: dict | None, dt: float) -> str:
    m, role = row["metrics"], row["role"]
    if not row["up"]:
        return row.get("why", "")
    serving = "" if m.get("photon_serving", 1.0) and row.get("health", "SERVING") in ("SERVING", "") \
        else "NOT SERVING  "
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


def _region_line(name: str, info: dict) -> str:
    where = ("launched here" if info["visible_here"] else
             "reached over the network" if info["launcher"] == "control" or info["serving"] else "not launched here")
    lost = "?" if info["lost"] is None else info["lost"]
    parts = [f"region {name}: {where}, {info['state']} ({info['serving']}/{info['processes']} serving)"]
    if info["leader_of_shards"]:
        parts.append(f"registry leader of shard(s) {', '.join(map(str, info['leader_of_shards']))}")
    if "lag_bytes" in info:
        rate = "-" if info.get("joined_per_s") is None else f"{info['joined_per_s']:.0f}"
        parts.append(f"lag {info['lag_bytes'] / 2**20:.1f} MB, joined/s {rate}")
    parts.append(f"lost awaiting recovery: {lost}")
    if info.get("unrecorded"):
        parts.append(f"UNRECORDED (lost, in no ledger): {info['unrecorded']}")
    return "; ".join(parts)


def format_status(config: PhotonConfig, now: dict, before: dict | None = None) -> str:
    status = summarize(config, now, before)
    dt = now["at"] - before["at"] if before else 0.0
    prev = {r["name"]: r for r in before["processes"]} if before else {}
    lines = [status.headline] if status.headline else []
    for name, info in status.regions.items():
        lines.append(_region_line(name, info))
        for row in (x for x in now["processes"] if x["region"] == name):
            lines.append(f"  {row['name']:<18} {'up' if row['up'] else 'DOWN':<5} pid {row['pid']!s:<8} "
                         f"{_fig(row, prev.get(row['name']), dt)}")
    lines.append("deployment: SERVING" if status.ok else
                 "deployment: NOT SERVING: " + "; ".join(status.problems))
    return "\n".join(lines)


def sample(config: PhotonConfig, interval_s: float = 1.0, timeout_s: float = 1.0) -> tuple[dict, dict | None]:
    """``(now, before)``: two samples ``interval_s`` apart (rates need two), or one when it is 0."""
    before = collect(config, timeout_s) if interval_s > 0 else None
    if before is not None:
        time.sleep(interval_s)               # the rates' measuring interval, not a wait for a condition
    return collect(config, timeout_s), before


def watch(config: PhotonConfig, every_s: float = 2.0, rounds: int | None = None, out=print) -> None:
    """Refresh the status in place every ``every_s`` (``rounds`` times, or until interrupted)."""
    before = collect(config)
    n = 0
    while rounds is None or n < rounds:
        time.sleep(every_s)
        now = collect(config)
        out("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + "photon status\n" + format_status(config, now, before))
        before, n = now, n + 1


__all__ = ["Status", "addresses_from_config", "collect", "format_status", "health_check", "sample", "summarize",
           "watch"]
