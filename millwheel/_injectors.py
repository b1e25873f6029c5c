"""Injectors bring data into a topology and publish an injector low watermark (paper §4.5, Figure 10).

The contract, in call order: ``restore(position)`` once (``None`` on a fresh start), then ``poll``
repeatedly. Each :class:`Poll` carries the records read since the last poll, the *position* just past
the last of them (resuming from it never re-reads a returned record and never skips one), the
injector's watermark estimate (no record it returns later should be older; a record that is older
anyway is flagged late downstream) and whether it has caught up with all input available now.
The runtime commits each poll's records as strong productions in the same atomic write as the
position, so a crash re-reads nothing that was committed and loses nothing that was read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from photon import EventIds, LogTailer, Quarantine, joined_horizon_us, local_folder, output_reader, parse_record

from millwheel._watermarks import END_OF_TIME, NO_WATERMARK

INPROGRESS = ".inprogress"
_BAD = object()


@dataclass
class Poll:
    records: list[tuple[str, Any, int]]
    position: Any
    watermark_us: int
    caught_up: bool


class Injector:
    """Base class: see the module docstring for the lifecycle."""

    def restore(self, position: Any) -> None:
        raise NotImplementedError

    def poll(self, max_records: int, now_us: int) -> Poll:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ListInjector(Injector):
    """Records ``(key, value, timestamp_us)`` from a list, for tests and examples. Its estimate is the
    oldest remaining timestamp (``END_OF_TIME`` when all are read) unless ``estimate(remaining, now_us)``
    says otherwise."""

    def __init__(self, records: Iterable[tuple[str, Any, int]],
                 estimate: Callable[[list, int], int] | None = None) -> None:
        self.records = list(records)
        self._estimate = estimate
        self._next = 0

    def restore(self, position: Any) -> None:
        self._next = int(position or 0)

    def poll(self, max_records: int, now_us: int) -> Poll:
        batch = self.records[self._next:self._next + max_records]
        self._next += len(batch)
        rest = self.records[self._next:]
        if self._estimate is not None:
            wm = self._estimate(rest, now_us)
        else:
            wm = min((r[2] for r in rest), default=END_OF_TIME)
        return Poll(batch, self._next, wm, not rest)


class FileInjector(Injector):
    """Tails JSON-lines logs under ``root`` (growing files, new files appearing, ``*.inprogress`` files
    not read until renamed). ``key(event)`` and ``timestamp_us(event)`` pick the record's key and
    event time; lines that are not JSON objects or whose key or time cannot be taken are bad records:
    counted, quarantined when a ``quarantine_dir`` is given, and skipped.

    Watermark estimate (paper Figure 10): while it has not caught up with the available input it holds
    its previous estimate; once caught up it is the minimum of the oldest read-but-unreturned event, the
    creation time of every unfinished file (an ``*.inprogress`` file, or one modified within
    ``finish_after_us``: taken as the first time this injector saw it, remembered across restarts) and
    ``now - max_delay_us`` (files that have not appeared yet). It never goes back.
    """

    def __init__(self, root: str | Path, key: Callable[[dict], str],
                 timestamp_us: Callable[[dict], int], required: Iterable[str] = (),
                 max_delay_us: int = 30_000_000, finish_after_us: int = 5_000_000,
                 read_bytes: int = 1 << 20, quarantine_dir: str | Path | None = None) -> None:
        self.root = Path(root)
        self._key = key
        self._ts = timestamp_us
        self._required = tuple(required)
        self.max_delay_us = max_delay_us
        self.finish_after_us = finish_after_us
        self.read_bytes = read_bytes
        # shared: an injector moved to another worker process while its old owner still reads, or read again
        # from its last committed position, reports the same bad line again
        self._quarantine = (Quarantine(quarantine_dir, "millwheel-injector", shared=True) if quarantine_dir
                            else None)
        self.bad_records = 0
        self._buffer: list[tuple[str, int, str, Any, int]] = []
        self._good = 0
        self._read_all = False
        self._pos: dict[str, int] = {}
        self._first_seen: dict[str, int] = {}
        self._estimate = NO_WATERMARK
        self._tailer = self._make_tailer({})

    def _make_tailer(self, offsets: dict):
        return LogTailer(self.root, offsets, read_bytes=self.read_bytes)

    def restore(self, position: Any) -> None:
        position = position or {}
        self._pos = dict(position.get("offsets", {}))
        self._first_seen = dict(position.get("first_seen", {}))
        self._estimate = int(position.get("estimate", NO_WATERMARK))
        self._tailer = self._make_tailer(self._pos)
        self._buffer = []
        self._good = 0
        self._read_all = False

    def poll(self, max_records: int, now_us: int) -> Poll:
        if self._good < max_records:
            self._read_all = self._fill()
        caught_up = self._read_all
        records: list[tuple[str, Any, int]] = []
        buf, i = self._buffer, 0
        while i < len(buf) and (len(records) < max_records or buf[i][3] is _BAD):
            file, end, key, value, ts = buf[i]
            self._pos[file] = end
            if value is not _BAD:
                records.append((key, value, ts))
            i += 1
        del buf[:i]
        self._good -= len(records)
        if caught_up:
            self._estimate = max(self._estimate, self._compute_estimate(now_us))
        position = {"offsets": dict(self._pos), "first_seen": dict(self._first_seen),
                    "estimate": self._estimate}
        return Poll(records, position, self._estimate, caught_up and not buf)

    def _fill(self) -> bool:
        """Read what is available; True if nothing is left unread (not even a line still being written)."""
        for chunk in self._tailer.poll(max_bytes=4 * self.read_bytes):
            for offset, line in zip(chunk.offsets, chunk.lines):
                self._parse(chunk.file, offset, offset + len(line) + 1, line)
        return self._tailer.pending_bytes() == 0

    def _parse(self, file: str, offset: int, end: int, line: bytes) -> None:
        event, reason = parse_record(line, self._required)
        if event is not None:
            try:
                key, ts = str(self._key(event)), int(self._ts(event))
            except (KeyError, TypeError, ValueError) as e:
                reason = f"no key or timestamp: {e!r}"
            else:
                self._buffer.append((file, end, key, event, ts))
                self._good += 1
                return
        self._buffer.append((file, end, "", _BAD, 0))
        self.bad_records += 1
        if self._quarantine is not None:
            self._quarantine.add(file, offset, reason, line)

    def _compute_estimate(self, now_us: int) -> int:
        candidates = [now_us - self.max_delay_us]
        candidates.extend(ts for _, _, _, v, ts in self._buffer if v is not _BAD)
        unfinished = self._unfinished(now_us)
        for rel in unfinished:
            candidates.append(self._first_seen.setdefault(rel, now_us))
        for rel in [r for r in self._first_seen if r not in unfinished]:
            del self._first_seen[rel]
        return min(candidates)

    def _unfinished(self, now_us: int) -> set[str]:
        out: set[str] = set()
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root)
                if name.endswith(INPROGRESS):
                    out.add(rel)
                    continue
                try:
                    mtime_us = os.stat(path).st_mtime_ns // 1000
                except FileNotFoundError:
                    continue
                if mtime_us > now_us - self.finish_after_us:
                    out.add(rel)
        return out

    def close(self) -> None:
        if self._quarantine is not None:
            self._quarantine.close()


def joined_root(path: str | Path) -> Path | str:
    """Photon's joined output: ``<output_root>/joined`` if it exists, else ``path`` itself (a location of an
    object kind, e.g. ``s3://``, is taken as it is)."""
    p = local_folder(path)
    if p is None:
        return str(path)
    return p / "joined" if (p / "joined").is_dir() else p


