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

from photon import LogTailer, OutputTailer, Quarantine, id_timestamp_us, parse_record

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
        self._quarantine = Quarantine(quarantine_dir, "millwheel-injector") if quarantine_dir else None
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


def joined_root(path: str | Path) -> Path:
    """Photon's joined output: ``<output_root>/joined`` if it exists, else ``path`` itself."""
    p = Path(path)
    return p / "joined" if (p / "joined").is_dir() else p


class JoinedInjector(FileInjector):
    """Photon's joined output under ``<output_root>/joined``, read the way the output contract says (README
    "Output contract"): a joined line is read once its joiner's commit record covers it (within about
    ``[joiner].commit_interval_ms`` of its write), not only when its file is published a minute later. One
    record per joined click, keyed by ``click_id``, at the click id's timestamp; the value is the joined
    event. Positions are byte offsets per published file name (an open file and its published self are one
    file), so a restart resumes exactly where the last committed poll ended.

    Unfinished files for the watermark estimate are the files still open (named by a commit record)."""

    def __init__(self, path: str | Path, **kw) -> None:
        super().__init__(joined_root(path), key=lambda e: e["click_id"],
                         timestamp_us=lambda e: id_timestamp_us(e["click_id"]), required=("click_id",), **kw)

    def _make_tailer(self, offsets: dict):
        return OutputTailer(self.root, offsets, read_bytes=self.read_bytes)

    def _unfinished(self, now_us: int) -> set[str]:
        return set(self._tailer.open_files)
