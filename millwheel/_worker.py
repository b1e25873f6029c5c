"""The thin threaded shell around the pure key runner.

A :class:`Worker` owns a set of key intervals (of every computation) and is their single writer: it
claimed them in the store, and every write carries the claim's sequencer. One loop iteration:

1. take a batch of deliveries (and control messages) from the inbox;
2. dedup: ids the Bloom filter has never seen are new; the rest are looked up in the store (the truth);
   ids produced before the sender's garbage-collection floor are repeats too;
3. per key: read state (cache, else store), run :func:`millwheel._runner.run_key` with the key's
   records and its due timers; weak productions are sent now;
4. commit every key's checkpoint (state, timers, processed ids, strong productions) in one store
   transaction (one atomic write per key);
5. ack the senders, then send the strong productions.
"""
from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

from millwheel._bloom import BloomFilter
from millwheel._model import STRONG, WATERMARK, WEAK, Computation, Delivery
from millwheel._runner import KeyInput, KeyResult, run_key
from millwheel._store import KEEP, StoredProduction, Write
from millwheel._transport import AckGroup, Done, Inbox

if TYPE_CHECKING:
    from millwheel._runtime import Runtime


class StateCache:
    """Per-worker cache of encoded key state (``None``: known to have none). Write-through: it holds what
    the store holds. When full it evicts the least recently used keys, but first those with no pending
    timer: a key with a timer will be read again when the timer fires."""

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
        self._d[key] = value
        self._d.move_to_end(key)

    def evict(self, will_be_read) -> None:
        while len(self._d) > self.capacity:
            victim = None
            for i, key in enumerate(self._d):
                if i >= 64:
                    break
                if not will_be_read(key):
                    victim = key
                    break
            self._d.pop(victim if victim is not None else next(iter(self._d)))


