"""The event store's pure parts: the byte-bounded LRU of raw primary events and the indexing of log lines.

Nothing here reads files, sockets or the clock. :class:`EventCache` is thread-safe (one lock around the
LRU); :func:`index_primary_lines` is a plain function from a chunk of log lines to ``(id, raw)`` pairs and
bad records.
"""
from __future__ import annotations

import re
import threading
from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate, compress, repeat
from operator import add, and_, eq, ge, itemgetter, mod, ne

import cachetools
import orjson

from photon import ID_REGEX, BadEventId, EventIds, LogChunk, is_event_id, parse_event_id, parse_record

ENTRY_OVERHEAD_BYTES = 28
"""Bytes charged per cached event on top of its raw line: 4 for its offset in its block, 12 for its slot of
the id index (a hash and a link) times the slots kept per event (1.1-1.5), and 4 for a bucket head times
the heads per event (0.55-1.5). tests/eventstore/test_es_cache.py measures the whole cache with tracemalloc."""

BLOCK_OVERHEAD_BYTES = 480
"""Bytes charged per block on top of its events: the block object, its lines' ``bytes`` header, its offsets
array and its entry in the LRU (measured for blocks of one event, the worst case)."""

KEPT_ID_BYTES = 57
"""Bytes charged, on top of the id's length, per event of a cache without ``id_field`` (the in-process
twin): its id is kept as a ``str`` beside its line."""

BLOCK_EVENTS = 1024
"""At most this many events share one block of the LRU (see :class:`EventCache`)."""

BLOCKS_PER_CACHE = 64
"""A block is also kept under ``1/BLOCKS_PER_CACHE`` of the byte bound, so an eviction frees a small part."""

_MIN_SLOTS = 4096
_SLOT_LOAD = 0.9                # the slot ring is rebuilt larger when live slots would pass this share
_SLOT_GROWTH = 1.5              # ... with this many slots per live slot
_REF_LIMIT = (1 << 32) - 1      # refs are array('I') values: past this, every live block is renumbered


def entry_size(raw: bytes, event_id: str | None = None) -> int:
    """The bytes one cached event is charged against ``[eventstore].cache_mb`` (besides its block's
    :data:`BLOCK_OVERHEAD_BYTES`); given ``event_id``, as in a cache that keeps ids (no ``id_field``)."""
    kept = 0 if event_id is None else KEPT_ID_BYTES + len(event_id)
    return len(raw) + ENTRY_OVERHEAD_BYTES + kept


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    entries: int
    bytes: int
    max_bytes: int
    puts: int
    evictions: int
    too_large: int
    lookups: int
    lookup_ids: int
    hits: int
    misses: int


class _Block:
    """Events put together: their lines concatenated in ``blob`` (event ``i`` is ``blob[offs[i]:offs[i+1]]``),
    held in the slots of refs ``base .. base + n - 1`` of the id index, and their ids when the cache keeps
    them (no ``id_field``)."""
    __slots__ = ("key", "base", "n", "blob", "offs", "ids", "live", "dead", "charged", "live_bytes")

    def __init__(self, key: int, base: int, blob: bytes, offs: array, ids: tuple | None) -> None:
        self.key = key          # its key in the LRU
        self.base = base
        self.n = len(offs) - 1
        self.blob = blob
        self.offs = offs
        self.ids = ids
        self.live = self.n      # events not replaced since
        self.dead = False       # evicted, or every event replaced: its slots hold nothing
        self.charged = 0        # what the LRU counts for this block (fixed once cached)
        self.live_bytes = 0     # the part still held: replaced events leave the block


class _BlockLRU(cachetools.LRUCache):
    """The cachetools LRU of blocks; evicting a block drops its events from the id index."""

    def __init__(self, maxsize: int, on_evict) -> None:
        super().__init__(maxsize, getsizeof=lambda block: block.charged)
        self._on_evict = on_evict

    def popitem(self):
        key, block = super().popitem()
        self._on_evict(block)
        return key, block


_NO_OFFSETS = array("I")


