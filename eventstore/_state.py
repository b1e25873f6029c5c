"""The event store's pure parts: the byte-bounded LRU of raw primary events and the indexing of log lines.

Nothing here reads files, sockets or the clock. :class:`EventCache` is thread-safe (one lock around the
LRU); :func:`index_lines` (and :func:`index_primary_lines`, its ``(id, raw)`` pairs) is a plain function
from a chunk of log lines to its good lines and ids and its bad records, worked a chunk at a time.
"""
from __future__ import annotations

import re
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate, compress, islice, repeat
from operator import add, itemgetter, lt, ne, not_

import cachetools
import msgspec.json  # noqa: F401  (photon.StringFields imports it on first use; here the fork server has it
                    # loaded, with this room, before it forks the service)

from photon import (ID_LINES, TIMESTAMP_DIGITS, BadEventId, EventIds, LogChunk, bad_id_positions, drop_at,
                    is_event_id, parse_event_id, parse_record, string_fields)

from eventstore._packed import packed_times

ENTRY_OVERHEAD_BYTES = 12
"""Bytes charged per cached event with a Photon id on top of its raw line: 8 for its timestamp and 4 for its
offset in its block (see :class:`EventCache`). tests/eventstore/test_es_cache.py measures the whole cache
with tracemalloc."""

KEYED_ENTRY_BYTES = 150
"""Bytes charged, on top of its line's and its id's lengths, per cached event whose id is kept (an id that
is not a Photon id, or a block whose ids do not run in time order): its offset, the id ``str``, its packed
position (an ``int``) and its entry in the id dict."""

BLOCK_OVERHEAD_BYTES = 800
"""Bytes charged per block on top of its events: the block object, its lines' ``bytes`` header, its arrays
and its entries in the LRU and the timeline (measured for blocks of one event, the worst case)."""

BLOCK_EVENTS = 1024
"""At most this many events share one block of the LRU (see :class:`EventCache`)."""

BLOCKS_PER_CACHE = 64
"""A block is also kept under ``1/BLOCKS_PER_CACHE`` of the byte bound, so an eviction frees a small part."""

_TS = TIMESTAMP_DIGITS
_SHIFT = 10                     # a kept id's position: block key << _SHIFT | index in its block
assert BLOCK_EVENTS == 1 << _SHIFT
_LOW = BLOCK_EVENTS - 1
_NO_TIMES = array("Q")
def entry_size(raw: bytes, event_id: str | None = None) -> int:
    """The bytes one cached event is charged against ``[eventstore].cache_mb`` (besides its block's
    :data:`BLOCK_OVERHEAD_BYTES`): with no ``event_id`` (or a Photon id put in time order), a timed
    event's; given an ``event_id`` that is kept, a keyed one's."""
    if event_id is None:
        return len(raw) + ENTRY_OVERHEAD_BYTES
    return len(raw) + KEYED_ENTRY_BYTES + len(event_id)