class _RegionTailers:
    """Several regions' joined output read as one (``readers``: region -> :class:`photon.OutputReader`), with
    the :class:`photon.OutputTailer` face (``poll``, ``pending_bytes``, ``offsets``, ``open_files``); file
    names are ``<region>/<name>``."""

    def __init__(self, readers: dict, offsets: dict, read_bytes: int) -> None:
        self.tailers = {}
        for region, reader in readers.items():
            mine = {k[len(region) + 1:]: v for k, v in offsets.items() if k.startswith(region + "/")}
            self.tailers[region] = reader.tailer(mine, read_bytes=read_bytes)

    def poll(self, max_bytes: int) -> list:
        chunks = []
        for region, tailer in self.tailers.items():
            for chunk in tailer.poll(max(1, max_bytes // len(self.tailers))):
                chunk.file = f"{region}/{chunk.file}"
                chunks.append(chunk)
        return chunks

    def pending_bytes(self) -> int:
        return sum(t.pending_bytes() for t in self.tailers.values())

    @property
    def open_files(self) -> set[str]:
        return {f"{region}/{name}" for region, t in self.tailers.items() for name in t.open_files}


class JoinedInjector(FileInjector):
    """Photon's joined output, read the way the output contract says (README "Output contract"): a joined line
    is read once its joiner's commit record covers it (a joiner answers JOINED only then), not only when its
    file is published. One record per joined click, keyed by ``click_id``, at the click id's timestamp (with
    ``[join].foreign_time_field``, at the time field's time); the
    value is the joined event. Positions are byte offsets per published file name (an open file and its
    published self are one file), so a restart resumes exactly where the last committed poll ended.

    ``path``: an output root or joined folder (local or ``s3://``), or a Photon config file (``*.toml``): then
    every pipeline region's joined output is read (local folders or ``s3://``, positions keyed
    ``<region>/<file>``), and the watermark estimate is the *joined horizon* (:func:`photon.joined_horizon_us`:
    the oldest click a live dispatcher still holds unresolved, or its last complete scan less ``log_delay_us``)
    once everything committed has been read: windows close seconds after their end, not when files roll.
    Without a live dispatcher (or without a config) the estimate comes from the files: unfinished files are
    the files still open (named by a commit record)."""

    def __init__(self, path: str | Path, *, log_delay_us: int = 2_000_000, stale_after_us: int = 10_000_000,
                 **kw) -> None:
        self._readers: dict | None = None
        self._state_dirs: list[Path] = []
        ids = EventIds("click_id")          # a single folder: Photon ids, the time inside them
        if str(path).endswith(".toml"):
            from photon import load_config
            config = load_config(path)
            self._readers = {r.name: r.output_reader("joined", config.s3) for r in config.pipeline_regions}
            self._state_dirs = [Path(r.state_dir) for r in config.pipeline_regions]
            ids = config.join.foreign_ids     # the time field, or the time inside the id
        id_field = ids.id_field
        self.log_delay_us = log_delay_us
        self.stale_after_us = stale_after_us
        self._horizon: int | None = None
        self._single = joined_root(path)
        root = (local_folder(self._single) or Path()) if self._readers is None else Path(path).parent
        super().__init__(root, key=lambda e: e[id_field], timestamp_us=ids.time_us,
                         required=(id_field,), **kw)

    def _make_tailer(self, offsets: dict):
        if self._readers is not None:
            return _RegionTailers(self._readers, offsets, self.read_bytes)
        return output_reader(self._single).tailer(offsets, read_bytes=self.read_bytes)

    def poll(self, max_records: int, now_us: int) -> Poll:
        # the horizon is read before the output: what the dispatchers had resolved by then is committed, so
        # once this poll has read everything committed, nothing older than the horizon is still to come
        self._horizon = (joined_horizon_us(self._state_dirs, now_us, self.log_delay_us, self.stale_after_us)
                         if self._state_dirs else None)
        return super().poll(max_records, now_us)

    def _compute_estimate(self, now_us: int) -> int:
        if self._horizon is None:
            return super()._compute_estimate(now_us)
        return min([self._horizon, *(ts for _, _, _, v, ts in self._buffer if v is not _BAD)])

    def _unfinished(self, now_us: int) -> set[str]:
        return set(self._tailer.open_files)
