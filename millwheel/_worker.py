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
   :class:`millwheel._runner.KeyRunner`, one per command; a key whose user code raised on a record is answered as
   :class:`KeyFailed`, and its core tries it again or sets the record aside), weak sends, and collect
   every :class:`Commit`;
3. if the previous transaction has landed, hand every core's key checkpoints of this step (and of the
   steps taken while it was in flight), as one store transaction, to the worker's commit thread; else keep
   them pending beside it (see below); and go on;
4. report each interval's low watermark to the authority when it changed.

**Commits overlap the next step.** A step's transaction runs on the worker's commit thread while the
worker thread takes and processes the next batch, so the thread no longer idles through each commit's
round trips and WAL flush. At most one transaction is in flight per worker, and its outcome is carried
out on the worker thread as soon as it lands (its :class:`CommitLanded` wakes the thread), before the next
transaction goes out: tell each core (:class:`CheckpointCommitted`, or :class:`CommitRefused` when
fenced), then register the strong productions, ack the senders, then send. **Group commit**: a step
taken while a transaction is in flight does not wait for it; its checkpoints are kept pending and go out,
together with those of every other step taken meanwhile, as the next transaction the moment the one in
flight lands. The worker thread so keeps taking records while a commit is out (a record arriving then
waits for one landing, not for the thread to come back from waiting on it and then for one more
commit), and under load the transactions grow instead of the queue. What stays exactly as with one
commit at a time:

* a key is locked from its run until its commit has landed, so the next step runs only other keys (and
  the records and due timers of a locked key wait in its core, in order); no state, dedup id or timer
  of a key is read while its checkpoint is in flight;
* acks and sends of strong productions follow the commit that stored them;
* commits go out in order, one at a time, each checking its intervals' sequencers; when one is refused,
  the next step's checkpoints of the refused intervals are dropped before they go out (their records went
  back with :class:`CommitRefused`), and the other intervals' go out alone;
* the step's production time stays held in the tracker (dedup GC must not pass it) until its
  productions are registered, at the landing;
* the worker is ``busy`` while a commit is in flight or pending; intervals are given up (:class:`GiveUp`) and the
  loop ends only after the commit in flight (and then the pending one) has landed.

