"""Following Photon's joined output from outside the pipeline, for the benchmarks.

Two views of the same output. *Seen*: every regular file under the output folder is read as it grows
(tailed by inode, so a file renamed when it is published is followed, not read twice): the moment the
joiner's flush reached the file. *Published*: what a reader following the output contract sees
(:class:`photon.OutputTailer` over each ``joined`` folder: published files plus the committed prefix of
open files, per the writers' commit records), the same definition ``bench.sql`` measures.
"""
from __future__ import annotations

import os
import time
from itertools import repeat
from pathlib import Path

import orjson

from photon import OutputTailer


class OutputFollower:
    """Records, per id, the wall time (µs) its joined line was first seen complete in any output file
    (:attr:`seen_us`) and first visible to a reader following the output contract (:attr:`published_us`;
    the same ids in the order they became visible: :attr:`published_order`). Call :meth:`poll` often.

    ``seen=False`` leaves :attr:`seen_us` empty and reads only what the contract publishes: each poll then
    reads the output once instead of twice (a benchmark polling every few ms shares the machine with what it
    measures)."""

    def __init__(self, directory, id_field: str = "click_id", seen: bool = True) -> None:
        self.directory = str(directory)
        self.key = b'"%s":"' % id_field.encode()
        # the id of each line (_id_of): its first occurrence of the key, up to the next quote; a chunk of lines
        # that all start with "{" and the key (as joined lines do) is read by C loops over all its lines
        self._lead = b"{" + self.key
        self.seen = seen
        self.seen_us: dict[str, int] = {}
        self.published_us: dict[str, int] = {}
        self.published_order: list[str] = []
        self._files: dict[int, list] = {}    # inode -> [offset, partial bytes]
        self._tailers: dict[str, OutputTailer] = {}     # joined folder -> its contract reader

    def _walk(self, path: str):
        try:
            entries = list(os.scandir(path))
        except FileNotFoundError:
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if not e.name.startswith("_"):
                    yield from self._walk(e.path)
            elif e.is_file(follow_symlinks=False):
                yield e

    def _id_of(self, line: bytes) -> str | None:
        at = line.find(self.key)
        if at >= 0:
            end = line.find(b'"', at + len(self.key))
            return line[at + len(self.key):end].decode()
        try:
            return orjson.loads(line).get(self.key[1:-3].decode())
        except (orjson.JSONDecodeError, AttributeError):
            return None

    def _ids_of(self, lines: list[bytes]) -> list[str]:
        """The ids of ``lines`` (each without ``\\n``), lines without one left out: ``_id_of`` of each line,
        at once when every line starts with ``{`` and the key and holds the closing quote (else line by line)."""
        lead, n = self._lead, len(self._lead)
        if all(map(bytes.startswith, lines, repeat(lead))):
            ends = list(map(bytes.find, lines, repeat(b'"'), repeat(n)))
            if -1 not in ends:
                return list(map(bytes.decode, map(bytes.__getitem__, lines, map(slice, repeat(n), ends))))
        return [cid for cid in map(self._id_of, lines) if cid is not None]

    def poll(self) -> int:
        """Read what was appended since the last poll; returns how many new lines were seen (0 with
        ``seen=False``)."""
        new = 0
        if self.seen:
            new = self._poll_seen()
        else:
            self._find_folders()
        published, order = self.published_us, self.published_order
        for folder, tailer in list(self._tailers.items()):
            tailer = self._tailers[folder] = tailer or OutputTailer(folder)
            chunks = tailer.poll()
            now = time.time_ns() // 1000
            for chunk in chunks:
                for cid in self._ids_of(chunk.lines):
                    if cid not in published:
                        published[cid] = now
                        order.append(cid)
        return new

    def _find_folders(self) -> None:
        """The ``joined`` folders under the directory (each read through an OutputTailer), without reading files."""
        for entry in self._walk(self.directory):
            self._note_folder(entry.path)

    def _note_folder(self, file_path: str) -> None:
        """Follow the ``joined`` folder of an output file (``joined/date=D/hour=H/<file>``) through the contract."""
        parents = Path(file_path).parents
        if len(parents) > 2 and parents[2].name == "joined":
            self._tailers.setdefault(str(parents[2]), None)

    def _poll_seen(self) -> int:
        new = 0
        for entry in self._walk(self.directory):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            f = self._files.setdefault(st.st_ino, [0, b""])
            self._note_folder(entry.path)
            if st.st_size <= f[0]:
                continue
            try:
                with open(entry.path, "rb") as fh:
                    fh.seek(f[0])
                    data = fh.read(st.st_size - f[0])
            except FileNotFoundError:
                continue
            now = time.time_ns() // 1000
            f[0] += len(data)
            data = f[1] + data
            cut = data.rfind(b"\n") + 1
            f[1] = data[cut:]
            for cid in self._ids_of(data[:cut].splitlines()):
                new += 1
                self.seen_us.setdefault(cid, now)
        return new
