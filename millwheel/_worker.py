"""The thin threaded shell around the pure key runner.

A :class:`Worker` owns a set of key intervals (of every computation) and is their single writer: it
claimed them in the store, and every write carries the claim's sequencer. One loop iteration:

1. take a batch of deliveries (and control messages) from the inbox;
2. dedup: ids the Bloom filter has never seen are new; the rest are looked up in the store (the truth);
   ids produced before the sender's garbage-collection floor are repeats too;
3. per key: read state (through the framework cache), run :func:`millwheel._runner.run_key` with the
   key's records and its due timers; weak productions are sent now;
4. commit every key's checkpoint (state, timers, processed ids, strong productions) in one store
   transaction (one atomic write per key);
5. ack the senders, then send the strong productions.
"""
from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from millwheel._bloom import BloomFilter
from millwheel._model import WATERMARK, WEAK, Computation, Delivery
from millwheel._runner import KeyInput, KeyResult, run_key
from millwheel._store import StoredProduction, Write
from millwheel._transport import Done, Inbox

if TYPE_CHECKING:
    from millwheel._runtime import Runtime


@dataclass
class CompState:
    """What a worker keeps about one computation for the intervals it owns."""
    name: str
    computation: Computation
    produces: tuple[str, ...]
    seqs: dict[int, int]
    bloom: BloomFilter | None = None
    floors: dict[str, int] = field(default_factory=dict)
    timers: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)
    heaps: dict[str, list] = field(default_factory=lambda: {"watermark": [], "wall": []})