def _zeros(typecode: str, n: int) -> array:
    return array(typecode, bytes(array(typecode).itemsize * n))


class EventCache:
    """Recent primary events by id, as raw log-line bytes, bounded by the bytes they are charged in total
    (:func:`entry_size` per event, :data:`BLOCK_OVERHEAD_BYTES` per block).

    Events are held in blocks: each ``put_many`` call fills blocks of up to :data:`BLOCK_EVENTS` events,
    and a cachetools LRU of blocks enforces the byte bound. Recency is kept per block: a lookup hit marks
    its block recently used, and the least recently used block is evicted whole. A single ``put`` is a
    block of one, so it behaves exactly as a per-event LRU.

    No Python object is kept per event. A block holds its lines concatenated in one ``bytes`` with an
    array of offsets. The id index is a chained hash table in arrays, worked a whole block at a time:
    every event gets a *ref* (a number, increasing in put order; a block's refs are consecutive), and
    ref ``r`` owns slot ``r % slots`` of a ring of slots holding its id's 64-bit ``hash()`` (0: replaced
    or evicted) and the next ref of its chain. A new event goes to the head of its bucket's chain, so a
    chain runs from newer to older refs, strictly decreasing; every ref below the *floor* (the first
    ref of the oldest block still held) is dead, so a walk stops there, and slots are reused only below
    it. Evicting a block zeroes its hashes (one slice); the oldest block, if kept by hits, is moved to
    the head (its events get new refs) when its slots are needed, and when fewer than a tenth of the
    slots are free the ring is rebuilt larger. A hash match is checked against the line: it must begin
    with ``{"<id_field>":"<id>"``, else its parsed id field must equal the id (an id written with JSON
    escapes, or a line with its id elsewhere). A cache without ``id_field`` (the in-process twin, whose
    callers put any bytes) keeps each block's ids and compares them.

    ``put`` of an id already held replaces it (the new bytes, in the new block). An event larger than the
    whole bound is not stored (counted in ``too_large``). ``lookup`` returns one result per id, in order.
    """

    def __init__(self, max_bytes: int, id_field: str | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache size must be > 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._id_field = id_field
        self._prefix = b"{" + orjson.dumps(id_field) + b':"' if id_field is not None else None
        self._block_bytes = max(1, max_bytes // BLOCKS_PER_CACHE)
        self._lru = _BlockLRU(max_bytes, self._evicted)
        self._next_key = 0
        self._entries = 0
        self._dead_bytes = 0       # charged to cached blocks for events since replaced
        self._lock = threading.Lock()
        self._puts = self._too_large = self._evictions = 0
        self._lookups = self._lookup_ids = self._hits = 0
        self._renumber([], _MIN_SLOTS)

    # -- the ring of slots -------------------------------------------------------------------------

    def _renumber(self, blocks: list[_Block], slots: int) -> None:
        """New arrays of ``slots`` slots holding ``blocks`` (in ref order) at refs from 1, chains rebuilt."""
        hashes, nexts = _zeros("q", slots), _zeros("I", slots)
        ref = 1
        for b in blocks:
            hashes[ref:ref + b.n] = self._segment(self._hash, b.base, b.n)
            b.base, ref = ref, ref + b.n
        self._slots = slots
        self._hash, self._next = hashes, nexts
        buckets = _MIN_SLOTS
        while buckets < slots:
            buckets *= 2
        self._heads, self._mask = _zeros("I", buckets), buckets - 1
        self._order, self._bases, self._first = list(blocks), [b.base for b in blocks], 0
        self._top = ref
        self._live_slots = ref - 1
        self._floor = 1
        live = hashes[1:ref]
        self._link(list(compress(range(1, ref), live)), list(map(and_, compress(live, live), repeat(self._mask))))

    def _segment(self, arr: array, base: int, n: int) -> array:
        p, size = base % self._slots, self._slots
        return arr[p:p + n] if p + n <= size else arr[p:] + arr[:p + n - size]

    def _write(self, arr: array, base: int, values: array) -> None:
        p, size, n = base % self._slots, self._slots, len(values)
        if p + n <= size:
            arr[p:p + n] = values
        else:
            arr[p:] = values[:size - p]
            arr[:p + n - size] = values[size - p:]

    def _link(self, refs: list[int], buckets: list[int]) -> None:
        """Put ``refs`` (increasing, all above every ref already linked) at the heads of their buckets'
        chains, in rounds of one ref per bucket (smallest first), so each chain stays decreasing."""
        heads, nexts, size = self._heads, self._next, self._slots
        while refs:
            first = dict(zip(reversed(buckets), reversed(refs)))      # bucket -> its smallest ref
            owners = list(first.values())
            deque(map(nexts.__setitem__, map(mod, owners, repeat(size)), map(heads.__getitem__, first)), 0)
            deque(map(heads.__setitem__, first, owners), 0)
            if len(owners) == len(refs):
                return
            keep = list(map(ne, map(first.__getitem__, buckets), refs))
            refs, buckets = list(compress(refs, keep)), list(compress(buckets, keep))

    def _advance_floor(self) -> None:
        order, i = self._order, self._first
        while i < len(order) and order[i].dead:
            i += 1
        if i > 4096 and 2 * i > len(order):
            del order[:i], self._bases[:i]
            i = 0
        self._first = i
        self._floor = order[i].base if i < len(order) else self._top

    def _reserve(self, n: int) -> int:
        """The first of ``n`` consecutive new refs whose slots are free. Keeps at least
        :data:`BLOCK_EVENTS` slots free after them, so the oldest block can always be moved: moves the
        oldest blocks kept by hits to the head until enough is free, or rebuilds the ring (larger when
        it is nearly full, or when refs reach their limit)."""
        self._advance_floor()
        while True:
            if self._top + n >= _REF_LIMIT or self._live_slots + n + BLOCK_EVENTS > _SLOT_LOAD * self._slots:
                need = self._live_slots + n
                self._renumber([b for b in self._order[self._first:] if not b.dead],
                               max(_MIN_SLOTS, int(need * _SLOT_GROWTH) + 2 * BLOCK_EVENTS))
            elif self._slots - (self._top - self._floor) >= n + BLOCK_EVENTS:
                break
            else:
                self._relocate(self._order[self._first])
        base = self._top
        self._top += n
        self._live_slots += n
        return base

    def _relocate(self, block: _Block) -> None:
        """The oldest block, still held, takes new refs at the head (its old slots are then free)."""
        hashes = self._segment(self._hash, block.base, block.n)
        base = self._top
        self._top += block.n
        self._write(self._hash, base, hashes)
        block.base = base
        self._first += 1
        self._order.append(block)
        self._bases.append(base)
        self._advance_floor()
        self._link(list(compress(range(base, base + block.n), hashes)),
                   list(map(and_, compress(hashes, hashes), repeat(self._mask))))

    # -- puts ------------------------------------------------------------------------------------

    def put(self, event_id: str, raw: bytes) -> None:
        self.put_many([(event_id, raw)])

    def put_many(self, events: list[tuple[str, bytes]]) -> None:
        if not events:
            return
        with self._lock:
            self._puts += len(events)
            ids, raws = zip(*events)
            sizes = list(map(len, raws))
            per_event = ENTRY_OVERHEAD_BYTES
            if self._id_field is None:        # the ids are kept beside the lines
                per_event += KEPT_ID_BYTES
                sizes = list(map(add, sizes, map(len, ids)))
            max_size = self.max_bytes - per_event - BLOCK_OVERHEAD_BYTES
            if max(sizes) > max_size:
                keep = [size <= max_size for size in sizes]
                self._too_large += keep.count(False)
                ids, raws, sizes = (list(compress(x, keep)) for x in (ids, raws, sizes))
                if not ids:
                    return
            n = len(sizes)
            cum = list(accumulate(map(per_event.__add__, sizes), initial=0))
            room = self._block_bytes - BLOCK_OVERHEAD_BYTES
            lo = 0
            while lo < n:
                end = bisect_right(cum, cum[lo] + room, lo + 1, min(n, lo + BLOCK_EVENTS) + 1) - 1
                hi = max(lo + 1, end)
                self._add_block(ids[lo:hi], raws[lo:hi], cum[hi] - cum[lo] + BLOCK_OVERHEAD_BYTES)
                lo = hi

    def _add_block(self, ids, raws, charged: int) -> None:
        n = len(ids)
        base = self._reserve(n)
        hashes = array("q", map(hash, ids))
        if 0 in hashes:                       # 0 marks a slot with nothing live
            hashes = array("q", [h or 1 for h in hashes])
        buckets = list(map(and_, hashes, repeat(self._mask, n)))
        heads = self._heads
        olds = list(map(heads.__getitem__, buckets))
        offs = array("I", accumulate(map(len, raws), initial=0))
        block = _Block(self._next_key, base, b"".join(raws), offs, tuple(ids) if self._id_field is None else None)
        self._next_key += 1
        block.charged = charged
        self._order.append(block)             # before older blocks may die, so the floor stays below it
        self._bases.append(base)
        self._replace_older(ids, hashes, olds)
        self._write(self._hash, base, hashes)
        refs = range(base, base + n)
        if len(set(buckets)) == n:           # the common case: no two of the block share a bucket
            self._write(self._next, base, array("I", olds))
            deque(map(heads.__setitem__, buckets, refs), 0)
        else:
            self._link(list(refs), buckets)
            self._replace_within(block, ids, hashes)
        self._entries += block.live
        block.live_bytes = block.charged
        if block.live:
            self._lru[block.key] = block      # may evict older blocks (see _evicted)
        else:
            self._kill(block)

    def _replace_older(self, ids, hashes: array, olds: list[int]) -> None:
        """Walk the chains the new events join (all at once, one step a round) for an event of the same
        id put earlier: each one found leaves its block (:meth:`_replaced`)."""
        floor, size, slot_hash, nexts = self._floor, self._slots, self._hash, self._next
        idx = list(compress(range(len(olds)), map(ge, olds, repeat(floor))))
        refs = list(compress(olds, map(ge, olds, repeat(floor))))
        while refs:
            slots = list(map(mod, refs, repeat(size)))
            same = list(map(eq, map(slot_hash.__getitem__, slots), map(hashes.__getitem__, idx)))
            if True in same:
                for i, ref in compress(zip(idx, refs), same):
                    block = self._block_of(ref)
                    if self._match(block, ref - block.base, ids[i]) is not None:
                        self._replaced(block, ref - block.base)
            refs = list(map(nexts.__getitem__, slots))
            keep = list(map(ge, refs, repeat(floor)))
            idx, refs = list(compress(idx, keep)), list(compress(refs, keep))

    def _replace_within(self, block: _Block, ids, hashes: array) -> None:
        """Of events of one block with the same id, the last is kept."""
        last: dict[int, list[int]] = {}
        for i, h in enumerate(hashes):
            last.setdefault(h, []).append(i)
        for group in last.values():
            for k, i in enumerate(group[:-1]):
                if any(ids[j] == ids[i] for j in group[k + 1:]):
                    self._replaced(block, i)

    def _block_of(self, ref: int) -> _Block:
        return self._order[bisect_right(self._bases, ref, self._first) - 1]

    def _match(self, block: _Block, i: int, event_id: str) -> bytes | None:
        """The line of event ``i`` of ``block`` if its id is ``event_id`` (its hash matched), else None."""
        if block.ids is not None:
            return block.blob[block.offs[i]:block.offs[i + 1]] if block.ids[i] == event_id else None
        line = block.blob[block.offs[i]:block.offs[i + 1]]
        if '"' not in event_id and "\\" not in event_id and line.startswith(
                self._prefix + event_id.encode() + b'"'):
            return line
        try:                                  # the id elsewhere in the line, or written with JSON escapes
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        return line if type(event) is dict and event.get(self._id_field) == event_id else None

    def _replaced(self, block: _Block, i: int) -> None:
        """An id put again: its old event leaves its block. A cached block stays charged in full until it
        goes (those bytes are counted as dead); the block being filled is charged less."""
        slot = (block.base + i) % self._slots
        if not self._hash[slot]:
            return
        self._hash[slot] = 0
        block.live -= 1
        size = block.offs[i + 1] - block.offs[i] + ENTRY_OVERHEAD_BYTES
        if block.ids is not None:
            size += KEPT_ID_BYTES + len(block.ids[i])
        if block.key not in self._lru:        # the block being filled
            block.charged -= size
            return
        self._entries -= 1
        block.live_bytes -= size
        if block.live:
            self._dead_bytes += size
        else:                                 # nothing live left: drop the block and its dead bytes
            self._dead_bytes -= block.charged - block.live_bytes - size
            del self._lru[block.key]
            self._kill(block)

    def _kill(self, block: _Block) -> None:
        """A block with nothing live: its lines go now; it stays in the ref order until the floor passes."""
        block.dead = True
        block.blob, block.offs, block.ids = b"", _NO_OFFSETS, None
        self._live_slots -= block.n
        self._advance_floor()

    def _evicted(self, block: _Block) -> None:
        if block.live:
            self._write(self._hash, block.base, _zeros("q", block.n))
        self._evictions += block.live
        self._entries -= block.live
        self._dead_bytes -= block.charged - block.live_bytes
        self._kill(block)

    # -- lookups ---------------------------------------------------------------------------------

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        with self._lock:
            heads, mask, slot_hash, nexts = self._heads, self._mask, self._hash, self._next
            floor, size, match, block_of = self._floor, self._slots, self._match, self._block_of
            out: list[bytes | None] = []
            touched: dict[int, None] = {}
            for event_id in ids:
                h = hash(event_id) or 1
                ref = heads[h & mask]
                line = None
                while ref >= floor:
                    slot = ref % size
                    if slot_hash[slot] == h:
                        block = block_of(ref)
                        line = match(block, ref - block.base, event_id)
                        if line is not None:
                            touched[block.key] = None
                            break
                    ref = nexts[slot]
                out.append(line)
            touch = self._lru.__getitem__
            for key in touched:      # once per block, in first-hit order
                touch(key)
            self._lookups += 1
            self._lookup_ids += len(ids)
            self._hits += len(out) - out.count(None)
        return out

    def statistics(self) -> CacheStatistics:
        with self._lock:
            return CacheStatistics(entries=self._entries, bytes=int(self._lru.currsize) - self._dead_bytes,
                                   max_bytes=self.max_bytes, puts=self._puts, evictions=self._evictions,
                                   too_large=self._too_large, lookups=self._lookups, lookup_ids=self._lookup_ids,
                                   hits=self._hits, misses=self._lookup_ids - self._hits)


@dataclass(frozen=True, slots=True)
class BadRecord:
    file: str
    offset: int
    reason: str
    raw: bytes


def index_primary_lines(chunk: LogChunk, id_field: "str | EventIds", good_offsets: list[int] | None = None,
                        map_keys: list[str] | None = None) -> tuple[list[tuple[str, bytes]], list[BadRecord]]:
    """Split a chunk of primary log lines into ``(id, raw)`` pairs to cache and bad records to quarantine.

    A line is good when it is a JSON object whose ``id_field`` is a string that parses as an event id.
    The raw line is kept as it is (no re-serialization); only the id is taken out of it. Given
    ``good_offsets``, the byte offset of each good line is appended to it (for the log-file map).

    ``id_field`` may be a :class:`photon.EventIds` with a time field (``[join].primary_time_field``): a line
    is then good when its id is one the config allows and its time parses (the reason names the field
    otherwise); pairs still carry the user's id (what clicks refer to), and ``map_keys`` gets each good
    line's Photon key (``<id>:0:<time_us>``), which the log-file map keys its entries on.
    """
    if isinstance(id_field, EventIds):
        if not id_field.custom:
            return index_primary_lines(chunk, id_field.id_field, good_offsets)
        return _index_custom(chunk, id_field, good_offsets, map_keys)
    lines, offsets = chunk.lines, chunk.offsets
    idx, ids = _well_formed(lines, id_field)
    if len(idx) == len(lines):               # the common case: every line good
        if good_offsets is not None:
            good_offsets += offsets
        return list(zip(ids, lines)), []
    if good_offsets is not None:
        good_offsets += map(offsets.__getitem__, idx)
    bad_at = sorted(set(range(len(lines))).difference(idx))
    return (list(zip(ids, map(lines.__getitem__, idx))),
            [_bad_record(chunk.file, offsets[k], lines[k], id_field) for k in bad_at])


_LAZY_ID = ID_REGEX.replace(r"[^\n]*:", r"[^\n]*?:", 1)    # the same ids, found with less backtracking
_ID_LINES = re.compile(r"(?:%s\n)*%s" % (_LAZY_ID, _LAZY_ID))
"""Ids joined by newlines, each one well-formed (``photon.is_event_id``)."""


def _map_marking(fn, items, errors) -> tuple[list, list[int]]:
    """``fn`` over ``items`` in C (``map``): the results where it returned, the indices where it raised."""
    out: list = []
    failed: list[int] = []
    rest = iter(items)
    while True:
        try:
            out.extend(map(fn, rest))         # on an error, what came before stays in ``out``
            return out, failed
        except errors:
            failed.append(len(out) + len(failed))


def _drop(idx, failed: list[int]) -> list[int]:
    gone = set(failed)
    return [k for j, k in enumerate(idx) if j not in gone]


def _well_formed(lines: list[bytes], id_field: str) -> tuple[list[int], list[str]]:
    """The indices of the lines that are JSON objects with a well-formed string id in ``id_field``, and
    those ids: one ``orjson.loads`` per line and one regular-expression match for all ids, in bulk."""
    idx: "range | list[int]" = range(len(lines))
    events, failed = _map_marking(orjson.loads, lines, orjson.JSONDecodeError)
    if failed:
        idx = _drop(idx, failed)
    ids, failed = _map_marking(itemgetter(id_field), events, (KeyError, TypeError, IndexError))
    if failed:
        idx = _drop(idx, failed)
    if ids and set(map(type, ids)) != {str}:
        keep = [type(i) is str for i in ids]
        idx, ids = list(compress(idx, keep)), list(compress(ids, keep))
    joined = "\n".join(ids)
    if ids and (joined.count("\n") != len(ids) - 1 or _ID_LINES.fullmatch(joined) is None):
        keep = [bool(is_event_id(i)) for i in ids]
        idx, ids = list(compress(idx, keep)), list(compress(ids, keep))
    return list(idx), ids


def _bad_record(file: str, offset: int, raw: bytes, id_field: str) -> BadRecord:
    """What is wrong with a line that is not a JSON object with a well-formed id in ``id_field``."""
    event, reason = parse_record(raw, (id_field,))
    if event is not None:
        try:
            parse_event_id(event[id_field])
            reason = "id does not parse"
        except BadEventId as e:
            reason = str(e)
    return BadRecord(file, offset, reason, raw)


def _index_custom(chunk: LogChunk, ids: EventIds, good_offsets: list[int] | None,
                  map_keys: list[str] | None) -> tuple[list[tuple[str, bytes]], list[BadRecord]]:
    """:func:`index_primary_lines` for primary events with a time field."""
    good: list[tuple[str, bytes]] = []
    bad: list[BadRecord] = []
    key = ids.key
    for offset, raw in zip(chunk.offsets, chunk.lines):
        event, reason = parse_record(raw, (ids.id_field,))
        if event is not None:
            try:
                k = key(event)
            except BadEventId as e:
                reason = str(e)
            else:
                good.append((event[ids.id_field], raw))
                if good_offsets is not None:
                    good_offsets.append(offset)
                if map_keys is not None:
                    map_keys.append(k)
                continue
        bad.append(BadRecord(chunk.file, offset, reason, raw))
    return good, bad
