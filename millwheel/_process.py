"""A worker process: the same workers, injector shells and watermark authority as the one-process
runtime, holding the key intervals a master gives it and exchanging records with other processes.

:class:`WorkerHost` lifecycle: ``WorkerHost(topology, config, masters)`` → :meth:`start` (serves gRPC,
registers with the master) → … → :meth:`stop` (tells the master it leaves, so its intervals move at once).

* **Ownership.** A heartbeat thread renews the lease (every quarter of it) with each held interval's
  records/s and a split key, and compares what the master says it owns with what it holds: a slot it lost
  (moved, split, merged, revoked, or held under another sequencer) is given up first (its cores drop
  their state; records they held go back to their senders unacked; its productions are left to the new
  owner, which replays them from the store); then every slot it gained is claimed under the master's
  sequencer and its pending timers, dedup ids and checkpointed productions are loaded before it takes a
  record. An injector is a computation with one interval: its owner runs it. If no heartbeat has
  succeeded by (when the last good one was sent) + the lease, workers stop processing (``may_run``). A
  commit refused by the store (a newer owner claimed the slot) makes the process ask the master at once.
* **Routing.** Records go to the owner of the consumer's slot per the master's interval map (read from
  any replica at every heartbeat, and again when a peer answers that a slot moved), over
  :mod:`millwheel._peer`.
* **Watermarks.** Each process writes its intervals' reports to the store (``report_watermarks``, which
  keeps the newest sequencer per slot and refuses one older than the slot's claim or than a grant of the
  master that a process recorded, ``record_grants``, from each map it read) and computes the authority's publication from every process's
  reports, every ``tick`` (every ``FLOWING_EXCHANGE_S`` while records flow and no timer is set, every
  ``QUIET_EXCHANGE_S`` while quiet: :func:`exchange_period`); so every process publishes the same
  watermarks without a coordinator. The
  cut epochs of computations on a cycle are decided in the store (``advance_epoch``), one per step.
* **Dedup garbage collection** by reports through the store and messages to the workers
  (:mod:`millwheel._gc`).
"""
from __future__ import annotations

import dataclasses
import gc as cyclic_gc
import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from photon import Clock, SystemClock
from photon.rpc import server_credentials

from millwheel import worker_pb2_grpc as pb_grpc
from millwheel._cache import CachedStore
from millwheel._config import RuntimeConfig
from millwheel._cpu import thread_cpu_ms
from millwheel._gc import ProcessDedupCollector
from millwheel._injector_shell import InjectorShell
from millwheel._master_client import MasterClient, MasterUnavailable
from millwheel._master_state import Interval, IntervalLoad, WorkerLoad
from millwheel._messages import IntervalsAssigned, ShowsWatermarks, WatermarkBoard, WatermarksReported
from millwheel._peer import GrpcTransport, RemoteTracker, WorkerServicer
from millwheel._routing import IntervalMap, Router, middle_slot_key, slots_in
from millwheel._store import StaleSequencer, StoreAbandoned, open_store
from millwheel._topology import Topology
from millwheel._transport import ACK_DELAY_BOUNDS_US, Inbox
from millwheel._watermarks import (EpochDecided, IntervalAssigned, WatermarkAuthority, WatermarkReported, new_grants,
                                   reports_to_write)
from millwheel._worker import GiveUp, Worker

COORDINATOR_TICK_S = 0.02
QUIET_EXCHANGE_S = 0.1
"""While this process is quiet (:meth:`WorkerHost.quiet`: no record waiting, running, unacked or in flight, no
timer set) it writes its watermark reports and reads every process's at most this often instead of every
tick: then only the clock moves them, and nothing here waits on them."""
EVERY_TICK = 0.0
FLOWING_EXCHANGE_S = 0.05
"""While records flow through this process but none of its workers has a timer set (and its topology has no
cycle), it exchanges watermarks at most this often: then nothing here waits on a published watermark (only
timers and a cycle's cut epochs do), and the reports it writes only show progress. A timer set makes the next
tick exchange. With the 20 ms tick, every third tick exchanges."""
GIVE_UP_WAIT_S = 10.0
STOP_GRACE_S = 2.0
"""How long :meth:`WorkerHost.stop` lets the threads end on their own (a commit in flight lands) before it
cuts off the store, master and peer calls still in progress (a server that hangs never answers them)."""
STOP_CUT_S = 1.5
"""How long it then waits for the threads before leaving them behind (daemon threads: the process exits)."""
LEAVE_BUDGET_S = 1.0
"""How long a stopping process tries to tell the master it leaves (else its lease runs out)."""
EARLY_LIMIT = 200_000
"""Records of slots not claimed yet kept per process at most (beyond, they are answered ``moved``)."""
RPC_THREADS = 64
"""The gRPC server's handler threads: each peer process's open ``ExchangeStream`` holds one, the rest serve
``Exchange`` and ``Status`` calls (so up to about this many peer processes are served at once)."""
LOAD_HALF_LIFE_S = 1.0
"""Half-life of the per-slot records/s a worker reports (the master's split and merge input)."""


