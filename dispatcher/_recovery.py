"""The recovery stream: ``photon recover`` writes re-injected foreign lines under
``<log_root>/<foreign_stream>-recovery/``, and the dispatcher tails that folder beside the foreign stream.

:class:`StreamAndRecovery` is a :class:`photon.LogTailer` look-alike over both folders. Files of the foreign
stream keep their names (paths relative to the stream folder, as before); files of the recovery folder are
named ``../<foreign_stream>-recovery/<file>``, which is also their path relative to the stream folder. So
checkpoints, offsets and quarantine entries need no new format, and each folder has its own offsets.
"""
from __future__ import annotations

from photon import LogChunk, LogTailer, recovery_stream
from photon import oldest_first as _oldest_first

MIN_FILE_READ_BYTES = 4 << 10
"""The least one poll reads of a file in front (see :func:`oldest_first`), however small its budget."""


def oldest_first(view, offsets, budget: int) -> tuple[list[str], int]:
    """The order a poll reads the foreign files in, and how much at most of each (:func:`photon.oldest_first`):
    the event store reads the primary files in the same order, so a backlog of several writers' clicks is read
    side by side and roughly in time order, as the store reads their queries. Read in listing order instead,
    one writer's clicks of the whole backlog came first; those past the store's position were held back,
    filled the read-ahead, and kept the other writers' clicks, whose queries the store had read, in the
    files."""
    return _oldest_first(view, offsets, budget, MIN_FILE_READ_BYTES)


class StreamAndRecovery:
    """Tails the foreign stream (``main``, a source) and its sibling recovery stream (``recovery``, a
    source; local folder or S3 prefix alike), resuming from one offsets map."""

    def __init__(self, main, recovery, stream_name: str, offsets=None, quarantine=None,
                 max_line_bytes: int | None = None) -> None:
        self.prefix = f"../{recovery_stream(stream_name).rsplit('/', 1)[-1]}/"
        offsets = dict(offsets or {})
        mine = {k: v for k, v in offsets.items() if not k.startswith(self.prefix)}
        theirs = {k[len(self.prefix):]: v for k, v in offsets.items() if k.startswith(self.prefix)}
        extra = {"max_line_bytes": max_line_bytes} if max_line_bytes else {}
        self.main = LogTailer(main, offsets=mine, quarantine=quarantine, **extra)
        self.recovery = LogTailer(recovery, offsets=theirs, quarantine=quarantine, **extra)
        self.root = self.main.root

    def poll(self, max_bytes: int = 16 << 20) -> list[LogChunk]:
        """Up to ``max_bytes`` of new lines: the foreign stream's files oldest first (see :func:`oldest_first`),
        then the recovery stream's with what is left of the budget."""
        main = self.main

        def order(view):
            names, main.read_bytes = oldest_first(view, main.offsets, max_bytes)
            return names

        chunks = main.poll(max_bytes, order=order)
        budget = max_bytes - sum(c.end - c.offsets[0] for c in chunks)
        if budget > 0:
            for c in self.recovery.poll(budget):
                chunks.append(LogChunk(self.prefix + c.file, c.offsets, c.lines, c.end))
        return chunks

    @property
    def offsets(self) -> dict[str, int]:
        out = dict(self.main.offsets)
        out.update({self.prefix + k: v for k, v in self.recovery.offsets.items()})
        return out

    @property
    def caught_up(self) -> bool:
        return self.main.caught_up and self.recovery.caught_up

    @property
    def shrunk(self) -> list[str]:
        return self.main.shrunk + [self.prefix + f for f in self.recovery.shrunk]

    def pending_bytes(self) -> int:
        return self.main.pending_bytes() + self.recovery.pending_bytes()
