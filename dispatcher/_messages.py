"""The dispatcher core's messages: events (past-tense facts the shell feeds in) and commands (instructions
the core returns, carried out in order). See :mod:`dispatcher._state` for the lifecycle they drive."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

# ---------------------------------------------------------------- events (facts)

@dataclass(frozen=True, slots=True)
class ChunkRead:
    """Complete lines of one file: ``lines[i]`` (no ``\\n``) starts at ``offsets[i]``; ``end`` is just past
    the last line's ``\\n`` (the shape of :class:`photon.LogChunk`)."""
    file: str
    offsets: list
    lines: list
    end: int


@dataclass(frozen=True, slots=True)
class LinesRead:
    """One scan of the logs finished at ``now_us`` and found ``chunks`` (empty: nothing new)."""
    chunks: list
    now_us: int


@dataclass(frozen=True, slots=True)
class LookupAnswered:
    batch_id: int
    present: list
    now_us: int


@dataclass(frozen=True, slots=True)
class LookupFailed:
    """The registry lookup of a batch failed; the batch is sent anyway (the joiner's commit decides)."""
    batch_id: int
    reason: str
    now_us: int


@dataclass(frozen=True, slots=True)
class JoinAnswered:
    """A joiner answered a batch: one outcome per event. ``store_behind``: its event store was still reading
    its logs (its NOT_FOUND answers came back THROTTLED). With it, when the store reported them,
    ``store_read_to``: per id key (``server_ip:process_id``), how far the store has read that key's ids, and
    ``store_read_through_us``: how far for a key not in it; a query of key K and time t greater than that
    has certainly not been read yet (None: not reported)."""
    batch_id: int
    outcomes: list
    now_us: int
    store_behind: bool = False
    store_read_to: dict | None = None
    store_read_through_us: int = 0


@dataclass(frozen=True, slots=True)
class JoinFailed:
    """The joiner request of a batch failed as a whole (unavailable, timeout): every event is retried."""
    batch_id: int
    reason: str
    now_us: int


@dataclass(frozen=True, slots=True)
class TimePassed:
    now_us: int


@dataclass(frozen=True, slots=True)
class StopRequested:
    """The dispatcher is stopping: a final checkpoint is written whether or not anything changed."""
    now_us: int


Event = Union[LinesRead, LookupAnswered, LookupFailed, JoinAnswered, JoinFailed, TimePassed, StopRequested]


# ---------------------------------------------------------------- commands (instructions)

@dataclass(frozen=True, slots=True)
class QuarantineRecords:
    """Write each ``(file, offset, reason, raw)`` to the quarantine log."""
    records: list


@dataclass(frozen=True, slots=True)
class Lookup:
    """Ask the registry which ``ids`` are already joined; answer with LookupAnswered / LookupFailed."""
    batch_id: int
    ids: list


@dataclass(frozen=True, slots=True)
class SendBatch:
    """Send one joiner request; answer with JoinAnswered / JoinFailed."""
    batch_id: int
    ids: list
    ref_ids: list
    raws: list


@dataclass(frozen=True, slots=True)
class WriteUnjoinable:
    """Write (and commit) the raw lines of events given up as unjoinable. Given-up events are gathered and
    written together right before the next checkpoint (one output commit per checkpoint interval, not one
    per joiner answer); a crash before it leaves them unresolved in the previous checkpoint."""
    raws: list


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Persist the dispatcher's state durably. Exactly one of the two is set:

    ``snapshot`` (JSON-ready, see :meth:`DispatcherState.snapshot`): the whole state; it replaces the
    checkpoint atomically and starts an empty journal.
    ``delta`` (JSON-ready, see :meth:`DispatcherState.delta`): what changed since the previous checkpoint;
    it is appended to the journal (and synced) as one line. Loading applies the journal's complete lines to
    the snapshot in order (:func:`apply_delta`)."""
    snapshot: dict | None = None
    delta: dict | None = None


Command = Union[QuarantineRecords, Lookup, SendBatch, WriteUnjoinable, Checkpoint]
