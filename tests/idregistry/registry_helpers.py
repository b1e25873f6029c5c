"""The registry tests' cluster helper: replica processes started from ``registry_processes`` (the
launcher's view), killed and restarted like the launcher would."""
from __future__ import annotations

import json
import os
import signal
import subprocess

from photon import load_config, wait_until
from tests.conftest import Procs
import idregistry


def make_config(root, **registry):
    """Write ``<root>/photon.toml`` with these ``[registry]`` options and one region; load it."""
    lines = ["[registry]"] + [f"{key} = {json.dumps(value)}" for key, value in registry.items()]
    lines += ["", "[[regions]]", 'name = "local"', f'log_root = "{root / "logs"}"',
              f'output_root = "{root / "out"}"', f'state_dir = "{root / "state"}"', ""]
    (root / "photon.toml").write_text("\n".join(lines))
    return load_config(root / "photon.toml")


class Cluster:
    """The replica processes of one config, by name; kill/restart them like the launcher would."""

    def __init__(self, config, procs: Procs) -> None:
        self.config = config
        self.procs = procs
        self.running: dict[str, subprocess.Popen] = {}
        self.client = None

    def start_missing(self) -> None:
        for spec in idregistry.registry_processes(self.config):
            p = self.running.get(spec.name)
            if p is None or p.poll() is not None:
                self.running[spec.name] = self.procs.start(spec.argv)

    def endpoints(self) -> list[str]:
        return idregistry.registry_endpoints(self.config)

    def status(self, shard: int = 0) -> list[dict]:
        return [s for s in self.client.status() if s["shard"] == shard]

    def leader(self, shard: int = 0) -> dict | None:
        leaders = [s for s in self.status(shard) if s.get("is_leader")]
        return leaders[0] if len(leaders) == 1 else None

    def wait_leader(self, shard: int = 0, timeout: float = 30.0) -> dict:
        wait_until(lambda: self.leader(shard) is not None, timeout, message=f"a leader of shard {shard}")
        return self.leader(shard)

    def name_of(self, status: dict) -> str:
        return f"registry-s{status['shard']}-r{status['replica']}"

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.running[name]
        os.kill(p.pid, sig)
        p.wait(timeout=10)

    def wait_all_up(self, timeout: float = 30.0) -> None:
        def up():
            rows = self.client.status()
            shards = {r["shard"] for r in rows}
            leaders = {r["shard"] for r in rows if r.get("is_leader")}
            return all("error" not in r for r in rows) and leaders == shards
        wait_until(up, timeout, message="every replica answering and a leader in every shard")


def start_cluster(root, procs: Procs, **registry) -> Cluster:
    c = Cluster(make_config(root, **registry), procs)
    c.start_missing()
    c.client = idregistry.RegistryClient(c.endpoints(), retry_timeout_s=30.0)
    c.wait_leader()
    c.wait_all_up()
    return c
