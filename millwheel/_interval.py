"""The deciding core of one key interval of one computation: a pure object, facts in, commands out.

:class:`IntervalCore` owns everything a worker decides for an interval it holds: which keys are locked
(a run of theirs is not committed yet), the heaps of pending timers, the dedup floors and Bloom filter,
the weak productions waiting for their checkpoint, the state cache and what it evicts, and the low
watermark it reports. It has no sockets, threads, store or clock reads; it never runs user code. The
shell (``_worker.py``) feeds it events through :meth:`IntervalCore.handle` and carries out the commands
it returns, **in order**, answering some of them with new events.

Lifecycle of one batch (the shell runs it synchronously; the core does not rely on that)::

    IntervalGranted ─► RecordsDelivered / TimePassed ─► RunUserCode ─► UserCodeRan ─┬─ strong: Commit
                                                                                    └─ weak: SendProductions,
                                                       AcksObserved … ─► Commit (once acked or late)
    Commit ─► CheckpointCommitted ─► CountResults, SendProductions (strong) / MarkStored (weak), AckDeliveries
           └► CommitRefused ─► Relinquish (the interval was fenced: someone else holds it now)
    WorkObserved ─► ReportWatermark (when the interval's low watermark or its input changed)
    EpochAnnounced (a computation on a cycle) ─► the next ReportWatermark carries the epoch and its cut

Rules kept here: a key has at most one run between :class:`RunUserCode` and its commit (later records
and due timers of a locked key wait, in order); acks follow the commit; strong productions are registered
before the acks and sent after them; records produced before their sender's floor are repeats.
"""
from __future__ import annotations

import heapq
from types import MappingProxyType

import orjson
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Mapping

from millwheel._bloom import BloomFilter
from millwheel._interval_events import (  # the events and commands, re-exported
    IntervalGranted, IntervalRevoked, InputWatermarkAdvanced, FloorsRaised,
    RecordsDelivered, TimePassed, UserCodeRan, AcksObserved, ProductionsAcked,
    CheckpointCommitted, CommitRefused, DedupIdsLoaded, WorkObserved, EpochAnnounced, KeyWork, KeyFailed,
    RunUserCode, Commit, SendProductions, MarkStored, AckDeliveries,
    CountResults, RebuildDedupFilter, ReportWatermark, Relinquish,
    ReturnDeliveries, Event, Command)
from millwheel._model import WALL, WATERMARK, Delivery, Record
from millwheel._routing import encode_all
from millwheel._runner import KeyResult
from millwheel._store import KEEP, SetAsideRecord, Write
from millwheel._watermarks import NO_WATERMARK, TimestampBag, WatermarkReported, interval_low

MIN_BLOOM_CAPACITY = 1024
_NO_TIMERS = MappingProxyType({})
"""A key's timers when it has none (read only: one object for every such key, not a dict each)."""

# ---------------------------------------------------------------- the state cache

