"""The MillWheel master's vocabulary: load reports, facts (past tense), commands (imperative), the views a
worker or a router is given, and the placement policy's options. Plain frozen values; what they mean
and how they change the map is :mod:`millwheel._master_state`."""
from __future__ import annotations

from dataclasses import dataclass, fields

from millwheel._config import MillWheelConfigError


# ---- load ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class IntervalLoad:
    """What a worker measured on one interval it holds: ``sequencer`` names the holding it measured (a
    report for an older sequencer is ignored), ``split_key`` is a key near the middle of its recent
    traffic (where a split would halve it; ``""`` when it has none)."""
    computation: str
    lo: str
    sequencer: int
    records_per_s: float
    split_key: str = ""


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A worker's load: ``cpu`` (busy fraction of its cores, 0..1), ``queue`` (records waiting) and its
    intervals' rates."""
    cpu: float = 0.0
    queue: int = 0
    intervals: tuple[IntervalLoad, ...] = ()


# ---- facts (past tense) -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ComputationDeclared:
    """A computation exists, initially cut at ``split_keys``. Declaring it again changes nothing."""
    computation: str
    split_keys: tuple[str, ...]
    now_us: int


@dataclass(frozen=True, slots=True)
class WorkerJoined:
    """A worker process registered. ``registration`` names the attempt: the same attempt seen again (a
    retried RPC) changes nothing; a new one is a new incarnation (a restarted process), whose predecessor's
    intervals are revoked."""
    worker: str
    address: str
    registration: str
    now_us: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A worker's incarnation is alive: its lease restarts now. ``load`` as in :class:`LoadReported`."""
    worker: str
    incarnation: int
    now_us: int
    load: WorkerLoad | None = None


@dataclass(frozen=True, slots=True)
class LoadReported:
    """A worker's incarnation measured its load (does not renew its lease)."""
    worker: str
    incarnation: int
    now_us: int
    load: WorkerLoad


@dataclass(frozen=True, slots=True)
class WorkerLeft:
    """A worker's incarnation stopped cleanly; its intervals go to others at once."""
    worker: str
    incarnation: int
    now_us: int


@dataclass(frozen=True, slots=True)
class TimePassed:
    """The master's time reached ``now_us``: leases at or past it expire, then one rebalancing round."""
    now_us: int


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    """A new Raft leader took over at ``now_us``: every live worker's lease restarts (grace period)."""
    now_us: int


FACTS = (ComputationDeclared, WorkerJoined, Heartbeat, LoadReported, WorkerLeft, TimePassed, LeaderChanged)


# ---- commands (imperative) ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Assign:
    """``worker`` now owns ``[lo, hi)`` under ``sequencer`` (the interval had no live owner)."""
    computation: str
    lo: str
    hi: str | None
    worker: str
    sequencer: int
    lease_until_us: int


@dataclass(frozen=True, slots=True)
class Revoke:
    """``worker`` no longer owns ``[lo, hi)`` held under ``sequencer``; ``reason`` says why."""
    computation: str
    lo: str
    hi: str | None
    worker: str
    sequencer: int
    reason: str


@dataclass(frozen=True, slots=True)
class Split:
    """``[lo, hi)`` (held under ``old_sequencer``) became ``[lo, mid)`` and ``[mid, hi)``, both kept by
    ``worker`` under new sequencers."""
    computation: str
    lo: str
    mid: str
    hi: str | None
    worker: str
    old_sequencer: int
    left_sequencer: int
    right_sequencer: int


@dataclass(frozen=True, slots=True)
class Merge:
    """``[lo, mid)`` (``left_worker``) and ``[mid, hi)`` (``right_worker``) became ``[lo, hi)``, owned by
    ``worker`` under ``sequencer``."""
    computation: str
    lo: str
    mid: str
    hi: str | None
    left_worker: str
    right_worker: str
    worker: str
    left_sequencer: int
    right_sequencer: int
    sequencer: int


