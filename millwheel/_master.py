"""One master replica process: its Raft member, the batcher that turns requests into replicated facts,
the leader's clock (``TimePassed``), and the gRPC front (:func:`serve_master`).

Requests only enqueue facts; one thread drains the queue into one replicated command per batch (no
minimum batch size, up to ``max_in_flight`` commands travelling at once), and answers each request with
what applying its fact returned. Writes go to the leader; a follower raises :class:`NotLeader` naming the
leader's gRPC address. Reads (the interval map, status) are answered from this replica's copy.

The leader is the only clock: every ``tick_ms`` it proposes ``TimePassed(now)`` (expiring leases and
running a rebalancing round); on taking over it first proposes ``LeaderChanged(now)`` (every lease
restarts: nobody could heartbeat while there was no leader) and declares the configured computations
(a no-op for those already declared).
"""
from __future__ import annotations

import json
import logging
import queue
import signal
import sys
import threading
import uuid
from concurrent import futures
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import grpc

from photon import Clock, SystemClock, free_port, raft_secret, secret_fingerprint
from photon.rpc import add_health, server_credentials

from millwheel import master_pb2 as pb
from millwheel import master_pb2_grpc as pb_grpc
from millwheel._metrics import MASTER_COMPONENT, MASTER_METRIC_KINDS, serve
from millwheel._master_raft import QUEUE_FULL, RaftMember, RaftSettings
from millwheel._master_state import (ComputationDeclared, Heartbeat, Interval, IntervalLoad, LeaderChanged,
                                     MasterState, PlacementPolicy, TimePassed, WorkerJoined, WorkerLeft,
                                     WorkerLoad, WorkerView)

log = logging.getLogger("millwheel.master")

SERVICE_NAME = "photon.millwheel.Master"
GRPC_OPTIONS = [("grpc.max_receive_message_length", 16 * 2**20), ("grpc.max_send_message_length", 16 * 2**20),
                ("grpc.so_reuseport", 0)]


class NotLeader(Exception):
    """This replica cannot decide; ``leader`` is the leader's gRPC address ("" when unknown)."""

    def __init__(self, leader: str) -> None:
        super().__init__(f"not the master leader (leader: {leader or 'unknown'})")
        self.leader = leader


class Rejected(Exception):
    """Raft did not apply the command (``overloaded``: its queue was full; back off)."""

    def __init__(self, reason: int) -> None:
        super().__init__(f"replicated command failed (pysyncobj reason {reason})")
        self.overloaded = reason == QUEUE_FULL


@dataclass(frozen=True)
class MasterSpec:
    """Everything one master replica needs (see :func:`master_specs`)."""
    replica: int
    raft_peers: tuple
    grpc_peers: tuple
    data_dir: str
    computations: dict = field(default_factory=dict)     # name -> initial split keys
    policy: PlacementPolicy = field(default_factory=PlacementPolicy)
    tick_ms: int = 200
    max_in_flight: int = 4
    max_facts_per_command: int = 2000
    snapshot_after_commands: int = 1000
    raft_min_timeout_s: float = 1.0
    raft_max_timeout_s: float = 2.0
    metrics_port: int = 0
    """Port of the replica's Prometheus metrics on its gRPC host (0: a free port, in its status)."""

    @property
    def grpc_address(self) -> str:
        return self.grpc_peers[self.replica]

    @property
    def raft_address(self) -> str:
        return self.raft_peers[self.replica]

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["policy"] = self.policy.as_dict()
        d["raft_peers"], d["grpc_peers"] = list(self.raft_peers), list(self.grpc_peers)
        d["computations"] = {k: list(v) for k, v in self.computations.items()}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "MasterSpec":
        d = json.loads(text)
        d["policy"] = PlacementPolicy.from_mapping(d.get("policy", {}))
        d["raft_peers"], d["grpc_peers"] = tuple(d["raft_peers"]), tuple(d["grpc_peers"])
        d["computations"] = {k: tuple(v) for k, v in d.get("computations", {}).items()}
        return cls(**d)

    def argv(self) -> list[str]:
        """The command line that runs this replica as a process."""
        return [sys.executable, "-m", "millwheel.master", "--spec", self.to_json()]


