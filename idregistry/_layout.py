"""Where the registry's replicas run: ports, data dirs and the argv of every replica process.

The layout is remembered in ``<registry_data_dir>/layout.json`` so that every call (and every restart of
the launcher) names the same processes on the same ports:

* ``initial_shards``: the shard count of the very first start (the first sharding epoch);
* ``shards``: how many shards have replicas (grows when a reshard adds shards; never shrinks, because
  a shard keeps answering for its older ids until they are garbage collected);
* ``ports``: ``{"<shard>": [[raft_port, grpc_port], ...]}`` when ports were picked free (``port_base = 0``).
"""
from __future__ import annotations

import fcntl
import json
import sys
from contextlib import contextmanager
from pathlib import Path

from photon import PhotonConfig, ProcessSpec, free_port, write_atomic
from idregistry._shell import ReplicaSpec, spec_to_json
from idregistry._state import Sharding

LAYOUT_FILE = "layout.json"


@contextmanager
def _locked_layout(data_dir: Path):
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "layout.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = data_dir / LAYOUT_FILE
        layout = json.loads(path.read_text()) if path.exists() else {}
        before = json.dumps(layout, sort_keys=True)
        yield layout
        if json.dumps(layout, sort_keys=True) != before:
            write_atomic(path, json.dumps(layout, indent=1, sort_keys=True).encode(), durable=True)


def _addresses(config: PhotonConfig, layout: dict, shards: int) -> dict[int, list[tuple[str, str]]]:
    """``{shard: [(raft_addr, grpc_addr), ...]}``, picking and remembering free ports when needed."""
    reg = config.registry
    host = reg.host
    out = {}
    ports = layout.setdefault("ports", {})
    for shard in range(shards):
        if reg.port_base:
            pairs = [(reg.port_base + 2 * (shard * reg.replicas + r), reg.port_base + 2 * (shard * reg.replicas + r) + 1)
                     for r in range(reg.replicas)]
        else:
            known = ports.get(str(shard))
            if not known or len(known) != reg.replicas:
                known = ports[str(shard)] = [[free_port(host), free_port(host)] for _ in range(reg.replicas)]
            pairs = [tuple(p) for p in known]
        out[shard] = [(f"{host}:{raft}", f"{host}:{grpc}") for raft, grpc in pairs]
    return out


def read_layout(config: PhotonConfig, grow_to: int | None = None) -> tuple[dict, dict[int, list[tuple[str, str]]]]:
    """The remembered layout (created on first use) and every shard's addresses. ``grow_to`` raises the
    number of shards with replicas (used by a reshard that adds shards)."""
    with _locked_layout(config.registry_data_dir) as layout:
        layout.setdefault("initial_shards", config.registry.shards)
        layout.setdefault("shards", config.registry.shards)
        if grow_to is not None and grow_to > layout["shards"]:
            layout["shards"] = grow_to
        addresses = _addresses(config, layout, layout["shards"])
        return dict(layout), addresses


def replica_specs(config: PhotonConfig) -> list[ReplicaSpec]:
    layout, addresses = read_layout(config)
    initial = Sharding(epochs=[(0, layout["initial_shards"])], version=1,
                       endpoints={s: [g for _, g in addresses[s]] for s in range(layout["initial_shards"])})
    reg = config.registry
    specs = []
    for shard, pairs in addresses.items():
        for replica in range(len(pairs)):
            specs.append(ReplicaSpec(
                shard=shard, replica=replica, raft_peers=[r for r, _ in pairs], grpc_peers=[g for _, g in pairs],
                data_dir=config.registry_data_dir / f"shard-{shard}" / f"replica-{replica}",
                initial_sharding=initial, gc_after_s=reg.gc_after_s, max_clock_skew_s=reg.max_clock_skew_s,
                fsync=reg.fsync, fsync_interval_ms=reg.fsync_interval_ms, max_in_flight=reg.max_in_flight,
                max_ids_per_command=reg.max_ids_per_command, max_queued_ids=reg.max_queued_ids,
                snapshot_after_commands=reg.snapshot_after_commands, simulated_rtt_ms=reg.simulated_rtt_ms))
    return specs


def registry_processes(config: PhotonConfig) -> list[ProcessSpec]:
    """Every registry replica process for this config, named ``registry-s<shard>-r<replica>``.

    Call it again at any time: the same config names the same processes with the same argv (ports are
    remembered in the data dir); after a reshard that adds shards it also names the new shards' replicas.
    """
    regions = config.registry.replica_regions
    default_region = config.regions[0].name if config.regions else ""
    out = []
    for spec in replica_specs(config):
        out.append(ProcessSpec(
            name=f"registry-s{spec.shard}-r{spec.replica}",
            argv=[sys.executable, "-m", "idregistry.main", "--spec", spec_to_json(spec)],
            role="registry",
            region=regions[spec.replica] if regions else default_region,
            address=spec.grpc_peers[spec.replica]))
    return out


def registry_endpoints(config: PhotonConfig) -> list[str]:
    """gRPC addresses of shard 0's replicas: enough for a :class:`RegistryClient` to learn the rest."""
    _, addresses = read_layout(config)
    return [g for _, g in addresses[0]]
