"""The runtime: a whole topology in one process, with worker threads, injector threads and one
coordinator thread (watermarks, retries, dedup garbage collection).

Lifecycle: ``Runtime(topology, config)`` → :meth:`Runtime.start` (claims every key interval, which
fences any older writer; loads timers and dedup ids; replays stored productions; restores injector
positions) → :meth:`Runtime.run_until_idle` or your own loop reading :meth:`Runtime.statistics` →
:meth:`Runtime.stop`. Any failure in a thread (user code raising, a stale sequencer) stops the runtime;
:attr:`Runtime.error` holds it and :meth:`Runtime.run_until_idle` raises it.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import mmh3
import orjson

from photon import Clock, SystemClock

from millwheel._cache import CachedStore
from millwheel._config import RuntimeConfig
from millwheel._injectors import Injector
from millwheel._model import Computation, Delivery, Production, Record
from millwheel._store import Store, StoredProduction, Write, open_store
from millwheel._topology import Topology
from millwheel._transport import Done, Inbox, LocalTransport, Tracker, Transport
from millwheel._watermarks import compute_watermarks
from millwheel._worker import Worker


@dataclass(frozen=True)
class ComputationStatistics:
    records_processed: int
    duplicates_dropped: int
    late_records: int
    timers_fired: int
    low_watermark_us: int
    input_watermark_us: int


@dataclass(frozen=True)
class RuntimeStatistics:
    computations: Mapping[str, ComputationStatistics]
    injector_watermarks_us: Mapping[str, int]
    in_flight: int
    outstanding_productions: int
    dedup_store_lookups: int
    injected: int


class InjectorShell:
    """Runs one injector: poll, commit position + records as strong productions, send, repeat."""

    def __init__(self, rt: "Runtime", name: str, injector: Injector) -> None:
        self.rt, self.name, self.injector = rt, name, injector
        self.inbox = Inbox()
        self.estimate = 0
        self.caught_up = False
        self.busy = False
        self.injected = 0
        self.thread = threading.Thread(target=self._main, name=f"millwheel-injector-{name}", daemon=True)

    def prepare(self) -> None:
        rt = self.rt
        self.seq = rt.store.claim(self.name, 0)
        raw = rt.store.read_states(self.name, [""]).get("")
        saved = orjson.loads(raw) if raw is not None else {}
        self.injector.restore(saved.get("position"))
        self.estimate = int(saved.get("estimate", 0))
        self._n = 0
        rt.replay(self.name, 0, rt.store.pending_productions(self.name, 0))

    def _main(self) -> None:
        try:
            while not self.rt.stopping.is_set():
                self._step()
        except BaseException as e:  # noqa: BLE001 - any failure stops the runtime loudly
            self.rt.fail(e)
        finally:
            self.injector.close()

    def _step(self) -> None:
        rt, cfg = self.rt, self.rt.config
        items = self.inbox.take(1 << 30, 0)
        done = [pid for item in items if isinstance(item, Done) for pid in item.ids]
        if rt.tracker.outstanding_count(self.name) >= cfg.max_in_flight:
            if done:
                rt.store.commit([Write(self.name, 0, self.seq, productions_done=done)])
            self.inbox.take(0, cfg.tick_us / 1e6)
            return
        self.busy = True
        try:
            with rt.tracker.producing(rt.clock.now_us) as now:
                prods = self._inject(now, done)
        finally:
            self.busy = False
        if not prods:
            self.inbox.take(0, max(cfg.tick_us, 20_000) / 1e6)

    def _inject(self, now: int, done: list[str]) -> list[StoredProduction]:
        rt, cfg = self.rt, self.rt.config
        poll = self.injector.poll(cfg.injector_batch, now)
        stream = rt.topology.injectors[self.name].produces
        prods = []
        for key, value, ts in poll.records:
            self._n += 1
            prods.append(StoredProduction(f"{self.name}/{self.seq}/{self._n}", stream, str(key),
                                          orjson.dumps(value), int(ts), now))
        writes = [Write(self.name, 0, self.seq, productions_done=done)] if done else []
        if prods:
            state = orjson.dumps({"position": poll.position, "estimate": max(self.estimate, poll.watermark_us)})
            writes.append(Write(self.name, 0, self.seq, key="", state=state, productions=prods))
        rt.store.commit(writes)
        out = rt.tracker.register(self.name, [(p, 0, True, rt.route(p, self.name)) for p in prods], now,
                                  cfg.retry_delay_us)
        rt.tracker.send(out)
        self.injected += len(prods)
        self.estimate = max(self.estimate, poll.watermark_us)
        self.caught_up = poll.caught_up and not prods
        return prods


class Runtime:
    """Runs a topology; see the module docstring for the lifecycle."""

    def __init__(self, topology: Topology, config: RuntimeConfig | None = None, clock: Clock | None = None,
                 store: Store | None = None, transport: Transport | None = None) -> None:
        self.topology = topology
        self.config = config or RuntimeConfig()
        self.clock = clock or SystemClock()
        self.store = CachedStore(store or open_store(self.config.store), self.config.cache_keys)
        self.workers = [Worker(i, self) for i in range(self.config.threads)]
        self.transport = transport or LocalTransport()
        self.transport.bind(self._consumer_inbox)
        self.tracker = Tracker(self.transport, self._owner_inbox)
        self.injectors: dict[str, InjectorShell] = {}
        self.low_watermarks: dict[str, int] = {}
        self.input_watermarks: dict[str, int] = {}
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.counters: Counter = Counter()
        self._count_lock = threading.Lock()
        self._per_comp: dict[str, Counter] = {}
        self._generation = 0
        self._gen_cond = threading.Condition()
        self._coordinator = threading.Thread(target=self._coordinate, name="millwheel-coordinator", daemon=True)
        self._started = False

    # ---- wiring used by the shells ------------------------------------------------------------
    def interval_of(self, key: str) -> int:
        return mmh3.hash(key, signed=False) % self.config.intervals

    def _consumer_inbox(self, consumer: str, interval: int) -> Inbox:
        return self.workers[interval % len(self.workers)].inbox

    def _owner_inbox(self, sender: str, interval: int) -> Inbox:
        if sender in self.injectors:
            return self.injectors[sender].inbox
        return self.workers[interval % len(self.workers)].inbox

    def encode(self, p: Production) -> StoredProduction:
        pid = f"{p.sender}:{mmh3.hash_bytes(p.id).hex()}"
        return StoredProduction(pid, p.stream, p.key, orjson.dumps(p.value), p.timestamp_us, p.produced_at_us)

    def route(self, p: StoredProduction, sender: str) -> list[Delivery]:
        """One delivery per consumer of the stream, keyed by that consumer's key extractor."""
        consumers = self.topology.consumers_of(p.stream)
        out = []
        for consumer, extract in consumers:
            value = orjson.loads(p.value)
            rec = Record(p.key, value, p.timestamp_us, p.id, p.stream, sender, p.produced_at_us)
            key = extract(rec)
            if key != rec.key:
                rec = Record(str(key), value, p.timestamp_us, p.id, p.stream, sender, p.produced_at_us)
            out.append(Delivery(consumer, self.interval_of(rec.key), rec))
        return out

    def replay(self, sender: str, interval: int, prods: list[StoredProduction]) -> None:
        """Send stored productions again after a restart; consumers drop the ones they committed."""
        now = self.clock.now_us()
        out = self.tracker.register(sender, [(p, interval, True, self.route(p, sender)) for p in prods], now,
                                    self.config.retry_delay_us)
        self.tracker.send(out)
        self.counters["replayed"] += len(prods)

    def count(self, name: str, results) -> None:
        with self._count_lock:
            c = self._per_comp.setdefault(name, Counter())
            for res in results:
                c["records"] += res.records_processed
                c["duplicates"] += res.duplicates_dropped
                c["late"] += res.late_records
                c["timers"] += len(res.fired)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.stopping.set()
        self._wake_all()

    def _wake_all(self) -> None:
        with self._gen_cond:
            self._gen_cond.notify_all()
        for w in self.workers:
            w.inbox.wake()
        for s in self.injectors.values():
            s.inbox.wake()

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "Runtime":
        self.low_watermarks = self.store.read_watermarks()
        for name in list(self.topology.computations):
            self._own(name)
        for name, spec in self.topology.injectors.items():
            shell = InjectorShell(self, name, spec.factory())
            self.injectors[name] = shell
            shell.prepare()
        self._recompute()
        self._coordinator.start()
        for w in self.workers:
            w.start()
        for s in self.injectors.values():
            s.thread.start()
        self._started = True
        return self

    def _own(self, name: str) -> None:
        n = len(self.workers)
        for w in self.workers:
            w.own(name, [i for i in range(self.config.intervals) if i % n == w.index])

    def add_computation(self, name: str, computation: Computation, consumes: Any = (),
                        produces: Any = ()) -> None:
        """Add a computation to the running topology: it receives what is produced from now on."""
        self.topology.add_computation(name, computation, consumes, produces)
        self._own(name)

    def stop(self) -> None:
        self.stopping.set()
        self._wake_all()
        threads = [w.thread for w in self.workers] + [s.thread for s in self.injectors.values()]
        if self._started:
            threads.append(self._coordinator)
        for t in threads:
            if t.is_alive():
                t.join(timeout=30)
        if self.error is None:
            self.store.save_watermarks(self.low_watermarks)
        self.store.close()

    def __enter__(self) -> "Runtime":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the coordinator -------------------------------------------------------------------------
    def _recompute(self) -> None:
        estimates = {name: s.estimate for name, s in self.injectors.items()}
        inputs, lows = compute_watermarks(self.topology.producers(), self.tracker.oldest(), estimates,
                                          self.low_watermarks)
        changed = inputs != self.input_watermarks
        self.input_watermarks, self.low_watermarks = inputs, lows
        if changed:
            for w in self.workers:
                w.inbox.wake()

    def _coordinate(self) -> None:
        cfg = self.config
        last_gc = time.monotonic()
        try:
            while not self.stopping.wait(cfg.tick_us / 1e6):
                self._recompute()
                if self.transport.may_lose:
                    self.tracker.due_retries(self.clock.now_us())
                if time.monotonic() - last_gc >= cfg.gc_interval_us / 1e6:
                    last_gc = time.monotonic()
                    self.store.save_watermarks(self.low_watermarks)
                    self._gc_dedup()
                with self._gen_cond:
                    self._generation += 1
                    self._gen_cond.notify_all()
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def _gc_dedup(self) -> None:
        """Forget dedup ids no sender can retry: older than each sender's oldest unacked production, and
        older than the retention."""
        now = self.clock.now_us()      # read before the snapshot: a step that starts later stamps later
        oldest, producing = self.tracker.oldest_produced_at()
        if producing is not None:
            now = min(now, producing)
        senders = list(self.topology.computations) + list(self.topology.injectors)
        for consumer in list(self.topology.computations):
            for sender in senders:
                floor = min(oldest.get(sender, now), now) - self.config.dedup_retention_us
                if floor <= 0:
                    continue
                for w in self.workers:  # workers drop repeats below the floor before rows go
                    cs = w.comps.get(consumer)
                    if cs is not None:
                        cs.floors[sender] = max(floor, cs.floors.get(sender, 0))
                self.counters["dedup_gc"] += self.store.gc_dedup(consumer, sender, floor)

    # ---- observing -------------------------------------------------------------------------------
    def idle(self) -> bool:
        """Every injector has caught up, nothing is in flight or unacked, and no timer is due."""
        if self.error is not None or not all(s.caught_up for s in self.injectors.values()):
            return False
        now = self.clock.now_us()
        if any(w.has_due(self.input_watermarks, now) for w in self.workers):
            return False
        # read after has_due: a worker that popped a due timer is busy until its productions are registered
        if any(w.busy or len(w.inbox) for w in self.workers) or any(s.busy for s in self.injectors.values()):
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
        with self._count_lock:
            per = {name: Counter(c) for name, c in self._per_comp.items()}
        comps = {name: ComputationStatistics(per.get(name, {}).get("records", 0),
                                             per.get(name, {}).get("duplicates", 0),
                                             per.get(name, {}).get("late", 0),
                                             per.get(name, {}).get("timers", 0),
                                             self.low_watermarks.get(name, 0),
                                             self.input_watermarks.get(name, 0))
                 for name in self.topology.computations}
        return RuntimeStatistics(comps, {n: self.low_watermarks.get(n, 0) for n in self.injectors},
                                 self.tracker.in_flight, self.tracker.outstanding_count(),
                                 self.counters["dedup_store_lookups"],
                                 sum(s.injected for s in self.injectors.values()))


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
