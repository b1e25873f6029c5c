"""Where the event store reads primary log files: a local folder or an S3 prefix.

:func:`open_primary` picks :class:`LocalFiles` or :class:`SourceFiles` (any ``photon.open_source``
location, e.g. ``s3://bucket/prefix``: ranged GETs through the base's source layer). :class:`LocalFiles`
serves a local folder: a :class:`photon.LogTailer` for the primary reader, and random
reads (``read_at``) for the logs store through a bounded pool of open files. Paths are relative to the
stream's folder and may never leave it.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Mapping

from photon import LogChunk, LogTailer, ObjectGone, Quarantine, local_folder, open_source

RANGE_READ_BYTES = 4 << 20


def line_chunks(read_at, rel: str, start: int, end: int | None, read_bytes: int = RANGE_READ_BYTES):
    """The complete lines of ``rel`` that start in ``[start, end)`` as :class:`~photon.LogChunk` values,
    read through ``read_at(rel, offset, size)`` (see :meth:`LocalFiles.chunks`)."""
    pos = start
    if start > 0 and read_at(rel, start - 1, 1) != b"\n":
        while True:                       # skip the rest of the line that began before ``start``
            head = read_at(rel, pos, read_bytes)
            nl = head.find(b"\n")
            if nl >= 0:
                pos += nl + 1
                break
            if len(head) < read_bytes:    # no end of that line yet
                return
            pos += len(head)
    while end is None or pos < end:
        data = read_at(rel, pos, read_bytes)
        cut = data.rfind(b"\n")
        while cut < 0 and len(data) >= read_bytes:     # a line longer than the read size
            more = read_at(rel, pos + len(data), read_bytes)
            if not more:
                break
            data += more
            cut = data.rfind(b"\n")
        if cut < 0:
            return
        offsets, lines, p = [], [], pos
        for line in data[:cut].split(b"\n"):
            if end is not None and p >= end:
                break
            offsets.append(p)
            lines.append(line)
            p += len(line) + 1
        if not lines:
            return
        yield LogChunk(rel, offsets, lines, p)
        pos = p


class LocalFiles:
    """Primary log files under ``root``; at most ``max_open`` kept open (least recently used closed first,
    never while a read is using it). Thread-safe."""

    def __init__(self, root: str | Path, max_open: int = 64) -> None:
        self.root = Path(root)
        self.max_open = max(1, max_open)
        self._open: OrderedDict[str, list] = OrderedDict()   # rel -> [fd, readers, evicted]
        self._lock = threading.Lock()
        self.opens = 0

    def tailer(self, offsets: Mapping[str, int] | None, quarantine: Quarantine | None,
               max_line_bytes: int = 4 << 20) -> LogTailer:
        return LogTailer(self.root, offsets=offsets, quarantine=quarantine, max_line_bytes=max_line_bytes)

    def path(self, rel: str) -> Path:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise FileNotFoundError(f"{rel}: not a path inside {self.root}")
        return self.root / rel

    def read_at(self, rel: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of ``rel`` from ``offset`` (fewer at its end). FileNotFoundError if gone."""
        slot = self._acquire(rel)
        try:
            return os.pread(slot[0], size, offset)
        finally:
            self._release(slot)

    def chunks(self, rel: str, start: int, end: int | None = None, read_bytes: int = RANGE_READ_BYTES):
        """The complete lines of ``rel`` that start in ``[start, end)`` (``end`` None: to the last ``\\n``), as
        :class:`~photon.LogChunk` values. A ``start`` inside a line skips to the next line (the usual split
        rule: a line belongs to the range it starts in); the last line may run past ``end``."""
        return line_chunks(self.read_at, rel, start, end, read_bytes)


    def open_files(self) -> int:
        with self._lock:
            return len(self._open)

    def _acquire(self, rel: str) -> list:
        with self._lock:
            slot = self._open.get(rel)
            if slot is not None:
                self._open.move_to_end(rel)
                slot[1] += 1
                return slot
        fd = os.open(self.path(rel), os.O_RDONLY)
        with self._lock:
            self.opens += 1
            slot = self._open.get(rel)
            if slot is not None:          # another thread opened it meanwhile: use theirs
                os.close(fd)
                self._open.move_to_end(rel)
            else:
                slot = self._open[rel] = [fd, 0, False]
                while len(self._open) > self.max_open:
                    _, old = self._open.popitem(last=False)
                    old[2] = True
                    if old[1] == 0:
                        self._close(old)
            slot[1] += 1
            return slot

    def _release(self, slot: list) -> None:
        with self._lock:
            slot[1] -= 1
            if slot[2] and slot[1] == 0:
                self._close(slot)

    def _close(self, slot: list) -> None:
        os.close(slot[0])

    def close(self) -> None:
        with self._lock:
            for slot in self._open.values():
                slot[2] = True
                if slot[1] == 0:
                    self._close(slot)
            self._open.clear()


class SourceFiles:
    """The interface of :class:`LocalFiles` over any source of the base (``s3://bucket/prefix``): the
    tailer lists and reads through its own source; ``read_at`` is one ranged GET. Nothing is held open."""

    def __init__(self, root: str, s3=None) -> None:
        self.root = root
        self.s3 = s3
        self.source = open_source(root, s3)
        self.opens = 0

    def tailer(self, offsets: Mapping[str, int] | None, quarantine: Quarantine | None,
               max_line_bytes: int = 4 << 20) -> LogTailer:
        return LogTailer(open_source(self.root, self.s3), offsets=offsets, quarantine=quarantine,
                         max_line_bytes=max_line_bytes)

    def read_at(self, rel: str, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes of ``rel`` from ``offset``. FileNotFoundError if gone."""
        try:
            return self.source.read(rel, offset, size)[0]
        except ObjectGone as e:
            raise FileNotFoundError(str(e)) from None


    def chunks(self, rel: str, start: int, end: int | None = None, read_bytes: int = RANGE_READ_BYTES):
        """As :meth:`LocalFiles.chunks`, by ranged reads."""
        return line_chunks(self.read_at, rel, start, end, read_bytes)

    def open_files(self) -> int:
        return 0

    def close(self) -> None:
        pass


def open_primary(root, max_open: int = 64, s3=None):
    """:class:`LocalFiles` for a local folder, else :class:`SourceFiles` (objects, e.g. ``s3://``)."""
    folder = local_folder(root)
    if folder is None:
        return SourceFiles(str(root), s3)
    return LocalFiles(folder, max_open)