def split_photon_ids(ids) -> tuple[str, array] | None:
    """``(key, timestamps)`` when every one of ``ids`` is ``<key>:<16 digits>`` with one ``key`` and the
    timestamps strictly increasing (one writer's events in file order), else None; the timestamps in packed
    decimal (:func:`packed_times`). One regular-expression pass over them all; ``key`` itself is not checked
    (``photon.is_event_id`` of one id does that)."""
    n = len(ids)
    key = ids[0][:-_TS - 1]
    joined = "\n".join(ids)
    if not key or joined.count("\n") != n - 1:
        return None
    tails = re.findall(r"^%s:([0-9]{%d})$" % (re.escape(key), _TS), joined, re.MULTILINE)
    if len(tails) != n or (n > 1 and not all(map(lt, tails, islice(tails, 1, None)))):
        return None                           # (equal-width digits: text order is number order)
    return key, packed_times("".join(tails))


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
    """Events put together: their lines concatenated in ``blob``. ``offs`` counts, from ``offs[0]``, each
    line's bytes plus :data:`ENTRY_OVERHEAD_BYTES` (what a put measured already to charge them, no second
    pass), so event ``i`` is ``blob[s:s + offs[i+1] - offs[i] - ENTRY_OVERHEAD_BYTES]`` with
    ``s = offs[i] - offs[0] - i * ENTRY_OVERHEAD_BYTES`` (:meth:`line`). A block cut straight from the bytes
    its lines were read as (:meth:`EventCache.put_lines` given ``read``) keeps them so, each followed by its
    newline, and their offsets in the file: ``pad`` (the bytes ``offs`` counts per event before an event's line
    that ``blob`` does not hold) 0 and ``tail`` (the bytes after each line) 1 instead of both
    :data:`ENTRY_OVERHEAD_BYTES`; event ``i`` is ``blob[s:offs[i+1] - offs[0] - i * pad - tail]`` with
    ``s = offs[i] - offs[0] - i * pad`` in both forms;
    and either their ids as one key and increasing timestamps in packed decimal (a *timed* block: event
    ``i``'s id is ``f"{id_key}:{tss[i]:016x}"``, see :func:`packed_times`) or kept in the cache's id dict (a
    *keyed* block, ``id_key`` None)."""
    __slots__ = ("key", "blob", "offs", "pad", "tail", "id_key", "tss", "ids", "replaced", "live", "charged",
                 "live_bytes")

    def __init__(self, key: int, blob: bytes, offs: array, id_key: str | None, tss: array, ids,
                 pad: int = ENTRY_OVERHEAD_BYTES, tail: int = ENTRY_OVERHEAD_BYTES) -> None:
        self.key = key          # its key in the LRU
        self.blob = blob
        self.offs = offs
        self.pad = pad
        self.tail = tail
        self.id_key = id_key
        self.tss = tss
        self.ids = ids          # a keyed block's ids (None for a timed one)
        self.replaced: set[int] | None = None   # events whose id was put again since
        self.live = len(offs) - 1
        self.charged = 0        # what the LRU counts for this block (fixed once cached)
        self.live_bytes = 0     # the part still held: replaced events leave the block

    def line(self, i: int) -> bytes:
        offs = self.offs
        start = offs[i] - offs[0] - i * self.pad
        return self.blob[start:start + offs[i + 1] - offs[i] - self.tail]


class _Timeline:
    """The timed blocks of one id key, by first timestamp. ``overlap``: the spans of time of some of them
    intersect (then a lookup may have to look in more than one block, and a put may repeat ids held)."""
    __slots__ = ("starts", "blocks", "overlap")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.blocks: list[_Block] = []
        self.overlap = False

    def place(self, lo: int, hi: int) -> tuple[int, bool]:
        """Where a block spanning ``lo .. hi`` goes, and whether it would intersect a block held."""
        i = bisect_right(self.starts, lo)
        meets = (i > 0 and self.blocks[i - 1].tss[-1] >= lo) or (i < len(self.starts) and self.starts[i] <= hi)
        return i, meets or self.overlap

    def add(self, i: int, meets: bool, block: _Block) -> None:
        self.overlap = self.overlap or meets
        self.starts.insert(i, block.tss[0])
        self.blocks.insert(i, block)

    def remove(self, block: _Block) -> None:
        i = 0 if self.blocks[0] is block else self.blocks.index(block)
        del self.starts[i], self.blocks[i]
        if self.overlap:      # sorted by start, spans intersect iff two neighbours' do
            self.overlap = any(a.tss[-1] >= b.tss[0] for a, b in zip(self.blocks, islice(self.blocks, 1, None)))

    def holding(self, ts: int):
        """The blocks whose span may hold ``ts``."""
        i = bisect_right(self.starts, ts)
        if not self.overlap:
            return self.blocks[i - 1:i] if i else ()
        return [b for b in self.blocks[:i] if b.tss[-1] >= ts]


class _BlockLRU(cachetools.LRUCache):
    """The cachetools LRU of blocks; evicting a block drops its events from the indexes."""

    def __init__(self, maxsize: int, on_evict) -> None:
        super().__init__(maxsize, getsizeof=lambda block: block.charged)
        self._on_evict = on_evict

    def popitem(self):
        key, block = super().popitem()
        self._on_evict(block)
        return key, block


