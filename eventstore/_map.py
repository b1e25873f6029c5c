"""The log-file map, pure parts: entries, the W/M emission rule, the in-memory view and the line format.

An entry says: the primary log ``file`` (relative to the primary stream's folder) holds, at byte ``offset``
(the start of a line), an event of ``key`` (``server_ip:process_id``) with timestamp ``ts`` (µs). Entries
are written as JSON lines, the one format of the map whoever writes it (the cache servers' primary reader
or ``photon eventstore build-map``)::

    {"key":"10.1.0.1:1000","ts":1763712000123456,"file":"w0/queries-00000.jsonl","offset":4096}

**The W/M rule** (:class:`MapEmitter`): reading one file from one start offset, the first line of each key
gets an entry, and a later line of that key gets one when its timestamp is ``W`` µs or more past the key's
last entry in that file, or its offset ``M`` bytes or more past it (or its timestamp went backwards). So
every line of a key lies in the same file as an entry of its key with ``ts <=`` its own and starts fewer
than ``M`` bytes after it: a lookup reads at most about ``M`` bytes forward from the last entry at or before
the id's timestamp. Nothing here reads files, sockets or the clock.

**Custom primary ids** (``[join].primary_time_field`` set): a click names its query by the user's id alone,
with no time, so the W/M rule cannot lead to it. Entries are then made from each line's Photon key
``<id>:0:<time_us>`` (``key`` = ``<id>:0``, ``ts`` = the time field) for **every** good line
(``per_line``), and a lookup takes the last entry of ``<id>:0`` (:func:`lookup_point`). This costs one map
entry per primary line: about 120 bytes on disk per line and, in a :class:`MapView`, about 460 bytes per
line with UUID ids (the key string, two one-element lists, a tuple, dict slots; measured on 100,000).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import islice, repeat
from operator import le
from typing import Sequence

import orjson

from photon import ID_KEY, ID_TIME_DIGITS, MAX_TIME_US, check_custom_id

from eventstore._packed import pack_time, unpack_time


@dataclass(frozen=True, slots=True, order=True)
class MapEntry:
    key: str
    ts: int
    file: str
    offset: int

    def to_json(self) -> bytes:
        return orjson.dumps({"key": self.key, "ts": self.ts, "file": self.file, "offset": self.offset})


def split_id(event_id: str) -> tuple[str, int]:
    """``server_ip:process_id:timestamp_us`` -> (``server_ip:process_id``, timestamp_us); ValueError if not."""
    key, sep, ts = event_id.rpartition(":")
    if not sep or not key or ":" not in key or not ts.isdigit():
        raise ValueError(f"not an event id: {event_id!r}")
    return key, int(ts)


def lookup_point(event_id: str, custom: bool) -> tuple[str, int]:
    """Where a lookup of ``event_id`` starts: ``(key, ts)`` for :meth:`MapView.find`. Photon ids: their own
    prefix and time (:func:`split_id`); custom primary ids: the key ``<id>:0`` at the largest time (the
    last entry of that id). ValueError when the id cannot be a primary id."""
    if not custom:
        return split_id(event_id)
    if check_custom_id(event_id) is not None:
        raise ValueError(f"not an event id: {event_id!r}")
    return f"{event_id}:0", MAX_TIME_US


def parse_map_line(raw: bytes) -> MapEntry | str:
    """A map line as a :class:`MapEntry`, or the reason it is not one (a bad entry is skipped, never used)."""
    try:
        d = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return f"not valid JSON: {e}"
    if not isinstance(d, dict):
        return "not a JSON object"
    key, ts, file, offset = d.get("key"), d.get("ts"), d.get("file"), d.get("offset")
    if not isinstance(key, str) or ":" not in key:
        return f"bad key {key!r}"
    if type(ts) is not int or ts < 0:
        return f"bad ts {ts!r}"
    if type(offset) is not int or offset < 0:
        return f"bad offset {offset!r}"
    if not isinstance(file, str) or not file or file.startswith("/") or ".." in file.split("/"):
        return f"bad file {file!r} (must be a path relative to the primary stream's folder)"
    return MapEntry(key, ts, file, offset)


class MapEmitter:
    """Decides which lines get map entries (the W/M rule of the module docstring).

    ``observe`` is called for every good line of a file in file order; :meth:`marks` / ``marks=`` carry the
    per ``(file, key)`` state across restarts so a resumed reader emits exactly what an uninterrupted one
    would. A reader that starts a file at some offset without marks (a Spark task of a file range) simply
    gives the first line of each key there an entry: the rule still holds.
    """

    def __init__(self, every_us: int, every_bytes: int, marks: dict | None = None, per_line: bool = False) -> None:
        if every_us <= 0 or every_bytes <= 0:
            raise ValueError("map_every_s and map_every_kb must be > 0")
        self.per_line = per_line
        self.every_us = every_us
        self.every_bytes = every_bytes
        self._marks: dict[tuple[str, str], tuple[int, int]] = dict(marks or {})

    def observe(self, file: str, offset: int, event_id: str) -> MapEntry | None:
        key, _, ts_text = event_id.rpartition(":")
        ts = int(ts_text)
        if self.per_line:           # custom primary ids: every line its own entry, no marks kept
            return MapEntry(key, ts, file, offset)
        mark = self._marks.get((file, key))
        if (mark is None or ts - mark[0] >= self.every_us or offset - mark[1] >= self.every_bytes
                or ts < mark[0]):
            self._marks[(file, key)] = (ts, offset)
            return MapEntry(key, ts, file, offset)
        return None

    def observe_many(self, file: str, offsets: list[int], event_ids: list[str],
                     timed: "tuple[str, Sequence[int]] | None" = None) -> list[MapEntry]:
        """:meth:`observe` for lines of ``file`` in file order (increasing ``offsets``): the entries made.
        ``timed``: ``(key, timestamps)`` when all the ids are of one key with increasing timestamps (see
        ``eventstore._state.split_photon_ids``: packed decimal), else worked out here when it holds.

        Such a chunk (the usual one) is done without a step per line: from each entry, the next one is
        the first line ``W`` µs or ``M`` bytes past it, found by bisection. Others go line by line."""
        if not event_ids:
            return []
        if not self.per_line:
            if timed is None:
                key = ID_KEY(event_ids[0])
                if list(map(ID_KEY, event_ids)).count(key) == len(event_ids):
                    tss = list(map(int, map(ID_TIME_DIGITS, event_ids), repeat(16)))   # packed decimal
                    if all(map(le, tss, islice(tss, 1, None))):
                        timed = key, tss
            if timed is not None:
                return self._jump(file, timed[0], offsets, timed[1])
        return [e for e in map(self.observe, repeat(file), offsets, event_ids) if e is not None]

    def _jump(self, file: str, key: str, offsets: list[int], tss) -> list[MapEntry]:
        """The entries of one key's lines with non-decreasing timestamps, given in packed decimal (see
        :meth:`observe_many`): marks and entries hold the numbers, one conversion each way per entry."""
        out: list[MapEntry] = []
        mark = self._marks.get((file, key))
        i, n = 0, len(tss)
        while i < n:
            if mark is None or tss[i] < pack_time(mark[0]):
                j = i
            else:
                j = min(bisect.bisect_left(tss, pack_time(mark[0] + self.every_us), i),
                        bisect.bisect_left(offsets, mark[1] + self.every_bytes, i))
                if j >= n:
                    break
            ts = unpack_time(tss[j])
            mark = (ts, offsets[j])
            out.append(MapEntry(key, ts, file, offsets[j]))
            i = j + 1
        if out:
            self._marks[(file, key)] = mark
        return out

    def marks(self) -> dict[tuple[str, str], tuple[int, int]]:
        return dict(self._marks)


def marks_to_json(marks: dict) -> list:
    return [[f, k, ts, off] for (f, k), (ts, off) in sorted(marks.items())]


def marks_from_json(data) -> dict:
    return {(f, k): (int(ts), int(off)) for f, k, ts, off in data or []}


class MapView:
    """The entries known so far, by key, sorted by timestamp (exact duplicates kept once). Not thread-safe:
    its owner locks."""

    def __init__(self) -> None:
        self._ts: dict[str, list[int]] = {}
        self._where: dict[str, list[tuple[str, int]]] = {}
        self.entries = 0
        self.newest_ts = 0

    def add(self, entry: MapEntry) -> bool:
        """Add one entry; False if it was already known."""
        tss = self._ts.get(entry.key)
        if tss is None:
            tss, where = self._ts[entry.key], self._where[entry.key] = [], []
        else:
            where = self._where[entry.key]
        pos = (entry.file, entry.offset)
        if not tss or entry.ts > tss[-1]:
            tss.append(entry.ts)
            where.append(pos)
        else:
            lo = bisect.bisect_left(tss, entry.ts)
            hi = bisect.bisect_right(tss, entry.ts, lo)
            if pos in where[lo:hi]:
                return False
            tss.insert(hi, entry.ts)
            where.insert(hi, pos)
        self.entries += 1
        self.newest_ts = max(self.newest_ts, entry.ts)
        return True

    def find(self, key: str, ts: int) -> tuple[str, int] | None:
        """``(file, offset)`` of the last entry of ``key`` with a timestamp at or before ``ts``, or None."""
        tss = self._ts.get(key)
        if not tss:
            return None
        i = bisect.bisect_right(tss, ts)
        return self._where[key][i - 1] if i else None

    def tail_starts(self, since_ts: int) -> dict[str, int]:
        """Per file, the offset from which reading covers every event with a timestamp at or after
        ``since_ts`` (the entry at or before it, else the first entry after it): what a warm-up re-reads."""
        starts: dict[str, int] = {}
        for key, tss in self._ts.items():
            where = self._where[key]
            i = max(0, bisect.bisect_right(tss, since_ts) - 1)
            seen: set[str] = set()
            for j in range(i, len(tss)):
                file, offset = where[j]
                if file in seen:
                    continue
                seen.add(file)
                starts[file] = min(starts.get(file, offset), offset)
        return starts

    def keys(self) -> int:
        return len(self._ts)
