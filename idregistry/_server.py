"""One registry replica process: a Raft member of one shard, its batcher, and the housekeeping that only a
leader does (publishing the initial sharding config, advancing the GC boundary).

:class:`ReplicaServer` is the domain face the gRPC servicer calls; it raises :class:`NotLeader` when a
request must go to the leader, :class:`photon.BadEventId` for malformed ids, and
:class:`~idregistry._batcher.Rejected` / ``TimeoutError`` when Raft did not apply a command.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from photon import Clock, SystemClock
from idregistry._batcher import Batcher, op_size
from idregistry._replica import QUEUE_FULL_REASONS, RaftReplica, RaftSettings, fsync_path
from idregistry._state import (OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT, OP_DELETE, OP_SET_SHARDING,
                               CommitResult, Sharding, ShardState, bucket_width_us, validate_ids)

log = logging.getLogger("idregistry.server")

FSYNC_NONE, FSYNC_BATCH, FSYNC_INTERVAL = "none", "batch", "interval"


class NotLeader(Exception):
    """This replica cannot decide; ``leader`` is the leader's gRPC address ("" when unknown)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ShardingUnknown(Exception):
    """This replica has no sharding config fresh enough to judge the ids it was sent."""


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
    raft: RaftSettings = field(default_factory=RaftSettings)

    @property
    def raft_address(self) -> str:
        return self.raft_peers[self.replica]

    @property
    def grpc_address(self) -> str:
        return self.grpc_peers[self.replica]