class EventCache:
    """Recent primary events by id, as raw log-line bytes, bounded by the bytes they are charged in total
    (:func:`entry_size` per event, :data:`BLOCK_OVERHEAD_BYTES` per block).

    Events are held in blocks: each ``put_many`` call fills blocks of up to :data:`BLOCK_EVENTS` events,
    and a cachetools LRU of blocks enforces the byte bound. Recency is kept per block: a lookup hit marks
    its block recently used, and the least recently used block is evicted whole. A single ``put`` is a
    block of one, so it behaves exactly as a per-event LRU.

    A block holds its lines concatenated in one ``bytes`` with an array of offsets: no Python object per
    event (the primary reader's blocks are slices of the bytes it read, each line with its newline, and the
    lines' offsets in their file: see :meth:`put_lines`). Photon ids need no index of their own: a block of one writer's events in file order (one
    ``server_ip:process_id`` key, timestamps strictly increasing, what a chunk of a primary log file is)
    keeps the key once and the timestamps in an array (packed decimal, :func:`packed_times`), and the
    cache keeps, per key, its blocks in order of their first timestamp (a *timeline*). A lookup splits the id into key and timestamp, bisects the
    timeline for the block and the block's timestamps for the event: an id is exactly its key and
    timestamp, so a match is the event of that id. Any other block (ids that are not Photon ids, such as
    custom primary ids, or that do not run in time order) keeps its ids in one dict, charged for it.

    ``put`` of an id already held replaces it (the new bytes, in the new block). An event larger than the
    whole bound is not stored (counted in ``too_large``). ``lookup`` returns one result per id, in order.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache size must be > 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._block_bytes = max(1, max_bytes // BLOCKS_PER_CACHE)
        self._timelines: dict[str, _Timeline] = {}
        self._where: dict[str, int] = {}          # a kept id -> block key << _SHIFT | index in its block
        self._keyed: dict[int, _Block] = {}       # keyed blocks by key
        self._lru = _BlockLRU(max_bytes, self._evicted)
        self._next_key = 0
        self._entries = 0
        self._dead_bytes = 0       # charged to cached blocks for events since replaced
        self._lock = threading.Lock()
        self._puts = self._too_large = self._evictions = 0
        self._lookups = self._lookup_ids = self._hits = 0

    def put(self, event_id: str, raw: bytes) -> None:
        self.put_many([(event_id, raw)])

    def put_many(self, events: list[tuple[str, bytes]]) -> None:
        if events:
            ids, raws = zip(*events)
            self.put_lines(ids, raws)

    def put_lines(self, ids, raws, timed: tuple[str, array] | None = None, read=None) -> None:
        """``put_many`` of ``zip(ids, raws)``; ``timed``: :func:`split_photon_ids` of ``ids`` if known.
        ``read``: where the lines lie in the bytes they were read as, ``(data, base, starts, breaks)``: ``data``
        starts at file offset ``base``, line ``i`` at offset ``starts[i]`` and is followed by a newline, and
        line ``i`` follows line ``i - 1`` in ``data`` unless ``i`` is one of ``breaks`` (increasing; lines
        left out between them). With ``timed``, blocks are then cut from ``data`` as it is (one slice each,
        their offsets from ``starts``), not joined and measured line by line again."""
        if not ids:
            return
        if read is not None and timed is not None and self._put_read(ids, raws, timed, *read):
            return
        with self._lock:
            self._puts += len(ids)
            cum = list(accumulate(map(add, map(len, raws), repeat(ENTRY_OVERHEAD_BYTES)), initial=0))
            n = len(raws)
            max_size = self.max_bytes - BLOCK_OVERHEAD_BYTES - ENTRY_OVERHEAD_BYTES
            if cum[-1] - n * ENTRY_OVERHEAD_BYTES > max_size and max(map(len, raws)) > max_size:   # (all: none)
                keep = [len(raw) <= max_size for raw in raws]
                self._too_large += keep.count(False)
                ids, raws = list(compress(ids, keep)), list(compress(raws, keep))
                if timed is not None:
                    timed = timed[0], array("Q", compress(timed[1], keep))
                if not ids:
                    return
                cum = list(accumulate(map(add, map(len, raws), repeat(ENTRY_OVERHEAD_BYTES)), initial=0))
                n = len(raws)
            code = "I" if cum[-1] >> 32 == 0 else "Q"
            room = self._block_bytes - BLOCK_OVERHEAD_BYTES
            lo = 0
            while lo < n:
                end = bisect_right(cum, cum[lo] + room, lo + 1, min(n, lo + BLOCK_EVENTS) + 1) - 1
                hi = max(lo + 1, end)
                part = ids[lo:hi]
                split = (timed[0], timed[1][lo:hi]) if timed is not None else split_photon_ids(part)
                if split is not None:
                    self._add_timed(part, raws[lo:hi], cum[hi] - cum[lo] + BLOCK_OVERHEAD_BYTES, *split,
                                    offs=array(code, cum[lo:hi + 1]))   # (an array from a list: faster)
                else:
                    self._put_keyed(part, raws[lo:hi])
                lo = hi

    def _put_read(self, ids, raws, timed: tuple[str, array], data: bytes, base: int, starts: list[int],
                  breaks: list[int]) -> bool:
        """:meth:`put_lines` of one key's timed lines straight from ``data`` (see there): blocks of up to
        :data:`BLOCK_EVENTS` lines in a row (cut at ``breaks`` too), each charged exactly as a block joined
        from its lines. False (nothing put) when some block would exceed the room of one."""
        n = len(raws)
        room = self._block_bytes - BLOCK_OVERHEAD_BYTES
        per_line = ENTRY_OVERHEAD_BYTES - 1                 # (the offsets count each line's newline)
        cuts = [*breaks, n]
        plan = []
        lo = b = 0
        while lo < n:
            while cuts[b] <= lo:
                b += 1
            hi = min(n, lo + BLOCK_EVENTS, cuts[b])
            end = starts[hi - 1] + len(raws[hi - 1]) + 1    # (past the last line's newline)
            charge = end - starts[lo] + per_line * (hi - lo)
            if charge > room:
                return False
            plan.append((lo, hi, end, charge + BLOCK_OVERHEAD_BYTES))
            lo = hi
        key, tss = timed
        with self._lock:
            self._puts += n
            for lo, hi, end, charged in plan:
                offs = array("I" if end >> 32 == 0 else "Q", starts[lo:hi])   # (an array from a list: fast)
                offs.append(end)
                block = _Block(self._next_key, data[starts[lo] - base:end - base], offs, key, tss[lo:hi], None,
                               pad=0, tail=1)
                self._next_key += 1
                self._add_timed_block(ids[lo:hi], block, charged)
        return True

    def _put_keyed(self, ids, raws) -> None:
        """Events whose ids are kept, in blocks cut by what they are charged (more than timed ones)."""
        sizes = list(map(entry_size, raws, ids))
        limit = self.max_bytes - BLOCK_OVERHEAD_BYTES
        if max(sizes) > limit:
            keep = [size <= limit for size in sizes]
            self._too_large += keep.count(False)
            ids, raws, sizes = (list(compress(x, keep)) for x in (ids, raws, sizes))
        cum = list(accumulate(sizes, initial=0))
        room, lo, n = self._block_bytes - BLOCK_OVERHEAD_BYTES, 0, len(sizes)
        while lo < n:
            hi = max(lo + 1, bisect_right(cum, cum[lo] + room, lo + 1, min(n, lo + BLOCK_EVENTS) + 1) - 1)
            self._add_keyed(ids[lo:hi], raws[lo:hi])
            lo = hi

    def _new_block(self, raws, id_key: str | None, tss: array, ids, offs: array | None = None) -> _Block:
        """A block of ``raws``; ``offs``: as :class:`_Block` keeps them, if the caller has them."""
        # (a join of one returns that object itself, with whatever room its maker left in it: copy it)
        blob = b"".join(raws) if len(raws) > 1 else bytes(memoryview(raws[0]))
        if offs is None:
            offs = array("I", list(accumulate(map(add, map(len, raws), repeat(ENTRY_OVERHEAD_BYTES)), initial=0)))
        block = _Block(self._next_key, blob, offs, id_key, tss, ids)
        self._next_key += 1
        return block

    def _add_timed(self, ids, raws, charged: int, id_key: str, tss: array, offs: array | None = None) -> None:
        self._add_timed_block(ids, self._new_block(raws, id_key, tss, None, offs), charged)

    def _add_timed_block(self, ids, block: _Block, charged: int) -> None:
        id_key, tss = block.id_key, block.tss
        block.charged = charged
        timeline = self._timelines.get(id_key)
        if timeline is not None and timeline.place(tss[0], tss[-1])[1]:
            for ts in tss:                    # it may repeat ids held: those leave their blocks
                for held in timeline.holding(ts):
                    j = bisect_left(held.tss, ts)
                    if j < len(held.tss) and held.tss[j] == ts:
                        self._replaced(held, j)
        if self._where:
            for event_id in compress(ids, map(self._where.__contains__, ids)):
                self._replace_kept(event_id)
        self._cache(block)                    # may evict blocks, and empty timelines
        timeline = self._timelines.get(id_key)
        if timeline is None:
            timeline = self._timelines[id_key] = _Timeline()
        timeline.add(*timeline.place(tss[0], tss[-1]), block)

    def _add_keyed(self, ids, raws) -> None:
        """Events kept by id; of events of one put with the same id, the last is kept."""
        block = self._new_block(raws, None, _NO_TIMES, tuple(ids))
        block.charged = BLOCK_OVERHEAD_BYTES
        base = block.key << _SHIFT
        where = self._where
        for i, (event_id, raw) in enumerate(zip(ids, raws)):
            old = where.get(event_id)
            if old is not None:
                if old >> _SHIFT == block.key:       # earlier in this block
                    j = old & _LOW
                    block.replaced = block.replaced or set()
                    block.replaced.add(j)
                    block.live -= 1
                    block.charged -= entry_size(block.line(j), event_id)
                else:
                    self._replace_kept(event_id)
            else:
                self._replace_timed(event_id)
            where[event_id] = base | i
            block.charged += entry_size(raw, event_id)
        self._keyed[block.key] = block
        self._cache(block)

    def _cache(self, block: _Block) -> None:
        block.live_bytes = block.charged
        self._entries += block.live
        self._lru[block.key] = block          # may evict older blocks (see _evicted)

    def _replace_kept(self, event_id: str) -> None:
        ref = self._where.pop(event_id)
        self._replaced(self._keyed[ref >> _SHIFT], ref & _LOW)

    def _replace_timed(self, event_id: str) -> None:
        found = self._find_timed(event_id)
        if found is not None:
            self._replaced(*found)

    def _replaced(self, block: _Block, i: int) -> None:
        """An id put again: its old event leaves its block (a kept id has left the id dict already). A
        cached block stays charged in full until it goes (those bytes are counted as dead)."""
        if block.replaced is None:
            block.replaced = set()
        elif i in block.replaced:
            return
        block.replaced.add(i)
        size = entry_size(block.line(i), None if block.ids is None else block.ids[i])
        block.live -= 1
        self._entries -= 1
        block.live_bytes -= size
        if block.live:
            self._dead_bytes += size
        else:                                 # nothing live left: drop the block and its dead bytes
            self._dead_bytes -= block.charged - block.live_bytes - size
            del self._lru[block.key]
            self._forget(block)

    def _forget(self, block: _Block) -> None:
        """A block leaves the indexes (evicted, or nothing live left in it)."""
        if block.id_key is not None:
            timeline = self._timelines[block.id_key]
            timeline.remove(block)
            if not timeline.blocks:
                del self._timelines[block.id_key]
        else:
            del self._keyed[block.key]
            where, base = self._where, block.key << _SHIFT
            for i, event_id in enumerate(block.ids):
                if where.get(event_id) == base | i:
                    del where[event_id]

    def _evicted(self, block: _Block) -> None:
        self._forget(block)
        self._evictions += block.live
        self._entries -= block.live
        self._dead_bytes -= block.charged - block.live_bytes

    def _find_timed(self, event_id: str) -> tuple[_Block, int] | None:
        """The timed block and index of ``event_id``, if it is a Photon id held."""
        timeline = self._timelines.get(event_id[:-_TS - 1])
        if timeline is None or event_id[-_TS - 1:-_TS] != ":":
            return None
        text = event_id[-_TS:]
        if not (text.isascii() and text.isdigit()):
            return None
        ts = int(text, 16)                    # (packed decimal, as the blocks hold)
        for block in timeline.holding(ts):
            tss = block.tss
            i = bisect_left(tss, ts)
            if i < len(tss) and tss[i] == ts and (block.replaced is None or i not in block.replaced):
                return block, i
        return None

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        # every id's timestamp packed at once when all end in ":" and 16 ASCII digits (the usual request);
        # else each id's is read in the loop (None: not a Photon id's tail)
        packed = _packed_tails(ids)
        with self._lock:
            timelines, where, keyed, find = self._timelines, self._where, self._keyed, self._find_timed
            out: list[bytes | None] = []
            touched: dict[int, None] = {}
            for event_id, ts in zip(ids, packed if packed is not None else repeat(None)):
                timeline = timelines.get(event_id[:-_TS - 1])
                if timeline is not None and not timeline.overlap:      # the usual case, inline
                    if ts is None:
                        text = event_id[-_TS:]
                        if event_id[-_TS - 1:-_TS] == ":" and text.isdigit() and text.isascii():
                            ts = int(text, 16)          # (packed decimal, as the blocks hold)
                    if ts is not None:
                        i = bisect_right(timeline.starts, ts)
                        if i:
                            block = timeline.blocks[i - 1]
                            tss = block.tss
                            j = bisect_left(tss, ts)
                            if j < len(tss) and tss[j] == ts and (block.replaced is None or j not in block.replaced):
                                offs = block.offs
                                skip = offs[0] + j * block.pad       # (see _Block)
                                out.append(block.blob[offs[j] - skip:offs[j + 1] - block.tail - skip])
                                touched[block.key] = None
                                continue
                    found = None
                else:
                    found = find(event_id) if timeline is not None else None
                if found is None:
                    ref = where.get(event_id) if where else None
                    if ref is None:
                        out.append(None)
                        continue
                    found = keyed[ref >> _SHIFT], ref & _LOW
                block, j = found
                out.append(block.line(j))
                touched[block.key] = None
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
    found = index_lines(chunk, id_field, good_offsets, map_keys)
    return list(zip(found.ids, found.lines)), found.bad


@dataclass(frozen=True, slots=True)
class IndexedLines:
    """A chunk's good lines, their ids, its bad records, and :func:`split_photon_ids` of the ids if it
    holds (what the cache and the map emitter then need not work out again; its timestamps are packed
    decimal, see :func:`packed_times`), the positions in the chunk of the bad lines (increasing), and the
    good lines' offsets when :func:`index_lines` worked them out (None: not yet)."""
    ids: list[str]
    lines: list[bytes]
    bad: list[BadRecord]
    timed: tuple[str, array] | None
    bad_at: list[int] = field(default_factory=list)
    offsets: list[int] | None = None

    def read_at(self, chunk: LogChunk):
        """Where :attr:`lines` lie in the bytes ``chunk`` was read as, for :meth:`EventCache.put_lines`
        (``read``), or None when the chunk did not keep them (or kept them in a mutable buffer)."""
        if type(chunk.data) is not bytes:
            return None
        bad_at = self.bad_at
        if not bad_at:
            return chunk.data, chunk.offsets[0], chunk.offsets, []
        starts = self.offsets if self.offsets is not None else drop_at(chunk.offsets, bad_at)
        return (chunk.data, chunk.offsets[0], starts,
                [k - i for i, k in enumerate(bad_at)])      # (the line after bad line k, among those kept)


