"""The runtime: a whole topology in one process, made of the same parts a distributed deployment has.

* Workers (``_worker.py``), each a thread holding key intervals, one pure :class:`IntervalCore` per
  (computation, interval). Which worker holds an interval is the :class:`Placement`'s answer (here
  :class:`ModuloPlacement`; a master replaces it).
* Injector threads (``_injector_shell.py``).
* One coordinator thread: the low watermark authority (:class:`WatermarkAuthority`, fed by the
  workers' and injectors' reports, publishing to the workers), retries over a lossy transport, and dedup
  garbage collection (floors go to the workers as :class:`RaiseFloors`; ids are deleted once every
  worker holding the consumer has answered).

They talk through inboxes (messages), the store and the tracker; none reaches into another's state.

Lifecycle: ``Runtime(topology, config)`` → :meth:`Runtime.start` (claims every key interval, which
fences any older writer; loads timers and dedup ids; replays stored productions; restores injector
positions) → :meth:`Runtime.run_until_idle` or your own loop reading :meth:`Runtime.statistics` →
:meth:`Runtime.stop`. A record on which user code raises is tried again, up to ``max_attempts`` times,
then set aside in the store (``store.set_aside_records()``) while the key's other records go on. Any
other failure in a thread (a raising timer, a stale sequencer) stops the runtime; :attr:`Runtime.error`
holds it and :meth:`Runtime.run_until_idle` raises it.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from photon import Clock, SystemClock

from millwheel._cache import CachedStore
from millwheel._config import RuntimeConfig
from millwheel._injector_shell import InjectorShell
from millwheel._messages import FloorsRaised, RaiseFloors, ShowsWatermarks, WatermarkBoard, WatermarksReported
from millwheel._model import Computation
from millwheel._routing import ModuloPlacement, Placement, Router
from millwheel._store import Store, StoreAbandoned, open_store
from millwheel._topology import Topology
from millwheel._transport import Inbox, LocalTransport, Tracker, Transport
from millwheel._watermarks import IntervalAssigned, WatermarkAuthority
from millwheel._worker import Worker

STOP_GRACE_S = 2.0
"""How long :meth:`Runtime.stop` lets its threads end on their own before it cuts off the calls to a store
it opened itself (see ``millwheel._process.STOP_GRACE_S``)."""
STOP_CUT_S = 1.5


@dataclass(frozen=True)
class ComputationStatistics:
    records_processed: int
    duplicates_dropped: int
    late_records: int
    timers_fired: int
    low_watermark_us: int
    input_watermark_us: int
    records_set_aside: int = 0
    """Records user code kept failing on, set aside (in this process's run; all of them are in
    ``store.set_aside_records()``)."""


@dataclass(frozen=True)
class RuntimeStatistics:
    computations: Mapping[str, ComputationStatistics]
    injector_watermarks_us: Mapping[str, int]
    in_flight: int
    outstanding_productions: int
    dedup_store_lookups: int
    injected: int


class Runtime(ShowsWatermarks):
    """Runs a topology; see the module docstring for the lifecycle."""

    def __init__(self, topology: Topology, config: RuntimeConfig | None = None, clock: Clock | None = None,
                 store: Store | None = None, transport: Transport | None = None,
                 placement: Placement | None = None) -> None:
        self.topology = topology
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self.store = CachedStore(store or open_store(self.config.store), self.config.cache_keys)
        self._own_store = store is None      # only a store opened here gives up, or is cut off, at stop
        self.placement = placement or ModuloPlacement(self.config.threads, self.config.intervals)
        self.router = Router(topology.consumers_of, self.config.intervals)
        self.transport = transport or LocalTransport()
        self.transport.bind(self._consumer_inbox)
        self.tracker = Tracker(self.transport, self._owner_inbox)
        self.stopping = threading.Event()
        if self._own_store:
            self.store.give_up_when(self.stopping)     # no store call is tried again once stopping
        self.gave_up: list[str] = []      # store calls given up because the runtime was stopping
        self._inbox = Inbox()                 # the coordinator's: watermark reports, floor answers
        self.workers = [Worker(i, config=self.config, clock=self.clock, store=self.store, tracker=self.tracker,
                               router=self.router, topology=topology, report=self._inbox,
                               stopping=self.stopping, fail=self.fail)
                        for i in range(self.config.threads)]
        self.injectors: dict[str, InjectorShell] = {}
        self.authority = WatermarkAuthority()
        self._auth_lock = threading.Lock()
        self.board = WatermarkBoard()         # the last publication, announced to the workers
        self._coordinating = False
        self.error: BaseException | None = None
        self.counters: Counter = Counter()
        self._gc_round = 0
        self._gc_pending: tuple[int, dict, set] | None = None
        self._generation = 0
        self._gen_cond = threading.Condition()
        self._coordinator = threading.Thread(target=self._coordinate, name="millwheel-coordinator", daemon=True)
        self._started = False

    # ---- wiring ------------------------------------------------------------------------------------
    def interval_of(self, key: str) -> int:
        return self.router.interval_of(key)

    def _consumer_inbox(self, consumer: str, interval: int) -> Inbox:
        return self.workers[self.placement.owner(consumer, interval)].inbox

    def _owner_inbox(self, sender: str, interval: int) -> Inbox:
        shell = self.injectors.get(sender)
        if shell is not None:
            return shell.inbox
        return self.workers[self.placement.owner(sender, interval)].inbox

    def fail(self, error: BaseException) -> None:
        if self.stopping.is_set() and isinstance(error, StoreAbandoned):
            self.gave_up.append(f"{threading.current_thread().name}: {error}")   # not a failure: see stop
            return
        if self.error is None:
            self.error = error
        self.stopping.set()
        self._wake_all()

    def _wake_all(self) -> None:
        with self._gen_cond:
            self._gen_cond.notify_all()
        self._inbox.wake()
        for w in self.workers:
            w.inbox.wake()
        for s in self.injectors.values():
            s.inbox.wake()

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Runtime":
        self.authority.restore(self.store.read_watermarks())
        for name in list(self.topology.computations):
            self._grant(name)
        for name, spec in self.topology.injectors.items():
            shell = InjectorShell(name, spec.factory(), spec.produces, config=self.config, clock=self.clock,
                                  store=self.store, tracker=self.tracker, router=self.router, report=self._inbox,
                                  stopping=self.stopping, fail=self.fail)
            self.injectors[name] = shell
            seq = shell.prepare()
            with self._auth_lock:
                self.authority.handle(IntervalAssigned(name, 0, seq))
        self._publish()
        self._coordinator.start()
        for w in self.workers:
            w.start()
        for s in self.injectors.values():
            s.thread.start()
        self._started = True
        return self

    def _grant(self, name: str) -> None:
        """Give every worker the intervals of ``name`` the placement says are its own."""
        spec = self.topology.computations[name]
        for w in self.workers:
            intervals = self.placement.intervals_of(name, w.index)
            if not intervals:
                continue
            seqs = w.grant(spec, intervals)
            with self._auth_lock:
                self.authority.handle(*(IntervalAssigned(name, i, seq) for i, seq in seqs.items()))

    def add_computation(self, name: str, computation: Computation, consumes: Any = (),
                        produces: Any = ()) -> None:
        """Add a computation to the running topology: it receives what is produced from now on."""
        self.topology.add_computation(name, computation, consumes, produces)
        self._grant(name)

    def stop(self) -> None:
        self.stopping.set()
        self._wake_all()
        threads = [w.thread for w in self.workers] + [s.thread for s in self.injectors.values()]
        if self._started:
            threads.append(self._coordinator)
        if not (self._own_store and self.store.interruptible):     # (SQLite and memory calls do not hang)
            for t in threads:
                if t.is_alive():
                    t.join(timeout=30)
            if self.error is None:
                self.store.save_watermarks(self.low_watermarks)
            self.store.close()
            return
        # a store opened here: bounded like a worker process's stop (see WorkerHost.stop); what was not
        # committed was acked to nobody and is redone from the store at the next start
        threads = [t for t in threads if t.ident is not None]    # (a runtime stopped before or while starting)
        try:
            deadline = time.monotonic() + STOP_GRACE_S
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            cut = any(t.is_alive() for t in threads)
            if cut:
                self.store.interrupt()     # calls a hung server never answers
                deadline = time.monotonic() + STOP_CUT_S
                for t in threads:
                    t.join(max(0.0, deadline - time.monotonic()))
                self.gave_up.append("saving the watermarks (the store's calls were cut off)")
            elif self.error is None:
                try:
                    self.store.save_watermarks(self.low_watermarks)
                except StoreAbandoned as e:
                    self.gave_up.append(f"saving the watermarks ({e})")
        finally:
            self.store.close()

    def __enter__(self) -> "Runtime":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the coordinator -------------------------------------------------------------------------
    def _coordinate(self) -> None:
        """Every tick: take the reports and answers that came in, publish watermarks, retry, collect.
        (Publishing once per tick, not per report, keeps the watermark traffic off the record path.)"""
        last_gc = self.clock.now_us()
        try:
            while not self.stopping.wait(self.config.tick_us / 1e6):
                self._coordinating = True
                try:
                    self._on_messages(self._inbox.take(1 << 30, 0))
                    self._publish()
                    now = self.clock.now_us()
                    if self.transport.may_lose:
                        self.tracker.due_retries(now)
                    if now - last_gc >= self.config.gc_interval_us:
                        last_gc = now
                        self.store.save_watermarks(self.low_watermarks)
                        self._start_gc()
                finally:
                    self._coordinating = False
                with self._gen_cond:
                    self._generation += 1
                    self._gen_cond.notify_all()
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def _on_messages(self, items: list) -> None:
        reports = [r for m in items if isinstance(m, WatermarksReported) for r in m.reports]
        if reports:
            with self._auth_lock:
                self.authority.handle(*reports)
        for m in items:
            if isinstance(m, FloorsRaised):
                self._floors_raised(m)

    def _publish(self) -> None:
        """Publish the authority's watermarks (to the workers first, see :class:`WatermarkBoard`)."""
        with self._auth_lock:
            pub = self.authority.publish(self.topology.producers())
        self.board.publish(pub, self.workers)

    def _start_gc(self) -> None:
        """Begin a dedup garbage collection round (unless one is still waiting for answers): send each
        consumer's floors to the workers holding its intervals."""
        if self._gc_pending is not None:
            return
        now = self.clock.now_us()      # read before the snapshot: a step that starts later stamps later
        oldest, producing = self.tracker.oldest_produced_at()
        floors = dedup_floors(list(self.topology.computations),
                              list(self.topology.computations) + list(self.injectors),
                              oldest, now if producing is None else min(now, producing),
                              self.config.dedup_retention_us)
        if not floors:
            return
        self._gc_round += 1
        waiting = set()
        for consumer, fl in floors.items():
            for w in self.workers:
                if self.placement.intervals_of(consumer, w.index):
                    waiting.add((w.index, consumer))
                    w.inbox.put_many([RaiseFloors(self._gc_round, consumer, fl)])
        self._gc_pending = (self._gc_round, floors, waiting)

    def _floors_raised(self, m: FloorsRaised) -> None:
        if self._gc_pending is None or self._gc_pending[0] != m.round:
            return
        _, floors, waiting = self._gc_pending
        waiting.discard((m.worker, m.consumer))
        if waiting:
            return
        self._gc_pending = None
        for consumer, fl in floors.items():  # every worker drops repeats below the floors: now rows go
            for sender, floor in fl.items():
                self.counters["dedup_gc"] += self.store.gc_dedup(consumer, sender, floor)

    # ---- observing -------------------------------------------------------------------------------
    def idle(self) -> bool:
        """Every injector has caught up, nothing is in flight or unacked, no timer is due, and the
        watermarks are settled (every interval reported with the published input)."""
        if self.error is not None or not all(s.caught_up for s in self.injectors.values()):
            return False
        now = self.clock.now_us()
        if any(w.has_due(now) for w in self.workers):
            return False
        # read after has_due: a worker that popped a due timer is busy until its productions are registered
        if any(w.busy or len(w.inbox) for w in self.workers) or any(s.busy for s in self.injectors.values()):
            return False
        # reports still in the coordinator's inbox are taken at its next tick, before run_until_idle's
        # second look (with a clock-driven injector estimate some always are)
        if self._coordinating or not self.board.settled:
            return False
        return not (self.tracker.in_flight or self.tracker.outstanding_count())

    def wait_ticks(self, n: int = 1, timeout_s: float = 10.0) -> None:
        with self._gen_cond:
            target = self._generation + n
            self._gen_cond.wait_for(lambda: self._generation >= target or self.stopping.is_set(), timeout_s)

    def run_until_idle(self, timeout_s: float | None = None) -> None:
        """Block until :meth:`idle` holds across two coordinator ticks; raise a thread's failure."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self.error is not None:
                raise self.error
            if self.idle():
                self.wait_ticks(2)
                if self.idle():
                    return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"millwheel runtime not idle after {timeout_s} s: {self.statistics()}")
            self.wait_ticks(1)

    def statistics(self) -> RuntimeStatistics:
        per: dict[str, Counter] = {}
        for w in self.workers:
            for name, c in w.statistics().items():
                per.setdefault(name, Counter()).update(c)
        for shell in self.injectors.values():     # records a consumer's key extractor raised on
            for name, n in shell.set_aside.items():
                per.setdefault(name, Counter())["set_aside"] += n
        comps = {name: ComputationStatistics(per.get(name, {}).get("records", 0),
                                             per.get(name, {}).get("duplicates", 0),
                                             per.get(name, {}).get("late", 0),
                                             per.get(name, {}).get("timers", 0),
                                             self.low_watermarks.get(name, 0),
                                             self.input_watermarks.get(name, 0),
                                             per.get(name, {}).get("set_aside", 0))
                 for name in self.topology.computations}
        return RuntimeStatistics(comps, {n: self.low_watermarks.get(n, 0) for n in self.injectors},
                                 self.tracker.in_flight, self.tracker.outstanding_count(),
                                 sum(w.dedup_store_lookups for w in self.workers),
                                 sum(s.injected for s in self.injectors.values()))


def dedup_floors(consumers: list[str], senders: list[str], oldest: Mapping[str, int], now_us: int,
                 retention_us: int) -> dict[str, dict[str, int]]:
    """Per consumer and sender, the production time below which the sender can no longer retry: its
    oldest unacked production (or ``now_us``, the oldest a step still producing may stamp) minus the
    retention. Only positive floors."""
    out: dict[str, dict[str, int]] = {}
    for sender in senders:
        floor = min(oldest.get(sender, now_us), now_us) - retention_us
        if floor > 0:
            for consumer in consumers:
                out.setdefault(consumer, {})[sender] = floor
    return out


def serve(topology: Topology, config: RuntimeConfig | None = None, clock: Clock | None = None,
          until_idle: bool = False) -> Runtime:
    """Start a runtime for ``topology``; with ``until_idle`` run it until idle, stop it and return it."""
    rt = Runtime(topology, config, clock).start()
    if until_idle:
        try:
            rt.run_until_idle()
        finally:
            rt.stop()
    return rt
