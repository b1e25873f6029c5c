"""The event store's pure parts: the byte-bounded LRU of raw primary events and the indexing of log lines.

Nothing here reads files, sockets or the clock. :class:`EventCache` is thread-safe (one lock around the
LRU); :func:`index_primary_lines` is a plain function from a chunk of log lines to ``(id, raw)`` pairs and
bad records.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import cachetools
import orjson

from photon import BadEventId, EventIds, LogChunk, is_event_id, parse_event_id, parse_record

# Bytes charged per cached event on top of its raw line's length. Measured with tracemalloc on CPython 3.11
# for 100K events with 28-character ids (tests/eventstore/test_es_cache.py checks it): about 60 bytes in
# each of the id index and the event's block, 79 for the id string and 33 for the bytes object's header.
ENTRY_OVERHEAD_BYTES = 190

BLOCK_EVENTS = 1024
"""At most this many events share one block of the LRU (see :class:`EventCache`)."""

BLOCKS_PER_CACHE = 64
"""A block is also kept under ``1/BLOCKS_PER_CACHE`` of the byte bound, so an eviction frees a small part."""


def entry_size(raw: bytes) -> int:
    """The bytes one cached event is charged against ``[eventstore].cache_mb``."""
    return len(raw) + ENTRY_OVERHEAD_BYTES


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
    """Events put together: their raw lines by id, and the bytes the block was charged when cached."""
    __slots__ = ("key", "events", "charged", "live_bytes")

    def __init__(self, key: int) -> None:
        self.key = key
        self.events: dict[str, bytes] = {}
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


class EventCache:
    """Recent primary events by id, as raw log-line bytes, bounded by :func:`entry_size` bytes in total.

    Events are held in blocks: each ``put_many`` call fills blocks of up to :data:`BLOCK_EVENTS` events,
    and a cachetools LRU of blocks enforces the byte bound. Recency is kept per block: a lookup hit marks
    its block recently used, and the least recently used block is evicted whole. Working per block rather
    than per event takes the LRU's bookkeeping (a few microseconds an operation) off the indexing path;
    a single ``put`` is a block of one, so it behaves exactly as a per-event LRU.

    ``put`` of an id already held replaces it (the new bytes, in the new block). An event larger than the
    whole bound is not stored (counted in ``too_large``). ``lookup`` returns one result per id, in order.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache size must be > 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._block_bytes = max(1, max_bytes // BLOCKS_PER_CACHE)
        self._where: dict[str, _Block] = {}
        self._lru = _BlockLRU(max_bytes, self._evicted)
        self._next_key = 0
        self._dead_bytes = 0       # charged to cached blocks for events since replaced
        self._lock = threading.Lock()
        self._puts = self._too_large = self._evictions = 0
        self._lookups = self._lookup_ids = self._hits = 0

    def put(self, event_id: str, raw: bytes) -> None:
        self.put_many([(event_id, raw)])

    def put_many(self, events: list[tuple[str, bytes]]) -> None:
        with self._lock:
            block = None
            where, overhead = self._where, ENTRY_OVERHEAD_BYTES
            limit, max_bytes = self._block_bytes, self.max_bytes
            for event_id, raw in events:
                size = len(raw) + overhead
                if size > max_bytes:
                    self._too_large += 1
                    continue
                if block is not None and (len(block.events) >= BLOCK_EVENTS or block.charged + size > limit):
                    self._cache(block)
                    block = None
                if block is None:
                    block = _Block(self._next_key)
                    self._next_key += 1
                old = where.get(event_id)
                if old is not None:
                    self._forget(old, event_id)
                block.events[event_id] = raw
                block.charged += size
                where[event_id] = block
            if block is not None:
                self._cache(block)
            self._puts += len(events)

    def _cache(self, block: _Block) -> None:
        block.live_bytes = block.charged
        if block.events:
            self._lru[block.key] = block      # may evict older blocks (see _evicted)

    def _forget(self, block: _Block, event_id: str) -> None:
        """An id put again: its old bytes leave their block. A cached block stays charged in full until it
        goes (those bytes are counted as dead); one still being filled is simply charged less."""
        size = len(block.events.pop(event_id)) + ENTRY_OVERHEAD_BYTES
        if block.key not in self._lru:
            block.charged -= size
            return
        block.live_bytes -= size
        if block.events:
            self._dead_bytes += size
        else:                                 # nothing live left: drop the block and its dead bytes
            self._dead_bytes -= block.charged - size
            del self._lru[block.key]

    def _evicted(self, block: _Block) -> None:
        where = self._where
        for event_id in block.events:
            if where.get(event_id) is block:
                del where[event_id]
        self._evictions += len(block.events)
        self._dead_bytes -= block.charged - block.live_bytes

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        with self._lock:
            where = self._where.get
            out: list[bytes | None] = []
            touched: dict[int, None] = {}
            for event_id in ids:
                block = where(event_id)
                if block is None:
                    out.append(None)
                else:
                    out.append(block.events[event_id])
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
            return CacheStatistics(entries=len(self._where), bytes=int(self._lru.currsize) - self._dead_bytes,
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
    if good_offsets is not None:
        good_offsets += chunk.offsets
        good, bad = index_primary_lines(chunk, id_field)
        if bad:
            dropped = {b.offset for b in bad}
            del good_offsets[len(good_offsets) - len(chunk.offsets):]
            good_offsets += [o for o in chunk.offsets if o not in dropped]
        return good, bad
    good: list[tuple[str, bytes]] = []
    bad: list[BadRecord] = []
    required = (id_field,)
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    for offset, raw in zip(chunk.offsets, chunk.lines):
        try:  # the fast path: a well-formed line
            event_id = loads(raw)[id_field]
            if type(event_id) is str and is_event_id(event_id):
                good.append((event_id, raw))
                continue
        except (decode_error, KeyError, TypeError, IndexError):
            pass
        event, reason = parse_record(raw, required)
        if event is None:
            bad.append(BadRecord(chunk.file, offset, reason, raw))
            continue
        try:
            parse_event_id(event[id_field])
            reason = "id does not parse"
        except BadEventId as e:
            reason = str(e)
        bad.append(BadRecord(chunk.file, offset, reason, raw))
    return good, bad


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