def index_lines(chunk: LogChunk, id_field: "str | EventIds", good_offsets: list[int] | None = None,
                map_keys: list[str] | None = None) -> IndexedLines:
    """:func:`index_primary_lines`, the ids and lines apart (as the primary reader puts them)."""
    if isinstance(id_field, EventIds):
        if id_field.custom:
            good, bad = _index_custom(chunk, id_field, good_offsets, map_keys)
            return IndexedLines([g[0] for g in good], [g[1] for g in good], bad, None)
        id_field = id_field.id_field
    lines, offsets = chunk.lines, chunk.offsets
    ids, timed, bad_at = _well_formed(lines, id_field, chunk.data is not None)   # (data kept: checked UTF-8)
    if not bad_at:                           # the common case: every line good
        if good_offsets is not None:
            good_offsets += offsets
        return IndexedLines(ids, lines, [], timed, bad_at, offsets)
    # (the lines kept are all the others: slices between the bad ones)
    kept_at = None
    if good_offsets is not None:             # (the cache's blocks take the same offsets: dropped once)
        kept_at = drop_at(offsets, bad_at)
        good_offsets += kept_at
    return IndexedLines(ids, drop_at(lines, bad_at),
                        [_bad_record(chunk.file, offsets[k], lines[k], id_field) for k in bad_at], timed, bad_at,
                        kept_at)


