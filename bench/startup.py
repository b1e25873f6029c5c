"""A timeline of ``photon run``'s start: ``python -m bench.startup [--queries N] [--runs K] [--json]``.

A small workload is generated (as :mod:`bench.compare` does, one region) and ``photon run`` started on it.
Every 5 ms the watcher looks at the launcher's process tree (the fork server's children named by their pids
in ``launcher.json``) and the processes' logs, and prints, in seconds from the launcher's start: when the fork
server and each process were started, when it printed ``serving on`` (the line a
service prints once it answers; the fork server says when in that line, as its log may be placed later),
its CPU-seconds until then (seen when the line was) and until the first join, the dispatcher's first
status file, and the first joined click seen complete in an output file and visible under the output
contract. Figures, not a pass/fail test; the machine's load average is printed beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench._common import emit, stop_groups
from bench._output import OutputFollower
from bench.compare import generate_workload, process_kind

ROOT = Path(__file__).resolve().parent.parent


def _cpu(proc: psutil.Process) -> float | None:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


def one_run(root: Path, timeout_s: float) -> dict:
    """One cold ``photon run`` on the workload in ``root``; its timeline as ``{figure: seconds}``."""
    log = open(root / "run.log", "ab")  # noqa: SIM115  (closed in the finally below)
    t0 = time.monotonic()
    wall0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "photon.app.cli", "run", "--config", str(root / "photon.toml")],
                            cwd=root, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    launcher = psutil.Process(proc.pid)
    follower = OutputFollower(root / "out" / "a" / "joined")
    logs = root / "state" / "a" / "logs"
    status = root / "state" / "a" / "dispatcher" / "status.json"
    state = root / "state" / "a" / "launcher.json"
    seen: dict[int, tuple[str, psutil.Process]] = {proc.pid: ("launcher", launcher)}
    names: dict[int, str] = {proc.pid: "launcher"}
    fig: dict = {}
    cpu: dict[int, float] = {}
    first_seen: dict[int, float] = {}
    serving_cpu: dict[str, float] = {}
    try:
        while time.monotonic() - t0 < timeout_s:
            now = time.monotonic() - t0
            try:
                kids = launcher.children(recursive=True)
            except psutil.Error:
                kids = []
            for k in kids:
                if k.pid not in seen:
                    seen[k.pid] = ("?", k)
                    first_seen[k.pid] = now
                if k.pid not in names:       # named once it runs its own program (not the launcher's fork)
                    name = _name(k, state, proc.pid)
                    if name:
                        names[k.pid] = name
                        fig[f"start {name}"] = round(first_seen[k.pid], 3)
            for pid, (_, p) in seen.items():
                c = _cpu(p)
                if c is not None:
                    cpu[pid] = c
            for pid, name in names.items():
                key = f"serving {name}"
                if key in fig or pid == proc.pid:
                    continue
                f = logs / f"{name}.log"
                try:
                    text = f.read_bytes()
                except FileNotFoundError:
                    continue
                if b"serving on" in text:
                    # the fork server's log is placed only once the launcher holds its state dirs, after it
                    # may have started serving: it says when (CLOCK_MONOTONIC, this process's clock too)
                    at = re.search(rb"at monotonic ([0-9.]+)", text)
                    fig[key] = round(float(at.group(1)) - t0, 3) if at else round(now, 3)
                    imports = re.search(rb"imported in ([0-9.]+) CPU-s", text)
                    serving_cpu[name] = cpu.get(pid, 0.0)
                    if imports:
                        fig[f"cpu of {name}'s imports until serving"] = float(imports.group(1))
            if "dispatcher status" not in fig and status.exists():
                fig["dispatcher status"] = round(now, 3)
            follower.poll()
            if "first join seen" not in fig and follower.seen_us:
                fig["first join seen"] = round(min(follower.seen_us.values()) / 1e6 - wall0, 3)
            if follower.published_us:
                fig["first join visible"] = round(min(follower.published_us.values()) / 1e6 - wall0, 3)
                break
            time.sleep(0.005)     # the watcher's own sampling period (a benchmark, not product code)
        else:
            raise SystemExit(f"no join within {timeout_s} s; see {root / 'run.log'}")
    finally:
        stop_groups([proc])
        log.close()
    for name, c in sorted(serving_cpu.items()):
        fig[f"cpu to serving {name}"] = round(c, 3)
    for pid, name in sorted(names.items(), key=lambda kv: kv[1]):
        fig[f"cpu to first join {name}"] = round(cpu.get(pid, 0.0), 3)
    fig["cpu to first join, all"] = round(sum(cpu.values()), 3)
    return dict(sorted(fig.items(), key=lambda kv: (kv[0].startswith("cpu"), kv[1] if not kv[0].startswith("cpu") else 0, kv[0])))


def _name(p: psutil.Process, state: Path, launcher_pid: int) -> str:
    """The launcher's name for one of its processes, once it runs its own program ("" before): its pid in
    the launcher's ``launcher.json`` (a service forked by the fork server), else ``PHOTON_PROCESS`` in its
    environment (a process the launcher started itself); ``forkserver`` for the fork server."""
    try:
        kind = process_kind(p)
        if kind == "launcher":
            return ""
        if kind == "forkserver":      # the fork server, or a service it forked that has not named itself yet
            return "forkserver" if p.ppid() == launcher_pid else ""
        try:
            listed = json.loads(state.read_text())["processes"]
        except (OSError, ValueError, KeyError):
            listed = {}
        for name, entry in listed.items():
            if entry.get("pid") == p.pid:
                return name
        return p.environ().get("PHOTON_PROCESS", "")
    except psutil.Error:
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (the processes' logs)")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="photon-startup-"))
    try:
        generate_workload(base / "gen", args.queries)
        for k in range(args.runs):
            root = base / f"run{k}"
            shutil.copytree(base / "gen", root)
            figures = {"load_average_at_start": round(os.getloadavg()[0], 2), **one_run(root, args.timeout)}
            emit(figures, args.json, f"photon run, start-up timeline (run {k + 1}, seconds from its start)")
    finally:
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
