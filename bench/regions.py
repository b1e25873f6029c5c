"""Two regions at a distance: ``python -m bench.regions [--rtts 0,30,100] [--queries N] [--json]``.

For each round trip, regions a and b run the pipeline and c hosts registry replicas only (5 replicas as
2/2/1), each region started by its own ``photon run --region`` in its own network namespace with
``tc netem`` delay on its link. Where the kernel has no netem (or namespaces are refused), every region
runs on this host's loopback and the registry's ``simulated_rtt_ms`` delays the messages between replicas
instead; the output says which (``distance``). Figures per round trip: clicks joined per second (union of
both regions, over the whole run's real time), join latency p50/p90/p99 (worst region), registry ids per
command, wasted joins, and the catch-up time of region b after an outage (b down from the start while a
joins everything, then up: the time until b's dispatcher has caught up on its whole copy).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import orjson

from bench._common import emit, stop_groups
from bench.netns import RegionNetwork, netem_refused
from photon import REGION_PORT_SPAN, load_config, read_output_lines, scrape, wait_until, write_atomic
from photon.app import GenOptions, generate


def _workload(root: Path, queries: int, hosts: dict | None, simulated_rtt_ms: float) -> Path:
    generate(GenOptions(out=str(root), queries=queries, regions=("a", "b"), unjoinable_fraction=0.0,
                        duplicate_fraction=0.0, bad_line_fraction=0.0, unjoinable_after_s=60.0, seed=11))
    path = root / "photon.toml"
    data = tomllib.loads(path.read_text())
    data["regions"].append({"name": "c", "state_dir": "state/c", "registry_only": True})
    base = 10_000 + (os.getpid() % 7) * 3 * REGION_PORT_SPAN     # below the ephemeral ports (32768 on)
    lines = [f"[{k}]\n" + "\n".join(f"{kk} = {orjson.dumps(vv).decode()}" for kk, vv in v.items())
             for k, v in data.items() if k != "regions"]
    if simulated_rtt_ms:
        lines.append(f"[registry]\nsimulated_rtt_ms = {simulated_rtt_ms}")
    for i, r in enumerate(data["regions"]):
        r["port_base"] = base + i * REGION_PORT_SPAN
        if hosts:
            r["host"] = hosts[r["name"]]
        body = "\n".join(f"{k} = {'true' if v is True else orjson.dumps(v).decode()}" for k, v in r.items())
        lines.append("[[regions]]\n" + body)
    path.write_text("\n\n".join(lines) + "\n")
    return path


def _start(config_path: Path, region: str, prefix: list, log: Path) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-m", "photon.app.cli", "run", "--config", str(config_path),
                             "--region", region], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _joined(config) -> int:
    return len({orjson.loads(x)[config.join.foreign_id_field] for r in config.pipeline_regions
                for x in read_output_lines(r.joined_dir, include_inprogress=True)})


def _duplicates(config) -> int:
    ids = [orjson.loads(x)[config.join.foreign_id_field] for r in config.pipeline_regions
           for x in read_output_lines(r.joined_dir, include_inprogress=True)]
    return len(ids) - len(set(ids))


def _status(config, region: str) -> dict:
    from dispatcher import read_status
    return read_status(config.region(region).state_dir) or {}


def _one_rtt(root: Path, rtt_ms: float, queries: int, timeout_s: float, use_netns: bool) -> dict:
    net = RegionNetwork(["a", "b", "c"], rtt_ms=rtt_ms).open() if use_netns else None
    procs = []
    try:
        hosts = {n: net.host(n) for n in "abc"} if net else None
        config_path = _workload(root, queries, hosts, 0.0 if net else rtt_ms)
        config = load_config(config_path)
        expected = len(set((root / "truth" / "joinable.txt").read_text().split()))
        prefix = (lambda n: net.prefix(n)) if net else (lambda n: [])
        t0 = time.monotonic()
        procs = [_start(config_path, n, prefix(n), root / f"launcher-{n}.log") for n in "cab"]
        wait_until(lambda: _joined(config) >= expected, timeout_s, interval=0.2, message="every click joined")
        elapsed = time.monotonic() - t0
        wait_until(lambda: all(_status(config, n).get("caught_up") for n in "ab"), timeout_s, interval=0.2)
        lat = [_status(config, n).get("join_latency_ms", {}) for n in "ab"]
        wasted = sum(_status(config, n).get("already_joined", 0) for n in "ab")
        commands = ids = 0
        for state_dir in (config.region(n).state_dir for n in "abc"):
            for p in orjson.loads((Path(state_dir) / "launcher.json").read_bytes())["processes"].values():
                m = scrape(p["metrics"]) if p["role"] == "registry" and p.get("metrics") else None
                if m and m.get("photon_registry_is_leader"):
                    commands += m.get("photon_registry_commands", 0)
                    ids += m.get("photon_registry_ids_committed", 0)
        stop_groups(procs)
        procs = []
        duplicates = _duplicates(config)
        # the outage: fresh output and state; region b marked down before it starts, a joins everything
        for sub in ("out", "state"):
            subprocess.run(["rm", "-rf", str(root / sub)], check=True)
        b_state = Path(config.region("b").state_dir)
        b_state.mkdir(parents=True)
        write_atomic(b_state / "region-control.json", b'{"down": true, "hard": true, "seq": 1}')
        procs = [_start(config_path, n, prefix(n), root / f"outage-{n}.log") for n in "cab"]
        wait_until(lambda: _joined(config) >= expected, timeout_s, interval=0.2, message="a joined everything")
        from photon.app import region_up
        t_up = time.monotonic()
        region_up(config, "b")
        wait_until(lambda: _status(config, "b").get("caught_up") and _status(config, "b").get("events_read", 0) > 0,
                   timeout_s, interval=0.1, message="b caught up")
        catch_up = time.monotonic() - t_up
        stop_groups(procs)
        procs = []
        duplicates += _duplicates(config)
        return {"clicks_joined_per_s": round(expected / elapsed, 1),
                "join_p50_ms": max(x.get("p50", 0) for x in lat), "join_p90_ms": max(x.get("p90", 0) for x in lat),
                "join_p99_ms": max(x.get("p99", 0) for x in lat),
                "registry_ids_per_command": round(ids / commands, 1) if commands else 0.0,
                "wasted_joins": wasted, "catch_up_s": round(catch_up, 2), "clicks": expected,
                "duplicates": duplicates}
    finally:
        stop_groups(procs)
        if net:
            net.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.regions", description=__doc__.splitlines()[0])
    p.add_argument("--rtts", default="0,30,100", help="round trips between regions in ms (comma-separated)")
    p.add_argument("--queries", type=int, default=100_000, help="queries per region copy (clicks: about a tenth)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each phase may take")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    refused = netem_refused()
    distance = "netns+netem" if refused is None else f"simulated_rtt_ms between registry replicas ({refused})"
    figures: dict = {"distance": distance}
    for rtt in [float(x) for x in args.rtts.split(",") if x.strip()]:
        with tempfile.TemporaryDirectory(prefix="bench-regions-") as tmp:
            r = _one_rtt(Path(tmp), rtt, args.queries, args.timeout, use_netns=refused is None)
        for k, v in r.items():
            figures[f"rtt{rtt:g}ms_{k}"] = v
    rates = [v for k, v in figures.items() if k.endswith("clicks_joined_per_s")]
    figures["clicks_joined_per_s"] = min(rates) if rates else 0.0
    figures["duplicates"] = sum(v for k, v in figures.items() if k.endswith("_duplicates"))
    emit(figures, args.json, "Photon regions benchmark: two regions (+ a registry-only one) at a distance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