class WorkerHost(ShowsWatermarks):
    """See the module docstring. ``masters``: the master replicas' gRPC addresses."""

    def __init__(self, topology: Topology, config: RuntimeConfig, masters: list[str], *, name: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, clock: Clock | None = None,
                 lease_gate: bool = True, wait_for_workers: int = 0, wait_for_workers_s: float = 30.0) -> None:
        self.topology, self.config = topology, config
        self.clock = clock or SystemClock()
        self.slots = config.intervals
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.stopping = threading.Event()
        self.store = CachedStore(open_store(config.store), config.cache_keys)
        self.store.give_up_when(self.stopping)      # no store call is tried again once stopping
        self.router = Router(topology.consumers_of, self.slots)
        self.error: BaseException | None = None
        self.gave_up: list[str] = []      # what was abandoned because the process was stopping
        self._cut = False                 # the calls still in progress were cut off (see stop)
        self.client = MasterClient(masters, retry_timeout_s=5.0, stopping=self.stopping)
        self.map = IntervalMap([], self.slots)
        self._map_stale = threading.Event()
        self._resync = threading.Event()
        self._map_behind = threading.Event()
        self._lease_gate = lease_gate
        self._wait_for_workers = wait_for_workers
        self._wait_until = time.monotonic() + wait_for_workers_s
        self._lease_until = 0.0
        self.incarnation = 0
        self.lease_us = 0
        self.holding: tuple[Interval, ...] = ()
        self.counters: Counter = Counter()
        self.metrics_address: str | None = None   # where its Prometheus metrics are served (millwheel worker)
        self._inbox = Inbox()
        self._discard = Inbox()
        # every peer's ExchangeStream holds one of these threads while it is open (see _peer)
        self._rpc_pool = futures.ThreadPoolExecutor(max_workers=RPC_THREADS, thread_name_prefix="mw-peer-rpc")
        self._grpc = grpc.server(self._rpc_pool,
                                 options=[("grpc.max_receive_message_length", 64 * 2**20), ("grpc.so_reuseport", 0)])
        creds = server_credentials()
        bound = self._grpc.add_secure_port(f"{host}:{port}", creds) if creds else \
            self._grpc.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{bound}"
        self.transport = GrpcTransport(self.address, self._owner_address, self._map_stale.set)
        self.transport.bind(self._consumer_inbox)
        self.tracker = RemoteTracker(self.transport, self._owner_inbox, self.clock.now_us)
        self.workers = [Worker(i, config=config, clock=self.clock, store=self.store, tracker=self.tracker,
                               router=self.router, topology=topology, report=self._inbox, stopping=self.stopping,
                               fail=self.fail) for i in range(config.threads)]
        for w in self.workers:
            w.on_fenced = self._fenced
            w.may_run = self._lease_ok
        self.injectors: dict[str, tuple[InjectorShell, threading.Event]] = {}
        self._injectors_set_aside: Counter = Counter()   # per consumer, by injector shells no longer held
        self.gc = ProcessDedupCollector(topology, self.store, slots=self.slots, workers=len(self.workers),
                                        retention_us=config.dedup_retention_us, interval_us=config.gc_interval_us,
                                        held=self._held, oldest_produced=self.tracker.oldest_produced_at,
                                        send=lambda i, m: self.workers[i].inbox.put_many([m]))
        self._accepting: dict[tuple[str, int], int] = {}
        self._early: dict[tuple[str, int], list] = {}   # records of slots given here but not claimed yet
        self._early_n = 0
        self._accept_lock = threading.Lock()
        self._moved_slots: set[tuple[str, int]] = set()      # owners changed in a map read, not yet resent
        self.authority = WatermarkAuthority(decide_epochs=False)   # the store decides (see _watermarks)
        for cname in topology.computations:
            self.authority.handle(*(IntervalAssigned(cname, s, 0) for s in range(self.slots)))
        for iname in topology.injectors:
            self.authority.handle(IntervalAssigned(iname, 0, 0))
        self.board = WatermarkBoard()       # the last publication, announced to the workers
        self._report_seqs: dict[tuple[str, int], int] = {}
        self._last_counts: Counter = Counter()
        self._rates: dict[tuple[str, int], float] = {}
        self._slot_rates: dict[tuple[str, int], float] = {}
        self._written: dict[tuple[str, int], tuple] = {}     # the last watermark report written per interval
        self._written_cuts: dict[tuple[str, int], tuple] = {}  # and cut report (computations on a cycle)
        self._unwritten: dict[tuple[str, int], tuple] = {}     # reports held while the lease has lapsed
        self._unwritten_cuts: dict[tuple[str, int], tuple] = {}
        self._granted: dict[tuple[str, int], int] = {}   # the newest sequencer per interval of the maps read
        self._exchanged_at = float("-inf")     # the coordinator's last watermark exchange (QUIET_EXCHANGE_S)
        self._quiet_reports: list[WatermarkReported] = []   # taken at ticks without an exchange, in order
        self._cyclic: bool | None = None       # the topology has a cycle (known at the first tick)
        self._started_at = self._load_at = time.monotonic()
        pb_grpc.add_WorkerServicer_to_server(WorkerServicer(self.tracker, self._accept, self.status), self._grpc)
        self._threads = [threading.Thread(target=self._heartbeats, name="millwheel-heartbeat", daemon=True),
                         threading.Thread(target=self._coordinate, name="millwheel-process-coordinator", daemon=True)]

    # ---- lifecycle -----------------------------------------------------------------------------------
    def start(self, serving: Callable[[str], None] | None = None) -> "WorkerHost":
        """Serve, register with the master and start working. ``serving(address)`` is called once the gRPC
        server serves and before the master can give this process an interval: a process's "serving on" line
        comes before anything its intervals write (a sink's echo of what it writes on stdout)."""
        self.authority.restore(self.store.read_watermarks())
        self._grpc.start()
        if serving is not None:
            serving(self.address)
        for w in self.workers:
            w.start()
        self._register()
        for t in self._threads:
            t.start()
        return self

    def fail(self, error: BaseException) -> None:
        if isinstance(error, StaleSequencer):   # an injector fenced: ask the master what is still ours
            self._fenced(error)
            return
        if self.stopping.is_set() and isinstance(error, (StoreAbandoned, MasterUnavailable)):
            # a call given up because this process stops: not a failure (nothing of it was acked; the
            # intervals' next owners redo it), but said when the process ends
            self.gave_up.append(f"{threading.current_thread().name}: {error}")
            return
        if self.error is None:
            self.error = error
        self.stopping.set()

    def stop(self, leave: bool = True) -> "StopReport":
        """Stop within about ``LEAVE_BUDGET_S + STOP_GRACE_S + STOP_CUT_S`` seconds whatever the store, the
        master and the peers are doing: retries end at once (``stopping``); the master is told this process
        leaves (for at most about ``LEAVE_BUDGET_S``); from then the threads get ``STOP_GRACE_S`` to end on
        their own (a commit in flight lands); then the calls still in progress are cut off
        (:meth:`_cut_off`), and threads still running ``STOP_CUT_S`` later are left behind. Nothing is lost
        by giving up: what was not committed was acked to nobody, and the intervals' next owners redo it.
        The report says what was given up."""
        started = time.monotonic()
        self.stopping.set()
        for shell, ev in list(self.injectors.values()):
            ev.set()
            shell.inbox.wake()
        for w in self.workers:
            w.inbox.wake()
        left = saved = False
        if leave and self.incarnation:
            try:
                self.client.heartbeat(self.name, self.incarnation, leaving=True, budget_s=LEAVE_BUDGET_S)
                left = True
            except (MasterUnavailable, grpc.RpcError, ValueError) as e:
                # (a status not tried again, or a channel closed under the call: the stop goes on all the same)
                what = e if isinstance(e, MasterUnavailable) else f"{type(e).__name__}: {e}"
                self.gave_up.append(f"telling the master this process leaves ({what}): its intervals move "
                                    f"when its lease ends")
        # the grace counts from here: a slow leave does not cut off threads that were ending on their own
        watchdog = threading.Timer(STOP_GRACE_S, self._cut_off)
        watchdog.daemon = True
        watchdog.start()
        try:
            deadline = time.monotonic() + STOP_GRACE_S + STOP_CUT_S
            threads = [w.thread for w in self.workers] + [s.thread for s, _ in self.injectors.values()] + self._threads
            for t in threads:
                if t.is_alive():
                    t.join(max(0.0, deadline - time.monotonic()))
            behind = tuple(t.name for t in threads if t.is_alive())
            self._grpc.stop(grace=0.5).wait(1.0)
            self._rpc_pool.shutdown(wait=False)   # its idle threads end now (a busy one after its call)
            self.transport.close()
            self.client.close()
            if self._cut:
                self.gave_up.append("saving the watermarks (the store's calls were cut off)")
            elif self.error is None:
                try:
                    self.store.save_watermarks(self.low_watermarks)
                    saved = True
                except StoreAbandoned as e:
                    self.gave_up.append(f"saving the watermarks ({e})")
        finally:
            watchdog.cancel()
        self.store.close()
        return StopReport(round(time.monotonic() - started, 3), left, saved, self._cut, tuple(self.gave_up), behind)

    def _cut_off(self) -> None:
        """Still stopping after ``STOP_GRACE_S``: cut off the store, master and peer calls in progress (each
        raises in its thread, which then ends) and refuse new ones."""
        self._cut = True
        self.store.interrupt()
        self.client.interrupt()
        self.transport.close()

    # ---- wiring ------------------------------------------------------------------------------------
    def _thread_of(self, slot: int) -> Worker:
        return self.workers[slot % len(self.workers)]

    def _consumer_inbox(self, consumer: str, slot: int) -> Inbox:
        return self._thread_of(slot).inbox

    def _owner_inbox(self, sender: str, slot: int) -> Inbox:
        if sender in self.topology.injectors:
            held = self.injectors.get(sender)
            return held[0].inbox if held else self._discard
        return self._thread_of(slot).inbox

    def _owner_address(self, consumer: str, slot: int) -> str | None:
        if (consumer, slot) in self._accepting:
            return self.address
        owner = self.map.owner(consumer, slot)
        return owner[1] if owner else None

    def _accept(self, reply_to: str, deliveries: list) -> list[tuple[str, int, str]]:
        """Records from another process: take those of slots held here, name the owner of the others."""
        moved, mine, early = [], {}, []
        with self._accept_lock:
            for d in deliveries:
                k = (d.consumer, d.interval)
                if k in self._accepting:
                    mine.setdefault(d.interval % len(self.workers), []).append(d)
                    continue
                owner = self.map.owner(d.consumer, d.interval)
                if owner and owner[1] == self.address and self._early_n < EARLY_LIMIT:
                    early.append(d)        # the master gave it here and the claim is under way: keep it
                    self._early.setdefault(k, []).append((reply_to, d))
                    self._early_n += 1
                else:
                    moved.append((d.consumer, d.interval, owner[1] if owner else ""))
        for index, items in mine.items():
            self.tracker.note_origin(items, reply_to)
            self.workers[index].inbox.put_many(items)
        if early:      # claimed at the next heartbeat, as always: no earlier, so as not to run beside its
            self.counters["taken_before_claim"] += len(early)   # old owner longer (user side effects)
        if moved:
            self.counters["stale_routes"] += len(moved)
            self._map_behind.set()   # the sender may know a newer map: read it (not a heartbeat, no claim)
        return moved

    def _take_early(self, key: tuple[str, int], claimed: bool) -> None:
        """Records that came for ``key`` before this process claimed it: into its worker once claimed (the
        claim loaded its dedup ids, so repeats are dropped), else dropped, their senders asked to send them
        again at once (by their maps; a newer owner holds the slot)."""
        with self._accept_lock:
            items = self._early.pop(key, [])
            self._early_n -= len(items)
            if claimed:
                self._accepting[key] = key[1] % len(self.workers)
        if not items:
            return
        if not claimed:
            self.counters["dropped_for_refused_claims"] += len(items)
            self._drop_early(items)
            return
        per: dict[str, list] = {}
        for reply_to, d in items:
            per.setdefault(reply_to, []).append(d)
        for reply_to, ds in per.items():
            self.tracker.note_origin(ds, reply_to)
        self._thread_of(key[1]).inbox.put_many([d for _, d in items])

    def _drop_early(self, items: list[tuple[str, Any]]) -> None:
        """Early records ``(reply_to, delivery)`` of a slot this process will not hold: no map change
        their senders see need announce it, so they are asked to send them again now (else they wait for
        their retry timeout, up to 4 x ``retry_delay_us``)."""
        self.counters["early_dropped"] += len(items)
        self.tracker.resend_dropped(items)
        self._map_behind.set()      # the map that gave the slot here is old: read it before they come back

    def _lease_ok(self) -> bool:
        return not self._lease_gate or time.monotonic() < self._lease_until

    def _fenced(self, error: StaleSequencer) -> None:
        """A commit was refused: its cores gave their slots up (their records went back to their senders).
        Records for those slots are not taken into a worker from now on (which would hand them back again
        at once) but kept until the slot is claimed again, or answered ``moved``; then ask the master."""
        self.counters["fenced_commits"] += 1
        with self._accept_lock:
            # what is held read under the lock: a slot granted meanwhile enters _accepting only after its
            # core exists, under this lock, so no slot held is taken out
            held = self._held()
            for k in [k for k in self._accepting if k not in held]:
                del self._accepting[k]
        self._resync.set()

    # ---- ownership ---------------------------------------------------------------------------------
    def _register(self) -> None:
        sent = time.monotonic()
        a = self.client.register(self.name, self.address)
        self.incarnation, self.lease_us = a.incarnation, a.lease_us
        self._lease_until = sent + a.lease_us / 1e6
        self.counters["registrations"] += 1
        self._apply(a.intervals)

    def _heartbeats(self) -> None:
        try:
            while not self.stopping.is_set():
                period = max(0.05, self.lease_us / 4e6) if self.lease_us else 0.5
                self._resync.wait(period)
                self._resync.clear()
                if self.stopping.is_set():
                    return
                sent = time.monotonic()
                try:
                    a = self.client.heartbeat(self.name, self.incarnation, self._load())
                except MasterUnavailable:
                    self.counters["heartbeats_failed"] += 1
                    continue
                if self.stopping.is_set():   # (an answer to a heartbeat sent before this process left)
                    return
                if not a.known:     # the master dropped this incarnation (its lease lapsed): start again
                    self.counters["lost_incarnations"] += 1
                    self._apply(())
                    self._register()
                else:
                    self._lease_until = sent + a.lease_us / 1e6
                    self.lease_us = a.lease_us
                    self._refresh_map()
                    self._apply(a.intervals)
                    self.transport.resend_parked()    # records answered "moved" go by the new map at once
                    self.tracker.resend_to(self._take_moved())   # and what was in flight to a moved slot
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def _read_map(self) -> None:
        """Only the map (records that came here for slots it gives to others are answered by it)."""
        try:
            self._new_map(IntervalMap(self.client.interval_map(), self.slots))
            self.counters["map_reads_on_stale_route"] += 1
        except MasterUnavailable:
            pass
        self.tracker.resend_to(self._take_moved())

    def _refresh_map(self) -> None:
        self._map_stale.clear()
        try:
            self._new_map(IntervalMap(self.client.interval_map(), self.slots))
        except MasterUnavailable:
            self._map_stale.set()
            return

    def _new_map(self, new: IntervalMap) -> None:
        old, self.map = self.map, new
        # every interval's sequencer now, to the authority: reports under older ones are stale from here on
        self._inbox.put_many([IntervalsAssigned(assigned_in(new, self.topology))])
        moved = new.moved_since(old)
        if moved:
            with self._accept_lock:
                self._moved_slots |= moved

    def _take_moved(self) -> set[tuple[str, int]]:
        """Slots whose owner changed in the maps read since the last call (their unacked copies go again)."""
        with self._accept_lock:
            moved, self._moved_slots = self._moved_slots, set()
        return moved

    def _held(self) -> dict[tuple[str, int], int]:
        out = {}
        for w in self.workers:
            with w._lock:
                comps = list(w.comps.items())
            for cname, comp in comps:
                for slot, core in list(comp.cores.items()):
                    if core.sequencer is not None:
                        out[(cname, slot)] = core.sequencer
        for iname, (shell, ev) in list(self.injectors.items()):
            if shell.thread.is_alive() and not ev.is_set():
                out[(iname, 0)] = shell.seq
        return out

    def _apply(self, intervals) -> None:
        """Make what this process holds what the master says it owns: give up first, then claim."""
        want: dict[tuple[str, int], int] = {}
        for iv in intervals:
            if iv.computation in self.topology.injectors:
                if iv.covers("0000"):
                    want[(iv.computation, 0)] = iv.sequencer
            elif iv.computation in self.topology.computations:
                for s in slots_in(iv.lo, iv.hi, self.slots):
                    want[(iv.computation, s)] = iv.sequencer
        # an injector whose thread ended (its commit was refused: the master moved it) is gone: forget it,
        # or it stays "not caught up" for good and this process is never idle
        for iname, (shell, ev) in list(self.injectors.items()):
            if not shell.thread.is_alive() and shell.thread.ident is not None:
                self.injectors.pop(iname, None)
                self._injectors_set_aside.update(shell.set_aside)
                self.tracker.forget(iname, 0)      # its next owner replays the stored productions
                self.counters["injectors_ended"] += 1
        held = self._held()
        lost = [k for k, seq in held.items() if want.get(k) != seq]
        # also slots accepted but whose core went away (a refused commit): take them out of routing
        with self._accept_lock:
            for k in list(self._accepting):
                if k not in held or want.get(k) != held[k]:
                    self._accepting.pop(k, None)
            dropped = []
            for k in [k for k in self._early if k not in want]:
                dropped.extend(self._early.pop(k))      # given elsewhere meanwhile
            self._early_n -= len(dropped)
        if dropped:
            self._drop_early(dropped)
        self._give_up(lost)
        # computations first: an injector starts sending at once, to owners that must be known
        for (cname, slot), seq in sorted(want.items(), key=lambda kv: (kv[0][0] in self.topology.injectors, kv[0])):
            if held.get((cname, slot)) == seq:
                continue
            if self.lease_us and time.monotonic() > self._lease_until - self.lease_us / 2e6:
                # granting takes store round trips per slot, and no heartbeat goes out meanwhile: with half
                # the lease gone, renew it first (at once) and grant the rest then, or a loaded worker given
                # many intervals loses them all before it holds them, again and again
                self.counters["grants_deferred"] += 1
                self._resync.set()
                continue
            try:
                if cname in self.topology.injectors:
                    if not self._inputs_may_start():
                        continue
                    self._start_injector(cname, seq)
                else:
                    self._thread_of(slot).grant(self.topology.computations[cname], [slot], {slot: seq})
                    self._take_early((cname, slot), True)
            except StaleSequencer:
                self.counters["stale_grants"] += 1      # a newer owner holds it already
                self._take_early((cname, slot), False)
                continue
            self.counters["granted"] += 1
            self._inbox.put_many([IntervalsAssigned((IntervalAssigned(cname, slot, seq),))])
        self.holding = tuple(intervals)

    def _inputs_may_start(self) -> bool:
        """Injectors wait (up to ``wait_for_workers_s``) until ``wait_for_workers`` workers each hold at
        least half their share of the intervals, so a cluster started at once spreads its intervals (the
        master moves them one per round) before the input flows."""
        if time.monotonic() >= self._wait_until or self._wait_for_workers <= 1:
            return True
        per = Counter(iv.worker for iv in self.map.rows if iv.worker)
        share = len(self.map.rows) // (2 * self._wait_for_workers)
        return len(per) >= self._wait_for_workers and min(per.values()) >= share

    def _give_up(self, lost: list[tuple[str, int]]) -> None:
        if not lost:
            return
        self.counters["given_up"] += len(lost)
        waits = []
        per: dict[tuple[int, str], list[int]] = {}
        for cname, slot in lost:
            with self._accept_lock:
                self._accepting.pop((cname, slot), None)
            if cname in self.topology.injectors:
                shell, ev = self.injectors.pop(cname)
                self._injectors_set_aside.update(shell.set_aside)   # (counted when set aside: kept)
                ev.set()
                shell.inbox.wake()
                waits.append(shell.thread)
            else:
                per.setdefault((slot % len(self.workers), cname), []).append(slot)
        events = []
        for (index, cname), slots in per.items():
            done = threading.Event()
            self.workers[index].inbox.put_many([GiveUp(cname, tuple(slots), done)])
            events.append(done)
        for done in events:      # (a worker thread that ended, the process stopping, never sets it)
            _Either(self.stopping, done).wait(GIVE_UP_WAIT_S)
        for t in waits:
            deadline = time.monotonic() + GIVE_UP_WAIT_S
            while t.is_alive() and not self.stopping.is_set() and time.monotonic() < deadline:
                t.join(0.05)
        for cname, slot in lost:
            self.tracker.forget(cname, slot)    # its new owner replays the stored productions

    def _start_injector(self, iname: str, seq: int) -> None:
        spec = self.topology.injectors[iname]
        ev = threading.Event()
        stopping = _Either(self.stopping, ev)
        shell = InjectorShell(iname, spec.factory(), spec.produces, config=self.config, clock=self.clock,
                              store=self.store, tracker=self.tracker, router=self.router, report=self._inbox,
                              stopping=stopping, fail=self.fail)
        shell.prepare(seq)
        self.injectors[iname] = (shell, ev)
        shell.thread.start()

    def _load(self) -> WorkerLoad:
        """Each held interval's records/s and split key, from per-slot rates smoothed over
        ``LOAD_HALF_LIFE_S`` (one heartbeat's count swings with batching and retries)."""
        counts: Counter = Counter()
        for w in self.workers:
            counts.update(dict(w.received_per_slot))   # a copy: its worker thread adds slots meanwhile
        now = time.monotonic()
        elapsed = max(1e-3, now - self._load_at)
        self._load_at = now
        keep = 0.5 ** (elapsed / LOAD_HALF_LIFE_S)
        for k in set(counts) | set(self._slot_rates):
            current = (counts.get(k, 0) - self._last_counts.get(k, 0)) / elapsed
            self._slot_rates[k] = keep * self._slot_rates.get(k, current) + (1 - keep) * current
        self._last_counts = counts
        rates = []
        for iv in self.holding:
            if iv.computation not in self.topology.computations:
                rates.append(IntervalLoad(iv.computation, iv.lo, iv.sequencer, 1.0, ""))
                continue
            per_slot = {s: self._slot_rates.get((iv.computation, s), 0.0) for s in slots_in(iv.lo, iv.hi, self.slots)}
            # at least 1 record/s: intervals held idle still count, so an idle cluster spreads them by count
            rate = max(1.0, sum(per_slot.values()))
            rates.append(IntervalLoad(iv.computation, iv.lo, iv.sequencer, rate,
                                      middle_slot_key(iv.lo, iv.hi, per_slot, self.slots)))
            self._rates[(iv.computation, iv.lo)] = rate
        queue = sum(len(w.inbox) for w in self.workers)
        return WorkerLoad(cpu=0.0, queue=queue, intervals=tuple(rates))

    # ---- watermarks and retries ------------------------------------------------------------------
    def _coordinate(self) -> None:
        last_save = time.monotonic()
        try:
            while not self.stopping.wait(COORDINATOR_TICK_S):
                items = self._inbox.take(1 << 30, 0)
                self._quiet_reports.extend(r for m in items if isinstance(m, WatermarksReported) for r in m.reports)
                facts = [f for m in items if isinstance(m, IntervalsAssigned) for f in m.facts]
                now = time.monotonic()
                period = EVERY_TICK if facts else self._exchange_period()
                if now - self._exchanged_at < period:      # the reports taken go out at the next exchange
                    self.counters["quiet_ticks" if period == QUIET_EXCHANGE_S else "flowing_ticks"] += 1
                else:
                    self._exchanged_at = now
                    reports, self._quiet_reports = self._quiet_reports, []
                    self._watermarks(reports, facts)
                self.tracker.due_retries(self.clock.now_us(), max_backoff_us=self.config.retry_delay_us * 4)
                if self._map_stale.is_set():
                    self._resync.set()
                elif self._map_behind.is_set():
                    self._map_behind.clear()
                    self._read_map()
                self.gc.tick(self.clock.now_us(), items)
                if time.monotonic() - last_save >= self.config.gc_interval_us / 1e6:
                    last_save = time.monotonic()
                    self.store.save_watermarks(self.low_watermarks)
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def _watermarks(self, reports: list[WatermarkReported], assigned: list[IntervalAssigned] = ()) -> None:
        """Write this process's new reports to the store, read every process's, publish. A topology with a
        cycle also shares its cut reports and epochs through the store: every process's authority
        proposes the next epoch of a component, the store takes one proposal per step
        (``advance_epoch``), and every authority adopts the stored one (so the moment an epoch is
        announced is one for all processes). ``assigned``: sequencers learnt since the last tick (grants,
        map reads), handled first, so a report under an older one is ignored whatever the store holds."""
        producers = self.topology.producers()
        cyclic = bool(self.authority.components(producers))
        self.authority.handle(*assigned)
        grants = new_grants(self._granted, assigned)
        if grants:      # the master's grants, in the store before this process's reports: see record_grants
            self.store.record_grants(grants)
            self.counters["grants_recorded"] += len(grants)
        for r in reports:     # the newest report per interval, and only if it changed
            self._unwritten[(r.name, r.interval)] = (r.name, r.interval, r.sequencer, r.low_us, r.input_us,
                                                     r.oldest_us)
            if r.epoch:
                self._unwritten_cuts[(r.name, r.interval)] = (r.name, r.interval, r.sequencer, r.epoch, r.cut_us)
        rows = self._write_reports()          # with every process's reports, in the same statement
        if rows is None:
            rows = self.store.read_watermark_reports()
        self._report_seqs = {(r[0], r[1]): r[2] for r in rows}
        if cyclic:
            cut_of = {(c[0], c[1]): c for c in self.store.read_cuts()}
            reported = []
            for row in rows:
                c = cut_of.get((row[0], row[1]))
                same = c is not None and c[2] == row[2]      # the cut of the interval's current owner
                reported.append(WatermarkReported(*row, c[3], c[4]) if same else WatermarkReported(*row))
            self.authority.handle(*reported)
            self.authority.handle(*(EpochDecided(comp, epoch, external, tuple(tuple(x) for x in json.loads(cohort)))
                                    for comp, epoch, external, cohort in self.store.read_epochs()))
        else:
            self.authority.handle(*(WatermarkReported(*row) for row in rows))
        pub = self.authority.publish(producers)
        for p in pub.proposals:
            self.store.advance_epoch(p.component, p.epoch, p.external_us, json.dumps(p.cohort))
        self.board.publish(pub, self.workers)

    def _write_reports(self) -> list[tuple] | None:
        """Write the reports taken (changed ones only) of intervals still held under their sequencer; none
        while the lease has lapsed (a stopped process resumed past its lease may have lost them all: they
        wait until it knows, then go if still held), nor of an interval a map read since gave a newer
        sequencer (before the heartbeat gives it up). The store refuses one whose interval was claimed, or
        granted in a map any process has read, under a newer sequencer since; this keeps the old owner's
        reports out also before the new owner's claim. Returns every process's reports when it wrote some
        (the store reads them in the same statement), else ``None``."""
        if not (self._unwritten or self._unwritten_cuts) or not self._lease_ok():
            return None
        read = None
        held = self._held()
        for pending, written, cuts in ((self._unwritten, self._written, False),
                                       (self._unwritten_cuts, self._written_cuts, True)):
            rows = [row for k, row in pending.items() if written.get(k) != row]
            mine = reports_to_write(rows, held, self._granted)
            if not self._lease_ok():       # checked again just before the write: lapsed meanwhile, they wait
                return read
            pending.clear()
            if len(mine) < len(rows):      # of intervals given up meanwhile: their old owner's reports
                self.counters["reports_dropped"] += len(rows) - len(mine)
            if mine:
                if cuts:
                    self.store.report_cuts(mine)
                else:
                    read = self.store.report_and_read_watermarks(mine)
                written.update(((row[0], row[1]), row) for row in mine)
        return read

    def _exchange_period(self) -> float:
        """How long the coordinator may go without a watermark exchange now (see :func:`exchange_period`)."""
        if self._cyclic is None:
            self._cyclic = bool(self.authority.components(self.topology.producers()))
        quiet = self.quiet()
        return exchange_period(quiet, not quiet and any(w.has_timers() for w in self.workers), self._cyclic)

    # ---- observing ---------------------------------------------------------------------------------
    def quiet(self) -> bool:
        """Nothing here waits on a watermark: no record waiting, running or deferred in a worker, no
        commit in flight, no timer set, nothing sent and unacked."""
        if self.tracker.in_flight or self.tracker.outstanding_count():
            return False
        return not any(w.busy or len(w.inbox) or w._deferred or w.has_timers() for w in self.workers)

    def idle(self) -> bool:
        """Nothing to do here: held injectors caught up, no record waiting, running, in flight or unacked,
        no timer due, and the watermarks settled."""
        return not self.busy_because()

    def busy_because(self) -> list[str]:
        """Why this process is not idle (empty: it is)."""
        why = []
        if self.error is not None:
            why.append("failed")
        if not all(s.caught_up and not s.busy for s, _ in self.injectors.values()):
            why.append("injecting")
        now = self.clock.now_us()
        if any(w.has_due(now) for w in self.workers):
            why.append("timers due")
        if any(w.busy or len(w.inbox) or w._deferred for w in self.workers):
            why.append("records waiting")
        if not self.settled:
            why.append("watermarks not settled")
        if any(self._report_seqs.get(k) != seq for k, seq in self._held().items()):
            why.append("an interval not reported by its owner yet")
        if self.tracker.in_flight or self.tracker.outstanding_count():
            why.append("unacked records")
        return why

    def status(self, thread_cpu: bool = False) -> dict[str, Any]:
        """This process's statistics (``millwheel status``); with ``thread_cpu`` also ``thread_cpu_ms``, the
        CPU used so far by each kind of thread (:func:`millwheel._cpu.thread_cpu_ms`: about a millisecond
        of reads, so only when asked)."""
        per: dict[str, Counter] = {}
        for w in self.workers:
            for cname, c in w.statistics().items():
                per.setdefault(cname, Counter()).update(c)
        # records a consumer's key extractor raised on, set aside by this process's injectors (as the
        # one-process statistics count them)
        aside = Counter(self._injectors_set_aside)
        for shell, _ in list(self.injectors.values()):
            aside.update(dict(shell.set_aside))
        for cname, n in aside.items():
            per.setdefault(cname, Counter())["set_aside"] += n
        return {
            "worker": self.name, "pid": os.getpid(), "address": self.address, "incarnation": self.incarnation,
            "metrics": self.metrics_address,
            "intervals": [{"computation": iv.computation, "lo": iv.lo, "hi": iv.hi, "sequencer": iv.sequencer,
                           "records_per_s": round(self._rates.get((iv.computation, iv.lo), 0.0), 1)}
                          for iv in self.holding],
            "injectors": {n: {"caught_up": s.caught_up, "injected": s.injected, "held_back_by_acks": s.held_back,
                              "outstanding_limit": s.pace.limit() if s.pace is not None else None}
                          for n, (s, _) in self.injectors.items()},
            "computations": {n: dict(c) for n, c in per.items()},
            "low_watermarks_us": self.low_watermarks, "input_watermarks_us": self.input_watermarks,
            "watermark_authority": dataclasses.asdict(self.authority.statistics()),
            "settled": self.settled, "idle": self.idle(), "busy": self.busy_because(), "in_flight": self.tracker.in_flight,
            "outstanding": self.tracker.outstanding_count(),
            "counters": {**self.counters, "set_aside": sum(c.get("set_aside", 0) for c in per.values())},
            "transport": {**self.transport.counters, "resent_after_delay": self.tracker.resent,
                          "resent_after_move": self.tracker.resent_after_move,
                          "resent_on_request": self.tracker.resent_on_request,
                          "retries_deferred": self.tracker.retries_deferred},
            "acks": {"retry_timeout_ms": self.tracker.retry_timeout_us // 1000,
                     "inbox_high": max(w.inbox_high for w in self.workers),
                     "landed_on_commit_thread": sum(w.landed_on_commit_thread for w in self.workers),
                     "delays": {_bound_name(b): n for b, n in zip(ACK_DELAY_BOUNDS_US, self.tracker.ack_delays)}},
            "cache": dataclasses.asdict(self.store.statistics()),
            "error": repr(self.error) if self.error else None,
            "dedup_gc": {"rounds": self.gc.rounds, "deleted": self.gc.deleted, "floors": self.gc.floors},
            # not gc.get_freeze_count(): it walks every frozen object, and the status is read often
            "collector_threshold": list(cyclic_gc.get_threshold()),
            "store": _store_statistics(self.store),
            "uptime_s": round(time.monotonic() - self._started_at, 3),
        } | ({"thread_cpu_ms": thread_cpu_ms()} if thread_cpu else {})