def _well_formed(lines: list[bytes], id_field: str, utf8: bool = False
                 ) -> tuple[list[str], tuple[str, array] | None, list[int]]:
    """The well-formed string ids in ``id_field`` of the lines that are JSON objects with one, in order,
    :func:`split_photon_ids` of them if it holds, and the indices of the other lines, increasing: the ids
    read by :class:`photon.StringFields` (msgspec, with ``orjson.loads``' outcome per line; ``utf8``: the
    lines are known valid UTF-8) and checked in bulk. A line without an id stands as an empty id among the
    others (an id of another width, like any bad id), so every position found is the line's own and the ids
    are dropped once, with all the bad ones. The lines kept are not listed: they are all the others (a step
    per bad line, not per line)."""
    ids, missing = string_fields(id_field).read(lines, utf8)
    if len(missing) == len(ids):
        return [], None, missing
    # the first line with an id: the first position the missing ones (increasing) do not fill from 0
    first = next((i for i, k in enumerate(missing) if k != i), len(missing))
    for k in missing:
        ids[k] = ""
    joined = "\n".join(ids)
    if joined.count("\n") != len(ids) - 1:                   # an id holding a newline: one by one
        keep = [bool(is_event_id(i)) for i in ids]
        bad = list(compress(range(len(ids)), map(not_, keep)))
        ids = list(compress(ids, keep))
        return ids, split_photon_ids(ids) if ids else None, bad   # (the ids left are well-formed)
    one = _one_writer(ids, joined, first)
    if one is not None:                                 # one writer's ids, maybe a few bad ones among them
        return one
    bad = bad_id_positions(joined) if missing or ID_LINES.fullmatch(joined) is None else []
    if bad:                                             # several writers' ids: the bad ones found in one pass
        ids = drop_at(ids, bad)
    return ids, split_photon_ids(ids) if ids else None, bad


