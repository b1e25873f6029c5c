"""Where the registry's replicas run: ports, data dirs and the argv of every replica process.

The layout is remembered in ``<registry_data_dir>/layout.json`` so that every call (and every restart of
the launcher) names the same processes on the same ports:

* ``initial_shards``: the shard count of the very first start (the first sharding epoch);
* ``shards``: how many shards have replicas (grows when a reshard adds shards; never shrinks, because
  a shard keeps answering for its older ids until they are garbage collected);
* ``ports``: ``{"<shard>": [[raft_port, grpc_port], ...]}`` when ports were picked free (no ``port_base``).

Each replica runs in the region ``replica_placement`` gives it, binds that region's ``host`` and, when the
region has a ``port_base``, fixed ports derived from it; its data dir is under that region's state dir
(unless ``[registry].data_dir`` is set).
"""
from __future__ import annotations

import fcntl
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from photon import REGION_PORTS, ConfigError, PhotonConfig, ProcessSpec, free_port, remembered_ports, write_atomic
from idregistry._spec import ReplicaSpec, spec_to_json
from idregistry._state import Sharding

LAYOUT_FILE = "layout.json"
REGISTRY_ONLY_ELECTION_SCALE = 3.0
"""Election timeouts of replicas in registry-only regions, in multiples of the default (1-2 s)."""


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



def replica_placement(config: PhotonConfig) -> list[str]:
    """The region of each replica of a shard, by replica number (``[registry].replica_regions``, which the
    config fills in for three or more regions; otherwise every replica in the first region)."""
    return list(config.registry.replica_regions) or [config.regions[0].name] * config.registry.replicas


def addresses_fixed(config: PhotonConfig) -> bool:
    """True when every replica's address follows from the config alone (a ``port_base`` of its region or
    ``[registry].port_base``), so every machine sharing the config names the same replicas."""
    return bool(config.registry.port_base) or all(config.region(r).port_base for r in replica_placement(config))


def _fixed_ports(config: PhotonConfig, shard: int, replica: int) -> tuple[int, int, int] | None:
    """(raft, grpc, metrics) ports of one replica when the config fixes them, else None (metrics 0: the
    replica picks a free one)."""
    reg = config.registry
    region = config.region(replica_placement(config)[replica])
    g = shard * reg.replicas + replica
    if region.port_base:
        raft = region.port_base + REGION_PORTS["registry"] + 3 * g
        return raft, raft + 1, raft + 2
    if reg.port_base:
        return reg.port_base + 2 * g, reg.port_base + 2 * g + 1, 0
    return None


def _addresses(config: PhotonConfig, layout: dict, shards: int) -> dict[int, list[tuple[str, str, str]]]:
    """``{shard: [(raft_addr, grpc_addr, metrics_addr), ...]}``: each replica at its region's host (or
    ``[registry].host``), on ports fixed by the config or picked free once and remembered in ``layout``.
    The metrics address is empty when the replica picks its metrics port itself."""
    reg = config.registry
    placement = replica_placement(config)
    out = {}
    ports = layout.setdefault("ports", {})
    for shard in range(shards):
        hosts = [config.region(placement[r]).bind_host(reg.host) for r in range(reg.replicas)]
        fixed = [_fixed_ports(config, shard, r) for r in range(reg.replicas)]
        if any(f is None for f in fixed):
            known = ports.get(str(shard))
            if not known or len(known) != reg.replicas:
                known = ports[str(shard)] = [[free_port(hosts[r]), free_port(hosts[r])] for r in range(reg.replicas)]
            fixed = [f if f is not None else (known[r][0], known[r][1], 0) for r, f in enumerate(fixed)]
        out[shard] = [(f"{hosts[r]}:{raft}", f"{hosts[r]}:{grpc}", f"{hosts[r]}:{metrics}" if metrics else "")
                      for r, (raft, grpc, metrics) in enumerate(fixed)]
    return out


def layout_dir(config: PhotonConfig, regions: list[str] | None = None) -> Path:
    """Where ``layout.json`` lives: ``[registry].data_dir``, else the registry folder of the first region
    this launcher runs (``regions``), else of the config's first region."""
    if config.registry.data_dir or not regions:
        return config.registry_data_dir
    return Path(config.region(regions[0]).state_dir) / "registry"


def replica_data_dir(config: PhotonConfig, shard: int, replica: int) -> Path:
    """``[registry].data_dir``/shard-s/replica-r, else under the state dir of the replica's region."""
    root = config.registry_data_dir if config.registry.data_dir else \
        Path(config.region(replica_placement(config)[replica]).state_dir) / "registry"
    return root / f"shard-{shard}" / f"replica-{replica}"


def read_layout(config: PhotonConfig, grow_to: int | None = None,
                regions: list[str] | None = None) -> tuple[dict, dict[int, list[tuple[str, str, str]]]]:
    """The remembered layout (created on first use) and every shard's addresses. ``grow_to`` raises the
    number of shards with replicas (used by a reshard that adds shards)."""
    with _locked_layout(layout_dir(config, regions)) as layout:
        layout.setdefault("initial_shards", config.registry.shards)
        layout.setdefault("shards", config.registry.shards)
        if grow_to is not None and grow_to > layout["shards"]:
            layout["shards"] = grow_to
        addresses = _addresses(config, layout, layout["shards"])
        return dict(layout), addresses


