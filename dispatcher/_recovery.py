"""The recovery stream: ``photon recover`` writes re-injected foreign lines under
``<log_root>/<foreign_stream>-recovery/``, and the dispatcher tails that folder beside the foreign stream.

:class:`StreamAndRecovery` is a :class:`photon.LogTailer` look-alike over both folders. Files of the foreign
stream keep their names (paths relative to the stream folder, as before); files of the recovery folder are
named ``../<foreign_stream>-recovery/<file>``, which is also their path relative to the stream folder. So
checkpoints, offsets and quarantine entries need no new format, and each folder has its own offsets.
"""
from __future__ import annotations

from pathlib import Path

from photon import LogChunk, LogTailer


class StreamAndRecovery:
    """Tails ``stream_root`` and its sibling ``<name>-recovery`` folder, resuming from one offsets map."""

    def __init__(self, stream_root: str | Path, offsets=None, quarantine=None) -> None:
        stream_root = Path(stream_root)
        self.prefix = f"../{stream_root.name}-recovery/"
        offsets = dict(offsets or {})
        mine = {k: v for k, v in offsets.items() if not k.startswith(self.prefix)}
        theirs = {k[len(self.prefix):]: v for k, v in offsets.items() if k.startswith(self.prefix)}
        self.main = LogTailer(stream_root, offsets=mine, quarantine=quarantine)
        self.recovery = LogTailer(stream_root.parent / f"{stream_root.name}-recovery", offsets=theirs)
        self.root = stream_root

    def poll(self, max_bytes: int = 16 << 20) -> list[LogChunk]:
        chunks = self.main.poll(max_bytes)
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
