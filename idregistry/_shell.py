"""One registry replica process: a Raft member of one shard, its batcher, its lease on the sharding config,
and the housekeeping only a leader does (publishing the initial sharding config, advancing the GC boundary).

:class:`ReplicaServer` is the domain face the gRPC servicer calls; it raises :class:`NotLeader` when a
request must go to the leader, :class:`photon.BadEventId` for malformed ids, :class:`ShardingUnknown`
when it cannot judge which shard an id belongs to, and :class:`~idregistry._batcher.Rejected` /
``TimeoutError`` when Raft did not apply a command.

The sharding lease: a replica judges an id against a copy of the sharding config fetched (from shard 0's
leader, after a read barrier) at local time ``f``. Changes only ever start later than the proposer's
now + S (S = the clock-skew bound), so that copy is right for every id whose timestamp is below
``f + S - G``, where G = min(S/2, 1 s) absorbs disagreement between the registry servers' own clocks; for a
later id the replica refetches first, and an id still past the lease (at most G ahead of the horizon) is
answered UNAVAILABLE so the client retries a moment later.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from pathlib import Path

import grpc

from photon import Clock, LatencyHistogram, SystemClock, raft_secret, secret_fingerprint
from idregistry import registry_pb2 as pb
from idregistry import registry_pb2_grpc as pb_grpc
from idregistry._batcher import Batcher
from idregistry._spec import (FSYNC_BATCH, FSYNC_INTERVAL, FSYNC_NONE, ReplicaSpec,  # noqa: F401 (re-exported)
                              spec_from_json, spec_to_json)
from idregistry._replica import JOURNAL_FILE, QUEUE_FULL_REASONS, RaftReplica, storage_failed
from idregistry._trace import install_replica
from photon.rpc import open_channel
from idregistry._state import (OP_ADD_EPOCH, OP_ADVANCE_GC, OP_CLEAR_TOKENS, OP_COMMIT_RUNS, OP_DELETE,
                               OP_INIT_SHARDING, OP_NOOP, OP_SNAPSHOT, CommitResult, Sharding, ShardingLease, ShardState,
                               bucket_width_us, pack_ids, run_ids, runs_count, runs_newest, runs_of,
                               split_checked, validate_ids)

log = logging.getLogger("idregistry.server")

SERVER_CLOCK_GUARD_US = 1_000_000   # registry servers' clocks may disagree by this much (or S/2 if smaller)
BARRIER_RETRY_S = 2.0               # a catch-up no-op unanswered this long is sent again


class NotLeader(Exception):
    """This replica cannot decide; ``leader`` is the leader's gRPC address ("" when unknown)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ShardingUnknown(Exception):
    """This replica has no sharding config fresh enough to judge the ids it was sent (retry later)."""


class JobOnly(Exception):
    """This replica was started for a job (``photon verify``/``recover``/``registry export`` with no
    registry running) and refuses what only the pipeline sends: commits, token clearing, reshards."""

    def __init__(self, job: str, what: str) -> None:
        super().__init__(f"this registry runs only for {job}: {what} refused until it stops and the pipeline's "
                         f"registry runs again")


class CatchingUp(Exception):
    """This replica started recently and has not yet applied an entry of the current leader's term, so its
    copy may miss committed operations (deletes too): it does not answer lookups yet."""


class FutureId(ValueError):
    """An id whose timestamp is further ahead of this replica's clock than the clock-skew bound."""


def _raft_password(spec: ReplicaSpec) -> str | None:
    """The Raft secret (see :func:`photon.raft_secret`), logged by fingerprint; an ``OSError`` (the replica
    refuses to start) when TLS is on and no secret can be had, so Raft never runs in the clear under TLS."""
    secret, source = raft_secret()
    if secret:
        log.info("registry shard %d replica %d: Raft traffic authenticated and encrypted with a secret %s "
                 "(fingerprint %s; replicas with another fingerprint cannot join this group)", spec.shard,
                 spec.replica, source, secret_fingerprint(secret))
    else:
        log.info("registry shard %d replica %d: Raft traffic in the clear ([tls] off and no "
                    "raft_secret_file)", spec.shard, spec.replica)
    return secret


