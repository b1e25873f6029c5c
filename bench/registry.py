"""IdRegistry benchmark: a real cluster (replica processes on 127.0.0.1), clients in their own processes.

    python -m bench.registry --shards 1 --replicas 3 [--rtt-ms 100] [--clients 2] [--json]

With ``--rtt-ms``, the replicas run in three network namespaces (one region each, replica k in region
k mod 3) any two of them that round trip apart, and the clients in the first region (:class:`Bench`);
``distance`` says how the delay was made.

Phases: *light* (one client thread, one small commit at a time: latency without load), *peak* (every
client process and thread committing batches of fresh ids as fast as answers come: ids/s), *half*
(the same clients paced to half the peak rate: latency under moderate load), *race* (two clients commit
the same ids under different tokens: each id must be accepted exactly once). Then the bytes per held id
of a shard holding ``--memory-ids`` ids, measured in-process on the shard's state object (``sys.getsizeof``
of everything it holds, and this process's RSS growth): with tokens cleared (``bytes_per_id``), and with one
joiner-style token per join request, never cleared, under GC churn, for each of ``--ids-per-request``
(default 20, what a request holds in the pipeline at 1,000 clicks/s: ``pipeline_tokens_bytes_per_id``; and
300: ``tokens_of_300_ids_bytes_per_id``). Last, as a replica process holds them: a fresh cluster is filled
with ``--replica-memory-ids`` ids by clients sending requests of the pipeline's size (20 ids), each under
its own token, and the growth of each replica process's resident memory is divided by the ids it holds
(``replica_rss_bytes_per_id``: the leader's; ``replica_anon_bytes_per_id``: without file-backed pages
such as the memory-mapped Raft journal; ``replica_rss_bytes_per_id_max``: the largest over replicas).

Prints a table, or with ``--json`` one JSON object on its last line (ids_per_s, commit_p50_ms,
commit_p99_ms, ids_per_command, raft_commands_per_s, replica_cpu_s_per_m_ids (CPU-seconds per million ids
committed in the peak phase, each replica, largest first), client_cpu_s_per_m_ids, leader_context_switches_per_m_ids (the leader's threads' context switches per
million ids: its hand-offs), half_rate_replica_cpu_s_per_m_ids, bytes_per_id, replica_rss_bytes_per_id, ...).
``--half-rate R`` runs the half phase at R ids/s instead of half the peak's: a fixed load, to compare two
builds by latency and CPU at the same rate when the peak moves with the host's load. ``--profile DIR`` records a py-spy profile of every replica process during
the peak phase (``python -m bench._profile DIR`` summarises them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench._common import percentile, stop_groups
from bench.netns import RegionNetwork, delay_kind, delay_refused, namespaces_refused
from photon import REGION_PORT_SPAN, parse_config, wait_until
import idregistry


PLACES = ("r0", "r1", "r2")
"""The regions of ``--rtt-ms`` runs: r0 runs the clients (a pipeline region), r1 and r2 registry replicas only."""


# ---- the client worker (its own process) -------------------------------------------------------------

def worker(args) -> None:
    """Commit batches of ids from ``--threads`` threads until ``--duration`` has passed; print results."""
    client = idregistry.RegistryClient(args.endpoints.split(","), retry_timeout_s=60.0)
    client.sharding()
    from idregistry import client_recorder, cpu_pressure_us, thread_sched
    trace = client_recorder()       # None unless PHOTON_REGISTRY_TRACE names a folder (--trace)
    start_at = args.start_at
    if not start_at:                # told once every client is ready (a loaded machine starts them late)
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
    stop_at = start_at + args.duration
    limit = args.count // args.threads if args.count else 0      # ids per thread (0: until the duration ends)
    per_thread_rate = args.rate / args.threads if args.rate else 0.0
    lock = threading.Lock()
    out = {"ok": 0, "exists": 0, "too_old": 0, "latencies_ms": [], "ok_ids": []}

    def run(t: int) -> None:
        prefix = f"10.{args.seed % 250}.{t}.9:{7000 + args.seed}:"
        ts = args.base_us           # the same sequence in every racing client
        lat, ok, exists, ok_ids = [], 0, 0, []
        sent = 0
        while time.time() < start_at:
            time.sleep(0.001)
        began = time.perf_counter()
        began_wall = time.time()
        seq = 0
        ok_result = idregistry.CommitResult.OK
        while time.time() < stop_at and (not limit or sent < limit):
            ids = [f"{prefix}{t:016d}" for t in range(ts, ts + args.batch)]
            ts += args.batch
            if trace is not None:
                psi0, (c0, q0) = cpu_pressure_us(), thread_sched()
            t0 = time.perf_counter()
            token = args.token
            if args.token_per_request:      # the joiner's shape: host:port/pid/start_us/seq, one per request
                seq += 1
                token = f"127.0.0.{t + 1}:{7000 + args.seed}/{os.getpid()}/{args.base_us}/{seq}"
            results = client.commit(ids, token)
            t1 = time.perf_counter()
            lat.append((t1 - t0) * 1000)
            if trace is not None:       # perf_counter is the host's monotonic clock, as in the replicas
                c1, q1 = thread_sched()
                trace.add("commit", t0, t1, first=ids[0], thread=t, cpu_ms=round((c1 - c0) / 1e6, 3),
                          runq_ms=round((q1 - q0) / 1e6, 3), pressure_ms=round((cpu_pressure_us() - psi0) / 1000, 3))
            accepted = results.count(ok_result)
            ok += accepted
            exists += len(results) - accepted
            if args.keep_ids:
                ok_ids.extend(event_id for event_id, r in zip(ids, results) if r == ok_result)
            sent += len(ids)
            if per_thread_rate:
                ahead = sent / per_thread_rate - (time.perf_counter() - began)
                if ahead > 0:
                    time.sleep(ahead)   # pacing a load generator, not waiting for a condition
        ended_wall = time.time()
        with lock:
            out["cpu_s"] = round(time.process_time(), 3)
            out["began_s"] = min(out.get("began_s", began_wall), began_wall)
            out["ended_s"] = max(out.get("ended_s", ended_wall), ended_wall)
            out["ok"] += ok
            out["exists"] += exists
            out["latencies_ms"].extend(lat)
            out["ok_ids"].extend(ok_ids)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    if trace is not None:
        trace.flush()
    print(json.dumps(out))


# ---- the driver -------------------------------------------------------------------------------------

class Bench:
    """A fresh cluster. With ``net`` (a :class:`bench.netns.RegionNetwork` of :data:`PLACES`), replica k runs
    in the namespace of ``PLACES[k % 3]`` (the first a pipeline region, the others registry-only, as a
    deployment places them), any two a real round trip apart, and the clients run in the first region:
    a commit pays the round trip from the leader to a majority. Without it every replica runs on this
    host's loopback, and ``simulated_rtt_ms`` (``--rtt-ms`` where namespaces are refused) delays Raft's
    messages only."""

    def __init__(self, args, net=None) -> None:
        self.args = args
        self.net = net
        self.tmp = tempfile.TemporaryDirectory(prefix="photon-bench-registry-")
        root = Path(self.tmp.name)
        registry = {"shards": args.shards, "replicas": args.replicas, "fsync": args.fsync,
                    "max_in_flight": args.in_flight, "simulated_rtt_ms": 0.0 if net else args.rtt_ms,
                    **({"snapshot_after_commands": args.snapshot_after} if args.snapshot_after else {})}
        if net:
            registry["replica_regions"] = [PLACES[k % len(PLACES)] for k in range(args.replicas)]
            base = 10_000 + (os.getpid() % 7) * len(PLACES) * REGION_PORT_SPAN   # below the ephemeral ports
            regions = [{"name": n, "state_dir": str(root / n / "state"), "host": net.host(n),
                        "port_base": base + k * REGION_PORT_SPAN,
                        **({"log_root": str(root / "logs"), "output_root": str(root / "out")} if k == 0
                           else {"registry_only": True})} for k, n in enumerate(PLACES)]
        else:
            regions = [{"name": "bench", "log_root": str(root / "logs"), "output_root": str(root / "out"),
                        "state_dir": str(root / "state")}]
        self.config = parse_config({"registry": registry, "regions": regions},
                                   path=str(root / "photon.toml"), base=root)
        self.procs: list[subprocess.Popen] = []
        self.seed = 0
        self.base_us = int(time.time() * 1e6)

    def _prefix(self, region: str) -> list[str]:
        return self.net.prefix(region) if self.net else []

    def start(self) -> None:
        for spec in idregistry.registry_processes(self.config):
            self.procs.append(subprocess.Popen([*self._prefix(spec.region), *spec.argv], start_new_session=True))
        self.endpoints = idregistry.registry_endpoints(self.config)
        self.client = idregistry.RegistryClient(self.endpoints)

        def leaders() -> bool:
            rows = self.client.status()
            return len({r["shard"] for r in rows if r.get("is_leader")}) == self.args.shards
        wait_until(leaders, 60, interval=0.1, message="a leader in every shard")

    def stop(self) -> None:
        self.client.close()
        stop_groups(self.procs, grace_s=10)
        self.tmp.cleanup()

    def leader_counters(self) -> tuple[int, int]:
        rows = [r for r in self.client.status() if r.get("is_leader")]
        return sum(r["commands"] for r in rows), sum(r["ids_committed"] for r in rows)

    def held(self) -> int:
        return sum(r["ids_held"] for r in self.client.status() if r.get("is_leader"))

    def run_clients(self, clients: int, threads: int, batch: int, duration: float, rate: float = 0.0,
                    race: bool = False, count: int = 0, token_per_request: bool = False,
                    profiler=None) -> list[dict]:
        self.base_us = int(time.time() * 1e6)   # fresh seeds (id prefixes) keep phases apart
        procs = []
        for c in range(clients):
            seed = self.seed if race else self.seed + c
            argv = [*self._prefix(PLACES[0]), sys.executable, "-m", "bench.registry", "--worker",
                    "--endpoints", ",".join(self.endpoints),
                    "--threads", str(threads), "--batch", str(batch), "--duration", str(duration),
                    "--rate", str(rate / clients), "--seed", str(seed), "--token", f"bench-{c}",
                    "--base-us", str(self.base_us)]
            if race:
                argv.append("--keep-ids")
            if count:
                argv += ["--count", str(count // clients)]
            if token_per_request:
                argv.append("--token-per-request")
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True))
            if profiler is not None:
                profiler.attach(procs[-1].pid, "client")
        self.seed += clients + 1
        for p in procs:              # every client has imported and found the shard leaders: start together
            if p.stdout.readline().strip() != b"ready":
                p.wait(timeout=30)
                raise RuntimeError(f"bench client exited with {p.returncode} before it was ready")
        start_at = time.time() + 0.2
        for p in procs:
            p.stdin.write(f"{start_at}\n".encode())
            p.stdin.flush()                # (closed by communicate below)
        outs = []
        for p in procs:
            stdout, _ = p.communicate(timeout=duration + 120)
            if p.returncode != 0:
                raise RuntimeError(f"bench client exited with {p.returncode}")
            outs.append(json.loads(stdout.decode().strip().splitlines()[-1]))
        return outs

    def measure(self) -> dict:
        a = self.args
        figures: dict = {"shards": a.shards, "replicas": a.replicas, "rtt_ms": a.rtt_ms, "distance": a.distance,
                         "clients": a.clients,
                         "threads_per_client": a.threads, "ids_per_rpc": a.batch, "fsync": a.fsync,
                         "max_in_flight": a.in_flight}
        # light: one thread, small commits one at a time
        light = self.run_clients(1, 1, a.light_batch, a.light_duration)
        figures["light_commit_p50_ms"] = round(percentile(light[0]["latencies_ms"], 50), 2)
        figures["light_commit_p99_ms"] = round(percentile(light[0]["latencies_ms"], 99), 2)
        accepted = light[0]["ok"]
        # peak
        c0, i0 = self.leader_counters()
        t0 = time.monotonic()
        profiler = None
        if getattr(a, "profile", None):     # py-spy on every replica process, for the peak phase only
            from bench._profile import Profiler
            profiler = Profiler(Path(a.profile), gil=a.profile_gil)
            for p in self.procs:
                profiler.attach(p.pid, "replica")
        import psutil
        replicas = [psutil.Process(p.pid) for p in self.procs]
        cpu0 = [r.cpu_times()[:2] for r in replicas]
        switches0 = [_context_switches(p.pid) for p in self.procs]
        try:
            peak = self.run_clients(a.clients, a.threads, a.batch, a.duration, profiler=profiler)
        finally:
            if profiler is not None:
                profiler.stop()
        split = [tuple(a - b for a, b in zip(r.cpu_times()[:2], c)) for r, c in zip(replicas, cpu0)]
        cpu = [user + system for user, system in split]
        switches = [_context_switches(p.pid) - s0 for p, s0 in zip(self.procs, switches0)]
        c1, i1 = self.leader_counters()
        elapsed = time.monotonic() - t0 - 1.5
        ok = sum(o["ok"] for o in peak)
        accepted += ok
        lat = [x for o in peak for x in o["latencies_ms"]]
        figures["ids_per_s"] = round(ok / _elapsed(peak))
        figures["commit_p50_ms"] = round(percentile(lat, 50), 2)
        figures["commit_p99_ms"] = round(percentile(lat, 99), 2)
        figures["ids_per_command"] = round((i1 - i0) / max(1, c1 - c0), 1)
        figures["raft_commands_per_s"] = round((c1 - c0) / max(elapsed, a.duration), 1)
        # CPU-seconds per million ids committed in the peak phase (user + system): each replica, the clients
        figures["replica_cpu_s_per_m_ids"] = sorted((round(c * 1e6 / max(1, ok), 2) for c in cpu), reverse=True)
        # the busiest replica (the leader): user and system CPU-seconds per million ids
        figures["leader_user_sys_s_per_m_ids"] = [round(x * 1e6 / max(1, ok), 2) for x in max(split, key=sum)]
        # the leader's threads' context switches (voluntary and not) per million ids: the hand-offs
        figures["leader_context_switches_per_m_ids"] = round(
            switches[max(range(len(split)), key=lambda k: sum(split[k]))] * 1e6 / max(1, ok))
        figures["client_cpu_s_per_m_ids"] = round(sum(o["cpu_s"] for o in peak) * 1e6 / max(1, ok), 2)
        leader = next(r for r in self.client.status() if r.get("is_leader"))
        figures["leader_fsyncs"] = leader["fsyncs"]
        figures["leader_fsync_ms_mean"] = leader["fsync_ms_mean"]
        # half the peak rate
        if a.half_duration > 0:
            half_rate = a.half_rate or figures["ids_per_s"] / 2
            cpu0 = [r.cpu_times()[:2] for r in replicas]
            half_began = time.monotonic()
            half = self.run_clients(a.clients, a.threads, a.batch, a.half_duration, rate=half_rate)
            if a.trace:         # what every slow commit of this phase waited for (bench/registry_tail.py)
                from bench.registry_tail import attribute
                figures["half_rate_tail"] = attribute(a.trace, half_began, time.monotonic(), a.slow_ms)
            half_ok = sum(o["ok"] for o in half)
            figures["half_rate_replica_cpu_s_per_m_ids"] = sorted(
                (round((sum(r.cpu_times()[:2]) - sum(c)) * 1e6 / max(1, half_ok), 2)
                 for r, c in zip(replicas, cpu0)), reverse=True)
            hl = [x for o in half for x in o["latencies_ms"]]
            accepted += sum(o["ok"] for o in half)
            figures["half_rate_ids_per_s"] = round(sum(o["ok"] for o in half) / _elapsed(half))
            figures["half_rate_commit_p50_ms"] = round(percentile(hl, 50), 2)
            figures["half_rate_commit_p99_ms"] = round(percentile(hl, 99), 2)
        # race: two clients, the same ids, different tokens
        race = self.run_clients(2, 2, a.batch, a.race_duration, race=True)
        seen: dict[str, int] = {}
        for o in race:
            for event_id in o["ok_ids"]:
                seen[event_id] = seen.get(event_id, 0) + 1
        accepted += len(seen)
        figures["race_ids"] = len(seen)
        figures["duplicates"] = sum(1 for n in seen.values() if n > 1)
        held = self.held()
        figures["ids_held"] = held
        figures["accepted_equals_held"] = accepted == held
        return figures


    def replica_memory(self, n_ids: int, ids_per_request: int) -> dict:
        """Fill this (fresh) cluster with ``n_ids`` ids in requests of ``ids_per_request`` ids, each under its
        own token, and report each replica process's resident-memory growth per id held."""
        import psutil
        procs = [psutil.Process(p.pid) for p in self.procs]
        before = [p.memory_info() for p in procs]
        t0 = time.monotonic()
        outs = self.run_clients(2, 8, ids_per_request, duration=self.args.replica_fill_timeout, count=n_ids,
                                token_per_request=True)
        fill_s = time.monotonic() - t0 - 1.5
        rows = [r for r in self.client.status() if "error" not in r]
        held = max(r["ids_held"] for r in rows)
        wait_until(lambda: all(r.get("ids_held") == held for r in self.client.status()), 60, interval=0.2,
                   message="every replica holding every id")
        leader = next(r for r in self.client.status() if r.get("is_leader"))
        after = [p.memory_info() for p in procs]
        by_pid = {p.pid: (b, a) for p, b, a in zip(procs, before, after)}
        rss = {pid: (a.rss - b.rss) / max(1, held) for pid, (b, a) in by_pid.items()}
        anon = {pid: ((a.rss - a.shared) - (b.rss - b.shared)) / max(1, held) for pid, (b, a) in by_pid.items()}
        lead = leader["pid"] if leader["pid"] in rss else max(rss, key=rss.get)
        return {"replica_rss_bytes_per_id": round(rss[lead], 2), "replica_anon_bytes_per_id": round(anon[lead], 2),
                "replica_rss_bytes_per_id_max": round(max(rss.values()), 2), "replica_memory_ids": held,
                "replica_memory_ids_per_request": ids_per_request,
                "replica_fill_ids_per_s": round(sum(o["ok"] for o in outs) / max(fill_s, 1e-6)),
                "replica_memory_measured": (f"resident memory growth of each replica process (psutil), fresh "
                                            f"{self.args.replicas}-replica cluster filled with {held} ids in requests "
                                            f"of {ids_per_request} ids, one token each")}