class Worker:
    def __init__(self, index: int, rt: "Runtime") -> None:
        self.index = index
        self.rt = rt
        self.inbox = Inbox()
        self.comps: dict[str, CompState] = {}
        self._lock = threading.Lock()
        self.busy = False
        self._deferred: list[Delivery] = []
        self._locked: set[tuple[str, str]] = set()
        self._pending_weak: list = []
        self.thread = threading.Thread(target=self._main, name=f"millwheel-worker-{index}", daemon=True)

    # ---- ownership and recovery ---------------------------------------------------------------
    def own(self, name: str, intervals: list[int]) -> None:
        """Claim the intervals, load timers and dedup ids, and replay stored productions."""
        rt = self.rt
        spec = rt.topology.computations[name]
        seqs = {i: rt.store.claim(name, i) for i in intervals}
        cs = CompState(name, spec.factory(), spec.produces, seqs)
        holds = []
        for key, tag, ts, domain in rt.store.read_timers(name, intervals):
            cs.timers.setdefault(key, {})[tag] = (ts, domain)
            heapq.heappush(cs.heaps[domain], (ts, key, tag))
            if domain == WATERMARK:
                holds.append(ts)
        rt.tracker.change_holds(name, holds, ())
        if cs.computation.exactly_once:
            self._rebuild_bloom(cs)
        with self._lock:
            self.comps[name] = cs  # before the replay: acks of replayed productions come back here
        for interval in intervals:
            rt.replay(name, interval, rt.store.pending_productions(name, interval))

    def _rebuild_bloom(self, cs: CompState) -> None:
        ids = self.rt.store.dedup_ids(cs.name, cs.seqs)
        cs.bloom = BloomFilter(max(self.rt.config.bloom_capacity, 2 * len(ids)))
        for i in ids:
            cs.bloom.add(i)
        cs.floors = self.rt.store.gc_floors(cs.name)

    def start(self) -> None:
        self.thread.start()

    # ---- the loop -----------------------------------------------------------------------------
    def _main(self) -> None:
        cfg = self.rt.config
        try:
            while not self.rt.stopping.is_set():
                items = self.inbox.take(cfg.max_batch, cfg.tick_us / 1e6)
                self.step(items)
        except BaseException as e:  # noqa: BLE001 - any failure stops the runtime loudly
            self.rt.fail(e)

    def step(self, items: list) -> None:
        rt = self.rt
        self.busy = True
        try:
            rt.tracker.received([d for d in items if isinstance(d, Delivery)])
            with rt.tracker.producing(rt.clock.now_us) as now:   # until its productions are registered
                by_comp: dict[str, list[Delivery]] = {}
                writes: list[Write] = []
                for item in self._deferred + items:
                    if isinstance(item, Delivery):
                        by_comp.setdefault(item.consumer, []).append(item)
                    elif isinstance(item, Done):
                        seq = self.comps[item.sender].seqs[item.interval]
                        writes.append(Write(item.sender, item.interval, seq, productions_done=list(item.ids)))
                self._deferred = []
                with self._lock:
                    comps = list(self.comps.values())
                after = [self._run_comp(cs, by_comp.pop(cs.name, []), now, writes) for cs in comps]
                after.extend(self._weak_ready(now, writes))
                rt.store.commit(writes)
                for fn in after:
                    if fn is not None:
                        fn()
                # deliveries for a computation this worker does not own yet: keep them for the next step
                self._deferred.extend(d for ds in by_comp.values() for d in ds)
        finally:
            self.busy = False

    def _due_keys(self, cs: CompState, input_wm: int, now: int) -> set[str]:
        """Keys with a due timer; a key whose weak checkpoint is pending keeps its timers for later."""
        keys: set[str] = set()
        for domain, bound in (("watermark", input_wm), ("wall", now)):
            heap, kept = cs.heaps[domain], []
            while heap and heap[0][0] <= bound:
                ts, key, tag = heapq.heappop(heap)
                if cs.timers.get(key, {}).get(tag) == (ts, domain):
                    if (cs.name, key) in self._locked:
                        kept.append((ts, key, tag))
                    else:
                        keys.add(key)
            for entry in kept:
                heapq.heappush(heap, entry)
        return keys

    def has_due(self, input_wms: dict[str, int], now: int) -> bool:
        with self._lock:
            comps = list(self.comps.values())
        for cs in comps:
            for domain, bound in (("watermark", input_wms.get(cs.name, 0)), ("wall", now)):
                heap = cs.heaps[domain]
                if heap and heap[0][0] <= bound:
                    return True
        return False

    def _dedup(self, cs: CompState, deliveries: list[Delivery]) -> set[str]:
        if not cs.computation.exactly_once:
            return set()
        dups = {d.record.id for d in deliveries if d.record.produced_at_us < cs.floors.get(d.record.sender, 0)}
        maybe = [d.record.id for d in deliveries if d.record.id not in dups and cs.bloom.might_contain(d.record.id)]
        if maybe:
            self.rt.counters["dedup_store_lookups"] += len(maybe)
            dups |= self.rt.store.seen(cs.name, maybe)
        return dups

    def _states(self, cs: CompState, keys) -> dict[str, bytes | None]:
        found = self.rt.store.read_states(cs.name, keys)  # through the framework cache (millwheel._cache)
        return {key: found.get(key) for key in keys}

    def _run_comp(self, cs: CompState, deliveries: list[Delivery], now: int, writes: list[Write]):
        rt = self.rt
        input_wm = rt.input_watermarks.get(cs.name, 0)
        weak = cs.computation.productions == WEAK
        if weak and self._locked:  # a key whose weak checkpoint is pending waits for it
            held = [d for d in deliveries if (cs.name, d.record.key) in self._locked]
            if held:
                self._deferred.extend(held)
                deliveries = [d for d in deliveries if (cs.name, d.record.key) not in self._locked]
        due = self._due_keys(cs, input_wm, now)
        if not deliveries and not due:
            return None
        dups = self._dedup(cs, deliveries)
        by_key: dict[str, list[Delivery]] = {}
        for d in deliveries:
            by_key.setdefault(d.record.key, []).append(d)
        for key in due:
            by_key.setdefault(key, [])
        states = self._states(cs, by_key)
        results: list[_KeyDone] = []
        for key, ds in by_key.items():
            old_timers = cs.timers.get(key, {})
            inp = KeyInput(cs.name, key, [d.record for d in ds], states[key], old_timers, dups, input_wm, now,
                           cs.produces)
            res = run_key(cs.computation, inp)
            interval = rt.interval_of(key)
            prods = [rt.encode(p) for p in res.productions]
            write = Write(cs.name, interval, cs.seqs[interval], key, res.state, res.timers_set,
                          res.timers_deleted, res.processed, [] if weak else prods)
            results.append(_KeyDone(res, ds, interval, prods, old_timers, write))
        if weak:
            self._send_weak(cs, results, now)
            return None
        writes.extend(r.write for r in results)
        return lambda: self._after_commit(cs, results, now)

    def _send_weak(self, cs: CompState, results: list["_KeyDone"], now: int) -> None:
        """Paper Figure 11: weak productions go out before anything is persisted; the keys' checkpoints
        wait (the keys are locked) until every production is acked or the delay has passed."""
        rt = self.rt
        out = []
        for r in results:
            out.extend(rt.tracker.register(cs.name, [(p, r.interval, False, rt.route(p, cs.name))
                                                     for p in r.prods], now, rt.config.retry_delay_us))
            self._locked.add((cs.name, r.res.key))
        rt.tracker.send(out)
        self._pending_weak.append((cs, results, now + rt.config.weak_checkpoint_delay_us))

    def _weak_ready(self, now: int, writes: list[Write]) -> list:
        """Checkpoints of weak keys whose productions are all acked, or whose delay has passed: the
        productions still unacked are checkpointed in the key's atomic write."""
        after, waiting = [], []
        for cs, results, deadline in self._pending_weak:
            unacked = {r.res.key: self.rt.tracker.unacked(p.id for p in r.prods) for r in results}
            if now < deadline and any(unacked.values()):
                waiting.append((cs, results, deadline))
                continue
            for r in results:
                r.write.productions = unacked[r.res.key]
                writes.append(r.write)
            after.append(lambda cs=cs, results=results, unacked=unacked: self._weak_committed(cs, results, unacked))
        self._pending_weak = waiting
        return after

    def _weak_committed(self, cs: CompState, results: list["_KeyDone"], unacked: dict) -> None:
        for r in results:
            if unacked[r.res.key]:
                self.rt.tracker.mark_stored(cs.name, r.interval, [p.id for p in unacked[r.res.key]])
            self._locked.discard((cs.name, r.res.key))
        self._after_commit(cs, results, self.rt.clock.now_us(), weak=True)

    def _after_commit(self, cs: CompState, results: list["_KeyDone"], now: int, weak: bool = False) -> None:
        rt = self.rt
        add, remove, acks, out = [], [], [], []
        for r in results:
            res, key = r.res, r.res.key
            for tag, (ts, domain) in r.old_timers.items():
                if domain == WATERMARK and res.timers.get(tag) != (ts, domain):
                    remove.append(ts)
            for tag, ts, domain in res.timers_set:
                heapq.heappush(cs.heaps[domain], (ts, key, tag))
                if domain == WATERMARK:
                    add.append(ts)
            if res.timers:
                cs.timers[key] = res.timers
            else:
                cs.timers.pop(key, None)
            if cs.bloom is not None:
                for rid, _, _ in res.processed:
                    cs.bloom.add(rid)
            acks.extend(r.deliveries)
            if not weak:
                out.extend(rt.tracker.register(cs.name, [(p, r.interval, True, rt.route(p, cs.name))
                                                         for p in r.prods], now, rt.config.retry_delay_us))
        rt.tracker.change_holds(cs.name, add, remove)
        rt.count(cs.name, [r.res for r in results])
        rt.tracker.acked(acks)  # the senders are acked, then the productions are sent
        rt.tracker.send(out)
        if cs.bloom is not None and cs.bloom.full:
            self._rebuild_bloom(cs)


@dataclass(slots=True)
class _KeyDone:
    """One key's runner result waiting for (or past) its commit."""
    res: KeyResult
    deliveries: list[Delivery]
    interval: int
    prods: list[StoredProduction]
    old_timers: dict
    write: Write