class ReplicaServer:
    """Start with the spec; ``close()`` stops the batcher and leaves the Raft group."""

    def __init__(self, spec: ReplicaSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock = clock or SystemClock()
        self._skew_us = int(spec.max_clock_skew_s * 1e6)
        self._lease_us = self._skew_us - min(self._skew_us // 2, SERVER_CLOCK_GUARD_US)
        self._raft_to_grpc = dict(zip(spec.raft_peers, spec.grpc_peers))
        journal = str(Path(spec.data_dir) / JOURNAL_FILE)      # made once: the fsync thread names it per fsync
        self._syncer = None if spec.fsync == FSYNC_NONE else _Syncer(
            lambda: journal,
            interval_s=spec.fsync_interval_ms / 1000 if spec.fsync == FSYNC_INTERVAL else 0.0)
        state = ShardState(spec.shard, bucket_width_us(spec.gc_after_s))
        batch = spec.fsync == FSYNC_BATCH
        try:
            self.raft = RaftReplica(spec.raft_address, list(spec.raft_peers), Path(spec.data_dir), state,
                                    spec.raft_settings(_raft_password(spec)),
                                    ack_after_sync=self._syncer.after_sync if batch else None,
                                    on_append=self._syncer.appended if self._syncer else None,
                                    on_replace=self._syncer.replaced if self._syncer else None, holder=spec.holder)
        except BaseException:
            if self._syncer is not None:
                self._syncer.close()
            raise
        self.batcher = Batcher(self.raft.submit, lambda reason: reason in QUEUE_FULL_REASONS,
                               max_in_flight=spec.max_in_flight, max_ids_per_command=spec.max_ids_per_command,
                               max_queued_ids=spec.max_queued_ids, name=f"registry-batcher-{spec.shard}",
                               deliver=self._syncer.after_sync if batch else None)
        self._lease: ShardingLease | None = None
        self._lease_lock = threading.Lock()
        self._meta_channels: dict[str, pb_grpc.RegistryStub] = {}
        self._meta_leader = ""
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._caught_up = threading.Event()     # set once a barrier of this replica's was applied here
        self._barrier_sent = 0.0                # monotonic time of the last catch-up no-op sent
        self._rates = _Rates()
        self._housekeeper = threading.Thread(target=self._housekeeping, name="registry-housekeeping",
                                             daemon=True)
        self._housekeeper.start()
        self._trace = install_replica(self)     # None unless PHOTON_REGISTRY_TRACE names a folder

    # ---- requests ----------------------------------------------------------------------------------

    @property
    def state(self) -> ShardState:
        return self.raft.state

    def _require_leader(self) -> None:
        if not self.raft.is_leader():
            leader = self.raft.leader()
            raise NotLeader(self._raft_to_grpc.get(leader, "") if leader else "")

    def lookup(self, ids: list[str]) -> tuple[list[bool], list[int]]:
        """``(present per id, indexes of ids of another shard)``; answered from this replica's copy.
        A stale "absent" only costs a wasted join, so lookups never wait for a fresh sharding lease. A
        replica that has just started raises :class:`CatchingUp` until it has caught up once (see
        :meth:`_catch_up`): until then its copy may still hold ids that recovery deleted, and a stale
        "present" would make a dispatcher drop a re-injected click as already joined."""
        if not self._caught_up.is_set():
            raise CatchingUp(f"registry shard {self.spec.shard} replica {self.spec.replica} has just started and "
                             f"is catching up with the leader; retry in a moment")
        held = self.state.lookup(ids)       # checked and parsed at once; raises BadEventId first
        return held, self.sharding().wrong_shard(self.spec.shard, ids)

    def _refuse_for_job(self, what: str) -> None:
        if self.spec.job:
            raise JobOnly(self.spec.job, what)

    def commit(self, token: str, ids: list[str]) -> bytes:
        """One :class:`CommitResult` byte per id, decided by the leader after replication."""
        self._refuse_for_job("commits are")
        self._require_leader()
        runs = runs_of(*split_checked(ids))     # checked and packed at once; the newest timestamp falls out of it
        wrong = self._judge(ids, runs_newest(runs)).wrong_shard(self.spec.shard, ids)
        if not wrong:
            return self.batcher.run((OP_COMMIT_RUNS, token, runs, self.clock.now_us()), len(ids))
        wrong_set = set(wrong)
        mine = [i for n, i in enumerate(ids) if n not in wrong_set]
        decided = iter(self.batcher.run((OP_COMMIT_RUNS, token, pack_ids(mine), self.clock.now_us()), len(mine))
                       if mine else b"")
        return bytes(CommitResult.WRONG_SHARD if n in wrong_set else next(decided) for n in range(len(ids)))

    def commit_runs(self, token: str, runs) -> bytes:
        """:meth:`commit` of ids the client packed (checked :func:`~idregistry._state.runs_from_wire` runs):
        with one shard, nothing is done id by id here; otherwise the ids are judged one by one."""
        self._refuse_for_job("commits are")
        self._require_leader()
        if self._judge((), runs_newest(runs)).one_shard and self.spec.shard == 0:
            return self.batcher.run((OP_COMMIT_RUNS, token, runs, self.clock.now_us()), runs_count(runs))
        return self.commit(token, run_ids(runs))

    def clear_tokens(self, ids: list[str]) -> tuple[int, list[int]]:
        self._refuse_for_job("clearing tokens is")
        self._require_leader()
        validate_ids(ids)
        wrong = set(self._judge(ids).wrong_shard(self.spec.shard, ids))
        mine = [i for n, i in enumerate(ids) if n not in wrong]
        cleared = self.batcher.run((OP_CLEAR_TOKENS, mine), len(mine)) if mine else 0
        return cleared, sorted(wrong)

    def delete(self, event_id: str, expected_token: str) -> bool | None:
        """True when deleted, False when absent or the token differs, None for an id of another shard."""
        self._require_leader()
        validate_ids([event_id])
        if self._judge([event_id]).wrong_shard(self.spec.shard, [event_id]):
            return None
        return self.batcher.run((OP_DELETE, event_id, expected_token), 1)

    def export(self):
        """Every held ``(id, token, timestamp_us, registered_us)`` (see :meth:`ShardSnapshot.rows`) of this
        shard as of one log position (leader only): a
        replicated read barrier copies the entries between two commands, so the export holds every id
        committed before it was asked for and none half-applied; ids committed later are not in it."""
        self._require_leader()
        return self.batcher.run((OP_SNAPSHOT,), 1).rows()

    def reshard(self, start_us: int, shards: int, endpoints: dict) -> str | None:
        """Add a sharding epoch (shard 0's leader only). Returns why it was refused, or None."""
        if self.spec.shard != 0:
            return f"reshard must be sent to shard 0, not shard {self.spec.shard}"
        self._refuse_for_job("resharding is")
        self._require_leader()
        self._ensure_sharding_initialised()
        return self.batcher.run((OP_ADD_EPOCH, int(start_us), int(shards), endpoints, self.clock.now_us(),
                                 self._skew_us), 1)

    # ---- the sharding config -----------------------------------------------------------------------

    def sharding(self) -> Sharding:
        """The newest config this replica knows (for routing hints; judging uses the lease)."""
        lease = self._lease
        state = self.state
        if self.spec.shard == 0 and state.sharding_set:
            if lease is None or state.sharding.version >= lease.sharding.version:
                return state.sharding
        return lease.sharding if lease is not None else self.spec.initial_sharding

    def authoritative_sharding(self) -> Sharding:
        """Shard 0's leader only: the config after a read barrier (every committed change applied)."""
        if self.spec.shard != 0:
            raise NotLeader("")
        self._require_leader()
        self._ensure_sharding_initialised()
        self.batcher.run((OP_NOOP,), 1)
        return self.state.sharding

    def _ensure_sharding_initialised(self) -> None:
        if not self.state.sharding_set:
            self.batcher.run((OP_INIT_SHARDING, self.spec.initial_sharding), 1)

    def _judge(self, ids: list[str], newest: int | None = None) -> Sharding:
        """A config valid for every id of ``ids`` (refreshing the lease if needed); ``newest`` is their
        newest timestamp when the caller knows it already."""
        if newest is None:
            newest = ShardingLease.newest(ids)
        lease = self._lease
        if lease is not None and newest < lease.valid_below_us:
            return lease.sharding
        now = self.clock.now_us()
        lease = self._refresh_lease(now)
        if newest < lease.valid_below_us:
            return lease.sharding
        if newest > now + self._skew_us:
            raise FutureId(f"an id is timestamped {newest} us, more than the clock-skew bound "
                           f"({self.spec.max_clock_skew_s} s) ahead of this server's clock")
        raise ShardingUnknown(f"an id timestamped {newest} us is past this replica's sharding lease "
                              f"({lease.valid_below_us} us); retry in a moment")

    def _refresh_lease(self, newer_than_us: int = 0) -> ShardingLease:
        with self._lease_lock:
            lease = self._lease
            if lease is not None and lease.valid_below_us - self._lease_us >= newer_than_us:
                return lease          # another thread refreshed while we waited
            asked_at = self.clock.now_us()
            sharding = self._fetch_sharding()
            lease = self._lease = ShardingLease.fetched(sharding, asked_at, self._lease_us)
            return lease

    def _fetch_sharding(self) -> Sharding:
        if self.spec.shard == 0 and self.raft.is_leader():
            return self.authoritative_sharding()
        replicas = list(self.spec.initial_sharding.endpoints.get(0, []))
        order = ([self._meta_leader] if self._meta_leader else []) + [r for r in replicas if r != self._meta_leader]
        errors, tried = [], set()
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            tried.add(address)
            stub = self._meta_channels.get(address)
            if stub is None:
                stub = self._meta_channels[address] = pb_grpc.RegistryStub(open_channel(address, []))
            try:
                reply = stub.GetSharding(pb.ShardingRequest(authoritative=True), timeout=2.0)
            except grpc.RpcError as e:
                errors.append(f"{address}: {e.code().name}")
                continue
            if reply.redirect:
                if reply.redirect != "?" and reply.redirect not in tried:
                    order.insert(0, reply.redirect)
                continue
            self._meta_leader = address
            return Sharding.from_dict(json.loads(reply.sharding_json))
        raise ShardingUnknown(f"shard {self.spec.shard}: cannot reach shard 0's leader for the sharding config "
                              f"({'; '.join(errors) or 'no leader'})")

    # ---- housekeeping (leader decisions, lease refresh, fsync policy, rates) ----------------------

    def _housekeeping(self) -> None:
        refresh_every = min(1.0, self._lease_us / 4e6)
        last = {"leader": 0.0, "lease": 0.0}
        while not self._stop.wait(0.05):
            now = time.monotonic()
            if not self._caught_up.is_set():
                self._quietly(self._catch_up)
            if now - last["leader"] >= 0.2:
                last["leader"] = now
                self._rates.sample(self.batcher.stats, now)
                self._quietly(self._leader_work)
            if now - last["lease"] >= refresh_every:
                last["lease"] = now
                self._quietly(lambda: self._refresh_lease(self.clock.now_us()))

    def _quietly(self, fn) -> None:
        try:
            fn()
        except Exception:   # lost leadership or an unreachable shard 0: the next round retries
            log.debug("registry housekeeping step failed", exc_info=True)

    def _catch_up(self) -> None:
        """Until it succeeds once: replicate a no-op from this replica. pysyncobj calls back with success
        only once this replica has applied that entry, which the leader appended in its current term, so
        every operation committed before (a recovery's deletes before a restart included) is applied here
        too. After a restart a replica applies only up to the commit index it had saved (pysyncobj saves it
        once a second), the rest once a leader commits an entry of its own term: this waits for that. A
        no-op unanswered for :data:`BARRIER_RETRY_S` (its message lost) is sent again."""
        now = time.monotonic()
        if self._caught_up.is_set() or now - self._barrier_sent < BARRIER_RETRY_S:
            return
        self._barrier_sent = now

        def done(_result, error) -> None:
            if error == 0:
                self._caught_up.set()
            else:
                self._barrier_sent = 0.0        # no leader yet, or it changed: try again at once
        self.raft.submit([(OP_NOOP,)], done)

    def _leader_work(self) -> None:
        if not self.raft.is_leader():
            return
        state = self.state
        if self.spec.shard == 0:
            self._ensure_sharding_initialised()
        boundary = self.clock.now_us() - int(self.spec.gc_after_s * 1e6)
        if boundary - state.gc_boundary_us >= min(state.bucket_us // 4, 1_000_000):
            self.batcher.run((OP_ADVANCE_GC, boundary), 1)

    # ---- seeing it ---------------------------------------------------------------------------------

    def status(self) -> dict:
        raft = self.raft.raft_status()
        state = self.state
        stats = self.batcher.stats
        leader = self.raft.leader()
        lease = self._lease
        saved = state.token_bytes_saved()
        return {
            "shard": self.spec.shard, "replica": self.spec.replica, "address": self.spec.grpc_address,
            "raft_address": self.spec.raft_address, "pid": os.getpid(),
            "is_leader": self.raft.is_leader(), "leader": self._raft_to_grpc.get(leader, "") if leader else "",
            "caught_up": self._caught_up.is_set(),
            "term": raft["raft_term"], "commit_index": raft["commit_idx"], "last_applied": raft["last_applied"],
            "log_len": raft["log_len"], "ids_held": state.ids_held, "bytes_held": state.approx_bytes(),
            "tokens_dropped_ids": saved[0], "bytes_saved_by_clearing": saved[1],
            "gc_boundary_us": state.gc_boundary_us, "bucket_us": state.bucket_us,
            "queue_depth": self.batcher.queue_depth(), "queued_ids": self.batcher.queued_ids(),
            "in_flight": stats.in_flight, "commands": stats.commands, "ids_committed": stats.ids,
            "refused_overloaded": stats.refused,
            "batch_ids_histogram": {str(k): v for k, v in sorted(stats.batch_ids_histogram.items())},
            "commands_per_s": round(self._rates.commands_per_s, 1), "ids_per_s": round(self._rates.ids_per_s, 1),
            "sharding": self.sharding().as_dict(),
            "sharding_lease_until_us": lease.valid_below_us if lease else 0,
            "fsync": self.spec.fsync, "fsyncs": self._syncer.fsyncs if self._syncer else 0,
            "fsync_ms_mean": self._syncer.mean_ms() if self._syncer else 0.0,
            "fsync_latency_hist": self._syncer.latency_json() if self._syncer else {},
            "uptime_s": round(time.monotonic() - self._started, 3),
            "first_election": dataclasses.asdict(first) if (first := self.raft.first_election_statistics()) else {},
        }

    def serving_problem(self) -> str | None:
        """Why this replica should not be sent requests now (None: it can serve): stopping, or its Raft
        member has no leader it is connected to (see :meth:`RaftReplica.serving_problem`)."""
        if self._stop.is_set():
            return "stopping"
        return self.raft.serving_problem()

    def close(self) -> None:
        self._stop.set()
        self.batcher.close()
        self.raft.destroy()
        if self._syncer is not None:
            self._syncer.close()
        self._housekeeper.join(timeout=2)


class _Syncer:
    """Flushes the Raft journal to disk off the Raft thread, grouping fsyncs.

    ``appended()`` after an entry was written to the journal (the thread starts an fsync as soon as it is
    free). ``after_sync(fn)`` runs ``fn`` once every entry written before the call is on disk: at once if
    a finished fsync already covered them, else after the fsync that does. The leader answers clients this
    way ("batch"): its fsync of an entry runs while the entry is being replicated, so by the time the
    followers' acknowledgements are in it is usually done. With ``interval_s`` the journal is flushed at
    most that often and nothing waits for it ("interval").

    A failed fsync is fail-stop: no waiter runs (so no client gets OK and no follower acknowledges), later
    ``after_sync`` calls never run theirs, and ``on_failure(what, error)`` is called (the replica's default
    logs why and exits; the supervisor restarts it and it reads its journal back from the disk). A later
    fsync that succeeds proves nothing after one failed (the kernel may have dropped the dirty pages).

    By default the thread keeps the journal open and fsyncs that descriptor (one system call per fsync, not
    an open, an fsync and a close: each releases the GIL, which a busy leader pays in thread switches).
    ``replaced()`` must be called when a new file takes the journal's path (compaction renames one over
    it) before anything is written to the new file: the next fsync opens the path again. Entries written
    before the replacement are in the new file, which the compaction fsynced, so an fsync of the old
    descriptor still covers every entry counted before it. With ``fsync`` given, ``fsync(path)`` is
    called instead (tests)."""

    def __init__(self, path, interval_s: float = 0.0, *, fsync=None, on_failure=storage_failed) -> None:
        self._path = path
        self._fsync = fsync
        self._fd: int | None = None     # the journal, kept open by the thread (fsync is None)
        self._reopen = False            # the journal's path names a new file: open it before the next fsync
        self._on_failure = on_failure
        self.failed: BaseException | None = None
        self._interval_s = interval_s
        self._cond = threading.Condition()
        self._dirty = False
        self._appended = 0          # entries written so far
        self._synced = 0            # entries on disk (the count an fsync started with, once it finished)
        self._waiting: list[tuple[int, object]] = []
        self._closed = False
        self._closing = threading.Event()
        self.fsyncs = 0
        self._seconds = 0.0
        self._latency = LatencyHistogram()      # every fsync's duration (µs); read under _cond
        self._thread = threading.Thread(target=self._run, name="registry-fsync", daemon=True)
        self._thread.start()

    def appended(self) -> None:
        with self._cond:
            self._appended += 1
            self._dirty = True
            self._cond.notify()

    def replaced(self) -> None:
        """A new file took the journal's path (before anything is written to it)."""
        with self._cond:
            self._reopen = True

    def after_sync(self, fn) -> None:
        with self._cond:
            if self.failed is not None:
                return                      # never: the journal may not be on disk
            need = self._appended
            if self._synced < need:
                self._waiting.append((need, fn))
                self._dirty = True
                self._cond.notify()
                return
        fn()

    def latency_json(self) -> dict:
        """Every fsync's duration so far, as :meth:`photon.LatencyHistogram.to_json`."""
        with self._cond:
            return self._latency.to_json()

    def mean_ms(self) -> float:
        return round(1000 * self._seconds / self.fsyncs, 3) if self.fsyncs else 0.0

    def _run(self) -> None:
        try:
            self._loop()
        finally:                    # the thread owns the descriptor: closed here, never under a running fsync
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait(0.5)
                if self._closed and not self._waiting:
                    return
                self._dirty = False
                covering = self._appended
                reopen, self._reopen = self._reopen, False
            t = time.perf_counter()
            try:
                self._flush(reopen)
            except OSError as e:
                with self._cond:
                    self.failed = e
                    self._waiting = []
                self._on_failure("fsync of the Raft journal", e)
                return
            took = time.perf_counter() - t
            self._seconds += took
            self.fsyncs += 1
            with self._cond:
                self._latency.add(int(took * 1e6))
                self._synced = max(self._synced, covering)
                ready = [fn for need, fn in self._waiting if need <= covering]
                self._waiting = [(need, fn) for need, fn in self._waiting if need > covering]
                if self._waiting:
                    self._dirty = True
            for fn in ready:
                try:
                    fn()
                except Exception:   # one failing waiter must not stop the fsyncs every other one needs
                    log.exception("a callback after the journal fsync failed")
            if self._interval_s:
                self._closing.wait(self._interval_s)

    def _flush(self, reopen: bool) -> None:
        if self._fsync is not None:
            self._fsync(self._path())
            return
        if reopen and self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
        if self._fd is None:
            self._fd = os.open(self._path(), os.O_RDONLY)
        os.fsync(self._fd)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._closing.set()
        self._thread.join(timeout=2)    # the thread closes the journal on its way out, also after this gives up


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
