"""The events (facts) an :class:`millwheel._interval.IntervalCore` handles and the commands it returns.
Plain frozen data: a shell in another process could carry them. See ``_interval.py`` for the lifecycle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from millwheel._watermarks import WatermarkReported


# ---------------------------------------------------------------- events (facts)

@dataclass(frozen=True, slots=True)
class IntervalGranted:
    """The interval is ours under ``sequencer``; what the store holds for it: its timers
    ``(key, tag, ts, domain)``, the dedup floors per sender and the committed record ids."""
    sequencer: int
    timers: list
    floors: Mapping[str, int]
    dedup_ids: list


@dataclass(frozen=True, slots=True)
class IntervalRevoked:
    """The interval is no longer ours: forget it; received records go back to be routed again."""


@dataclass(frozen=True, slots=True)
class InputWatermarkAdvanced:
    watermark_us: int


@dataclass(frozen=True, slots=True)
class FloorsRaised:
    """Records from ``floors``' senders produced before their floor are repeats."""
    floors: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class RecordsDelivered:
    deliveries: list


@dataclass(frozen=True, slots=True)
class TimePassed:
    """Time is ``now_us``: look for due timers and ready records (ends every batch of events)."""
    now_us: int


@dataclass(frozen=True, slots=True)
class KeyFailed:
    """In :class:`UserCodeRan`'s results: user code raised on ``record_id`` of ``key``; the key's run had
    no effect."""
    key: str
    record_id: str
    error: str


@dataclass(frozen=True, slots=True)
class UserCodeRan:
    """Answer to :class:`RunUserCode`: one result per key (a ``KeyResult``, or :class:`KeyFailed`), and the
    states read from the store."""
    run_id: int
    results: list
    states_read: Mapping[str, bytes | None]
    now_us: int


@dataclass(frozen=True, slots=True)
class AcksObserved:
    """Of the ids in :meth:`IntervalCore.pending_weak_ids`, ``unacked`` are still not acked by every
    consumer at ``now_us``."""
    unacked: frozenset
    now_us: int


@dataclass(frozen=True, slots=True)
class ProductionsAcked:
    """These checkpointed productions are acked by every consumer: delete them."""
    ids: tuple


@dataclass(frozen=True, slots=True)
class CheckpointCommitted:
    commit_id: int


@dataclass(frozen=True, slots=True)
class CommitRefused:
    """The store refused the commit (a stale sequencer in its transaction)."""
    commit_id: int


@dataclass(frozen=True, slots=True)
class DedupIdsLoaded:
    """Answer to :class:`RebuildDedupFilter`."""
    ids: list
    floors: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class WorkObserved:
    """The oldest timestamp of the interval's work the shell tracks (records received and not committed,
    productions not acked by every consumer; ``None``: none). ``window_low_us``: on a cycle, the oldest
    the shell tracked at any moment since the last :class:`EpochAnnounced` (``None``: none)."""
    oldest_us: int | None
    window_low_us: int | None = None


@dataclass(frozen=True, slots=True)
class EpochAnnounced:
    """The authority announced cut epoch ``epoch`` to the interval's computation, which is on a cycle. The
    shell restarted its tracking window at this moment; ``window_low_us`` is the oldest work it tracked
    at any moment in the window just ended (``None``: none)."""
    epoch: int
    window_low_us: int | None


Event = Union[IntervalGranted, IntervalRevoked, InputWatermarkAdvanced, FloorsRaised, RecordsDelivered,
              TimePassed, UserCodeRan, AcksObserved, ProductionsAcked, CheckpointCommitted, CommitRefused,
              DedupIdsLoaded, WorkObserved, EpochAnnounced]


# ---------------------------------------------------------------- commands

@dataclass(slots=True)
class KeyWork:
    """One key's share of a run. ``state`` is the cached state unless ``read`` (then read it). Made per key
    and never changed after: not frozen (a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``)."""
    key: str
    records: list
    timers: dict
    state: bytes | None
    read: bool


@dataclass(frozen=True, slots=True)
class RunUserCode:
    """Run user code (:func:`millwheel._runner.run_key`) for each key of ``keys``: first read the states
    of ``read_states`` from the store and ask it which of ``lookup_ids`` it has committed; those plus
    ``duplicates`` are the run's repeats. ``sequencer``: the interval's, under which the run's checkpoint
    will be committed (user code sees it as ``ctx.sequencer``). Answer with :class:`UserCodeRan`."""
    run_id: int
    computation: str
    keys: list
    read_states: list
    lookup_ids: list
    duplicates: frozenset
    input_watermark_us: int
    now_us: int
    sequencer: int | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    """Write these key checkpoints (each atomic; they may share a transaction with other intervals').
    Answer with :class:`CheckpointCommitted` or :class:`CommitRefused`."""
    commit_id: int
    writes: list


@dataclass(frozen=True, slots=True)
class SendProductions:
    """Register ``productions`` as outstanding (``stored``: checkpointed) and send them to their
    consumers; strong ones after the acks that follow in the same command list."""
    computation: str
    interval: int
    productions: list
    stored: bool


@dataclass(frozen=True, slots=True)
class MarkStored:
    """These weak productions are now checkpointed too."""
    computation: str
    interval: int
    ids: list


@dataclass(frozen=True, slots=True)
class AckDeliveries:
    deliveries: list


@dataclass(frozen=True, slots=True)
class CountResults:
    """Committed: ``results`` (``KeyResult``) and the records ``set_aside`` (``SetAsideRecord``)."""
    results: list
    set_aside: tuple = ()


@dataclass(frozen=True, slots=True)
class RebuildDedupFilter:
    """The Bloom filter is full: load the interval's committed ids (answer :class:`DedupIdsLoaded`)."""
    computation: str
    interval: int


@dataclass(frozen=True, slots=True)
class ReportWatermark:
    report: WatermarkReported


@dataclass(frozen=True, slots=True)
class Relinquish:
    """The interval is fenced: another owner holds a newer sequencer. Nothing of it is held any more."""
    computation: str
    interval: int


@dataclass(frozen=True, slots=True)
class ReturnDeliveries:
    """Records received and not committed, for the interval's next owner."""
    deliveries: list


Command = Union[RunUserCode, Commit, SendProductions, MarkStored, AckDeliveries, CountResults,
                RebuildDedupFilter, ReportWatermark, Relinquish, ReturnDeliveries]