def master_specs(data_root, computations: dict, replicas: int = 3, host: str = "127.0.0.1",
                 policy: PlacementPolicy | None = None, **options) -> list[MasterSpec]:
    """Specs of a master group on free ports of ``host``, each replica's data under ``data_root/master-<i>``."""
    raft = tuple(f"{host}:{free_port(host)}" for _ in range(replicas))
    grpc_ = tuple(f"{host}:{free_port(host)}" for _ in range(replicas))
    comps = {k: tuple(v) for k, v in computations.items()}
    return [MasterSpec(i, raft, grpc_, str(Path(data_root) / f"master-{i}"), comps,
                       policy or PlacementPolicy(), **options) for i in range(replicas)]


@dataclass(frozen=True)
class MasterReplicaStatistics:
    """One replica's view of itself and of the placement (the placement counts are the same on every
    replica that applied the same facts)."""
    replica: int
    address: str
    is_leader: bool
    leader: str
    term: int
    commit_index: int
    last_applied: int
    log_len: int
    journal_syncs: int
    batches: int
    facts_proposed: int
    largest_batch: int
    queue_depth: int
    workers: int
    intervals: int
    placement_facts: int
    placement_commands: int
    assigns: int
    revokes: int
    splits: int
    merges: int
    moves: int
    expired_workers: int
    master_now_us: int
    metrics: str | None = None
    """Where this replica serves its Prometheus metrics (None: nowhere)."""


class _Pending:
    __slots__ = ("fact", "done", "result", "error")

    def __init__(self, fact) -> None:
        self.fact = fact
        self.done = threading.Event()
        self.result = None
        self.error: Exception | None = None