def _one_writer(ids: list[str], joined: str, first: int = 0
                ) -> tuple[list[str], tuple[str, array] | None, list[int]] | None:
    """When every well-formed id among ``ids`` (``joined``: them joined by newlines, none holding one) is
    ``ids[first]``'s key and 16 digits: the ids that are well-formed, the key with their timestamps if they
    strictly increase (else None), and the positions of the others (increasing). None when some other
    well-formed id is there (several writers) or no such key. Usually every id of the key's width is the
    key, ``:`` and 16 ASCII digits: that is checked, and their timestamps packed, by columns
    (:func:`_all_one_writer`), the ids of other widths (found by one C ``map``) being the ones that are not.
    Otherwise the ids that are exactly the key, ``:`` and 16 ASCII digits are taken in runs by one regular
    expression (a match per run, each stopping only at an id that is not: a step per such id, not per id;
    the runs' ids all have one width, so a run's length counts its ids); the key is checked once, each other
    id alone. Their order is their timestamps' (one key, one width), and the timestamps are their last 16
    characters joined, packed by one C call (no ``int`` per id)."""
    key = ids[first][:-_TS - 1]
    if not key:
        return None
    id_width = len(key) + _TS + 1                       # the key, ":" and the digits
    if len(joined) == len(ids) * (id_width + 1) - 1:
        holes, kept, text = [], ids, joined
    else:                                               # ids of another width: not the key and 16 digits
        holes = _other_widths(ids, id_width)
        kept = drop_at(ids, holes)
        text = "\n".join(kept)
    whole = _all_one_writer(kept, text, key) if kept else None
    if whole is not None:                               # every other id the key and 16 digits (the usual chunk)
        if holes and any(is_event_id(ids[k]) for k in holes):
            return None
        if not is_event_id(kept[0]):
            return None
        if len(kept) > 1 and not all(map(lt, kept, islice(kept, 1, None))):
            return kept, None, holes
        return kept, (key, whole), holes
    run = _key_runs(key)
    width = len(key) + _TS + 2                          # the key, ":", the digits and the newline
    text = joined + "\n"
    holes: list[int] = []
    pos = line = 0
    end = len(text)
    while True:
        stop = run(text, pos).end()                     # (matches at least the empty string)
        line += (stop - pos) // width
        if stop == end:
            break
        holes.append(line)                              # an id that is not the key and 16 digits
        line += 1
        pos = text.index("\n", stop) + 1
    kept = ids
    if holes:
        if len(holes) == len(ids) or any(is_event_id(ids[k]) for k in holes):
            return None
        kept = drop_at(ids, holes)
    if not is_event_id(kept[0]):
        return None
    if len(kept) > 1 and not all(map(lt, kept, islice(kept, 1, None))):
        return kept, None, holes                        # (one key, one width: text order is number order)
    return kept, (key, packed_times("".join(map(_DIGITS, kept)))), holes   # (one C call, not an int per id)


