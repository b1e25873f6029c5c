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
from pathlib import Path

import orjson

from photon import OutputTailer


class OutputFollower:
    """Records, per id, the wall time (µs) its joined line was first seen complete in any output file
    (:attr:`seen_us`) and first visible to a reader following the output contract (:attr:`published_us`).
    Call :meth:`poll` often."""

    def __init__(self, directory, id_field: str = "click_id") -> None:
        self.directory = str(directory)
        self.key = b'"%s":"' % id_field.encode()
        self.seen_us: dict[str, int] = {}
        self.published_us: dict[str, int] = {}
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

    def poll(self) -> int:
        """Read what was appended since the last poll; returns how many new lines were seen."""
        new = 0
        for entry in self._walk(self.directory):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            f = self._files.setdefault(st.st_ino, [0, b""])
            if os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(entry.path)))) == "joined":
                self._tailers.setdefault(str(Path(entry.path).parents[2]), None)
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
            for line in data[:cut].splitlines():
                cid = self._id_of(line)
                if cid is None:
                    continue
                new += 1
                self.seen_us.setdefault(cid, now)
        for folder, tailer in list(self._tailers.items()):
            tailer = self._tailers[folder] = tailer or OutputTailer(folder)
            chunks = tailer.poll()
            now = time.time_ns() // 1000
            for chunk in chunks:
                for line in chunk.lines:
                    cid = self._id_of(line)
                    if cid is not None:
                        self.published_us.setdefault(cid, now)
        return new
