"""Messages between the parts of a runtime: workers, injectors, the coordinator (watermark authority and
dedup garbage collector) and, later, a master. Plain frozen data, so any transport can carry them; the
one-process runtime puts them in the parts' inboxes. (Acks of productions are :class:`millwheel._transport.Done`.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from millwheel._watermarks import WatermarkReported


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