@dataclass
class CompState:
    """What a worker keeps about one computation for the intervals it owns."""
    name: str
    computation: Computation
    produces: tuple[str, ...]
    seqs: dict[int, int]
    cache: StateCache
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
        self.thread = threading.Thread(target=self._main, name=f"millwheel-worker-{index}", daemon=True)

    # ---- ownership and recovery ---------------------------------------------------------------
    def own(self, name: str, intervals: list[int]) -> None:
        """Claim the intervals, load timers and dedup ids, and replay stored productions."""
        rt = self.rt
        spec = rt.topology.computations[name]
        seqs = {i: rt.store.claim(name, i) for i in intervals}
        cs = CompState(name, spec.factory(), spec.produces, seqs, StateCache(rt.config.cache_keys))
        holds = []
        for key, tag, ts, domain in rt.store.read_timers(name, intervals):
            cs.timers.setdefault(key, {})[tag] = (ts, domain)
            heapq.heappush(cs.heaps[domain], (ts, key, tag))
            if domain == WATERMARK:
                holds.append(ts)
        rt.tracker.change_holds(name, holds, ())
        if cs.computation.exactly_once:
            self._rebuild_bloom(cs)
        for interval in intervals:
            rt.replay(name, interval, rt.store.pending_productions(name, interval))
        with self._lock:
            self.comps[name] = cs

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
        now = rt.clock.now_us()
        by_comp: dict[str, list[Delivery]] = {}
        writes: list[Write] = []
        for item in items:
            if isinstance(item, Delivery):
                by_comp.setdefault(item.consumer, []).append(item)
            elif isinstance(item, Done):
                seq = self.comps[item.sender].seqs[item.interval]
                writes.append(Write(item.sender, item.interval, seq, productions_done=list(item.ids)))
        with self._lock:
            comps = list(self.comps.values())
        after = []
        for cs in comps:
            after.append(self._run_comp(cs, by_comp.pop(cs.name, []), now, writes))
        after.append(self._checkpoint_weak(comps, now, writes))
        rt.store.commit(writes)
        for fn in after:
            if fn is not None:
                fn()
        if by_comp:  # deliveries for a computation this worker does not own (yet): put back
            self.inbox.put_many([d for ds in by_comp.values() for d in ds])

    def _due_keys(self, cs: CompState, input_wm: int, now: int) -> set[str]:
        keys: set[str] = set()
        for domain, bound in (("watermark", input_wm), ("wall", now)):
            heap = cs.heaps[domain]
            while heap and heap[0][0] <= bound:
                ts, key, tag = heapq.heappop(heap)
                if cs.timers.get(key, {}).get(tag) == (ts, domain):
                    keys.add(key)
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
        out: dict[str, bytes | None] = {}
        missing = []
        for key in keys:
            hit, value = cs.cache.get(key)
            if hit:
                out[key] = value
            else:
                missing.append(key)
        if missing:
            found = self.rt.store.read_states(cs.name, missing)
            for key in missing:
                out[key] = found.get(key)
                cs.cache.put(key, out[key])
        return out

    def _run_comp(self, cs: CompState, deliveries: list[Delivery], now: int, writes: list[Write]):
        rt = self.rt
        input_wm = rt.input_watermarks.get(cs.name, 0)
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
        results: list[tuple[KeyResult, list[Delivery], dict]] = []
        weak = cs.computation.productions == WEAK
        groups = []
        for key, ds in by_key.items():
            old_timers = cs.timers.get(key, {})
            inp = KeyInput(cs.name, key, [d.record for d in ds], states[key], old_timers, dups, input_wm, now,
                           cs.produces)
            res = run_key(cs.computation, inp)
            interval = rt.interval_of(key)
            prods = [rt.encode(p) for p in res.productions]
            writes.append(Write(cs.name, interval, cs.seqs[interval], key, res.state, res.timers_set,
                                res.timers_deleted, res.processed, [] if weak else prods))
            if weak:  # paper Figure 11: send first, persist after, ack upstream when safe
                group = AckGroup(ds)
                out = rt.tracker.register(cs.name, [(p, interval, False, rt.route(p, cs.name)) for p in prods],
                                          now, rt.config.retry_delay_us, group)
                rt.tracker.send(out)
                groups.append(group)
            results.append((res, ds, {"interval": interval, "prods": prods, "old_timers": old_timers}))
        rt.count(cs.name, results)
        return lambda: self._after_commit(cs, results, groups, now)

    def _after_commit(self, cs: CompState, results, groups: list[AckGroup], now: int) -> None:
        rt = self.rt
        add, remove, acks, sends = [], [], [], []
        for res, ds, extra in results:
            key = res.key
            if not isinstance(res.state, type(KEEP)):
                cs.cache.put(key, res.state)
            old = extra["old_timers"]
            for tag, (ts, domain) in old.items():
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
            if cs.computation.productions == STRONG:
                sends.append((extra["prods"], extra["interval"]))
                acks.extend(ds)
        rt.tracker.change_holds(cs.name, add, remove)
        out = []
        for prods, interval in sends:
            out.extend(rt.tracker.register(cs.name, [(p, interval, True, rt.route(p, cs.name)) for p in prods],
                                           now, rt.config.retry_delay_us))
        rt.tracker.acked(acks)
        for g in groups:
            rt.tracker.release(g)
        rt.tracker.send(out)
        cs.cache.evict(lambda k: k in cs.timers)
        if cs.bloom is not None and cs.bloom.full:
            self._rebuild_bloom(cs)

    def _checkpoint_weak(self, comps: list[CompState], now: int, writes: list[Write]):
        """Weak productions unacked for longer than the delay are checkpointed (paper Figure 11)."""
        owned = {(cs.name, i) for cs in comps if cs.computation.productions == WEAK for i in cs.seqs}
        if not owned:
            return None
        late = self.rt.tracker.unstored_older_than(owned, now - self.rt.config.weak_checkpoint_delay_us)
        if not late:
            return None
        by_iv: dict[tuple[str, int], list[StoredProduction]] = {}
        for pid, o in late:
            by_iv.setdefault((o.sender, o.interval), []).append(o.prod)
        for (name, interval), prods in by_iv.items():
            writes.append(Write(name, interval, self.comps[name].seqs[interval], productions=prods))
        return lambda: self.rt.tracker.mark_stored(late)


def encode_value(value) -> bytes:
    return orjson.dumps(value)