@dataclasses.dataclass(frozen=True)
class StopReport:
    """How :meth:`WorkerHost.stop` went."""
    seconds: float
    left: bool
    """The master was told this process leaves (its intervals moved at once)."""
    watermarks_saved: bool
    cut_off: bool
    """Calls still in progress after ``STOP_GRACE_S`` were cut off."""
    gave_up: tuple[str, ...]
    """Calls given up because the process was stopping (thread: what)."""
    left_behind: tuple[str, ...]
    """Threads still running when it returned (daemon threads: the process exits anyway)."""

    def describe(self) -> str:
        """One line for the log."""
        text = f"stopped in {self.seconds:.2f} s"
        if self.gave_up or self.left_behind or self.cut_off:
            text += (f"; gave up {len(self.gave_up)} call(s) the store or the master did not answer"
                     + (" (cut off after %.0f s)" % STOP_GRACE_S if self.cut_off else "")
                     + "".join(f"; {g}" for g in self.gave_up)
                     + (f"; threads left behind: {', '.join(self.left_behind)}" if self.left_behind else "")
                     + "; nothing is lost: what was not committed is redone by the intervals' next owners")
        return text


def exchange_period(quiet: bool, timers_set: bool, cyclic: bool) -> float:
    """The longest a worker process's coordinator goes between watermark exchanges (writing its changed
    reports and reading every process's): ``QUIET_EXCHANGE_S`` while the process is quiet
    (:meth:`WorkerHost.quiet`); every tick while a worker of it has a timer set or the topology has a cycle
    (a timer fires, and a cut epoch advances, on published watermarks); else, records flowing with nothing
    waiting on a watermark, ``FLOWING_EXCHANGE_S``. New sequencers (a grant, a map read) exchange at the
    next tick whatever this says. A longer period only delays what the reports show: every report still
    goes through the store's fenced statement, and the newest one per interval is written."""
    if quiet:
        return QUIET_EXCHANGE_S
    if timers_set or cyclic:
        return EVERY_TICK
    return FLOWING_EXCHANGE_S


def assigned_in(intervals: IntervalMap, topology: Topology) -> tuple[IntervalAssigned, ...]:
    """The sequencer of every slot of the topology's computations, and of each injector's one interval,
    in a master's interval map (an interval whose owner is gone has a new one too)."""
    return tuple(IntervalAssigned(name, slot, seq) for (name, slot), seq in sorted(intervals.sequencers().items())
                 if name in topology.computations or (name in topology.injectors and slot == 0))


def _bound_name(bound_us: int) -> str:
    return f"under_{bound_us // 1000}ms" if bound_us < ACK_DELAY_BOUNDS_US[-1] else "longer"


def _store_statistics(store) -> dict:
    """The store's own statistics under the cache (PostgreSQL: commits, retries, ...), if it keeps any."""
    stats = getattr(getattr(store, "store", store), "statistics", None)
    return dataclasses.asdict(stats()) if stats is not None else {}


class _Either:
    """An event-like object set when either of two events is (what an injector shell waits on)."""

    def __init__(self, a: threading.Event, b: threading.Event) -> None:
        self._a, self._b = a, b

    def is_set(self) -> bool:
        return self._a.is_set() or self._b.is_set()

    def set(self) -> None:
        self._b.set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                break
            self._b.wait(left)
        return self.is_set()
