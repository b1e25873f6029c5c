"""What one registry replica process is told (:class:`ReplicaSpec`), and its JSON form on the command line.

Kept apart from the replica's server (:mod:`idregistry._shell`) so that the launcher plans replicas
(:mod:`idregistry._layout`) without importing gRPC, pysyncobj and the replica itself.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from idregistry._state import Sharding

if TYPE_CHECKING:
    from idregistry._replica import RaftSettings

FSYNC_NONE, FSYNC_BATCH, FSYNC_INTERVAL = "none", "batch", "interval"


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything one replica process needs to know (built by ``registry_processes``)."""
    shard: int
    replica: int
    raft_peers: list        # Raft addresses of this shard's replicas, by replica number
    grpc_peers: list        # gRPC addresses of this shard's replicas, by replica number
    data_dir: Path
    initial_sharding: Sharding = field(default_factory=Sharding)
    gc_after_s: float = 3 * 86400.0
    max_clock_skew_s: float = 60.0
    fsync: str = FSYNC_BATCH
    fsync_interval_ms: float = 5.0
    max_in_flight: int = 4
    max_ids_per_command: int = 20000
    max_queued_ids: int = 200000
    snapshot_after_commands: int = 2000
    simulated_rtt_ms: float = 0.0
    election_timeout_scale: float = 1.0   # > 1: this replica rarely becomes leader (see replica_specs)
    region: str = ""                      # the region it is placed in (a label of its metrics)
    job: str = ""           # non-empty: serves only this job (e.g. "photon verify (pid 7)"), see JobOnly

    @property
    def holder(self) -> str:
        """What this replica writes into its data dir's lock file."""
        return f"registry replica s{self.shard}-r{self.replica}" + (f" for {self.job}" if self.job else "")

    @property
    def raft_address(self) -> str:
        return self.raft_peers[self.replica]

    @property
    def grpc_address(self) -> str:
        return self.grpc_peers[self.replica]

    def raft_settings(self, raft_password: str | None = None) -> RaftSettings:
        # imported here: the launcher plans replicas without importing pysyncobj
        from idregistry._replica import RaftSettings
        s = self.election_timeout_scale
        return RaftSettings(commands_queue=max(64, 4 * self.max_in_flight),
                            raft_min_timeout_s=RaftSettings.raft_min_timeout_s * s,
                            raft_max_timeout_s=RaftSettings.raft_max_timeout_s * s,
                            log_compaction_min_entries=self.snapshot_after_commands,
                            simulated_rtt_ms=self.simulated_rtt_ms, raft_password=raft_password,
                            first_election_rank=self.first_election_rank)

    @property
    def first_election_rank(self) -> int:
        """Replica 0 asks its first pre-vote first, each next replica later; replicas that rarely lead
        (``election_timeout_scale`` > 1) after all the others."""
        return self.replica + (len(self.raft_peers) if self.election_timeout_scale > 1 else 0)


_SPEC_FIELDS = ("shard", "replica", "raft_peers", "grpc_peers", "gc_after_s", "max_clock_skew_s", "fsync",
                "fsync_interval_ms", "max_in_flight", "max_ids_per_command", "max_queued_ids",
                "snapshot_after_commands", "simulated_rtt_ms", "election_timeout_scale", "region", "job")


def spec_to_json(spec: ReplicaSpec) -> str:
    d = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    d["data_dir"] = str(spec.data_dir)
    d["initial_sharding"] = spec.initial_sharding.as_dict()
    return json.dumps(d, sort_keys=True)


def spec_from_json(text: str) -> ReplicaSpec:
    d = json.loads(text)
    d.setdefault("region", "")
    d["data_dir"] = Path(d["data_dir"])
    d["initial_sharding"] = Sharding.from_dict(d["initial_sharding"])
    return ReplicaSpec(**d)
