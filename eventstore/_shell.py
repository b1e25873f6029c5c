"""The CacheEventStore shell: a primary reader thread feeding an :class:`EventCache`, and its in-process twin.

Lifecycle of :class:`CacheEventStore`: construct, :meth:`~CacheEventStore.start` (the reader thread begins
at offset 0 of every primary log file, any depth, and keeps tailing: growing files and new files),
:meth:`~CacheEventStore.lookup` from any thread, :meth:`~CacheEventStore.close` (stops and joins the
reader). Only complete lines (terminated by ``\\n``) are read. Bad lines go to the quarantine log with
their file and offset and are skipped. What is guaranteed: an event whose line was read is found until the
byte bound pushes it out (least recently used first). Not guaranteed: older events (a later logs-based
event store covers those), or that a line written a moment ago has been read already.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from photon import LogTailer, Quarantine

from eventstore._state import CacheStatistics, EventCache, index_primary_lines

log = logging.getLogger("photon.eventstore")

POLL_INTERVAL_S = 0.01
"""How long the reader waits before looking at the logs again when it found nothing new."""

POLL_MAX_BYTES = 8 << 20
"""Bytes read per pass, so lookups are never starved by a large backlog."""


@dataclass(frozen=True, slots=True)
class EventStoreStatistics(CacheStatistics):
    """The cache's statistics plus the primary reader's."""
    region: str
    read_through_us: int
    lines_read: int
    events_indexed: int
    bad_records: int
    files: int
    pending_bytes: int
    reader_alive: bool


class CacheEventStore:
    """Recent primary events from ``primary_root`` held in a byte-bounded LRU (see module docstring)."""

    def __init__(self, region: str, primary_root: str | Path, id_field: str, max_bytes: int,
                 quarantine_dir: str | Path) -> None:
        self.region = region
        self.cache = EventCache(max_bytes)
        self._id_field = id_field
        self._quarantine = Quarantine(quarantine_dir, f"eventstore-{region}")
        self._quarantine.skip_known()      # the reader starts at offset 0: bad lines it quarantined before
        self._tailer = LogTailer(primary_root, quarantine=self._quarantine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"eventstore-{region}-reader", daemon=True)
        self._lines_read = 0
        self._events_indexed = 0
        self.read_through_us = 0
        """Wall time (µs) up to which the store has read everything: every complete line the logs held at
        that moment is indexed. 0 until the first pass that reached the end of every file."""

    def start(self) -> None:
        self._thread.start()

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        return self.cache.lookup(ids)

    def read_once(self) -> int:
        """One pass over the logs: index every new complete line; returns the number of lines read.
        The reader thread calls this in a loop; tests may call it directly on a store never started."""
        lines = 0
        started_us = time.time_ns() // 1000
        for chunk in self._tailer.poll(POLL_MAX_BYTES):
            good, bad = index_primary_lines(chunk, self._id_field)
            self.cache.put_many(good)
            for b in bad:
                self._quarantine.add(b.file, b.offset, b.reason, b.raw)
            lines += len(chunk.lines)
            self._events_indexed += len(good)
        self._lines_read += lines
        if self._tailer.caught_up:
            self.read_through_us = started_us
        return lines

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.read_once() == 0:
                    self._stop.wait(POLL_INTERVAL_S)
            except Exception:  # a reader that dies silently would starve every join: log and go on
                log.exception("eventstore %s: primary reader pass failed; retrying", self.region)
                self._stop.wait(1.0)

    def statistics(self) -> EventStoreStatistics:
        return EventStoreStatistics(
            **dataclasses.asdict(self.cache.statistics()), region=self.region,
            read_through_us=self.read_through_us, lines_read=self._lines_read,
            events_indexed=self._events_indexed,
            bad_records=self._quarantine.count, files=len(self._tailer.offsets),
            pending_bytes=self._tailer.pending_bytes(), reader_alive=self._thread.is_alive())

    def status(self) -> dict:
        return dataclasses.asdict(self.statistics())

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._quarantine.close()


class InMemoryEventStore:
    """The in-process twin of :class:`~eventstore.EventStoreClient`: events are ``put`` by the caller
    instead of read from logs. Same byte-bounded LRU, same ``lookup`` contract. Thread-safe."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.cache = EventCache(max_bytes)

    def put(self, event_id: str, raw: bytes) -> None:
        self.cache.put(event_id, raw)

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        return self.cache.lookup(ids)

    def status(self) -> dict:
        return dataclasses.asdict(self.cache.statistics())

    def close(self) -> None:
        pass
