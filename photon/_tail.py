"""Tailing a stream on any source: complete new lines from every object, resuming from given offsets.

Offsets are byte positions of the next unread byte, i.e. just past the last consumed ``\\n``: resuming at
an offset never re-reads a consumed line and never skips an unconsumed one. A last line without its
``\\n`` is not written yet: it waits, on local files and on S3 alike (on S3 it comes with a longer version
of the object).

Bad input is counted and, given a quarantine, written there with the object's name, the byte offset and
the reason; the good lines around it all come through:

* an object that shrank below its offset (objects only grow) or was deleted with bytes unread;
* an object that cannot be read (permissions): skipped until a new version of it appears;
* an empty S3 object (S3 objects are written whole; an empty local file is just not written yet);
* a line that is not valid UTF-8;
* a line longer than ``max_line_bytes``: its first KiB is quarantined and the rest skipped as it is read,
  never held in memory whole.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from photon._logs import LogChunk, line_offsets
from photon._source import (ObjectGone, ObjectInfo, ObjectUnreadable, SourceUnavailable, open_source)

log = logging.getLogger("photon.source")

KEEP_OF_LONG_LINE = 1024
"""Bytes of an over-long line kept in its quarantine entry."""



def oldest_first(view, offsets: Mapping[str, int], budget: int, min_per_file: int) -> tuple[list[str], int]:
    """A reading order for a backlog of several writers, and how much at most to read of each file in front
    (``LogTailer.poll``'s ``order``, ``read_bytes``): first, in each folder, the first file by name that still
    has bytes to read (a writer's rolled files, written one after another), then every other file by name; the
    ``budget`` is shared evenly by the files in front, at least ``min_per_file`` each. So a backlog is read
    side by side and roughly in time order, rather than one writer's files after another. The event store
    reads the query files and the dispatcher the click files this way, so a click comes about when its query
    does. Any order reads every line; this one only decides which come first."""
    names = sorted(view)
    front: dict[str, str] = {}
    for name in names:
        if view[name].size > offsets.get(name, 0):
            front.setdefault(name.rpartition("/")[0], name)
    first = sorted(front.values())
    chosen = set(first)
    return first + [n for n in names if n not in chosen], max(min_per_file, budget // max(1, len(first)))

@dataclass(frozen=True)
class TailerStatistics:
    objects: int
    pending_bytes: int
    bad_objects: int
    long_lines: int
    bad_utf8_lines: int
    unavailable_polls: int
    caught_up: bool


class LogTailer:
    """Reads complete new lines from every object of a stream, resuming from given offsets.

    ``source`` is a source (:func:`photon.open_source`) or a location (path, ``file://``, ``s3://``).
    ``poll()`` returns chunks of lines read since the last call and advances :attr:`offsets` (the *read*
    positions). The caller decides what is durable: it persists offsets of lines it has resolved, and a new
    tailer started from those offsets resumes exactly there. A chunk's ``end`` may lie past skipped bad
    lines; a poll that found only bad lines returns no chunk for that object (its offset still advances).
    Never raises on bad input or on a transient S3 outage (that poll reads nothing, :attr:`caught_up` is
    False, and the next poll tries again).
    """

    def __init__(self, source, offsets: Mapping[str, int] | None = None, read_bytes: int = 4 << 20,
                 quarantine=None, max_line_bytes: int = 4 << 20, s3=None) -> None:
        self.source = source if hasattr(source, "scan") else open_source(source, s3)
        self.root = self.source.url
        self.quarantine = quarantine
        self.offsets: dict[str, int] = dict(offsets or {})
        self.read_bytes = max(1, read_bytes)
        self.max_line_bytes = max_line_bytes
        self.shrunk: list[str] = []
        self.caught_up = False
        """True when the last :meth:`poll` read every complete line the objects held when it looked at
        them (none left for lack of budget, cut at the read size, or unreachable)."""
        self._view: dict[str, ObjectInfo] = {}
        self._skipping: dict[str, tuple[int, int]] = {}   # name -> (long line's start, scanned up to)
        self._unreadable: dict[str, str] = {}             # name -> version that failed to read
        self._empty_reported: dict[str, str] = {}         # name -> version reported empty
        self._gone: set[str] = set()
        self._cut = False
        self._bad_objects = self._long_lines = self._bad_utf8 = self._unavailable = 0

    # ------------------------------------------------------------------ polling

    def poll(self, max_bytes: int = 16 << 20, order=None) -> list[LogChunk]:
        """Read up to ``max_bytes`` of complete new lines (at most :attr:`read_bytes` per object), objects in
        listing order, or in the order ``order(view)`` gives (``view``: name -> ObjectInfo; it must return every
        name of the view once)."""
        self._cut = False
        try:
            view = self.source.scan(self.offsets)
        except SourceUnavailable as e:
            self._unavailable += 1
            self.caught_up = False
            log.warning("%s: listing failed, trying again at the next poll: %s", self.root, e)
            return []
        self._note_vanished(view)
        self._view = view
        chunks: list[LogChunk] = []
        budget = max_bytes
        for name in (view if order is None else order(view)):
            info = view[name]
            if budget <= 0:
                self._cut = self._cut or info.size > self.offsets.get(name, 0)
                continue
            chunk = self._read(name, info, min(budget, self.read_bytes))
            if chunk is not None:
                chunks.append(chunk)
                budget -= chunk.end - chunk.offsets[0]
        self.caught_up = not self._cut
        return chunks

    def pending_bytes(self) -> int:
        """Bytes beyond the read offsets (including an unterminated last line) as of the last
        :meth:`poll`; objects that cannot be read do not count."""
        offsets, bad = self.offsets, self._unreadable
        return sum(max(0, i.size - offsets.get(n, 0)) for n, i in self._view.items() if bad.get(n) != i.version)

    def unread_objects(self) -> list[str]:
        """Names of the objects with bytes beyond their read offsets as of the last :meth:`poll` (left for lack
        of budget, cut at the read size, or holding an unterminated last line)."""
        offsets = self.offsets
        return [n for n, i in self._view.items() if i.size > offsets.get(n, 0)]

    def statistics(self) -> TailerStatistics:
        return TailerStatistics(len(self._view), self.pending_bytes(), self._bad_objects, self._long_lines,
                                self._bad_utf8, self._unavailable, self.caught_up)

    # ------------------------------------------------------------------ one object

    def _bad(self, name: str, offset: int, reason: str, raw: bytes = b"") -> None:
        log.warning("%s/%s at %d: %s", self.root, name, offset, reason)
        if self.quarantine is not None:
            self.quarantine.add(name, offset, reason, raw)

    def _note_vanished(self, view: Mapping[str, ObjectInfo]) -> None:
        for name, info in self._view.items():
            if name in view or name in self._gone:
                continue
            self._gone.add(name)
            unread = info.size - self.offsets.get(name, 0)
            if unread > 0:
                self._bad_objects += 1
                self._bad(name, self.offsets.get(name, 0), f"{self.root}/{name} was deleted with {unread} "
                                                            f"bytes unread (log objects must stay)")
        if self._gone:
            self._gone.difference_update(set(view) & self._gone)

    def _read(self, name: str, info: ObjectInfo, limit: int) -> LogChunk | None:
        start = self.offsets.get(name, 0)
        size = info.size
        if self._unreadable.get(name) == info.version:
            return None
        if size < start:
            self.shrunk.append(name)
            self._bad_objects += 1
            self._bad(name, start, f"{self.root}/{name} shrank from {start} to {size} bytes (log objects must "
                                   f"only grow); reading on from its new end")
            self.offsets[name] = start = size
            self._skipping.pop(name, None)
        if size == 0 and self.source.whole_objects:
            if self._empty_reported.get(name) != info.version:
                self._empty_reported[name] = info.version
                self._bad_objects += 1
                self._bad(name, 0, f"{self.root}/{name} is an empty object")
            return None
        if size == start:
            return None
        skip = self._skipping.get(name)
        pos = skip[1] if skip else start
        if pos >= size:
            return None
        got = self._fetch(name, info, start, pos, limit)
        if got is None:
            return None
        data, total = got
        searched = 0
        while not skip and len(data) <= self.max_line_bytes and pos + len(data) < total \
                and data.find(b"\n", searched) < 0:     # one line longer than the read size: read on
            searched = len(data)
            got = self._fetch(name, info, start, pos + len(data), max(limit, len(data)))
            if got is None or not got[0]:
                break
            data, total = data + got[0], got[1]
        if total > size:
            self._view = {**self._view, name: ObjectInfo(name, total, info.version)}
        if pos + len(data) < total:
            self._cut = True       # stopped at the read size: complete lines may follow
        if skip:
            return self._skip_on(name, skip[0], pos, data)
        return self._lines(name, start, data)

    def _fetch(self, name: str, info: ObjectInfo, start: int, pos: int, limit: int):
        try:
            return self.source.read(name, pos, limit)
        except ObjectGone:
            return None            # the next scan no longer lists it and reports the loss
        except ObjectUnreadable as e:
            self._unreadable[name] = info.version
            self._bad_objects += 1
            self._bad(name, start, f"cannot be read, skipped until a new version appears: {e}")
            return None
        except SourceUnavailable as e:
            self._unavailable += 1
            self._cut = True
            log.warning("%s/%s: read failed, trying again at the next poll: %s", self.root, name, e)
            return None

    def _skip_on(self, name: str, line_start: int, pos: int, data: bytes) -> LogChunk | None:
        """Go on skipping an over-long line whose start is already quarantined."""
        nl = data.find(b"\n")
        if nl < 0:
            self._skipping[name] = (line_start, pos + len(data))
            return None
        del self._skipping[name]
        self.offsets[name] = pos + nl + 1
        rest = data[nl + 1:]
        return self._lines(name, pos + nl + 1, rest) if rest else None

    def _lines(self, name: str, start: int, data: bytes) -> LogChunk | None:
        """The complete lines of ``data`` (read from ``start``), in few passes over its bytes, each in C: one
        split (the lines themselves, no slice of the body first), the offsets by one running sum of the
        lengths, the UTF-8 check of the whole chunk at once (one ``isascii`` scan, a decode of the complete
        lines only when some byte is not ASCII), and the longest line measured only when the chunk is long
        enough to hold an over-long one. Only a chunk that fails a check goes through its lines one by one."""
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            if len(data) > self.max_line_bytes:
                self._long_line(name, start, data)
            return None
        lines = data.split(b"\n")
        tail = lines.pop()                       # after the last newline: not written yet
        end = start + last_nl + 1
        offsets = line_offsets(start, lines)
        limit = self.max_line_bytes
        kept = data                              # (the lines are its first bytes while none is dropped)
        if (last_nl > limit and max(map(len, lines)) > limit) or not _is_utf8(data, last_nl):
            offsets, lines = self._drop_bad(name, offsets, lines)
            kept = None
        self.offsets[name] = end
        if len(tail) > limit:
            self._long_line(name, end, tail)
        if not lines:
            return None
        return LogChunk(name, offsets, lines, end, kept)

    def _long_line(self, name: str, line_start: int, head: bytes) -> None:
        self._long_lines += 1
        self._bad(name, line_start, f"line longer than max_line_bytes ({self.max_line_bytes}); skipped",
                  head[:KEEP_OF_LONG_LINE])
        self._skipping[name] = (line_start, line_start + len(head))

    def _drop_bad(self, name: str, offsets: list[int], lines: list[bytes]) -> tuple[list, list]:
        good_offsets, good = [], []
        limit = self.max_line_bytes
        for off, line in zip(offsets, lines):
            if len(line) > limit:
                self._long_lines += 1
                self._bad(name, off, f"line longer than max_line_bytes ({limit}); skipped",
                          line[:KEEP_OF_LONG_LINE])
                continue
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                self._bad_utf8 += 1
                self._bad(name, off, f"not valid UTF-8 ({e.reason} at byte {e.start})", line)
                continue
            good_offsets.append(off)
            good.append(line)
        return good_offsets, good


def _is_utf8(data: bytes, length: int) -> bool:
    """Whether the first ``length`` bytes of ``data`` are valid UTF-8, in one pass in C, without a copy: an
    all-ASCII ``data`` (the common case) needs no decode."""
    if data.isascii():
        return True
    try:
        str(memoryview(data)[:length], "utf-8")
    except UnicodeDecodeError:
        return False
    return True
