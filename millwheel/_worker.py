"""The thin threaded shell of a worker around its interval cores (``_interval.py``).

A :class:`Worker` holds some key intervals of some computations, one :class:`IntervalCore` each, and is
their single writer: it claimed them in the store, and every write carries the claim's sequencer. It
talks to the rest of the runtime only through its inbox (deliveries, :class:`Done` acks,
:class:`LowWatermarks`, :class:`RaiseFloors`), the coordinator's inbox (:class:`WatermarksReported`,
:class:`FloorsRaised`), the store, and the tracker (which registers, sends and acks productions). It
reads time only from the injected clock. One loop iteration:

1. take a batch from the inbox; apply published watermarks (each computation's input watermark is the
   minimum over its producers) and dedup floors, then feed each core its records and the time;
2. carry out the cores' commands: :class:`RunUserCode` (dedup lookups and state reads in the store, then
   :func:`millwheel._runner.run_key`), weak sends, and collect every :class:`Commit`;
3. commit every core's key checkpoints in one store transaction, then tell each core, and carry out the
   results: register strong productions, ack the senders, then send;
4. report each interval's low watermark to the authority when it changed.
"""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from photon import Clock

from millwheel._config import RuntimeConfig
from millwheel._interval import (AckDeliveries, AcksObserved, CheckpointCommitted, Commit, CommitRefused,
                                 CountResults, DedupIdsLoaded, FloorsRaised, InputWatermarkAdvanced,
                                 IntervalCore, IntervalGranted, IntervalRevoked, IntervalSettings, MarkStored,
                                 ProductionsAcked, RebuildDedupFilter, RecordsDelivered, Relinquish,
                                 ReportWatermark, ReturnDeliveries, RunUserCode, SendProductions, TimePassed,
                                 UserCodeRan, WorkObserved)
from millwheel._messages import FloorsRaised as FloorsRaisedReply
from millwheel._messages import LowWatermarks, RaiseFloors, WatermarksReported
from millwheel._model import WEAK, Computation, Delivery
from millwheel._routing import Router
from millwheel._runner import KeyInput, run_key
from millwheel._store import StaleSequencer, Store
from millwheel._topology import ComputationSpec, Topology
from millwheel._transport import Done, Inbox, Tracker
from millwheel._watermarks import input_watermark


@dataclass
class _Comp:
    """What a worker keeps about one computation: the user code and the cores of its intervals."""
    spec: ComputationSpec
    computation: Computation
    cores: dict[int, IntervalCore]


