"""The CacheEventStore shell: a primary reader thread feeding an :class:`EventCache`, and its in-process twin.

Lifecycle of :class:`CacheEventStore`: construct, :meth:`~CacheEventStore.start`, :meth:`~CacheEventStore.lookup`
from any thread, :meth:`~CacheEventStore.close` (stops the reader, writes a last checkpoint).

The reader thread tails every primary log file (any depth; growing files and new files). With a
``state_dir`` it is durable: every ``checkpoint_interval_s`` it fsyncs the log-file map entries it emitted
(if it is the map writer) and then atomically replaces ``<state_dir>/cache-<shard>.json`` with its per-file
offsets (the next unread byte), the W/M rule's marks and ``read_through_us``. A restarted store resumes at
those offsets (lines after them are read again, never lines before them), and first warms its cache by
re-reading the last ``warm_tail_s`` of event time through the map (from the entries at or before the
newest entry's time minus ``warm_tail_s``, up to the resume offsets). ``read_through_us`` stays 0 until the
resumed reader has caught up, so joiners keep deferring NOT_FOUND meanwhile.

Sharding: a store that is server ``shard`` of a :class:`HashRing` keeps only the ids the ring gives it (every
server reads all lines; only server 0 writes the map and the quarantine). Bad lines go to the quarantine
log with their file and offset. Guaranteed: an event whose line was read is found until the byte bound
pushes it out (least recently used first); older events are the logs store's.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass
from itertools import compress
from pathlib import Path

from photon import EventIds, Quarantine, is_event_id, key_and_time, write_atomic
from photon import oldest_first as _oldest_first

from eventstore._map import MapEmitter, MapView, marks_from_json, marks_to_json
from eventstore._mapfiles import MapFiles, READER_MAP_FILE
from eventstore._ring import HashRing
from eventstore._source import open_primary
from eventstore._packed import unpack_time
from eventstore._state import CacheStatistics, EventCache, index_lines

log = logging.getLogger("photon.eventstore")

POLL_INTERVAL_S = 0.01
"""How long the reader waits before looking at the logs again when it found nothing new."""

QUARANTINE_SYNC_S = 5.0
"""How often a quarantine with new entries is uploaded when the output is on S3 (and at close)."""

POLL_MAX_BYTES = 8 << 20
"""Bytes read per pass, so lookups are never starved by a large backlog."""

MIN_FILE_READ_BYTES = 256 << 10
"""The least a pass reads of one file in front (see :func:`oldest_first`)."""


def oldest_first(view, offsets) -> tuple[list[str], int]:
    """The order a pass reads the primary files in, and how much at most of each (:func:`photon.oldest_first`
    with a pass's budget): a backlog of several writers is read side by side and roughly in time order, as
    clicks come, so a click's query is read about when the clicks around it are."""
    return _oldest_first(view, offsets, POLL_MAX_BYTES, MIN_FILE_READ_BYTES)


@dataclass(frozen=True, slots=True)
class EventStoreStatistics(CacheStatistics):
    """The cache's statistics plus the primary reader's."""
    region: str
    shard: int
    servers: int
    read_through_us: int
    lines_read: int
    bytes_read: int
    events_indexed: int
    bad_records: int
    files: int
    pending_bytes: int
    reader_alive: bool
    resumed: bool
    warm_bytes: int
    warm_s: float
    map_entries_written: int
    checkpoints: int


@dataclass(frozen=True)
class ReaderOptions:
    """How the primary reader keeps its place and the map (see :class:`CacheEventStore`)."""
    state_dir: str | Path | None = None
    map_dir: str | Path | None = None
    map_every_s: float = 10.0
    map_every_kb: int = 256
    warm_tail_s: float = 300.0
    checkpoint_interval_s: float = 1.0
    shard: int = 0
    servers: int = 1
    vnodes: int = 64
    s3: object = None
    """``photon.S3Config`` for an ``s3://`` primary root (None: defaults and the environment)."""
    max_line_bytes: int = 4 << 20
    quarantine_publisher: object = None
    """A ``photon.S3Publisher`` uploading the quarantine when the output is on S3 (None: local output)."""


class CacheEventStore:
    """Recent primary events from ``primary_root`` held in a byte-bounded LRU (see module docstring)."""

    def __init__(self, region: str, primary_root: str | Path, id_field: "str | EventIds", max_bytes: int,
                 quarantine_dir: str | Path, options: ReaderOptions | None = None) -> None:
        self.region = region
        self.options = opts = options or ReaderOptions()
        self.cache = EventCache(max_bytes)
        self.files = open_primary(primary_root, s3=opts.s3)
        self._id_field = id_field
        self._ring = HashRing(opts.servers, opts.vnodes) if opts.servers > 1 else None
        self._writes_map = opts.shard == 0 and opts.map_dir is not None
        self._checkpoint = Path(opts.state_dir) / f"cache-{opts.shard}.json" if opts.state_dir else None
        saved = self._load_checkpoint()
        self.resumed = saved is not None
        offsets = saved["offsets"] if saved else {}
        self._resume_offsets = dict(offsets)
        self._custom = isinstance(id_field, EventIds) and id_field.custom   # see eventstore._map
        self._emitter = MapEmitter(int(opts.map_every_s * 1e6), opts.map_every_kb * 1024,
                                   marks_from_json(saved.get("marks")) if saved else None, per_line=self._custom)
        self._map = MapFiles(opts.map_dir) if opts.map_dir is not None else None
        self._map_out = self._map.writer(READER_MAP_FILE) if self._writes_map else None
        self._quarantine = Quarantine(quarantine_dir, f"eventstore-{region}",
                                      publisher=opts.quarantine_publisher) if opts.shard == 0 else None
        if self._quarantine is not None:
            self._quarantine.skip_known(offsets)   # lines past the resume offsets are read again
        self._tailer = self.files.tailer(offsets, self._quarantine, opts.max_line_bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"eventstore-{region}-{opts.shard}-reader",
                                        daemon=True)
        self._lines_read = self._bytes_read = self._events_indexed = self._bad = 0
        self._warm_bytes, self._warm_s, self._map_written, self._checkpoints = 0, 0.0, 0, 0
        self._warmed = not self.resumed
        self._last_checkpoint = time.monotonic()
        self.read_through_us = 0
        """Wall time (µs) up to which the store has read everything: every complete line the logs held at
        that moment is indexed. 0 until the first pass (after any warm-up) that reached every file's end."""
        self._read_to: dict[str, int] = {}    # id key -> the greatest timestamp of its ids read (reader thread)
        self._file_read_to: dict[str, dict[str, int]] = {}   # file -> id key -> the greatest timestamp read there
        self.read_to_us: dict[str, int] | None = {}
        """While the store is catching up (its latest pass did not reach every file's end): per id key
        (``server_ip:process_id``), how far the store has read that key's ids, made after each pass (a new
        dict each time: any thread may read it). None once a pass has caught up: then ``read_through_us``
        says how far. The position of a key is the greatest timestamp of its ids read, lowered to the last
        timestamp read in every file of that key that still has bytes to read (ids run in time order within
        a file, DESIGN §3): so every id of the key up to it has been read, as far as files already started
        tell, and an id after it may not have been. Custom primary ids have no key: nothing is recorded."""

    def _load_checkpoint(self) -> dict | None:
        if self._checkpoint is None:
            return None
        try:
            data = json.loads(self._checkpoint.read_bytes())
            if not isinstance(data.get("offsets"), dict):
                raise ValueError("no offsets")
            return data
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, AttributeError) as e:
            log.error("eventstore %s: checkpoint %s unreadable (%s); reading the logs from the start",
                      self.region, self._checkpoint, e)
            return None

    def start(self) -> None:
        self._thread.start()

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        return self.cache.lookup(ids)

    def _index(self, chunk, *, emit: bool) -> int:
        """Index one chunk: map entries (map writer only), then this shard's events into the cache."""
        offsets: list[int] | None = [] if emit and self._writes_map else None
        keys: list[str] | None = [] if self._custom and offsets is not None else None
        found = index_lines(chunk, self._id_field, offsets, keys)
        ids, lines, timed = found.ids, found.lines, found.timed
        if ids and not self._custom:
            self._note_read_to(chunk.file, ids, timed)
        if offsets is not None:
            entries = (self._emitter.observe_many(chunk.file, offsets, keys) if keys is not None
                       else self._emitter.observe_many(chunk.file, offsets, ids, timed))
            if entries:
                self._map_out.write([e.to_json() for e in entries])
                self._map_written += len(entries)
        if self._ring is not None:
            owner, me = self._ring.server_for, self.options.shard
            mine = [owner(i) == me for i in ids]
            ids, lines, timed = list(compress(ids, mine)), list(compress(lines, mine)), None
            self.cache.put_lines(ids, lines, timed)
        else:                                # every good line: put straight from the bytes as read
            self.cache.put_lines(ids, lines, timed, found.read_at(chunk) if timed is not None else None)
        if emit:
            self._bad += len(found.bad)
            if self._quarantine is not None:
                for b in found.bad:
                    self._quarantine.add(b.file, b.offset, b.reason, b.raw)
        return len(ids)

    def _order(self, view) -> list[str]:
        names, self._tailer.read_bytes = oldest_first(view, self._tailer.offsets)
        return names

    def _note_read_to(self, file: str, ids: list[str], timed) -> None:
        """Move each key's greatest timestamp read, overall and in ``file``, past ``ids`` (well-formed ids;
        ``timed``: one key's strictly increasing timestamps, when :func:`index_lines` found them so)."""
        read_to = self._read_to
        in_file = self._file_read_to.get(file)
        if in_file is None:
            in_file = self._file_read_to[file] = {}
        if timed is not None:
            key, tss = timed
            last = unpack_time(tss[-1])             # (packed decimal)
            if last > read_to.get(key, 0):
                read_to[key] = last
            if last > in_file.get(key, 0):
                in_file[key] = last
            return
        for event_id in ids:
            if is_event_id(event_id):
                key, ts = key_and_time(event_id)
                if ts > read_to.get(key, 0):
                    read_to[key] = ts
                if ts > in_file.get(key, 0):
                    in_file[key] = ts

    def _positions(self) -> dict[str, int]:
        """:attr:`read_to_us` as of now (the reader thread, after a pass that did not catch up)."""
        positions = dict(self._read_to)
        file_read_to = self._file_read_to
        for name in self._tailer.unread_objects():
            for key, last in file_read_to.get(name, {}).items():
                if last < positions[key]:
                    positions[key] = last
        return positions

    def warm(self) -> int:
        """Re-read the recent tail (``warm_tail_s`` of event time, found through the map) up to the resume
        offsets into the cache; returns the bytes read. Nothing is emitted or quarantined again."""
        t0 = time.monotonic()
        view = MapView()
        if self._map is not None:
            for entry in self._map.read_all()[0]:
                view.add(entry)
        cutoff = view.newest_ts - int(self.options.warm_tail_s * 1e6)
        read = 0
        for rel, start in sorted(view.tail_starts(cutoff).items()):
            end = self._resume_offsets.get(rel, 0)
            if start >= end or self._stop.is_set():
                continue
            try:
                for chunk in self.files.chunks(rel, start, end):
                    self._index(chunk, emit=False)
                    read += chunk.end - chunk.offsets[0]
            except OSError as e:
                log.warning("eventstore %s: warm-up skipped %s: %s", self.region, rel, e)
        self._warm_bytes, self._warm_s = read, time.monotonic() - t0
        self._warmed = True
        log.info("eventstore %s shard %d: warmed the cache from %d bytes of recent logs in %.2f s",
                 self.region, self.options.shard, read, self._warm_s)
        return read

    def read_once(self) -> int:
        """One pass over the logs: index every new complete line; returns the number of lines read.
        The reader thread calls this in a loop; tests may call it directly on a store never started."""
        if not self._warmed:
            self.warm()
        lines = 0
        started_us = time.time_ns() // 1000
        for chunk in self._tailer.poll(POLL_MAX_BYTES, order=self._order):
            self._events_indexed += self._index(chunk, emit=True)
            lines += len(chunk.lines)
            self._bytes_read += chunk.end - chunk.offsets[0]
        self._lines_read += lines
        if self._tailer.caught_up:
            self.read_through_us = started_us
            self.read_to_us = None
        elif lines or self.read_to_us is None:
            self.read_to_us = self._positions()
        if time.monotonic() - self._last_checkpoint >= self.options.checkpoint_interval_s:
            self.checkpoint()
        return lines

    def checkpoint(self) -> None:
        """Make the map entries durable, then the offsets past them (never the other way round)."""
        self._last_checkpoint = time.monotonic()
        if self._checkpoint is None:
            return
        if self._map_out is not None:
            self._map_out.sync()
        data = {"offsets": self._tailer.offsets, "marks": marks_to_json(self._emitter.marks()),
                "read_through_us": self.read_through_us, "at_us": time.time_ns() // 1000}
        self._checkpoint.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self._checkpoint, json.dumps(data).encode(), durable=True)
        self._checkpoints += 1

    def _run(self) -> None:
        synced = time.monotonic()
        while not self._stop.is_set():
            try:
                if self.read_once() == 0:
                    self._stop.wait(POLL_INTERVAL_S)
                if self._quarantine is not None and time.monotonic() - synced >= QUARANTINE_SYNC_S:
                    synced = time.monotonic()
                    self._quarantine.sync()        # uploads it when the output is on S3
            except Exception:  # a reader that dies silently would starve every join: log and go on
                log.exception("eventstore %s: primary reader pass failed; retrying", self.region)
                self._stop.wait(1.0)

    def statistics(self) -> EventStoreStatistics:
        return EventStoreStatistics(
            **dataclasses.asdict(self.cache.statistics()), region=self.region, shard=self.options.shard,
            servers=self.options.servers, read_through_us=self.read_through_us, lines_read=self._lines_read,
            bytes_read=self._bytes_read, events_indexed=self._events_indexed, bad_records=self._bad,
            files=len(self._tailer.offsets), pending_bytes=self._tailer.pending_bytes(),
            reader_alive=self._thread.is_alive(), resumed=self.resumed, warm_bytes=self._warm_bytes,
            warm_s=round(self._warm_s, 3), map_entries_written=self._map_written, checkpoints=self._checkpoints)

    def serving_problem(self) -> str | None:
        """Why this store should not be asked yet (None: it can answer): it is still catching up (it has
        not read to the end of the primary logs since it started, so a NOT_FOUND means little), or its
        reader thread is gone."""
        if self._thread.ident is not None and not self._thread.is_alive():
            return "the primary reader has stopped"
        if not self.read_through_us:
            return "catching up: the primary logs are not yet read to their end"
        return None

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        try:
            if self._warmed:
                self.checkpoint()
        except OSError:
            log.exception("eventstore %s: last checkpoint failed", self.region)
        if self._map_out is not None:
            self._map_out.close()
        if self._quarantine is not None:
            self._quarantine.close()
        self.files.close()


class InMemoryEventStore:
    """The in-process twin of :class:`~eventstore.EventStoreClient`: events are ``put`` by the caller
    instead of read from logs. Same byte-bounded LRU, same ``lookup`` contract. Thread-safe."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.cache = EventCache(max_bytes)

    def put(self, event_id: str, raw: bytes) -> None:
        self.cache.put(event_id, raw)

    def put_many(self, events: list[tuple[str, bytes]]) -> None:
        """Put events together (one block of the LRU per up to 1,024), as the primary reader does."""
        self.cache.put_many(events)

    def put_lines(self, ids: list[str], lines: list[bytes], timed=None) -> None:
        """``put_many`` of ``zip(ids, lines)``, as the primary reader puts an :func:`~eventstore.index_lines`
        result (``timed``: its ``timed``)."""
        self.cache.put_lines(ids, lines, timed)

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        return self.cache.lookup(ids)

    def status(self) -> dict:
        return dataclasses.asdict(self.cache.statistics())

    def close(self) -> None:
        pass