@dataclass(frozen=True, slots=True)
class Move:
    """``[lo, hi)`` went from ``from_worker`` (``old_sequencer``) to ``to_worker`` (``sequencer``)."""
    computation: str
    lo: str
    hi: str | None
    from_worker: str
    to_worker: str
    old_sequencer: int
    sequencer: int


Command = Assign | Revoke | Split | Merge | Move


# ---- views --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Interval:
    """One entry of a computation's map: ``[lo, hi)`` (``hi`` None: unbounded) owned by ``worker`` (""
    while no worker lives; ``address`` as it registered) under ``sequencer``, leased until
    ``lease_until_us`` (master time)."""
    computation: str
    lo: str
    hi: str | None
    worker: str
    sequencer: int
    lease_until_us: int
    address: str = ""

    def covers(self, key: str) -> bool:
        return self.lo <= key and (self.hi is None or key < self.hi)


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a worker is told after it registered or heartbeated: whether its incarnation is known (False:
    register again; it holds nothing), its incarnation, lease and every interval it owns now."""
    worker: str
    known: bool
    incarnation: int
    lease_until_us: int
    intervals: tuple[Interval, ...]


@dataclass(frozen=True)
class PlacementPolicy:
    """The master's placement knobs (times in microseconds); every one declared once and validated."""
    lease_us: int = 5_000_000
    """A worker's intervals are its own until this long after its last heartbeat."""
    split_ratio: float = 3.0
    """Split an interval carrying more than this many times its computation's mean records/s ..."""
    split_min_rate: float = 100.0
    """... and at least this many records/s."""
    max_interval_rate: float = 0.0
    """Split any interval above this many records/s, whatever the mean (0: no such cap)."""
    merge_ratio: float = 0.5
    """Merge an adjacent pair whose combined records/s is below this many times the mean."""
    move_ratio: float = 1.25
    """Move one interval away from a worker carrying more than this many times the mean worker load, and
    only if the receiver then carries at most the giver's load divided by this ratio (hysteresis: a move
    must leave a clear gain, not trade one noisy report for another)."""
    move_after_us: int = 3_000_000
    """The giver must have stayed overloaded (as above) for this long, round after round, before an interval
    leaves it, so that one noisy report moves nothing; waived when the receiver carries at most half the
    mean worker load (a new or emptied worker gets intervals at once)."""
    move_gap_us: int = 30_000_000
    """An interval moved by load is not moved by load again for this long (a dead worker's intervals still
    move at once)."""
    cooldown_us: int = 10_000_000
    """An interval changed less than this long ago is not split, merged or moved."""
    load_ttl_us: int = 15_000_000
    """A load report older than this is forgotten."""
    max_intervals: int = 1024
    """A computation is not split beyond this many intervals."""
    min_intervals: int = 1
    """A computation is not merged below this many intervals."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise MillWheelConfigError(f"master option {f.name!r} must be a non-negative number, "
                                           f"not {value!r}")
        for name in ("lease_us", "max_intervals", "min_intervals"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise MillWheelConfigError(f"master option {name!r} must be a positive integer, "
                                           f"not {getattr(self, name)!r}")
        if self.split_ratio <= 1.0:
            raise MillWheelConfigError(f"master option 'split_ratio' must be above 1, not {self.split_ratio!r}")
        if not 2 * self.merge_ratio < self.split_ratio:
            raise MillWheelConfigError("master options: 2 * 'merge_ratio' must stay below 'split_ratio' "
                                       "(else a merged pair could be split again at once)")
        if self.move_ratio <= 1.0:
            raise MillWheelConfigError(f"master option 'move_ratio' must be above 1, not {self.move_ratio!r}")
        if self.min_intervals > self.max_intervals:
            raise MillWheelConfigError("master options: 'min_intervals' exceeds 'max_intervals'")

    @classmethod
    def from_mapping(cls, options) -> "PlacementPolicy":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise MillWheelConfigError(f"unknown master option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