_DIGITS = itemgetter(slice(-_TS, None))
_TAIL = itemgetter(slice(-_TS - 1, None))      # ":" and the 16 digits


def _all_one_writer(ids: list[str], joined: str, key: str) -> array | None:
    """When every id of ``ids`` (``joined``: them joined by newlines, none holding one) is exactly ``key``,
    ``:`` and 16 ASCII digits: their timestamps packed (as :func:`packed_times` of their digits), else None.
    Checked and packed by columns, a few C calls over the whole chunk for each of the id's characters, not a
    step per id (nor :func:`_key_runs`' regular expression, a step per character): the newlines one period
    apart (so every id has the width of ``key:`` and 16 characters), each byte of ``key`` and the ``:`` in its
    column of every id, each digit column all ASCII digits; then each pair of digit columns made one byte of
    every timestamp (the two columns mapped to nibbles, read as two big integers and or-ed), put in its place
    in every 8 bytes. A chunk with any other id is left to the regular expression's runs."""
    n = len(ids)
    period = len(key) + _TS + 2                         # the key, ":", the digits and the newline
    if len(joined) != n * period - 1 or not joined.isascii():
        return None
    raw = joined.encode() + b"\n"
    if raw[period - 1::period] != b"\n" * n:            # (ids hold no newline: n of them one period apart)
        return None
    first = len(key) + 1                                # the first digit's column
    for column in range(first):
        if raw[column::period] != raw[column:column + 1] * n:     # (the first id's byte: the key's, or ":")
            return None
    if raw[first - 1] != 58:                            # ":"
        return None
    out = bytearray(8 * n)
    for k in range(8):
        high, low = raw[first + 2 * k::period], raw[first + 2 * k + 1::period]
        if not (high.isdigit() and low.isdigit()):      # (bytes: ASCII digits only)
            return None
        pair = int.from_bytes(high.translate(_HIGH_NIBBLE), "big") | int.from_bytes(low.translate(_LOW_NIBBLE), "big")
        out[k::8] = pair.to_bytes(n, "big")
    packed = array("Q", out)
    if sys.byteorder != "big":
        packed.byteswap()
    return packed