**Landings on the commit thread.** A worker's cores are touched only under its step lock, which the
worker thread holds for each step. At a low rate each record would otherwise wake the worker thread twice
per stage, once for its step and once for its commit's landing; so when the worker thread is idle (the
lock is free) the commit thread carries the landing out itself under the lock (:meth:`Worker._landed`;
not a refused commit, nor one with checkpoints pending beside it, and it still wakes the worker thread
when a landed key has records waiting or a timer due). The landing is the same code on either thread, so
everything above holds whichever thread runs it.
"""
from __future__ import annotations

import threading
from collections import Counter
import queue
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from photon import Clock

from millwheel._config import RuntimeConfig
from millwheel._interval import (AckDeliveries, AcksObserved, CheckpointCommitted, Commit, CommitRefused,
                                 CountResults, DedupIdsLoaded, EpochAnnounced, FloorsRaised, InputWatermarkAdvanced,
                                 IntervalCore, IntervalGranted, IntervalRevoked, IntervalSettings, KeyFailed,
                                 MarkStored,
                                 ProductionsAcked, RebuildDedupFilter, RecordsDelivered, Relinquish,
                                 ReportWatermark, ReturnDeliveries, RunUserCode, SendProductions, TimePassed,
                                 UserCodeRan, WorkObserved)
from millwheel._messages import FloorsRaised as FloorsRaisedReply
from millwheel._messages import LowWatermarks, RaiseFloors, WatermarksReported
from millwheel._model import WEAK, Computation, Delivery
from millwheel._routing import Router
from millwheel._runner import KeyRunner, UserCodeFailed
from millwheel._store import SetAsideRecord, StaleSequencer, Store, Write
from millwheel._topology import ComputationSpec, Topology
from millwheel._transport import Done, Inbox, Tracker
from millwheel._watermarks import input_watermark


IDLE_WAIT_US = 100_000
"""The longest a worker with nothing to do waits on its inbox (see :meth:`Worker.idle_wait_s`): what wakes
it sooner is an item, a wake, or its earliest processing-time timer coming due; the bound only covers a
clock that is not the wall clock (a test's) and anything left unwoken."""


@dataclass(frozen=True)
class GiveUp:
    """A worker process's host → one of its workers: stop holding these intervals of ``computation`` (the
    master moved them); ``done`` is set once they are given up."""
    computation: str
    intervals: tuple[int, ...]
    done: threading.Event


@dataclass(frozen=True)
class CommitLanded:
    """A worker's commit thread → the worker's inbox: the transaction in flight has an outcome (wakes the
    loop to carry it out)."""


class _Committer:
    """The one thread running a worker's transactions, in order (``submit(fn, *args) -> Future``). A daemon
    thread, unlike an executor's: a transaction a hung server never answers must not keep a stopping
    process from exiting (what it would have written was acked to nobody; the next owner redoes it)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._queue.put((future, fn, args))
        if self._thread.ident is None:
            self._thread.start()        # on the first transaction (only the worker thread submits)
        return future

    def shutdown(self) -> None:
        self._queue.put(None)

    def _main(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the worker thread raises it when it lands
                future.set_exception(e)


@dataclass
class _InFlight:
    """The one transaction of a worker in flight: its cores' commits, the step's time (its production time,
    held in the tracker until the productions are registered) and the commit thread's future."""
    commits: list
    nows: list[int]
    future: Future


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
        self._store_id = getattr(store, "identity", None)   # what user code's sequencers are fenced with
        self.router, self.topology, self._report, self._stopping, self._fail = router, topology, report, stopping, fail
        self.inbox = Inbox()
        self.comps: dict[str, _Comp] = {}
        self._lock = threading.Lock()
        self._busy = False
        self._in_flight: _InFlight | None = None
        self._pending: list = []                   # checkpoints of steps taken while a commit was in flight
        self._pending_nows: list[int] = []         # and those steps' production times (held in the tracker)
        self._committer = _Committer(f"millwheel-commit-{index}")
        self._step_lock = threading.Lock()         # held by whoever runs a step or lands a commit (see _landed)
        self.landed_on_commit_thread = 0           # commits carried out by the commit thread (worker idle)
        self.commits_waited = 0                    # transactions the worker thread had to wait for
        self.steps_grouped = 0                     # steps whose checkpoints waited pending beside a commit
        self.inbox_high = 0                        # the most items seen waiting in the inbox at a step
        self._deferred: list = []
        self._lows: dict[str, int] = {}
        self._inputs: dict[str, int] = {}          # each computation's input watermark (min over producers)
        self._epochs: dict[str, int] = {}          # the cut epoch announced to each computation on a cycle
        self._dirty: set[IntervalCore] = set()     # cores whose low watermark may have changed
        self.counters: dict[str, Counter] = {}
        self.dedup_store_lookups = 0
        self.user_code_failures = 0                # runs of a key undone because user code raised
        self._count_lock = threading.Lock()
        self._sends: list[Delivery] = []
        self._acks: list[Delivery] = []
        # set by a worker process's host (None: one process, which owns everything for good):
        self.on_fenced: Callable[[StaleSequencer], None] | None = None   # a commit was refused
        self.may_run: Callable[[], bool] | None = None                   # False: the lease has run out
        self.received_per_slot: Counter = Counter()                      # (computation, interval) -> records
        self.thread = threading.Thread(target=self._main, name=f"millwheel-worker-{index}", daemon=True)

    # ---- ownership and recovery ---------------------------------------------------------------
    def grant(self, spec: ComputationSpec, intervals: list[int],
              sequencers: dict[int, int] | None = None) -> dict[int, int]:
        """Claim the intervals (fencing older writers; under the master's ``sequencers`` when given), load
        their timers and dedup ids into new cores, and replay their stored productions, all before the
        cores take any record. Returns each interval's sequencer."""
        # until the replayed productions are registered, dedup floors must not pass them (they are older
        # than anything the tracker holds): a production time of 0 is held meanwhile
        with self.tracker.producing(lambda: 0):
            return self._grant(spec, intervals, sequencers)

    def _grant(self, spec: ComputationSpec, intervals: list[int], sequencers: dict[int, int] | None) -> dict[int, int]:
        cfg, store = self.config, self.store
        comp = self.comps.get(spec.name) or _Comp(spec, spec.factory(), {})
        weak = comp.computation.productions == WEAK
        bloom = max(1024, cfg.bloom_capacity // cfg.intervals)
        seqs = {i: store.claim(spec.name, i, sequencers.get(i) if sequencers else None) for i in intervals}
        # the floors after the claims: ids below a floor are deleted only by the holder of their interval's
        # sequencer, in the transaction that raises the floor, so a floor read now covers every id gone
        floors = store.gc_floors(spec.name)
        cores = {}
        for i in intervals:
            # no cache in the core: state is read through the process's framework cache (one cache, whose
            # hit ratio is every state read's)
            core = IntervalCore(IntervalSettings(spec.name, i, comp.computation.exactly_once, weak,
                                                 0, bloom, cfg.weak_checkpoint_delay_us, cfg.max_attempts))
            ids = store.dedup_ids(spec.name, [i]) if comp.computation.exactly_once else []
            core.handle(IntervalGranted(seqs[i], store.read_timers(spec.name, [i]), floors, ids))
            cores[i] = core
        with self._lock:  # before the replay: acks of replayed productions come back here
            self._inputs.pop(spec.name, None)   # computed again at the next step, with its producers
            comp.cores.update(cores)
            self.comps[spec.name] = comp
        now = self.clock.now_us()
        for i in intervals:
            prods = store.pending_productions(spec.name, i)
            self.tracker.send(self.tracker.register(spec.name, self._outgoing(spec.name, i, seqs[i], prods, True,
                                                                              replayed=True),
                                                    now, cfg.retry_delay_us))
        self.inbox.wake()
        return seqs

    def revoke(self, name: str, intervals: list[int]) -> None:
        """Give intervals up (a master moved them): their received records go back to be routed again.
        Call from the worker's own thread or while it is stopped."""
        self._land(wait=True)    # the commit in flight may hold the intervals' records: let it decide first
        comp = self.comps.get(name)
        for i in intervals:
            core = comp.cores.pop(i, None) if comp else None
            if core is not None:
                self._execute(core, core.handle(IntervalRevoked()), self.clock.now_us(), [])

    def start(self) -> None:
        self.thread.start()

    # ---- the loop -----------------------------------------------------------------------------
    def _main(self) -> None:
        cfg = self.config
        try:
            lock = self._step_lock
            wait_s = cfg.tick_us / 1e6
            while not self._stopping.is_set():
                items = self.inbox.take(cfg.max_batch, wait_s)
                with lock:
                    self.step(items)
                    wait_s = self.idle_wait_s() if not len(self.inbox) else 0.0
            with lock:
                self._land(wait=True)
                if self._pending:     # steps taken while the last commit was in flight: theirs go out too
                    self._send_commit([], None)
                    self._land(wait=True)
        except BaseException as e:  # noqa: BLE001 - any failure stops the runtime loudly
            self._fail(e)
        finally:
            self._committer.shutdown()

    def idle_wait_s(self) -> float:
        """How long the worker thread may wait on its inbox for the next step. ``tick_us`` while something
        would happen at a step with no new item: a step deferred (the lease), a commit in flight or pending
        (its landing is carried out or woken for anyway; the tick is kept as before), a core that wants a
        step (records waiting for their key, weak checkpoints waiting for acks, a timer due). Otherwise
        nothing changes without an item or a wake (records, acks, watermarks, floors, grants, the stop all
        come that way), so it waits until its earliest processing-time timer is due, at most
        ``IDLE_WAIT_US``: an idle worker no longer wakes every ``tick_us`` for an empty step. Call under
        the step lock."""
        tick = self.config.tick_us
        if self._deferred or self._in_flight is not None or self._pending:
            return tick / 1e6
        now = self.clock.now_us()
        wait = max(tick, IDLE_WAIT_US)
        with self._lock:
            cores = [core for comp in self.comps.values() for core in comp.cores.values()]
        for core in cores:
            if core.wants_step(now):
                return tick / 1e6
            due = core.next_wall_timer_us()
            if due is not None and due - now < wait:
                wait = max(tick, due - now)
        return wait / 1e6

    @property
    def busy(self) -> bool:
        """A step is running or a commit is in flight."""
        return self._busy or self._in_flight is not None or bool(self._pending)

    def step(self, items: list) -> None:
        self._busy = True
        self.inbox_high = max(self.inbox_high, len(self.inbox) + len(items))
        try:
            self._land(wait=False)    # the previous step's commit, if it has landed
            deliveries, control, work = [], [], list(self._deferred)
            for item in items:                  # one pass: records, acks, and the rest (control)
                kind = type(item)
                if kind is Delivery:
                    deliveries.append(item)
                    work.append(item)
                elif kind is Done:
                    work.append(item)
                else:
                    control.append(item)
            self.tracker.received(deliveries)
            with self._lock:
                comps = list(self.comps.values())
            self._control(control, comps)
            if self.may_run is not None and not self.may_run():
                self._deferred = work      # the lease ran out: touch nothing until the host knows more
                return
            with self._lock:
                comps = list(self.comps.values())   # intervals given up just now are gone
            now = self.tracker.hold_production_time(self.clock.now_us)  # until its productions are registered
            try:
                commits = self._batch(work, comps, now)
            except BaseException:
                self.tracker.release_production_time(now)
                raise
            flight = self._in_flight
            if flight is not None and not flight.future.done():
                # the previous commit is still in flight: this step's checkpoints wait beside it (group
                # commit) instead of the thread, which takes the records arriving meanwhile; they all go
                # out as one transaction when it lands (its CommitLanded wakes this thread)
                if commits:
                    self.steps_grouped += 1
                    self._pending.extend(commits)
                    self._pending_nows.append(now)
                else:
                    self.tracker.release_production_time(now)
            else:
                self._land(wait=True)   # landed already: carried out before the next commit goes out
                self._send_commit(commits, now)
            self._report_watermarks()
        finally:
            self._busy = False

    def _control(self, items: list, comps: list[_Comp]) -> None:
        lows = None
        for item in items:
            if isinstance(item, LowWatermarks):
                lows = item
            elif isinstance(item, GiveUp):
                self.revoke(item.computation, list(item.intervals))
                item.done.set()
            elif isinstance(item, RaiseFloors):
                comp = self.comps.get(item.consumer)
                for core in (self._cores(comp) if comp else ()):
                    core.handle(FloorsRaised(item.floors))
                self._report.put_many([FloorsRaisedReply(item.round, item.consumer, self.index)])
        if lows is not None:
            self._lows = dict(lows.lows)
            self._epochs = dict(lows.epochs)
        if self._epochs:
            self._announce_epochs(comps)
        if lows is None and all(c.spec.name in self._inputs for c in comps):
            return
        producers = self.topology.producers()
        for comp in comps:
            name = comp.spec.name
            wm = input_watermark(producers.get(name, ()), self._lows)
            if self._inputs.get(name) != wm:
                self._inputs[name] = wm
                for core in self._cores(comp):
                    core.handle(InputWatermarkAdvanced(wm))
                    self._dirty.add(core)

    def _announce_epochs(self, comps: list[_Comp]) -> None:
        """Give each core of a computation on a cycle the epoch announced to it, if it has not seen it
        (also a core granted since): its tracking window restarts now, in the tracker and in the core."""
        for comp in comps:
            epoch = self._epochs.get(comp.spec.name)
            if epoch is None:
                continue
            behind = [core for core in self._cores(comp) if core.held and core.epoch < epoch]
            if not behind:
                continue
            ended = self.tracker.restart_windows([(c.name, c.interval) for c in behind])
            for core, low in zip(behind, ended):
                core.handle(EpochAnnounced(epoch, low))
                self._dirty.add(core)

    def _cores(self, comp: _Comp) -> list[IntervalCore]:
        """The computation's cores now. A worker process's heartbeat thread grants intervals (adds cores)
        while this thread runs, so never iterate ``comp.cores`` itself here: a dict changing size under
        an iteration raised and stopped the worker process."""
        with self._lock:
            return list(comp.cores.values())

    def _batch(self, items: list, comps: list[_Comp], now: int) -> list:
        """Feed the cores their records and time, run user code; returns the step's commits."""
        by_core: dict[tuple[str, int], list] = {}
        for item in items:
            slot = (item.consumer, item.interval) if type(item) is Delivery else (item.sender, item.interval)
            mine = by_core.get(slot)
            if mine is None:
                by_core[slot] = [item]
            else:
                mine.append(item)
        commits: list[tuple[IntervalCore, Commit]] = []
        runs: list[tuple[IntervalCore, RunUserCode]] = []
        for comp in comps:
            for interval, core in list(comp.cores.items()):
                mine = by_core.pop((comp.spec.name, interval), None)
                if mine is not None:
                    self.received_per_slot[(comp.spec.name, interval)] += len(mine)
                if mine is None and not core.wants_step(now):
                    continue
                self._dirty.add(core)
                self._execute(core, core.handle(*self._events(core, mine or [], now)), now, commits, runs=runs)
        for core, ran in self._run_user_code(runs):
            self._execute(core, core.handle(ran), now, commits)
            if core.weak_waiting:  # weak productions just sent may be acked already (or there are none)
                unacked = self.tracker.unacked(core.pending_weak_ids())
                self._execute(core, core.handle(AcksObserved(unacked, now)), now, commits)
        # records for intervals this worker does not hold (yet): keep them for the next step; in a worker
        # process, records of intervals it gave up are handed back unacked (those produced in this process
        # go out again once the map has been read; other processes' senders send theirs again to the new
        # owner) and acks of productions it no longer owns are dropped (the new owner replays them)
        left = [i for items in by_core.values() for i in items]
        if self.on_fenced is not None and left:
            self.tracker.returned([i for i in left if isinstance(i, Delivery)])
            left = []
        self._deferred = left
        return commits

    def _events(self, core: IntervalCore, items: list, now: int) -> list:
        events: list = []
        delivered, done = [], []
        for i in items:
            if type(i) is Delivery:
                delivered.append(i)
            else:
                done.extend(i.ids)
        done = tuple(done)
        if done:
            events.append(ProductionsAcked(done))
        if delivered:
            events.append(RecordsDelivered(delivered))
        if core.weak_waiting:
            events.append(AcksObserved(self.tracker.unacked(core.pending_weak_ids()), now))
        events.append(TimePassed(now))
        return events

    def _send_commit(self, commits: list, now: int | None) -> None:
        """Hand the step's commits, with those of the steps taken while the previous commit was in flight,
        as one transaction to the commit thread (no commit is in flight now). The checkpoints of cores that
        lost their interval meanwhile (a commit refused at the landing just before) are dropped: their
        records went back with the refusal."""
        nows = self._pending_nows + ([] if now is None else [now])
        commits = [(core, c) for core, c in self._pending + commits if core.awaits(c.commit_id)]
        self._pending, self._pending_nows = [], []
        if not commits:
            for t in nows:
                self.tracker.release_production_time(t)
            return
        writes = [w for _, c in commits for w in c.writes]
        future = self._committer.submit(self.store.commit, writes)
        flight = self._in_flight = _InFlight(commits, nows, future)
        future.add_done_callback(lambda _: self._landed(flight))

    def _landed(self, flight: _InFlight) -> None:
        """On the commit thread, once the transaction in flight has an outcome. When the worker thread is
        idle (the step lock is free: it waits on its inbox) and no step's checkpoints wait beside this
        commit, this thread carries the landing out itself, as the worker thread would at its next step
        (tell the cores, ack, send the strong productions, release the production time) and reports the
        watermarks that moved, holding the step lock meanwhile; the worker thread is not woken for it. A
        refused commit, checkpoints pending, or a worker thread at work: the landing is the worker
        thread's, woken by :class:`CommitLanded` as before; so is it when a core of the commit has work left
        once it landed (records that waited for their key's checkpoint, a due timer)."""
        lock = self._step_lock
        if flight.future.exception() is None and not self._pending and lock.acquire(blocking=False):
            try:
                if self._in_flight is flight and not self._pending:
                    self._busy = True
                    try:
                        self._land(wait=True)
                        if self.may_run is None or self.may_run():   # as a step: no report past the lease
                            self._report_watermarks()
                        now = self.clock.now_us()
                        if not any(core.wants_step(now) for core, _ in flight.commits):
                            self.landed_on_commit_thread += 1
                            return
                    finally:
                        self._busy = False
            except BaseException as e:  # noqa: BLE001 - as on the worker thread: stops the runtime loudly
                self._fail(e)
                return
            finally:
                lock.release()
        self.inbox.put_many([CommitLanded()])

    def _land(self, wait: bool) -> None:
        """Carry out the outcome of the commit in flight (waiting for it if ``wait``): tell each core; then,
        for all of them: register the strong productions, ack the senders, send; then release the step's
        production time."""
        flight = self._in_flight
        if flight is None or not (wait or flight.future.done()):
            return
        if not flight.future.done():
            self.commits_waited += 1
        self._in_flight = None
        now = max(flight.nows)
        self._dirty.update(core for core, _ in flight.commits)   # their records are acked or handed back now
        try:
            try:
                flight.future.result()
            except StaleSequencer as e:
                for core, c in flight.commits:
                    self._execute(core, core.handle(CommitRefused(c.commit_id)), now, [])
                self._acks.clear()
                self._sends.clear()
                if self.on_fenced is None:
                    raise
                self.on_fenced(e)      # a worker process asks its master what it still owns
                return
            for core, c in flight.commits:
                self._execute(core, core.handle(CheckpointCommitted(c.commit_id)), now, [])
            acks, self._acks = self._acks, []
            self.tracker.acked(acks)
            sends, self._sends = self._sends, []
            self.tracker.send(sends)
        finally:
            for t in flight.nows:
                self.tracker.release_production_time(t)

    def _execute(self, core: IntervalCore, commands: list, now: int, commits: list, reports: list | None = None,
                 runs: list | None = None) -> None:
        """Carry out a core's commands in order. :class:`RunUserCode` goes to ``runs`` (the step runs them
        together, sharing the store reads), :class:`Commit` to ``commits`` (one transaction), acks and
        strong sends wait for the end of the commit."""
        tracker, cfg = self.tracker, self.config
        for cmd in commands:
            kind = type(cmd)
            if kind is RunUserCode:
                if runs is None:
                    raise RuntimeError(f"{core.name} interval {core.interval}: a run outside a step")
                runs.append((core, cmd))
            elif kind is Commit:
                commits.append((core, cmd))
            elif kind is SendProductions:
                out = tracker.register(cmd.computation, self._outgoing(cmd.computation, cmd.interval, core.sequencer,
                                                                       cmd.productions, cmd.stored),
                                       now, cfg.retry_delay_us)
                if cmd.stored:
                    self._sends.extend(out)   # after the acks
                else:
                    tracker.send(out)         # weak: before anything is persisted
            elif kind is AckDeliveries:
                self._acks.extend(cmd.deliveries)
            elif kind is MarkStored:
                tracker.mark_stored(cmd.computation, cmd.interval, cmd.ids)
            elif kind is CountResults:
                self._count(core.name, cmd.results, len(cmd.set_aside))
            elif kind is RebuildDedupFilter:
                loaded = DedupIdsLoaded(self.store.dedup_ids(cmd.computation, [cmd.interval]),
                                        self.store.gc_floors(cmd.computation))
                self._execute(core, core.handle(loaded), now, commits, reports)
            elif kind is ReportWatermark:
                reports.append(cmd.report)
            elif kind is ReturnDeliveries:
                tracker.hand_back(cmd.deliveries)
            elif kind is Relinquish:
                comp = self.comps.get(cmd.computation)
                if comp is not None:
                    comp.cores.pop(cmd.interval, None)
            else:
                raise TypeError(f"worker cannot carry out {cmd!r}")

    def _outgoing(self, sender: str, interval: int, sequencer: int | None, prods: list, stored: bool,
                  replayed: bool = False) -> list:
        """The rows to register for ``prods`` of ``sender``'s ``interval`` (:meth:`Router.outgoing`). A
        production a consumer's key extractor raises on is set aside for that consumer, as a record user code
        kept failing on is, instead of stopping the runtime (and, committed already, raising again at every
        start when it is replayed): the stream's other consumers still get it, and the set-aside record is
        written (under the sender's sequencer) before the production is registered, so before it can be
        acked and forgotten. A replayed production set aside by an earlier run is written again (the same
        row) but not counted again."""
        failed: list = []
        rows = self.router.outgoing(sender, interval, prods, stored, failed)
        if failed:
            self._set_aside_unroutable(sender, interval, sequencer, failed, replayed)
        return rows

    def _set_aside_unroutable(self, sender: str, interval: int, sequencer: int | None, failed: list,
                              replayed: bool) -> None:
        aside = [SetAsideRecord(consumer, p.id, p.key, f"the key extractor of {consumer} for stream {p.stream} "
                                f"raised on a production of {sender}: {error}", 1, p.value,
                                p.timestamp_us, sender, p.produced_at_us)
                 for consumer, p, error in failed]
        known: set = set()
        if replayed:
            for consumer in {r.computation for r in aside}:
                known.update((consumer, r.id) for r in self.store.set_aside_records(consumer))
        try:
            self.store.commit([Write(sender, interval, sequencer, set_aside=aside)])
        except StaleSequencer:
            if self.on_fenced is None:
                raise
            return      # a newer owner holds the interval: it replays the production and sets it aside
        for r in aside:
            if (r.computation, r.id) not in known:
                self._count(r.computation, (), 1)

    def _run_user_code(self, runs: list) -> list:
        """Carry out the step's :class:`RunUserCode` commands: per computation one dedup lookup and one
        state read in the store, then user code key by key. Returns ``(core, UserCodeRan)`` pairs."""
        found: dict[str, tuple[set, dict]] = {}
        for name in {cmd.computation for _, cmd in runs}:
            ids = [i for _, cmd in runs if cmd.computation == name for i in cmd.lookup_ids]
            keys = [k for _, cmd in runs if cmd.computation == name for k in cmd.read_states]
            if ids:
                self.dedup_store_lookups += len(ids)
            found[name] = (self.store.seen(name, ids) if ids else set(),
                           self.store.read_states(name, keys) if keys else {})
        out = []
        for core, cmd in runs:
            comp = self.comps[cmd.computation]
            seen, states = found[cmd.computation]
            dups = set(cmd.duplicates) | seen if seen else set(cmd.duplicates)
            results = []
            run = KeyRunner(comp.computation, cmd.computation, comp.spec.produces, dups, cmd.input_watermark_us,
                            cmd.now_us, cmd.sequencer, self._store_id).run   # the keys share their input
            for w in cmd.keys:
                try:
                    results.append(run(w.key, w.records, states.get(w.key) if w.read else w.state, w.timers))
                except UserCodeFailed as e:   # the core tries the record again, then sets it aside
                    self.user_code_failures += 1
                    results.append(KeyFailed(w.key, e.record_id, e.error))
            out.append((core, UserCodeRan(cmd.run_id, results, {k: states.get(k) for k in cmd.read_states},
                                          cmd.now_us)))
        return out

    def _report_watermarks(self) -> None:
        """Report the low watermark of every interval touched since the last report (a core reports only
        a changed value). An interval's work changes only through this worker: records it received or
        committed, and acks of its productions (:class:`Done`, or weak ones it polls)."""
        cores, self._dirty = [c for c in self._dirty if c.held], set()
        if not cores:
            return
        oldest = self.tracker.oldest([(c.name, c.interval) for c in cores])  # after this step's changes
        cyclic = [c for c in cores if c.epoch]
        windows = dict(zip(cyclic, self.tracker.window_lows([(c.name, c.interval) for c in cyclic])))
        reports: list = []
        for core, value in zip(cores, oldest):
            self._execute(core, core.handle(WorkObserved(value, windows.get(core))), 0, [], reports)
        if reports:
            self._report.put_many([WatermarksReported(tuple(reports))])

    def _count(self, name: str, results, set_aside: int = 0) -> None:
        with self._count_lock:
            c = self.counters.setdefault(name, Counter())
            if set_aside:
                c["set_aside"] += set_aside
            for res in results:
                c["records"] += res.records_processed
                c["duplicates"] += res.duplicates_dropped
                c["late"] += res.late_records
                c["timers"] += len(res.fired)

    # ---- observing -------------------------------------------------------------------------------
    def has_timers(self) -> bool:
        """A core of this worker has a timer set (due or not)."""
        with self._lock:
            comps = list(self.comps.values())
        return any(core.has_timers for comp in comps for core in list(comp.cores.values()))

    def has_due(self, now: int) -> bool:
        with self._lock:
            comps = list(self.comps.values())
        return any(core.has_due(now) for comp in comps for core in list(comp.cores.values()))

    def statistics(self) -> dict[str, Counter]:
        with self._count_lock:
            return {name: Counter(c) for name, c in self.counters.items()}