class MasterServer:
    """The domain face the servicer calls. Start with the spec; :meth:`close` leaves the Raft group."""

    def __init__(self, spec: MasterSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock = clock or SystemClock()
        self.metrics_address: str | None = None    # set by serve_master once its metrics are served
        self._raft_to_grpc = dict(zip(spec.raft_peers, spec.grpc_peers))
        settings = RaftSettings(commands_queue=max(64, 4 * spec.max_in_flight),
                                raft_min_timeout_s=spec.raft_min_timeout_s,
                                raft_max_timeout_s=spec.raft_max_timeout_s,
                                log_compaction_min_entries=spec.snapshot_after_commands,
                                raft_password=_raft_password(spec))
        self.raft = RaftMember(spec.raft_address, list(spec.raft_peers), Path(spec.data_dir),
                               MasterState(spec.policy), settings)
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._slots = threading.Semaphore(spec.max_in_flight)
        self._lock = threading.Lock()
        self._batches = self._facts = self._largest = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._drain, name="master-batcher", daemon=True),
                         threading.Thread(target=self._keep_time, name="master-clock", daemon=True)]
        for t in self._threads:
            t.start()

    # ---- requests ----------------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.raft.is_leader():
            leader = self.raft.leader()
            raise NotLeader(self._raft_to_grpc.get(leader, "") if leader else "")

    def register(self, worker: str, address: str, registration: str) -> WorkerView:
        self._require_leader()
        return self.propose(WorkerJoined(worker, address, registration, self.clock.now_us()))[1]

    def heartbeat(self, worker: str, incarnation: int, load: WorkerLoad | None, leaving: bool = False) -> WorkerView:
        self._require_leader()
        now = self.clock.now_us()
        fact = WorkerLeft(worker, incarnation, now) if leaving else Heartbeat(worker, incarnation, now, load)
        return self.propose(fact)[1]

    def interval_map(self, computation: str | None) -> list[Interval]:
        with self.raft.state_lock:
            return self.raft.state.interval_map(computation)

    def leader_address(self) -> str:
        leader = self.raft.leader()
        return self._raft_to_grpc.get(leader, "") if leader else ""

    def propose(self, fact, timeout: float = 5.0):
        """Replicate ``fact`` (batched with whatever else is waiting); ``(commands, reply)`` once applied.
        Raises :class:`Rejected` or ``TimeoutError`` when Raft did not apply it (e.g. leadership lost)."""
        if self._stop.is_set():
            raise Rejected(-1)
        p = _Pending(fact)
        self._queue.put(p)
        if not p.done.wait(timeout):
            raise TimeoutError(f"master command not applied within {timeout} s")
        if p.error is not None:
            raise p.error
        return p.result

    # ---- the batcher -------------------------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            self._slots.acquire()
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.spec.max_facts_per_command:
                try:
                    p = self._queue.get_nowait()
                except queue.Empty:
                    break
                if p is None:
                    self._queue.put(None)
                    break
                batch.append(p)
            self._send(batch)

    def _send(self, batch: list[_Pending]) -> None:
        with self._lock:
            self._batches += 1
            self._facts += len(batch)
            self._largest = max(self._largest, len(batch))

        def done(results, error) -> None:
            self._slots.release()
            if error == 0:
                for p, r in zip(batch, results):
                    p.result = r
                    if r[0]:
                        log.info("placement: %s", "; ".join(map(repr, r[0])))
                    p.done.set()
                return
            failure = Rejected(error)
            for p in batch:
                p.error = failure
                p.done.set()

        try:
            self.raft.submit([p.fact for p in batch], done)
        except Exception:          # the Raft member is gone (shutting down)
            done(None, -1)

    # ---- the leader's clock ------------------------------------------------------------------------

    def _keep_time(self) -> None:
        leading = False
        period = self.spec.tick_ms / 1000
        while not self._stop.wait(period):
            if not self.raft.is_leader():
                leading = False
                continue
            try:
                now = self.clock.now_us()
                if not leading:
                    self.propose(LeaderChanged(now))
                    for name, keys in sorted(self.spec.computations.items()):
                        self.propose(ComputationDeclared(name, tuple(keys), now))
                    leading = True
                    log.info("master replica %d leads (term %s)", self.spec.replica,
                             self.raft.raft_status().get("raft_term"))
                self.propose(TimePassed(self.clock.now_us()))
            except (Rejected, TimeoutError) as e:
                leading = False      # taking over again (if still leader) restarts the leases
                log.info("master replica %d: leader's fact not applied (%s)", self.spec.replica, e)

    # ---- seeing it ---------------------------------------------------------------------------------

    def statistics(self) -> MasterReplicaStatistics:
        raft = self.raft.raft_status()
        with self.raft.state_lock:
            placement = self.raft.state.statistics()
        with self._lock:
            batches, facts, largest = self._batches, self._facts, self._largest
        return MasterReplicaStatistics(
            replica=self.spec.replica, address=self.spec.grpc_address, is_leader=self.raft.is_leader(),
            leader=self.leader_address(), term=raft["raft_term"], commit_index=raft["commit_idx"],
            last_applied=raft["last_applied"], log_len=raft["log_len"], journal_syncs=self.raft.journal.syncs,
            batches=batches, facts_proposed=facts, largest_batch=largest, queue_depth=self._queue.qsize(),
            workers=placement.workers, intervals=placement.intervals, placement_facts=placement.facts,
            placement_commands=placement.commands, assigns=placement.assigns, revokes=placement.revokes,
            splits=placement.splits, merges=placement.merges, moves=placement.moves,
            expired_workers=placement.expired_workers, master_now_us=placement.now_us,
            metrics=self.metrics_address)

    def serving_problem(self) -> str | None:
        if self._stop.is_set():
            return "stopping"
        return self.raft.serving_problem()

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        for t in self._threads:
            t.join(timeout=2)
        while True:       # fail whatever is left so no handler waits for its timeout
            try:
                p = self._queue.get_nowait()
            except queue.Empty:
                break
            if p is not None:
                p.error = Rejected(-1)
                p.done.set()
        self.raft.destroy()


def _raft_password(spec: MasterSpec) -> str | None:
    secret, source = raft_secret()
    if secret:
        log.info("master replica %d: Raft traffic authenticated and encrypted with a secret %s (fingerprint %s)",
                 spec.replica, source, secret_fingerprint(secret))
    return secret


# ---- the gRPC adapter: proto in, MasterServer call, proto out -------------------------------------------

def interval_to_pb(i: Interval) -> pb.KeyInterval:
    msg = pb.KeyInterval(computation=i.computation, lo=i.lo, worker=i.worker, address=i.address,
                         sequencer=i.sequencer, lease_until_us=i.lease_until_us)
    if i.hi is not None:
        msg.hi = i.hi
    return msg


def interval_from_pb(m) -> Interval:
    return Interval(m.computation, m.lo, m.hi if m.HasField("hi") else None, m.worker, m.sequencer,
                    m.lease_until_us, m.address)