def _other_widths(ids: list[str], width: int) -> list[int]:
    """The positions of the ids whose length is not ``width``, increasing: the lengths as bytes (one C
    ``map``), marked by one ``translate`` and found by a search per such id (a step per id only when some id
    is longer than 255 characters)."""
    try:
        lengths = bytes(map(len, ids))
    except ValueError:                                  # (a length over 255)
        return list(compress(range(len(ids)), map(ne, map(len, ids), repeat(width))))
    marked = lengths.translate(_other_than(width)) if width < 256 else b"\x01" * len(ids)
    out, at = [], marked.find(1)
    while at >= 0:
        out.append(at)
        at = marked.find(1, at + 1)
    return out


@lru_cache(maxsize=64)
def _other_than(width: int) -> bytes:
    """A ``translate`` table marking every byte but ``width`` with 1, ``width`` with 0."""
    return bytes(0 if k == width else 1 for k in range(256))

_HIGH_NIBBLE = bytes.maketrans(b"0123456789", bytes(range(0, 160, 16)))
_LOW_NIBBLE = bytes.maketrans(b"0123456789", bytes(range(10)))


def _packed_tails(ids) -> array | None:
    """The timestamps of ``ids`` packed (:func:`packed_times`) when every one ends in ``:`` and 16 ASCII
    digits, else None: their tails joined and checked in C, one ``bytes.fromhex`` (no ``int`` per id). Each
    is what ``int(id[-16:], 16)`` gives for such an id; the key before the tail is not looked at."""
    n = len(ids)
    try:
        tails = "".join(map(_TAIL, ids))
    except TypeError:                                   # (not all str: each one alone)
        return None
    if len(tails) != (_TS + 1) * n or tails[::_TS + 1] != ":" * n:
        return None                                     # (an id shorter than a tail, or no ":" before it)
    digits = tails.replace(":", "")
    if len(digits) != _TS * n or not digits.isascii() or not digits.isdigit():
        return None
    return packed_times(digits)


@lru_cache(maxsize=256)
def _key_runs(key: str):
    """``match`` of a run of ids that are ``key``, ``:`` and 16 ASCII digits, each followed by a newline."""
    return re.compile(r"(?:%s:[0-9]{%d}\n)*" % (re.escape(key), _TS)).match


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