class ReplicaServer:
    """Start with the spec; ``close()`` stops the batcher and leaves the Raft group."""

    def __init__(self, spec: ReplicaSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock = clock or SystemClock()
        self._raft_to_grpc = dict(zip(spec.raft_peers, spec.grpc_peers))
        self._journal_dirty = False
        state = ShardState(spec.shard, bucket_width_us(spec.gc_after_s))
        self.raft = RaftReplica(spec.raft_address, list(spec.raft_peers), Path(spec.data_dir), state,
                                spec.raft, on_applied=self._on_applied)
        self.batcher = Batcher(self.raft.submit, lambda reason: reason in QUEUE_FULL_REASONS,
                               max_in_flight=spec.max_in_flight, max_ids_per_command=spec.max_ids_per_command,
                               name=f"registry-batcher-{spec.shard}")
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._rates = _Rates()
        self._housekeeper = threading.Thread(target=self._housekeeping, name="registry-housekeeping",
                                             daemon=True)
        self._housekeeper.start()

    # ---- requests ----------------------------------------------------------------------------------

    @property
    def state(self) -> ShardState:
        return self.raft.state

    def sharding(self) -> Sharding:
        state = self.state
        return state.sharding if state.sharding_set else self.spec.initial_sharding

    def _require_leader(self) -> None:
        if not self.raft.is_leader():
            leader = self.raft.leader()
            raise NotLeader(self._raft_to_grpc.get(leader, "") if leader else "")

    def lookup(self, ids: list[str]) -> tuple[list[bool], list[int]]:
        """``(present per id, indexes of ids of another shard)``; answered from this replica's copy."""
        validate_ids(ids)
        wrong = self.sharding().wrong_shard(self.spec.shard, ids)
        return self.state.lookup(ids), wrong

    def commit(self, token: str, ids: list[str]) -> bytes:
        """One :class:`CommitResult` byte per id, decided by the leader after replication."""
        self._require_leader()
        validate_ids(ids)
        wrong = self.sharding().wrong_shard(self.spec.shard, ids)
        if not wrong:
            return self.batcher.run((OP_COMMIT, token, list(ids)), len(ids))
        wrong_set = set(wrong)
        mine = [i for n, i in enumerate(ids) if n not in wrong_set]
        decided = iter(self.batcher.run((OP_COMMIT, token, mine), len(mine)) if mine else b"")
        return bytes(CommitResult.WRONG_SHARD if n in wrong_set else next(decided) for n in range(len(ids)))

    def clear_tokens(self, ids: list[str]) -> tuple[int, list[int]]:
        self._require_leader()
        validate_ids(ids)
        wrong = set(self.sharding().wrong_shard(self.spec.shard, ids))
        mine = [i for n, i in enumerate(ids) if n not in wrong]
        cleared = self.batcher.run((OP_CLEAR_TOKENS, mine), len(mine)) if mine else 0
        return cleared, sorted(wrong)

    def delete(self, event_id: str, expected_token: str) -> bool | None:
        """True when deleted, False when absent or the token differs, None for an id of another shard."""
        self._require_leader()
        validate_ids([event_id])
        if self.sharding().wrong_shard(self.spec.shard, [event_id]):
            return None
        return self.batcher.run((OP_DELETE, event_id, expected_token), 1)

    def export(self):
        return self.state.entries()

    # ---- housekeeping (leader decisions, fsync policy, rates) -------------------------------------

    def _on_applied(self, ops) -> None:
        if self.spec.fsync == FSYNC_BATCH:
            fsync_path(self.raft.journal_path())
        elif self.spec.fsync == FSYNC_INTERVAL:
            self._journal_dirty = True

    def _housekeeping(self) -> None:
        interval = self.spec.fsync_interval_ms / 1000 if self.spec.fsync == FSYNC_INTERVAL else 0.2
        last_leader_work = 0.0
        while not self._stop.wait(min(interval, 0.2)):
            if self._journal_dirty:
                self._journal_dirty = False
                fsync_path(self.raft.journal_path())
            now = time.monotonic()
            if now - last_leader_work >= 0.2:
                last_leader_work = now
                self._rates.sample(self.batcher.stats, now)
                try:
                    self._leader_work()
                except Exception:   # a lost leadership mid-way: the next round retries
                    log.debug("leader housekeeping failed", exc_info=True)

    def _leader_work(self) -> None:
        if not self.raft.is_leader():
            return
        state = self.state
        if self.spec.shard == 0 and not state.sharding_set:
            self.batcher.run((OP_SET_SHARDING, self.spec.initial_sharding), 1)
        boundary = self.clock.now_us() - int(self.spec.gc_after_s * 1e6)
        if boundary - state.gc_boundary_us >= min(state.bucket_us // 4, 1_000_000):
            self.batcher.run((OP_ADVANCE_GC, boundary), 1)

    # ---- seeing it ---------------------------------------------------------------------------------

    def status(self) -> dict:
        raft = self.raft.raft_status()
        state = self.state
        stats = self.batcher.stats
        leader = self.raft.leader()
        return {
            "shard": self.spec.shard, "replica": self.spec.replica, "address": self.spec.grpc_address,
            "raft_address": self.spec.raft_address, "pid": os.getpid(),
            "is_leader": self.raft.is_leader(), "leader": self._raft_to_grpc.get(leader, "") if leader else "",
            "term": raft["raft_term"], "commit_index": raft["commit_idx"], "last_applied": raft["last_applied"],
            "log_len": raft["log_len"], "ids_held": state.ids_held, "bytes_held": state.approx_bytes(),
            "gc_boundary_us": state.gc_boundary_us, "queue_depth": self.batcher.queue_depth(),
            "in_flight": stats.in_flight, "commands": stats.commands, "ids_committed": stats.ids,
            "batch_ids_histogram": {str(k): v for k, v in sorted(stats.batch_ids_histogram.items())},
            "commands_per_s": round(self._rates.commands_per_s, 1), "ids_per_s": round(self._rates.ids_per_s, 1),
            "sharding": self.sharding().as_dict(), "fsync": self.spec.fsync,
            "uptime_s": round(time.monotonic() - self._started, 3),
        }

    def close(self) -> None:
        self._stop.set()
        self.batcher.close()
        self.raft.destroy()
        self._housekeeper.join(timeout=2)


class _Rates:
    """Commands/s and ids/s over the last few seconds, from the batcher's counters."""

    def __init__(self) -> None:
        self._samples: list[tuple[float, int, int]] = []
        self.commands_per_s = 0.0
        self.ids_per_s = 0.0

    def sample(self, stats, now: float) -> None:
        self._samples.append((now, stats.commands, stats.ids))
        while len(self._samples) > 2 and now - self._samples[0][0] > 5.0:
            self._samples.pop(0)
        t0, c0, i0 = self._samples[0]
        if now > t0:
            self.commands_per_s = (stats.commands - c0) / (now - t0)
            self.ids_per_s = (stats.ids - i0) / (now - t0)


def spec_to_json(spec: ReplicaSpec) -> str:
    return json.dumps({
        "shard": spec.shard, "replica": spec.replica, "raft_peers": list(spec.raft_peers),
        "grpc_peers": list(spec.grpc_peers), "data_dir": str(spec.data_dir),
        "initial_sharding": spec.initial_sharding.as_dict(), "gc_after_s": spec.gc_after_s,
        "max_clock_skew_s": spec.max_clock_skew_s, "fsync": spec.fsync,
        "fsync_interval_ms": spec.fsync_interval_ms, "max_in_flight": spec.max_in_flight,
        "max_ids_per_command": spec.max_ids_per_command,
    })


def spec_from_json(text: str) -> ReplicaSpec:
    d = json.loads(text)
    d["data_dir"] = Path(d["data_dir"])
    d["initial_sharding"] = Sharding.from_dict(d["initial_sharding"])
    return ReplicaSpec(**d)


__all__ = ["FSYNC_BATCH", "FSYNC_INTERVAL", "FSYNC_NONE", "NotLeader", "ReplicaServer", "ReplicaSpec",
           "ShardingUnknown", "op_size", "spec_from_json", "spec_to_json"]