def load_from_pb(m) -> WorkerLoad:
    return WorkerLoad(cpu=m.cpu, queue=m.queue, intervals=tuple(
        IntervalLoad(r.computation, r.lo, r.sequencer, r.records_per_s, r.split_key) for r in m.intervals))


class MasterServicer(pb_grpc.MasterServicer):
    def __init__(self, server: MasterServer) -> None:
        self.server = server

    def _worker_reply(self, view: WorkerView) -> pb.WorkerReply:
        return pb.WorkerReply(known=view.known, incarnation=view.incarnation, lease_until_us=view.lease_until_us,
                              lease_us=self.server.spec.policy.lease_us,
                              intervals=[interval_to_pb(i) for i in view.intervals])

    def _write(self, context, call):
        try:
            return self._worker_reply(call())
        except NotLeader as e:
            return pb.WorkerReply(redirect=e.leader or "?")
        except Rejected as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED if e.overloaded else grpc.StatusCode.UNAVAILABLE,
                          str(e))
        except TimeoutError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    def RegisterWorker(self, request, context):
        if not request.worker or not request.registration:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "RegisterWorker needs a worker name and a registration id")
        return self._write(context, lambda: self.server.register(request.worker, request.address,
                                                                 request.registration))

    def Heartbeat(self, request, context):
        if not request.worker:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Heartbeat needs a worker name")
        load = load_from_pb(request.load) if request.HasField("load") else None
        return self._write(context, lambda: self.server.heartbeat(request.worker, request.incarnation, load,
                                                                  request.leaving))

    def GetIntervalMap(self, request, context):
        intervals = self.server.interval_map(request.computation or None)
        return pb.IntervalMapReply(intervals=[interval_to_pb(i) for i in intervals],
                                   leader=self.server.leader_address(),
                                   applied_index=self.server.raft.raft_status()["last_applied"])

    def Status(self, request, context):
        return pb.StatusReply(status_json=json.dumps(asdict(self.server.statistics())))


class RunningMaster:
    """A master replica serving in this process: ``address``, ``server`` (:class:`MasterServer`),
    ``statistics()``, ``stop()``."""

    def __init__(self, spec: MasterSpec, workers: int = 16) -> None:
        self.spec = spec
        self.address = spec.grpc_address
        self.server = MasterServer(spec)
        self._rpc_pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="master-rpc")
        self._grpc = grpc.server(self._rpc_pool, options=GRPC_OPTIONS)
        pb_grpc.add_MasterServicer_to_server(MasterServicer(self.server), self._grpc)
        self.health = add_health(self._grpc, SERVICE_NAME, self.server.serving_problem)
        creds = server_credentials()
        try:
            bound = self._grpc.add_secure_port(spec.grpc_address, creds) if creds else \
                self._grpc.add_insecure_port(spec.grpc_address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            self.server.close()
            raise OSError(f"millwheel master replica {spec.replica}: cannot bind {spec.grpc_address}")
        self._grpc.start()
        log.info("millwheel master replica %d serving gRPC on %s, Raft on %s", spec.replica, spec.grpc_address,
                 spec.raft_address)

    def statistics(self) -> MasterReplicaStatistics:
        return self.server.statistics()

    def stop(self) -> None:
        self.health.stopping()
        self._grpc.stop(grace=1.0).wait(2.0)
        self._rpc_pool.shutdown(wait=False)   # its idle threads end now (a busy one after its call)
        self.server.close()


def serve_master(spec: MasterSpec, stop: threading.Event | None = None) -> None:
    """Run one master replica until ``stop`` is set (or SIGTERM/SIGINT in the main thread). Prints
    ``millwheel master serving on <address>`` once it serves."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    running = RunningMaster(spec)
    running.server.metrics_address = serve(
        MASTER_COMPONENT, running.statistics, spec.grpc_address.rsplit(":", 1)[0], spec.metrics_port,
        MASTER_METRIC_KINDS, f"master-{spec.replica}", lambda text: log.warning("replica %d: %s", spec.replica, text))
    print(f"millwheel master serving on {running.address}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        running.stop()
        log.info("millwheel master replica %d stopped: %s", spec.replica, running.statistics())


def new_registration() -> str:
    """A fresh registration id (one per worker process start; reused by every retry of that start)."""
    return uuid.uuid4().hex
