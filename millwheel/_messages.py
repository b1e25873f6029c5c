"""Messages between the parts of a runtime: workers, injectors, the coordinator (watermark authority and
dedup garbage collector) and, later, a master. Plain frozen data, so any transport can carry them; the
one-process runtime puts them in the parts' inboxes. (Acks of productions are :class:`millwheel._transport.Done`.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from millwheel._watermarks import IntervalAssigned, WatermarkReported, WatermarksPublished


@dataclass(frozen=True, slots=True)
class WatermarksReported:
    """Worker or injector → authority: low watermarks of the intervals it owns (changed ones only)."""
    reports: tuple[WatermarkReported, ...]


@dataclass(frozen=True, slots=True)
class LowWatermarks:
    """Authority → workers: every computation's and injector's published low watermark, and the cut epoch
    announced to each computation on a cycle (``epochs``; see :class:`WatermarkAuthority`)."""
    lows: Mapping[str, int]
    epochs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IntervalsAssigned:
    """A worker process's heartbeat or map read → its authority: the sequencer each interval has now (a
    grant, or every interval of a master's map just read), so that the authority ignores reports under
    older ones from then on, whatever the store still holds."""
    facts: tuple[IntervalAssigned, ...]


class WatermarkBoard:
    """What a runtime shows of its authority's last publication (``lows``, ``inputs``, ``epochs``,
    ``settled``), and its announcement to the workers: :meth:`publish` sends them :class:`LowWatermarks`
    when what some consumer's input is made of changed, or a cycle's epoch (else they have it already).
    The one-process coordinator and a worker process's coordinator publish through one of these."""

    def __init__(self) -> None:
        self.lows: dict[str, int] = {}
        self.inputs: dict[str, int] = {}
        self.epochs: dict[str, int] = {}
        self.settled = False

    def publish(self, pub: WatermarksPublished, workers: Iterable) -> None:
        """Take ``pub``; announce it first (a worker's inbox is in order, so it sees a watermark before any
        record sent after it was observable here), then show it."""
        if pub.inputs != self.inputs or pub.epochs != self.epochs:
            msg = LowWatermarks(pub.lows, pub.epochs)
            for w in workers:
                w.inbox.put_many([msg])
        self.inputs, self.lows, self.epochs = dict(pub.inputs), dict(pub.lows), dict(pub.epochs)
        self.settled = pub.settled


class ShowsWatermarks:
    """What a runtime shows of its watermarks, read from its ``board`` (a :class:`WatermarkBoard`): the
    one-process runtime and a worker process show them alike."""
    board: WatermarkBoard

    @property
    def low_watermarks(self) -> dict[str, int]:
        return self.board.lows

    @property
    def input_watermarks(self) -> dict[str, int]:
        return self.board.inputs

    @property
    def epochs(self) -> dict[str, int]:
        """The cut epoch of each computation on a cycle."""
        return self.board.epochs

    @property
    def settled(self) -> bool:
        return self.board.settled


@dataclass(frozen=True, slots=True)
class RaiseFloors:
    """Garbage collector → the workers owning intervals of ``consumer``: records from each sender produced
    before its floor can no longer be retried by it; drop them as repeats from now on, then answer
    :class:`FloorsRaised` (the ids below are deleted from the store only after every answer)."""
    round: int
    consumer: str
    floors: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class FloorsRaised:
    """Worker → garbage collector: its intervals of ``consumer`` apply the floors of ``round``."""
    round: int
    consumer: str
    worker: int