def _context_switches(pid: int) -> int:
    """Context switches so far (voluntary and involuntary) summed over a process's live threads (Linux)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except (OSError, ValueError):      # a thread that ended meanwhile
            continue
    return total


def _elapsed(outs: list[dict]) -> float:
    """Real seconds from the first client thread's first commit to the last one's last answer."""
    return max(1e-6, max(o["ended_s"] for o in outs) - min(o["began_s"] for o in outs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.registry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="round trip between the replicas' regions (network namespaces, see bench.netns; "
                             "simulated between replicas only where namespaces are refused)")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per client process (default 4; 16 with --rtt-ms)")
    parser.add_argument("--batch", type=int, default=None, help="ids per commit RPC (default 500; 1000 with --rtt-ms)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of the peak phase")
    parser.add_argument("--half-duration", type=float, default=6.0, help="seconds of the half-rate phase")
    parser.add_argument("--half-rate", type=float, default=0.0,
                        help="ids/s of the half-rate phase (default 0: half the peak's): a fixed load to compare by")
    parser.add_argument("--light-duration", type=float, default=3.0)
    parser.add_argument("--light-batch", type=int, default=10)
    parser.add_argument("--race-duration", type=float, default=3.0)
    parser.add_argument("--in-flight", type=int, default=None,
                        help="replicated commands in flight per shard (default 4; 16 with --rtt-ms)")
    parser.add_argument("--snapshot-after", type=int, default=0,
                        help="[registry].snapshot_after_commands (default: the config's)")
    parser.add_argument("--fsync", default="batch", choices=["none", "batch", "interval"])
    parser.add_argument("--memory-ids", type=int, default=5_000_000, help="0 skips the bytes-per-id figure")
    parser.add_argument("--ids-per-request", default="20,300",
                        help="ids per join request (one token each, never cleared) for the pipeline-pattern "
                             "bytes-per-id figures, comma-separated: the first is the pipeline's (about 20 at "
                             "1,000 clicks/s), the others are reported as tokens_of_<n>_ids_...")
    parser.add_argument("--replica-memory-ids", type=int, default=1_000_000,
                        help="ids a fresh cluster is filled with for the replica resident-memory figure (0 skips)")
    parser.add_argument("--replica-fill-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--memory-churn", type=float, default=1.0,
                        help="for that figure, commit (1 + this) x --memory-ids ids while GC keeps about "
                             "--memory-ids held")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", default=None,
                        help="folder for py-spy profiles of every replica process during the peak phase "
                             "(summarise with python -m bench._profile DIR), and of the client processes")
    parser.add_argument("--trace", default=None,
                        help="folder for timing records of every replica and client process (idregistry/_trace.py); "
                             "the half-rate phase's slow commits are then attributed (half_rate_tail)")
    parser.add_argument("--slow-ms", type=float, default=15.0,
                        help="with --trace: a half-rate commit at least this slow is attributed")
    parser.add_argument("--profile-gil", action="store_true",
                        help="with --profile: sample only the thread holding the GIL (py-spy --gil)")
    # worker mode (internal)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--token", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--base-us", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--keep-ids", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--token-per-request", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    far = args.rtt_ms > 0      # a long round trip needs more ids in flight to keep the pipeline full
    args.threads = args.threads or (16 if far else 4)
    args.batch = args.batch or (1000 if far else 500)
    args.in_flight = args.in_flight or (16 if far else 4)
    if args.worker:
        worker(args)
        return 0
    if args.trace:          # every replica and client process started from here records (idregistry/_trace.py)
        os.environ["PHOTON_REGISTRY_TRACE"] = str(Path(args.trace).resolve())
    net = None
    refused = namespaces_refused() if far else "no round trip asked"
    kind = delay_kind() if refused is None else None
    if kind is not None:
        args.distance = {"netem": "netns + tc netem", "relay": "netns + TUN relay (bench._wire)"}[kind]
        net = RegionNetwork(list(PLACES), rtt_ms=args.rtt_ms, delay=kind).open()
    else:
        args.distance = ("loopback" if not far else
                         f"loopback; simulated_rtt_ms between replicas only ({refused or delay_refused()})")
    try:
        bench = Bench(args, net)
        try:
            bench.start()
            figures = bench.measure()
        finally:
            bench.stop()
    finally:
        if net:
            net.close()
    if args.memory_ids:
        mem = idregistry.measure_state_memory(args.memory_ids)
        figures["bytes_per_id"] = mem["bytes_per_id"]
        figures["rss_bytes_per_id"] = mem["rss_bytes_per_id"]
        figures["memory_ids"] = mem["ids"]
        figures["bytes_per_id_measured"] = "in-process, on one shard's state object, tokens cleared"
        sizes = [int(x) for x in args.ids_per_request.split(",") if x.strip()]
        for k, size in enumerate(sizes):
            pipe = idregistry.measure_state_memory(args.memory_ids, ids_per_token=size, churn=args.memory_churn)
            key = "pipeline_tokens" if k == 0 else f"tokens_of_{size}_ids"
            figures[f"{key}_bytes_per_id"] = pipe["bytes_per_id"]
            figures[f"{key}_rss_bytes_per_id"] = pipe["rss_bytes_per_id"]
            figures[f"{key}_held"] = pipe["tokens"]
            figures[f"{key}_ids_committed"] = pipe["ids_committed"]
            figures[f"{key}_measured"] = (f"the same, one token per join request of {size} ids, never cleared "
                                          f"(the pipeline's pattern), {pipe['ids_committed']} ids committed while "
                                          f"GC keeps about {args.memory_ids} held")
    if args.replica_memory_ids:
        fresh = Bench(args)
        try:
            fresh.start()
            figures.update(fresh.replica_memory(args.replica_memory_ids,
                                                int(args.ids_per_request.split(",")[0])))
        finally:
            fresh.stop()
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