class StateCache:
    """Encoded key state (``None``: known to have none), write-through: it holds what the store holds.
    When full it evicts the least recently used keys, but first those that will not be read soon (no
    pending timer, not locked). A capacity of 0 keeps nothing: every key is read (the shells of the
    runtime and of worker processes read through the framework cache, :class:`millwheel.CachedStore`,
    the one cache of a process)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, bytes | None] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: str):
        if key in self._d:
            self._d.move_to_end(key)
            self.hits += 1
            return True, self._d[key]
        self.misses += 1
        return False, None

    def put(self, key: str, value: bytes | None) -> None:
        if not self.capacity:
            return
        self._d[key] = value
        self._d.move_to_end(key)

    def evict(self, will_be_read) -> list[str]:
        """Evict down to capacity; returns the evicted keys."""
        gone = []
        while len(self._d) > self.capacity:
            victim = None
            for i, key in enumerate(self._d):
                if i >= 64:
                    break
                if not will_be_read(key):
                    victim = key
                    break
            victim = victim if victim is not None else next(iter(self._d))
            self._d.pop(victim)
            gone.append(victim)
        return gone

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)


# ---------------------------------------------------------------- the core

@dataclass(slots=True)
class _Run:
    """One batch of keys between RunUserCode and its commit."""
    works: dict                       # key -> KeyWork
    deliveries: dict                  # key -> [Delivery]
    results: list = field(default_factory=list)
    prods: dict = field(default_factory=dict)     # key -> [StoredProduction]
    writes: dict = field(default_factory=dict)    # key -> Write
    deadline_us: int = 0              # weak: checkpoint by then even if unacked
    unacked: dict = field(default_factory=dict)   # weak: key -> [StoredProduction] checkpointed with it
    aside: dict = field(default_factory=dict)     # key -> [Delivery] set aside in this run (not run)


@dataclass(frozen=True)
class IntervalSettings:
    """What an interval core needs to know about its computation and the runtime's options."""
    computation: str
    interval: int
    exactly_once: bool = True
    weak: bool = False
    cache_keys: int = 100_000
    bloom_capacity: int = MIN_BLOOM_CAPACITY
    weak_checkpoint_delay_us: int = 100_000
    max_attempts: int = 5


