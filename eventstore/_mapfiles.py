"""The log-file map on disk: ``<state_dir>/eventstore/map/``, JSON-lines files of :class:`MapEntry` values.

* ``reader.jsonl``: appended by the region's primary reader (cache server 0); fsynced before the reader's
  checkpoint moves past the lines it covers. A torn last line (a crash mid-write) is cut off when the
  reader opens the file again.
* ``spark-<build_us>/part-*.json``: written by ``photon eventstore build-map`` elsewhere and renamed into
  place whole, sorted by key and timestamp; a newer build replaces the older ones.

Readers take every file below the folder (any depth; names starting with ``.`` are skipped), tail them as
they grow (:class:`MapFollower`), skip bad lines with a logged reason, and drop exact duplicates.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from photon import LogTailer, fsync_path

from eventstore._map import MapEntry, parse_map_line

log = logging.getLogger("photon.eventstore")

READER_MAP_FILE = "reader.jsonl"
SPARK_PREFIX = "spark-"


def map_dir(state_dir: str | Path) -> Path:
    """The log-file map folder of a region whose state dir is ``state_dir``."""
    return Path(state_dir) / "eventstore" / "map"


class MapWriter:
    """Appends entry lines to one map file; :meth:`sync` makes everything written so far durable."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        if not created:
            with open(path, "r+b") as f:
                data = f.read()
                if data and not data.endswith(b"\n"):
                    f.truncate(data.rfind(b"\n") + 1)
                    log.warning("map %s: cut a torn last entry", path)
        self.path = path
        self._f = open(path, "ab")
        self._dirty = created

    def write(self, lines: list[bytes]) -> None:
        self._f.write(b"\n".join(lines) + b"\n")
        self._f.flush()
        self._dirty = True

    def sync(self) -> None:
        if not self._dirty:
            return
        os.fsync(self._f.fileno())
        fsync_path(self.path.parent)
        self._dirty = False

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._f.close()


class MapFollower:
    """Reads the map folder's entries as they land: each :meth:`poll` returns the new ones (and counts
    the bad lines, logging each reason)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._tailer = LogTailer(self.dir)
        self.bad_entries = 0

    def poll(self) -> list[MapEntry]:
        out: list[MapEntry] = []
        while True:
            chunks = self._tailer.poll(64 << 20)
            for chunk in chunks:
                for offset, raw in zip(chunk.offsets, chunk.lines):
                    entry = parse_map_line(raw)
                    if isinstance(entry, MapEntry):
                        out.append(entry)
                    elif raw.strip():
                        self.bad_entries += 1
                        if self.bad_entries <= 100 or self.bad_entries % 10_000 == 0:
                            log.warning("map %s offset %d: bad entry skipped (%s)", chunk.file, offset, entry)
            if self._tailer.caught_up:
                return out


class MapFiles:
    """The map folder of one region."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def writer(self, name: str) -> MapWriter:
        return MapWriter(self.dir / name)

    def follower(self) -> MapFollower:
        return MapFollower(self.dir)

    def read_all(self) -> tuple[list[MapEntry], int]:
        """Every entry now in the folder, and how many bad lines were skipped."""
        f = self.follower()
        entries = f.poll()
        return entries, f.bad_entries


def plan_map_ranges(primary_root: str | Path, range_bytes: int, s3=None) -> list[tuple[str, int, int]]:
    """The primary log files under ``primary_root`` (a folder, or an ``s3://`` prefix listed through the
    source layer with ``s3``, a :class:`photon.S3Config`) cut into ``(file, start, end)`` byte ranges of at
    most ``range_bytes`` (a line belongs to the range it starts in; see :func:`scan_map_range`)."""
    from photon import list_log_files, local_folder, stream_objects
    root = local_folder(primary_root)
    if root is None:
        sizes = [(o.name, o.size) for o in stream_objects(str(primary_root), s3)]
    else:
        sizes = []
        for rel in list_log_files(root):
            try:
                sizes.append((rel, os.path.getsize(root / rel)))
            except FileNotFoundError:
                continue
    ranges = []
    for rel, size in sizes:
        ranges += [(rel, s, min(size, s + range_bytes)) for s in range(0, size, max(1, range_bytes))]
    return ranges


def scan_map_range(primary_root: str | Path, rel: str, start: int, end: int, id_field,
                   every_s: float, every_kb: int, read_at=None) -> list[tuple[str, int, str, int]]:
    """The map entries of the lines of ``rel`` starting in ``[start, end)`` by the W/M rule, as
    ``(key, ts, file, offset)`` tuples; bad lines are skipped (the primary reader quarantines them). A range
    starting at 0 gives exactly the entries the primary reader emits for that file. ``read_at(rel, offset,
    size) -> bytes`` (FileNotFoundError when gone) reads another source than the local folder, e.g. ranged
    GETs of an ``s3://`` prefix. ``id_field``: the field, or a photon.EventIds (custom primary ids get an
    entry per line, see eventstore._map)."""
    from eventstore._map import MapEmitter
    from eventstore._source import LocalFiles, line_chunks
    from eventstore._state import index_primary_lines
    from photon import EventIds
    custom = isinstance(id_field, EventIds) and id_field.custom
    emitter = MapEmitter(int(every_s * 1e6), every_kb * 1024, per_line=custom)
    out = []
    local = LocalFiles(primary_root) if read_at is None else None
    chunks = local.chunks(rel, start, end) if local is not None else line_chunks(read_at, rel, start, end)
    try:
        for chunk in chunks:
            offsets: list[int] = []
            keys: list[str] | None = [] if custom else None
            good, _ = index_primary_lines(chunk, id_field, offsets, keys)
            for event_id, off in zip(keys if keys is not None else (g[0] for g in good), offsets):
                e = emitter.observe(rel, off, event_id)
                if e is not None:
                    out.append((e.key, e.ts, e.file, e.offset))
    except FileNotFoundError:
        log.warning("build-map: %s disappeared; skipped", rel)
    finally:
        if local is not None:
            local.close()       # a Spark worker scans many ranges in one process
    return out
