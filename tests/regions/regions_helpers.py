"""Helpers of the multi-region tests: a generated workload whose photon.toml places each region at its own
address (fixed ports from a port base), one ``photon run --region NAME`` launcher per region, and the
union of every region's joined output."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import orjson

from photon import REGION_PORT_SPAN, load_config, read_output_lines, wait_until
from photon.app import GenOptions, generate


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port_bases(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` port bases, REGION_PORT_SPAN apart, whose first ports are free right now."""
    for _ in range(200):
        start = random.randrange(20_000, 55_000, 100)
        bases = [start + i * REGION_PORT_SPAN for i in range(count)]
        probes = [b + off for b in bases for off in (*range(0, 20), *range(100, 140))]
        if all(_free(host, p) for p in probes):
            return bases
    raise RuntimeError("no free port range found")


def _toml_value(v) -> str:
    return orjson.dumps(v).decode() if not isinstance(v, bool) else ("true" if v else "false")


def write_toml(path: Path, data: dict) -> None:
    """A small TOML writer for Photon configs (tables of scalars and lists, and [[regions]])."""
    lines = []
    for name, table in data.items():
        if name == "regions":
            continue
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    for region in data.get("regions", []):
        lines.append("[[regions]]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in region.items()]
    path.write_text("\n".join(lines) + "\n")


def regions_workload(root: Path, regions=("a", "b"), registry_only=(), hosts=None, queries=3000,
                     seed=3, **sections) -> Path:
    """Generate a workload for ``regions`` under ``root`` and rewrite its photon.toml so that every
    region (and every name in ``registry_only``, a region that hosts registry replicas only) has a
    ``port_base`` (and ``host`` from ``hosts``). Extra ``sections`` are merged into the config."""
    generate(GenOptions(out=str(root), queries=queries, regions=tuple(regions), unjoinable_fraction=0.0,
                        duplicate_fraction=0.01, bad_line_fraction=0.0, unjoinable_after_s=30.0, seed=seed))
    path = root / "photon.toml"
    data = tomllib.loads(path.read_text())
    data["regions"] += [{"name": n, "state_dir": f"state/{n}", "registry_only": True} for n in registry_only]
    bases = free_port_bases(len(data["regions"]))
    for region, base in zip(data["regions"], bases):
        region["port_base"] = base
        if hosts:
            region["host"] = hosts[region["name"]]
    for name, table in sections.items():
        data.setdefault(name, {}).update(table)
    write_toml(path, data)
    return path


class RegionRun:
    """``photon run --config C --region NAME`` as a process in its own session; ``prefix`` runs it under
    another command (``ip netns exec NS``)."""

    def __init__(self, procs, config_path: Path, region: str, prefix=()) -> None:
        self.procs = procs
        self.config_path = Path(config_path)
        self.config = load_config(config_path)
        self.region = region
        self.prefix = list(prefix)
        self.proc = None

    @property
    def state_dir(self) -> Path:
        return Path(self.config.region(self.region).state_dir)

    def start(self, *extra: str) -> "RegionRun":
        self.log = open(self.config_path.parent / f"launcher-{self.region}.log", "ab")
        argv = [*self.prefix, os.environ.get("PHOTON_PYTHON", sys.executable), "-m",
                "photon.app.cli", "run", "--config", str(self.config_path), "--region", self.region, *extra]
        self.proc = self.procs.start(argv, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        code = self.proc.wait(timeout=90)
        self.log.close()
        return code

    def processes(self) -> dict:
        try:
            return json.loads((self.state_dir / "launcher.json").read_text())["processes"]
        except (OSError, ValueError, KeyError):
            return {}

    def launcher_pid(self) -> int | None:
        """The pid of the launcher that last wrote this region's ``launcher.json``."""
        try:
            return json.loads((self.state_dir / "launcher.json").read_text()).get("launcher_pid")
        except (OSError, ValueError):
            return None

    def kill_hard(self) -> list[int]:
        """SIGKILL the launcher and every process it started, all at once (a region lost whole)."""
        pids = [p["pid"] for p in self.processes().values() if p.get("pid")]
        for pid in [self.proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self.log.close()
        return pids

    def dispatcher_status(self) -> dict:
        from dispatcher import read_status
        return read_status(self.state_dir) or {}

    def output_text(self) -> str:
        return (self.config_path.parent / f"launcher-{self.region}.log").read_text(errors="replace")


def union_joined(config, committed_only: tuple[str, ...] = ()) -> Counter:
    """How often each click id appears in the joined output of every pipeline region: every whole line
    written, lines of open files after their last commit record included, but for the regions named in
    ``committed_only``: only the output contract's lines there (a killed region's lines after its joiners'
    last commit records are cut when it returns)."""
    ids = Counter()
    for region in config.pipeline_regions:
        for line in read_output_lines(region.joined_dir, include_inprogress=region.name not in committed_only):
            ids[orjson.loads(line)[config.join.foreign_id_field]] += 1
    return ids


def joinable(root: Path) -> set[str]:
    return set((root / "truth" / "joinable.txt").read_text().split())


def wait_all_joined(config, expected: set[str], timeout: float, runs=()) -> None:
    def done() -> bool:
        return set(union_joined(config)) >= expected
    try:
        wait_until(done, timeout, interval=0.5, message="every joinable click in the union of the regions' output")
    except TimeoutError:
        tails = "\n".join(f"--- {r.region}\n{r.output_text()[-1500:]}" for r in runs)
        raise AssertionError(f"not every click joined: {len(set(union_joined(config)) & expected)}"
                             f"/{len(expected)}\n{tails}") from None
