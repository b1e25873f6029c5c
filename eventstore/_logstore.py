"""The LogsEventStore: finds any primary event in the logs themselves through the log-file map.

For an id ``ip:pid:ts`` it takes the last map entry of ``ip:pid`` with a timestamp at or before ``ts``,
reads forward from that entry's offset in its file at most about ``M`` bytes (``[eventstore].map_every_kb``
plus one line), and returns the line whose id field equals the id, or NOT_FOUND (``None``). It never
returns a line without checking that: a bad map entry, a file that is gone or shorter than the map says,
or an entry in the middle of a line can only make it answer NOT_FOUND, counted by reason and logged.

Lifecycle: construct, :meth:`~LogsEventStore.start` (a thread loads the map's entries as they land, every
``refresh_s``), :meth:`~LogsEventStore.lookup` from any thread, :meth:`~LogsEventStore.close`.
``read_through_us`` is the primary reader's (from cache server 0's checkpoint, read before the map entries
that checkpoint covers): every event read by then is findable.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import orjson

from eventstore._map import MapView, lookup_point
from eventstore._mapfiles import MapFollower
from eventstore._source import open_primary

log = logging.getLogger("photon.eventstore")

LINE_SLACK_BYTES = 4 << 10
"""Read this much past ``M`` at once, so the line that starts just before ``M`` is usually read whole."""

MAX_LINE_BYTES = 16 << 20
"""A line longer than this is not followed further (NOT_FOUND, reason ``line_too_long``)."""

REASONS = ("bad_id", "no_entry", "not_in_range", "file_missing", "file_short", "entry_mid_line",
           "line_too_long", "read_error")
LOGGED_REASONS = {"file_missing", "file_short", "entry_mid_line", "read_error", "line_too_long"}


@dataclass(frozen=True, slots=True)
class LogsStoreStatistics:
    region: str
    lookups: int
    lookup_ids: int
    found: int
    not_found: int
    not_found_reasons: dict
    bytes_read: int
    map_entries: int
    map_keys: int
    bad_map_entries: int
    open_files: int
    files_opened: int
    read_through_us: int
    refreshes: int


class LogsEventStore:
    """See module docstring."""

    def __init__(self, region: str, primary_root: str | Path, id_field: str, map_dir: str | Path,
                 reader_checkpoint: str | Path | None, every_bytes: int, max_open: int = 64,
                 refresh_s: float = 0.2, s3=None, custom_ids: bool = False) -> None:
        self.region = region
        self.files = open_primary(primary_root, max_open, s3)
        self._id_field = id_field
        self._custom = custom_ids       # [join].primary_time_field set: an entry per line (eventstore._map)
        self._every_bytes = every_bytes
        self._follower = MapFollower(map_dir)
        self._checkpoint = Path(reader_checkpoint) if reader_checkpoint else None
        self._view = MapView()
        self._lock = threading.Lock()
        self._refresh_s = refresh_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logstore-{region}-map", daemon=True)
        self._c = dict(lookups=0, lookup_ids=0, found=0, bytes_read=0, refreshes=0)
        self._reasons = dict.fromkeys(REASONS, 0)
        self._logged = 0
        self.read_through_us = 0

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def refresh(self) -> int:
        """Load the map entries that landed since the last call; returns how many were new."""
        through = self._reader_through()
        entries = self._follower.poll()
        new = 0
        with self._lock:
            for e in entries:
                new += self._view.add(e)
            self._c["refreshes"] += 1
        if through is not None:
            self.read_through_us = through
        return new

    def _reader_through(self) -> int | None:
        if self._checkpoint is None:
            return None
        try:
            return int(json.loads(self._checkpoint.read_bytes()).get("read_through_us", 0))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, AttributeError) as e:
            log.warning("logs store %s: reader checkpoint %s unreadable: %s", self.region, self._checkpoint, e)
            return None

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            try:
                self.refresh()
            except Exception:
                log.exception("logs store %s: map refresh failed; retrying", self.region)

    def lookup(self, ids: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        read = 0
        for event_id in ids:
            raw, reason, n = self._lookup_one(event_id)
            read += n
            out.append(raw)
            if raw is None:
                self._not_found(event_id, reason)
        with self._lock:
            c = self._c
            c["lookups"] += 1
            c["lookup_ids"] += len(ids)
            c["found"] += len(out) - out.count(None)
            c["bytes_read"] += read
        return out

    def _not_found(self, event_id: str, reason: str) -> None:
        kind = reason.split(":", 1)[0]
        with self._lock:
            self._reasons[kind] += 1
            self._logged += 1
            logged = self._logged
        if kind in LOGGED_REASONS and (logged <= 100 or logged % 10_000 == 0):
            log.warning("logs store %s: %s not found: %s", self.region, event_id, reason)

    def _lookup_one(self, event_id: str) -> tuple[bytes | None, str, int]:
        try:
            key, ts = lookup_point(event_id, self._custom)
        except ValueError:
            return None, "bad_id", 0
        with self._lock:
            where = self._view.find(key, ts)
        if where is None:
            return None, "no_entry", 0
        rel, offset = where
        start = max(0, offset - 1)
        want = offset - start + self._every_bytes + LINE_SLACK_BYTES
        try:
            data = self.files.read_at(rel, start, want)
        except FileNotFoundError:
            return None, f"file_missing: {rel} (map entry at offset {offset})", 0
        except OSError as e:
            return None, f"read_error: {rel}: {e}", 0
        if len(data) <= offset - start:
            return None, f"file_short: {rel} ends before offset {offset} the map names", len(data)
        first = 0
        if offset > 0:
            if data[:1] != b"\n":
                nl = data.find(b"\n", 1)
                if nl < 0:
                    return None, f"entry_mid_line: {rel} offset {offset} is not a line start", len(data)
                first = nl + 1
                self._not_found_note(f"entry_mid_line: {rel} offset {offset} is not a line start")
            else:
                first = 1
        return self._scan(event_id, rel, start, data, first, want)

    def _not_found_note(self, reason: str) -> None:
        """An anomaly met on the way (the lookup may still succeed): counted and logged like a miss."""
        self._not_found("-", reason)

    def _scan(self, event_id: str, rel: str, start: int, data: bytes, first: int, want: int):
        """Look for the line of ``event_id`` among the lines of ``data`` (file ``rel`` from ``start``) that
        start at ``first`` or later and within ``M`` bytes of it."""
        if self._custom:                # the entry is the line itself: whatever escapes its writer used
            end = data.find(b"\n", first)
            try:
                if end >= 0 and orjson.loads(data[first:end]).get(self._id_field) == event_id:
                    return data[first:end], "", len(data)
            except (orjson.JSONDecodeError, AttributeError):
                pass
        needle = b'"' + event_id.encode() + b'"'
        limit = first + self._every_bytes
        read = len(data)
        pos = data.find(needle, first)
        while pos >= 0:
            line_start = data.rfind(b"\n", first, pos) + 1 or first
            if line_start > limit:
                break
            line_end = data.find(b"\n", pos)
            if line_end < 0:
                if len(data) < want:        # end of file: a last line without \n is not written yet
                    break
                data, more = self._extend(rel, start, data)
                read += more
                if more == 0:
                    return None, f"line_too_long: {rel} offset {start + line_start}", read
                continue
            line = data[line_start:line_end]
            try:
                if orjson.loads(line).get(self._id_field) == event_id:
                    return line, "", read
            except (orjson.JSONDecodeError, AttributeError):
                pass
            pos = data.find(needle, pos + 1)
        return None, "not_in_range", read

    def _extend(self, rel: str, start: int, data: bytes) -> tuple[bytes, int]:
        if len(data) >= MAX_LINE_BYTES + self._every_bytes:
            return data, 0
        try:
            more = self.files.read_at(rel, start + len(data), LINE_SLACK_BYTES)
        except OSError:
            return data, 0
        return data + more, len(more)

    def serving_problem(self) -> str | None:
        """Why this store should not be asked yet (None: it can answer): the primary reader whose map it
        follows (cache server 0) has not yet read the logs to their end, so the map is still catching up."""
        if not self.read_through_us:
            return "catching up: the primary reader it follows has not read the logs to their end yet"
        return None

    def statistics(self) -> LogsStoreStatistics:
        with self._lock:
            c, reasons = dict(self._c), dict(self._reasons)
            entries, keys = self._view.entries, self._view.keys()
        return LogsStoreStatistics(
            region=self.region, lookups=c["lookups"], lookup_ids=c["lookup_ids"], found=c["found"],
            not_found=c["lookup_ids"] - c["found"], not_found_reasons=reasons, bytes_read=c["bytes_read"],
            map_entries=entries, map_keys=keys, bad_map_entries=self._follower.bad_entries,
            open_files=self.files.open_files(), files_opened=self.files.opens,
            read_through_us=self.read_through_us, refreshes=c["refreshes"])

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.files.close()