def replica_specs(config: PhotonConfig, regions: list[str] | None = None, job: str = "") -> list[ReplicaSpec]:
    layout, addresses = read_layout(config, regions=regions)
    initial = Sharding(epochs=[(0, layout["initial_shards"])], version=1,
                       endpoints={s: [g for _, g, _ in addresses[s]] for s in range(layout["initial_shards"])})
    reg = config.registry
    placement = replica_placement(config)
    # a replica in a registry-only region waits longer before it stands for election, so the leader (to
    # which every commit goes) is almost always in a region that runs a pipeline: one wide-area round trip
    # less for that region's commits; it still takes over when no pipeline region's replica can
    scale = [REGISTRY_ONLY_ELECTION_SCALE if config.region(placement[r]).registry_only else 1.0
             for r in range(reg.replicas)]
    specs = []
    for shard, triples in addresses.items():
        for replica in range(len(triples)):
            specs.append(ReplicaSpec(
                shard=shard, replica=replica, raft_peers=[r for r, _, _ in triples],
                grpc_peers=[g for _, g, _ in triples], data_dir=replica_data_dir(config, shard, replica),
                initial_sharding=initial, gc_after_s=reg.gc_after_s, max_clock_skew_s=reg.max_clock_skew_s,
                fsync=reg.fsync, fsync_interval_ms=reg.fsync_interval_ms, max_in_flight=reg.max_in_flight,
                max_ids_per_command=reg.max_ids_per_command, max_queued_ids=reg.max_queued_ids,
                snapshot_after_commands=reg.snapshot_after_commands, simulated_rtt_ms=reg.simulated_rtt_ms,
                election_timeout_scale=scale[replica], region=placement[replica], job=job))
    return specs


def _check_regions(config: PhotonConfig, regions: list[str] | None) -> None:
    if regions is None or set(regions) >= {r.name for r in config.regions}:
        return
    if not addresses_fixed(config):
        loose = sorted({r for r in replica_placement(config) if not config.region(r).port_base})
        raise ConfigError(f"{config.path}: running only region(s) {', '.join(regions)} needs every registry "
                          f"replica's address fixed by the config, so that every region reaches the same "
                          f"replicas: set port_base in [[regions]] {', '.join(repr(r) for r in loose)} "
                          f"(or [registry].port_base)")


@dataclass(frozen=True)
class ReplicaPlace:
    """Where one replica runs and keeps its data, as the config (and the remembered layout) says."""
    shard: int
    replica: int
    region: str
    grpc_address: str
    data_dir: Path

    @property
    def name(self) -> str:
        """Its process name (as :func:`registry_processes` names it)."""
        return f"registry-s{self.shard}-r{self.replica}"


def replica_places(config: PhotonConfig) -> list[ReplicaPlace]:
    """Every replica of every shard (shards added by a reshard included), in shard then replica order."""
    _, addresses = read_layout(config)
    placement = replica_placement(config)
    return [ReplicaPlace(shard, replica, placement[replica], triples[replica][1],
                         replica_data_dir(config, shard, replica))
            for shard, triples in sorted(addresses.items()) for replica in range(len(triples))]


def registry_processes(config: PhotonConfig, regions: list[str] | None = None, job: str = "") -> list[ProcessSpec]:
    """The registry replica processes for this config, named ``registry-s<shard>-r<replica>``: every
    replica, or with ``regions`` only those placed in these regions (the others run elsewhere and are
    reached at their configured addresses; then every address must be fixed by the config, else
    :class:`photon.ConfigError`).

    Call it again at any time: the same config names the same processes with the same argv (ports are
    fixed or remembered); after a reshard that adds shards it also names the new shards' replicas.
    ``job`` (e.g. ``"photon verify (pid 7)"``) starts them for that job only: they refuse commits, token
    clearing and reshards (see :class:`~idregistry._shell.JobOnly`).
    """
    _check_regions(config, regions)
    placement = replica_placement(config)
    specs = replica_specs(config, regions, job)
    metrics = _metrics_addresses(config, regions)
    out = []
    for spec in specs:
        region = placement[spec.replica]
        if regions is not None and region not in regions:
            continue
        out.append(ProcessSpec(
            name=f"registry-s{spec.shard}-r{spec.replica}",
            argv=[sys.executable, "-m", "idregistry.main", "--spec", spec_to_json(spec)],
            role="registry", region=region, address=spec.grpc_peers[spec.replica],
            metrics_address=metrics[(spec.shard, spec.replica)]))
    return out


def _metrics_addresses(config: PhotonConfig, regions: list[str] | None) -> dict[tuple[int, int], str]:
    """Each replica's Prometheus address: fixed by its region's ``port_base``, else a free port remembered
    in ``ports.json`` beside ``layout.json``."""
    _, addresses = read_layout(config, regions=regions)
    out = {}
    for shard, triples in addresses.items():
        for replica, (_, grpc_addr, metrics) in enumerate(triples):
            if not metrics:
                host = grpc_addr.rsplit(":", 1)[0]
                (port,) = remembered_ports(layout_dir(config, regions), f"metrics-s{shard}-r{replica}", host, 1)
                metrics = f"{host}:{port}"
            out[(shard, replica)] = metrics
    return out


def registry_endpoints(config: PhotonConfig, regions: list[str] | None = None,
                       near: str | None = None) -> list[str]:
    """gRPC addresses of shard 0's replicas: enough for a :class:`RegistryClient` to learn the rest.
    ``regions`` are the regions this launcher runs (as for :func:`registry_processes`); replicas placed in
    region ``near`` come first, so that a client tries a near replica first."""
    _check_regions(config, regions)
    _, addresses = read_layout(config, regions=regions)
    placement = replica_placement(config)
    ordered = sorted(range(len(addresses[0])), key=lambda r: placement[r] != near)
    return [addresses[0][r][1] for r in ordered]
