"""The programming model (MillWheel paper §4-§5): records, timers, computations and their context.

A record is ``(key, value, timestamp_us)`` plus the framework's delivery data: a unique ``id`` assigned at
production (the exactly-once dedup key), the stream it travels on, the sender's name and the sender's
production time ``produced_at_us`` (which bounds how long the sender may retry it, so dedup data can be
garbage collected). ``is_late`` is set by the framework when the record's timestamp is below the consuming
computation's input low watermark at processing time; user code decides what a late record means.

Keys are strings. Values and state are JSON-compatible by default (orjson); a computation may choose its
own state serialization by overriding :meth:`Computation.encode_state` / :meth:`Computation.decode_state`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import orjson

WATERMARK = "watermark"
"""Timer domain: fires once the computation's input low watermark reaches the timer's timestamp."""
WALL = "wall"
"""Timer domain: fires once the wall clock reaches the timer's timestamp."""
DOMAINS = (WATERMARK, WALL)

STRONG = "strong"
"""Productions are checkpointed with the state in one atomic write, then sent (paper §6.1.1)."""
WEAK = "weak"
"""Productions are sent before the state is persisted; one not acked within the configured delay is
checkpointed so the upstream record can be acked (paper §6.1.2, Figure 11)."""


@dataclass(frozen=True, slots=True)
class Record:
    key: str
    value: Any
    timestamp_us: int
    id: str = ""
    stream: str = ""
    sender: str = ""
    produced_at_us: int = 0
    is_late: bool = False


@dataclass(frozen=True, slots=True, order=True)
class Timer:
    """A timer firing: ``tag`` is unique per key (setting a tag again moves the timer)."""
    timestamp_us: int
    key: str
    tag: str
    domain: str = WATERMARK


class Context(Protocol):
    """What user code sees while one record or timer of one key is processed.

    Everything done through the context (state, timers, productions) becomes visible to the rest of the
    world only with the key's checkpoint: one atomic write, after which the input is acked. User code
    never takes locks: one key is processed by one thread at a time.
    """
    key: str
    input_watermark_us: int
    now_us: int
    sequencer: int | None
    """The sequencer of the key's interval under which this call's checkpoint will be committed: a
    fencing token for user code's own side effects. A later owner of the interval (a move, a restart) has
    a larger one, and the store refuses the commits of an owner whose sequencer is older, but nothing stops
    an old owner, stopped and resumed, from running user code meanwhile; an external write that keeps the
    largest sequencer it has seen and refuses smaller ones is fenced as the store is (see
    :class:`millwheel.FileSink`). ``None`` when user code is run without an interval (the pure runner)."""
    store_id: str | None
    """The :attr:`millwheel.Store.identity` of the store ``sequencer`` belongs to: sequencers of two stores
    (a store replaced while the output was kept) are not comparable, so a fence keeps the two together."""

    @property
    def state(self) -> Any: ...

    @state.setter
    def state(self, value: Any) -> None: ...

    def set_timer(self, tag: str, timestamp_us: int, domain: str = WATERMARK) -> None: ...

    def delete_timer(self, tag: str) -> None: ...

    def timers(self) -> dict[str, tuple[int, str]]: ...

    def produce(self, stream: str, value: Any, timestamp_us: int | None = None,
                key: str | None = None) -> None: ...


class OutputFailed(Exception):
    """Raised by user code when the record is not at fault: its output cannot be written (a full disk, a
    read-only folder). The runtime does not try the record again and set it aside, as it does for other
    errors: it stops with this error, and what was not committed is redone at the next start.
    :class:`millwheel.FileSink` raises it for any error writing its file."""


class Computation:
    """Subclass and implement :meth:`process_record` and :meth:`process_timer`.

    Class attributes choose the guarantees (paper §6):

    * ``exactly_once`` (default True): records are deduplicated by id before user code runs. Turn it off
      only for idempotent computations: duplicates then reach user code.
    * ``productions`` (default :data:`STRONG`): :data:`STRONG` or :data:`WEAK`. Weak productions keep
      exactly-once only if the computation is deterministic (production ids derive from the input id).

    ``ctx.state`` is the key's persistent state (``None`` until first set; set it to ``None`` to delete).
    """
    exactly_once: bool = True
    productions: str = STRONG

    def process_record(self, ctx: Context, record: Record) -> None:
        raise NotImplementedError

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        raise NotImplementedError

    def encode_state(self, state: Any) -> bytes:
        return orjson.dumps(state)

    def decode_state(self, data: bytes) -> Any:
        return orjson.loads(data)


_new = object.__new__
(_SET_KEY, _SET_VALUE, _SET_TS, _SET_ID, _SET_STREAM, _SET_SENDER, _SET_AT, _SET_LATE) = (
    Record.__dict__[f].__set__ for f in ("key", "value", "timestamp_us", "id", "stream", "sender", "produced_at_us",
                                         "is_late"))


def new_record(key: str, value: Any, timestamp_us: int, id: str, stream: str, sender: str,
               produced_at_us: int) -> Record:
    """``Record(key, value, timestamp_us, id, stream, sender, produced_at_us)`` (not late), made for the
    framework's hot paths: each field is set through its slot directly instead of the frozen dataclass's
    ``__init__``, which goes through ``object.__setattr__`` per field (about 0.3 of its 1 µs here). The
    record is the same frozen value either way (equal, same hash)."""
    rec = _new(Record)
    _SET_KEY(rec, key)
    _SET_VALUE(rec, value)
    _SET_TS(rec, timestamp_us)
    _SET_ID(rec, id)
    _SET_STREAM(rec, stream)
    _SET_SENDER(rec, sender)
    _SET_AT(rec, produced_at_us)
    _SET_LATE(rec, False)
    return rec


KeyExtractor = Callable[[Record], str]


def default_key(record: Record) -> str:
    """The key the producer gave the record."""
    return record.key


# Production and Delivery are made per record and never changed after: not frozen, because a frozen
# dataclass's __init__ sets each field through object.__setattr__ (about 5x the cost of a plain slotted one).
@dataclass(slots=True)
class Production:
    """A record produced by a computation or injector, before it is routed to consumers."""
    id: str
    stream: str
    key: str
    value: Any
    timestamp_us: int
    produced_at_us: int
    sender: str


@dataclass(slots=True)
class Delivery:
    """One production on its way to one consumer; ``record.key`` is the consumer's key (its extractor's
    result) and ``interval`` the consumer's key interval."""
    consumer: str
    interval: int
    record: Record