class IntervalCore:
    """The decisions for one (computation, interval); only :meth:`handle` changes state."""

    def __init__(self, settings: IntervalSettings) -> None:
        self.s = settings
        self.name, self.interval = settings.computation, settings.interval
        self.sequencer: int | None = None
        self.cache = StateCache(settings.cache_keys)
        self.input_wm = NO_WATERMARK
        self._reset()

    def _reset(self) -> None:
        self.timers: dict[str, dict[str, tuple[int, str]]] = {}
        self._heaps: dict[str, list] = {WATERMARK: [], WALL: []}
        self._holds = TimestampBag()            # timestamps of pending watermark timers
        self.floors: dict[str, int] = {}
        self._bloom: BloomFilter | None = None
        self._incoming: list[Delivery] = []     # delivered, waiting for their key to be free
        self.locked: set[str] = set()
        self._runs: dict[int, _Run] = {}        # sent to user code, no answer yet
        self._weak: list[_Run] = []             # weak productions sent, checkpoint not written yet
        self._commits: dict[int, _Run | None] = {}
        self._next_id = 1
        self._attempts: dict[str, tuple[int, str]] = {}   # record id -> (failed runs, last error)
        self._reported: tuple | None = None
        self.epoch = 0                          # the newest cut epoch seen (a computation on a cycle)
        self._prev_window: int | None = None    # oldest work held from seeing epoch - 1 to seeing epoch
        self.cache.clear()

    # ------------------------------------------------------------ the one way in

    def handle(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        for ev in events:
            handler = _HANDLERS.get(type(ev))
            if handler is None:
                raise TypeError(f"IntervalCore cannot handle {ev!r}")
            handler(self, ev, out)
        return out

    # ------------------------------------------------------------ queries

    @property
    def held(self) -> bool:
        return self.sequencer is not None

    def has_due(self, now_us: int) -> bool:
        """A timer is due (or records wait for a free key): the shell should run a batch."""
        for domain, bound in ((WATERMARK, self.input_wm), (WALL, now_us)):
            heap = self._heaps[domain]
            if heap and heap[0][0] <= bound:
                return True
        return False

    def next_wall_timer_us(self) -> int | None:
        """When the earliest processing-time timer set is due (None: none is set; it may be one deleted or
        replaced since, which is only an early look)."""
        heap = self._heaps[WALL]
        return heap[0][0] if heap else None

    @property
    def has_timers(self) -> bool:
        """A timer is set (due or not)."""
        return any(self._heaps.values())

    def wants_step(self, now_us: int) -> bool:
        """Something would happen at :class:`TimePassed` with no new records: records wait for their key,
        weak checkpoints wait, or a timer is due."""
        return bool(self._incoming or self._weak) or self.has_due(now_us)

    @property
    def weak_waiting(self) -> bool:
        """Weak productions were sent and their keys' checkpoints wait: feed :class:`AcksObserved`."""
        return bool(self._weak)

    def pending_weak_ids(self) -> list[str]:
        return [p.id for run in self._weak for ps in run.prods.values() for p in ps]

    def awaits(self, commit_id: int) -> bool:
        """The commit is still this core's to send: it was not dropped by a refusal or a revocation since."""
        return commit_id in self._commits

    def oldest_timer_us(self) -> int | None:
        return self._holds.min()

    # ------------------------------------------------------------ ownership

    def _on_granted(self, ev: IntervalGranted, out: list) -> None:
        self._reset()
        self.sequencer = ev.sequencer
        for key, tag, ts, domain in ev.timers:
            self.timers.setdefault(key, {})[tag] = (ts, domain)
            heapq.heappush(self._heaps[domain], (ts, key, tag))
            if domain == WATERMARK:
                self._holds.add(ts)
        self._load_dedup(ev.dedup_ids, ev.floors)

    def _load_dedup(self, ids: list, floors: Mapping[str, int]) -> None:
        if not self.s.exactly_once:
            return
        self._bloom = BloomFilter(max(self.s.bloom_capacity, MIN_BLOOM_CAPACITY, 2 * len(ids)))
        self._bloom.add_many(ids)
        for sender, floor in floors.items():
            self.floors[sender] = max(floor, self.floors.get(sender, 0))

    def _unfinished(self) -> list:
        back = list(self._incoming)
        for run in list(self._runs.values()) + self._weak + [r for r in self._commits.values() if r]:
            back.extend(d for ds in run.deliveries.values() for d in ds)
        return back

    def _on_revoked(self, ev: IntervalRevoked, out: list) -> None:
        back = self._unfinished()
        self.sequencer = None
        self._reset()
        if back:
            out.append(ReturnDeliveries(back))

    def _on_refused(self, ev: CommitRefused, out: list) -> None:
        if ev.commit_id not in self._commits:
            return
        back = self._unfinished()
        self.sequencer = None
        self._reset()
        if back:
            out.append(ReturnDeliveries(back))   # not acked: they go to the interval's owner again
        out.append(Relinquish(self.name, self.interval))

    # ------------------------------------------------------------ inputs

    def _on_input(self, ev: InputWatermarkAdvanced, out: list) -> None:
        if ev.watermark_us > self.input_wm:
            self.input_wm = ev.watermark_us

    def _on_floors(self, ev: FloorsRaised, out: list) -> None:
        for sender, floor in ev.floors.items():
            if floor > self.floors.get(sender, 0):
                self.floors[sender] = floor

    def _on_delivered(self, ev: RecordsDelivered, out: list) -> None:
        self._incoming.extend(ev.deliveries)

    def _on_time(self, ev: TimePassed, out: list) -> None:
        if self.sequencer is None:
            return
        now = ev.now_us
        if not self.locked:          # no key locked: every waiting record is ready (no look per record)
            ready, self._incoming = self._incoming, []
        else:
            ready, waiting, locked = [], [], self.locked
            for d in self._incoming:
                (waiting if d.record.key in locked else ready).append(d)
            self._incoming = waiting
        due = self._pop_due(now)
        if ready or due:
            out.append(self._start_run(ready, due, now))

    def _pop_due(self, now: int) -> set[str]:
        """Keys with a due timer; a locked key keeps its timers for later."""
        keys: set[str] = set()
        for domain, bound in ((WATERMARK, self.input_wm), (WALL, now)):
            heap, kept = self._heaps[domain], []
            while heap and heap[0][0] <= bound:
                ts, key, tag = heapq.heappop(heap)
                if self.timers.get(key, {}).get(tag) == (ts, domain):
                    if key in self.locked:
                        kept.append((ts, key, tag))
                    else:
                        keys.add(key)
            for entry in kept:
                heapq.heappush(heap, entry)
        return keys

    def _start_run(self, ready: list[Delivery], due: set[str], now: int) -> RunUserCode:
        aside: dict[str, list[Delivery]] = {}
        if self._attempts:     # records user code failed on max_attempts times are not run again
            kept = []
            for d in ready:
                tried = self._attempts.get(d.record.id)
                if tried is not None and tried[0] >= self.s.max_attempts:
                    aside.setdefault(d.record.key, []).append(d)
                else:
                    kept.append(d)
            ready = kept
        dups, lookups = self._dedup(ready)
        by_key: dict[str, list[Delivery]] = {}
        for d in ready:
            ds = by_key.get(d.record.key)
            if ds is None:
                by_key[d.record.key] = [d]
            else:
                ds.append(d)
        for key in list(due) + list(aside):
            by_key.setdefault(key, [])
        # no cache (the shells read through the process's): every key is read, no look per key
        works, reads = self._uncached_works(by_key) if not self.cache.capacity else self._cached_works(by_key)
        if aside:
            for key, ds in by_key.items():
                if key in aside:
                    ds.extend(aside[key])      # acked (or handed back) with the key's others
        run_id = self._new_id()
        self._runs[run_id] = _Run(works, by_key, aside=aside)
        self.locked.update(by_key)
        return RunUserCode(run_id, self.name, list(works.values()), reads, lookups, frozenset(dups),
                           self.input_wm, now, self.sequencer)

    def _cached_works(self, by_key: dict[str, list[Delivery]]) -> tuple[dict[str, KeyWork], list[str]]:
        """Each key's :class:`KeyWork` (its state from the cache when there) and the keys to read."""
        works, reads, timers, cache_get = {}, [], self.timers, self.cache.get
        for key, ds in by_key.items():
            hit, state = cache_get(key)
            if not hit:
                reads.append(key)
            works[key] = KeyWork(key, [d.record for d in ds], timers.get(key) or _NO_TIMERS, state, not hit)
        return works, reads

    def _uncached_works(self, by_key: dict[str, list[Delivery]]) -> tuple[dict[str, KeyWork], list[str]]:
        """:meth:`_cached_works` for a core whose cache keeps nothing (every look a miss), in bulk."""
        works, timers = {}, self.timers
        reads = list(by_key)
        self.cache.misses += len(reads)
        for key, ds in by_key.items():
            works[key] = KeyWork(key, [ds[0].record] if len(ds) == 1 else [d.record for d in ds],
                                 timers.get(key) or _NO_TIMERS, None, True)
        return works, reads

    def _dedup(self, deliveries: list[Delivery]) -> tuple[set[str], list[str]]:
        """Ids certainly repeated (produced before their sender's floor), and ids to ask the store about
        (the Bloom filter may have seen them)."""
        if not self.s.exactly_once or not deliveries:
            return set(), []
        floors, bloom = self.floors, self._bloom
        dups: set[str] = set()
        above: list[str] = []
        for d in deliveries:
            rec: Record = d.record
            if rec.produced_at_us < floors.get(rec.sender, 0):
                dups.add(rec.id)
            else:
                above.append(rec.id)
        if bloom is None or not above:
            return dups, []
        return dups, [rid for rid, seen in zip(above, bloom.might_contain_many(above)) if seen]

    # ------------------------------------------------------------ runs and commits

    def _on_ran(self, ev: UserCodeRan, out: list) -> None:
        run = self._runs.pop(ev.run_id)
        for key, value in ev.states_read.items():
            self.cache.put(key, value)
        weak = self.s.weak
        run.results = [r for r in ev.results if not isinstance(r, KeyFailed)]
        self._failed([r for r in ev.results if isinstance(r, KeyFailed)], run)
        for res in run.results:
            prods = encode_all(res.productions)
            run.prods[res.key] = prods
            aside = self._set_aside(run.aside[res.key]) if run.aside and res.key in run.aside else []
            processed = res.processed + [(r.id, r.sender, r.produced_at_us) for r in aside] \
                if aside and self.s.exactly_once else res.processed
            run.writes[res.key] = Write(self.name, self.interval, self.sequencer, res.key, res.state,
                                        res.timers_set, res.timers_deleted, processed,
                                        [] if weak else prods, set_aside=aside)
        if not run.writes:
            return                 # every key failed: their records wait for the next attempt
        if not weak:
            self._commit(run, list(run.writes.values()), out)
            return
        # paper Figure 11: weak productions go out before anything is persisted; the keys stay locked
        # until every production is acked or the delay has passed
        sent = [p for ps in run.prods.values() for p in ps]
        if sent:
            out.append(SendProductions(self.name, self.interval, sent, False))
        run.deadline_us = ev.now_us + self.s.weak_checkpoint_delay_us
        self._weak.append(run)

    def _failed(self, failed: list[KeyFailed], run: _Run) -> None:
        """User code raised on a record: the key's run is undone (nothing of it is written) and its records
        wait again, first in line, for the next attempt; its due timers are looked at again too."""
        back = []
        for f in failed:
            tried, _ = self._attempts.get(f.record_id, (0, ""))
            self._attempts[f.record_id] = (tried + 1, f.error)
            back.extend(run.deliveries.pop(f.key, ()))
            run.works.pop(f.key, None)
            run.aside.pop(f.key, None)
            self.locked.discard(f.key)
            for tag, (ts, domain) in self.timers.get(f.key, {}).items():
                heapq.heappush(self._heaps[domain], (ts, f.key, tag))
        self._incoming[:0] = back

    def _set_aside(self, deliveries) -> list[SetAsideRecord]:
        out, seen = [], set()
        for d in deliveries:
            r = d.record
            if r.id in seen:
                continue
            seen.add(r.id)
            tried, error = self._attempts[r.id]
            out.append(SetAsideRecord(self.name, r.id, r.key, error, tried, orjson.dumps(r.value), r.timestamp_us,
                                      r.sender, r.produced_at_us))
        return out

    def _on_acks(self, ev: AcksObserved, out: list) -> None:
        waiting = []
        for run in self._weak:
            unacked = {k: [p for p in ps if p.id in ev.unacked] for k, ps in run.prods.items()}
            if ev.now_us < run.deadline_us and any(unacked.values()):
                waiting.append(run)
                continue
            run.unacked = unacked
            for key, write in run.writes.items():
                write.productions = unacked[key]
            self._commit(run, list(run.writes.values()), out)
        self._weak = waiting

    def _on_done(self, ev: ProductionsAcked, out: list) -> None:
        if self.sequencer is not None and ev.ids:
            self._commit(None, [Write(self.name, self.interval, self.sequencer, productions_done=list(ev.ids))],
                         out)

    def _commit(self, run: _Run | None, writes: list, out: list) -> None:
        commit_id = self._new_id()
        self._commits[commit_id] = run
        out.append(Commit(commit_id, writes))

    def _on_committed(self, ev: CheckpointCommitted, out: list) -> None:
        run = self._commits.pop(ev.commit_id, None)
        if run is None:
            return
        for res in run.results:
            self._apply(res, run.works[res.key].timers)
        if self._bloom is not None:      # the committed ids, together (one call per commit, not per id)
            self._bloom.add_many([rid for res in run.results for rid, _, _ in res.processed])
        aside = tuple(r for w in run.writes.values() for r in w.set_aside)
        if self._attempts:     # tried again and committed, or set aside: forget the failures
            for ds in run.deliveries.values():
                for d in ds:
                    self._attempts.pop(d.record.id, None)
        if aside and self._bloom is not None:
            self._bloom.add_many([r.id for r in aside])
        out.append(CountResults(run.results, aside))
        if self.s.weak:
            stored = [p.id for ps in run.unacked.values() for p in ps]
            if stored:
                out.append(MarkStored(self.name, self.interval, stored))
        else:
            sent = [p for ps in run.prods.values() for p in ps]
            if sent:
                out.append(SendProductions(self.name, self.interval, sent, True))
        out.append(AckDeliveries([d for ds in run.deliveries.values() for d in ds]))
        self.cache.evict(lambda k: k in self.timers or k in self.locked)
        if self._bloom is not None and self._bloom.full:
            out.append(RebuildDedupFilter(self.name, self.interval))

    def _apply(self, res: KeyResult, old_timers: dict) -> None:
        """The key's checkpoint is durable: cache, timers, watermark holds, lock (the Bloom filter takes
        the commit's ids together, in :meth:`_on_committed`)."""
        key = res.key
        if res.state is not KEEP:
            self.cache.put(key, res.state)
        for tag, (ts, domain) in old_timers.items():
            if domain == WATERMARK and res.timers.get(tag) != (ts, domain):
                self._holds.remove(ts)
        for tag, ts, domain in res.timers_set:
            heapq.heappush(self._heaps[domain], (ts, key, tag))
            if domain == WATERMARK and old_timers.get(tag) != (ts, domain):
                self._holds.add(ts)
        if res.timers:
            self.timers[key] = res.timers
        else:
            self.timers.pop(key, None)
        self.locked.discard(key)

    def _on_dedup_loaded(self, ev: DedupIdsLoaded, out: list) -> None:
        self._load_dedup(ev.ids, ev.floors)

    # ------------------------------------------------------------ watermark

    def _on_work(self, ev: WorkObserved, out: list) -> None:
        if self.sequencer is None:
            return
        oldest = ev.oldest_us
        timer = self._holds.min()
        if timer is not None and (oldest is None or timer < oldest):
            oldest = timer
        low = interval_low(oldest, self.input_wm)
        cut = None
        if self.epoch:     # everything held since first seeing epoch - 1: the shell's windows and the timers'
            cut = _least(_least(self._prev_window, ev.window_low_us), self._holds.window_low())
        if (low, self.input_wm, oldest, self.epoch, cut) != self._reported:
            self._reported = (low, self.input_wm, oldest, self.epoch, cut)
            out.append(ReportWatermark(WatermarkReported(self.name, self.interval, self.sequencer, low,
                                                         self.input_wm, oldest, self.epoch, cut)))

    def _on_epoch(self, ev: EpochAnnounced, out: list) -> None:
        """A new cut epoch: the window that ends now (the shell's part in the event, the timers' here)
        becomes the previous one, and a new window starts (see :class:`WatermarkAuthority`)."""
        if self.sequencer is None or ev.epoch <= self.epoch:
            return
        self._prev_window = _least(ev.window_low_us, self._holds.mark())
        self.epoch = ev.epoch

    def _new_id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n


_HANDLERS = {
    IntervalGranted: IntervalCore._on_granted, IntervalRevoked: IntervalCore._on_revoked,
    InputWatermarkAdvanced: IntervalCore._on_input, FloorsRaised: IntervalCore._on_floors,
    RecordsDelivered: IntervalCore._on_delivered, TimePassed: IntervalCore._on_time,
    UserCodeRan: IntervalCore._on_ran, AcksObserved: IntervalCore._on_acks, ProductionsAcked: IntervalCore._on_done,
    CheckpointCommitted: IntervalCore._on_committed, CommitRefused: IntervalCore._on_refused,
    DedupIdsLoaded: IntervalCore._on_dedup_loaded, WorkObserved: IntervalCore._on_work,
    EpochAnnounced: IntervalCore._on_epoch,
}


def _least(a: int | None, b: int | None) -> int | None:
    """The smaller of two optional timestamps (``None``: no work)."""
    if a is None:
        return b
    return a if b is None or a < b else b