class Worker:
    """See the module docstring. ``report`` is where watermark reports and floor answers go (the
    coordinator's inbox); ``fail`` stops the runtime with an error."""

    def __init__(self, index: int, *, config: RuntimeConfig, clock: Clock, store: Store, tracker: Tracker,
                 router: Router, topology: Topology, report: Inbox, stopping: threading.Event,
                 fail: Callable[[BaseException], None]) -> None:
        self.index = index
        self.config, self.clock, self.store, self.tracker = config, clock, store, tracker
        self.router, self.topology, self._report, self._stopping, self._fail = router, topology, report, stopping, fail
        self.inbox = Inbox()
        self.comps: dict[str, _Comp] = {}
        self._lock = threading.Lock()
        self.busy = False
        self._deferred: list = []
        self._lows: dict[str, int] = {}
        self.counters: dict[str, Counter] = {}
        self.dedup_store_lookups = 0
        self._count_lock = threading.Lock()
        self._sends: list[Delivery] = []
        self.thread = threading.Thread(target=self._main, name=f"millwheel-worker-{index}", daemon=True)

    # ---- ownership and recovery ---------------------------------------------------------------
    def grant(self, spec: ComputationSpec, intervals: list[int]) -> dict[int, int]:
        """Claim the intervals (fencing older writers), load their timers and dedup ids into new cores,
        and replay their stored productions. Returns each interval's sequencer."""
        cfg, store = self.config, self.store
        comp = self.comps.get(spec.name) or _Comp(spec, spec.factory(), {})
        weak = comp.computation.productions == WEAK
        per_interval_cache = max(16, cfg.cache_keys // max(1, len(intervals)))
        bloom = max(1024, cfg.bloom_capacity // cfg.intervals)
        floors = store.gc_floors(spec.name)
        cores, seqs = {}, {}
        for i in intervals:
            seqs[i] = store.claim(spec.name, i)
            core = IntervalCore(IntervalSettings(spec.name, i, comp.computation.exactly_once, weak,
                                                 per_interval_cache, bloom, cfg.weak_checkpoint_delay_us))
            ids = store.dedup_ids(spec.name, [i]) if comp.computation.exactly_once else []
            core.handle(IntervalGranted(seqs[i], store.read_timers(spec.name, [i]), floors, ids))
            cores[i] = core
        with self._lock:  # before the replay: acks of replayed productions come back here
            comp.cores.update(cores)
            self.comps[spec.name] = comp
        now = self.clock.now_us()
        for i in intervals:
            prods = store.pending_productions(spec.name, i)
            self.tracker.send(self.tracker.register(spec.name, self.router.outgoing(spec.name, i, prods, True),
                                                    now, cfg.retry_delay_us))
        self.inbox.wake()
        return seqs

    def revoke(self, name: str, intervals: list[int]) -> None:
        """Give intervals up (a master moved them): their received records go back to be routed again.
        Call from the worker's own thread or while it is stopped."""
        comp = self.comps.get(name)
        for i in intervals:
            core = comp.cores.pop(i, None) if comp else None
            if core is not None:
                self._execute(core, core.handle(IntervalRevoked()), self.clock.now_us(), [], [])

    def start(self) -> None:
        self.thread.start()

    # ---- the loop -----------------------------------------------------------------------------
    def _main(self) -> None:
        cfg = self.config
        try:
            while not self._stopping.is_set():
                self.step(self.inbox.take(cfg.max_batch, cfg.tick_us / 1e6))
        except BaseException as e:  # noqa: BLE001 - any failure stops the runtime loudly
            self._fail(e)

    def step(self, items: list) -> None:
        self.busy = True
        try:
            deliveries = [d for d in items if isinstance(d, Delivery)]
            self.tracker.received(deliveries)
            with self._lock:
                comps = list(self.comps.values())
            self._control([i for i in items if not isinstance(i, (Delivery, Done))], comps)
            work = self._deferred + [i for i in items if isinstance(i, (Delivery, Done))]
            with self.tracker.producing(self.clock.now_us) as now:  # until its productions are registered
                self._batch(work, comps, now)
            self._report_watermarks(comps)
        finally:
            self.busy = False

    def _control(self, items: list, comps: list[_Comp]) -> None:
        for item in items:
            if isinstance(item, LowWatermarks):
                self._lows = dict(item.lows)
            elif isinstance(item, RaiseFloors):
                comp = self.comps.get(item.consumer)
                for core in (comp.cores.values() if comp else ()):
                    core.handle(FloorsRaised(item.floors))
                self._report.put_many([FloorsRaisedReply(item.round, item.consumer, self.index)])
        producers = self.topology.producers()
        for comp in comps:
            wm = input_watermark(producers.get(comp.spec.name, ()), self._lows)
            for core in comp.cores.values():
                core.handle(InputWatermarkAdvanced(wm))

    def _batch(self, items: list, comps: list[_Comp], now: int) -> None:
        by_core: dict[tuple[str, int], list] = {}
        for item in items:
            if isinstance(item, Delivery):
                by_core.setdefault((item.consumer, item.interval), []).append(item)
            elif isinstance(item, Done):
                by_core.setdefault((item.sender, item.interval), []).append(item)
        commits: list[tuple[IntervalCore, Commit]] = []
        for comp in comps:
            for interval, core in list(comp.cores.items()):
                events = self._events(core, by_core.pop((comp.spec.name, interval), []), now)
                self._execute(core, core.handle(*events), now, commits, [])
        self._commit(commits, now)
        # records for intervals this worker does not hold (yet): keep them for the next step
        self._deferred = [i for items in by_core.values() for i in items]

    def _events(self, core: IntervalCore, items: list, now: int) -> list:
        events: list = []
        delivered = [i for i in items if isinstance(i, Delivery)]
        done = tuple(pid for i in items if isinstance(i, Done) for pid in i.ids)
        if done:
            events.append(ProductionsAcked(done))
        if delivered:
            events.append(RecordsDelivered(delivered))
        if core.weak_waiting:
            events.append(AcksObserved(self.tracker.unacked(core.pending_weak_ids()), now))
        events.append(TimePassed(now))
        return events

    def _commit(self, commits: list, now: int) -> None:
        if not commits:
            return
        try:
            self.store.commit([w for _, c in commits for w in c.writes])
        except StaleSequencer:
            for core, c in commits:
                self._execute(core, core.handle(CommitRefused(c.commit_id)), now, [], [])
            raise
        for core, c in commits:
            self._execute(core, core.handle(CheckpointCommitted(c.commit_id)), now, [], [])
        sends, self._sends = self._sends, []
        self.tracker.send(sends)

    def _execute(self, core: IntervalCore, commands: list, now: int, commits: list, reports: list) -> None:
        """Carry out a core's commands in order (some are answered at once with a new event)."""
        tracker, cfg = self.tracker, self.config
        for cmd in commands:
            kind = type(cmd)
            if kind is RunUserCode:
                self._execute(core, core.handle(self._run_user_code(cmd)), now, commits, reports)
            elif kind is Commit:
                commits.append((core, cmd))
            elif kind is SendProductions:
                out = tracker.register(cmd.computation, self.router.outgoing(cmd.computation, cmd.interval,
                                                                             cmd.productions, cmd.stored),
                                       now, cfg.retry_delay_us)
                if cmd.stored:
                    self._sends.extend(out)   # after the acks that follow
                else:
                    tracker.send(out)         # weak: before anything is persisted
            elif kind is AckDeliveries:
                tracker.acked(cmd.deliveries)
            elif kind is MarkStored:
                tracker.mark_stored(cmd.computation, cmd.interval, cmd.ids)
            elif kind is CountResults:
                self._count(core.name, cmd.results)
            elif kind is RebuildDedupFilter:
                loaded = DedupIdsLoaded(self.store.dedup_ids(cmd.computation, [cmd.interval]),
                                        self.store.gc_floors(cmd.computation))
                self._execute(core, core.handle(loaded), now, commits, reports)
            elif kind is ReportWatermark:
                reports.append(cmd.report)
            elif kind is ReturnDeliveries:
                tracker.unreceive(cmd.deliveries)
                tracker.send(cmd.deliveries)
            elif kind is Relinquish:
                comp = self.comps.get(cmd.computation)
                if comp is not None:
                    comp.cores.pop(cmd.interval, None)
            else:
                raise TypeError(f"worker cannot carry out {cmd!r}")

    def _run_user_code(self, cmd: RunUserCode) -> UserCodeRan:
        comp = self.comps[cmd.computation]
        dups = set(cmd.duplicates)
        if cmd.lookup_ids:
            self.dedup_store_lookups += len(cmd.lookup_ids)
            dups |= self.store.seen(cmd.computation, cmd.lookup_ids)
        found = self.store.read_states(cmd.computation, cmd.read_states) if cmd.read_states else {}
        produces = comp.spec.produces
        results = []
        for w in cmd.keys:
            state = found.get(w.key) if w.read else w.state
            inp = KeyInput(cmd.computation, w.key, w.records, state, w.timers, dups, cmd.input_watermark_us,
                           cmd.now_us, produces)
            results.append(run_key(comp.computation, inp))
        return UserCodeRan(cmd.run_id, results, {k: found.get(k) for k in cmd.read_states}, cmd.now_us)

    def _report_watermarks(self, comps: list[_Comp]) -> None:
        cores = [core for comp in comps for core in comp.cores.values()]
        oldest = self.tracker.oldest([(c.name, c.interval) for c in cores])  # after this step's changes
        reports: list = []
        for core, value in zip(cores, oldest):
            self._execute(core, core.handle(WorkObserved(value)), 0, [], reports)
        if reports:
            self._report.put_many([WatermarksReported(tuple(reports))])

    def _count(self, name: str, results) -> None:
        with self._count_lock:
            c = self.counters.setdefault(name, Counter())
            for res in results:
                c["records"] += res.records_processed
                c["duplicates"] += res.duplicates_dropped
                c["late"] += res.late_records
                c["timers"] += len(res.fired)

    # ---- observing -------------------------------------------------------------------------------
    def has_due(self, now: int) -> bool:
        with self._lock:
            comps = list(self.comps.values())
        return any(core.has_due(now) for comp in comps for core in list(comp.cores.values()))

    def statistics(self) -> dict[str, Counter]:
        with self._count_lock:
            return {name: Counter(c) for name, c in self.counters.items()}
