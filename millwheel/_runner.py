"""The pure key runner: records and timer firings of one key in, one key checkpoint and productions out.

No threads, sockets, clocks or I/O: the shell passes in the key's stored state and timers, the set of
record ids the dedup check found already committed, the computation's input low watermark and the time.
:func:`run_key` returns a :class:`KeyResult` that the shell turns into one atomic store write;
:class:`KeyRunner` runs many keys of one computation sharing that input (the same results as
:func:`run_key` key by key).

Order inside one call: records first (in delivery order), then due timers in increasing
``(timestamp, tag)`` order, including timers that user code set during this call and that are already
due. A ``(tag, timestamp)`` fires at most once per call.

A record on which ``process_record`` raises makes the whole call raise :class:`UserCodeFailed` naming
the record (the key's state object may be half changed, so nothing of the call is kept); a raising
``process_timer``, and a production to an undeclared stream, raise as they are.

Production ids are derived from the id of what caused them (``<record id>/<n>`` or
``<computation>/<key>/<tag>/<timestamp>/<n>``), so a deterministic computation re-run after a crash
produces the same ids and its consumers drop the repeats. A timer re-set to a ``(tag, timestamp)`` that
already fired therefore produces records the consumers see as repeats.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from millwheel._model import DOMAINS, WALL, WATERMARK, Computation, OutputFailed, Production, Record, Timer
from millwheel._store import KEEP

_UNREAD = object()


@dataclass(slots=True)
class KeyInput:
    computation: str
    key: str
    records: list[Record]
    state: bytes | None
    timers: dict[str, tuple[int, str]]
    duplicates: set[str]
    input_watermark_us: int
    now_us: int
    produces: tuple[str, ...] = ()
    sequencer: int | None = None
    store_id: str | None = None


@dataclass(slots=True)
class KeyResult:
    """What the shell commits for the key (state ``KEEP`` when unchanged) and then sends."""
    key: str
    state: Any = KEEP
    timers: dict[str, tuple[int, str]] = field(default_factory=dict)
    timers_set: list[tuple[str, int, str]] = field(default_factory=list)
    timers_deleted: list[str] = field(default_factory=list)
    processed: list[tuple[str, str, int]] = field(default_factory=list)
    productions: list[Production] = field(default_factory=list)
    fired: list[Timer] = field(default_factory=list)
    records_processed: int = 0
    duplicates_dropped: int = 0
    late_records: int = 0


class UserCodeFailed(Exception):
    """``process_record`` raised on the record ``record_id``; ``error`` is its text. The key's run has no
    effect (the shell keeps nothing of it); the caller decides whether to try again or set it aside."""

    def __init__(self, record_id: str, error: str) -> None:
        super().__init__(f"user code failed on record {record_id}: {error}")
        self.record_id, self.error = record_id, error


def error_text(e: BaseException, limit: int = 2000) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class UndeclaredStream(ValueError):
    """User code produced to a stream its computation does not declare."""


class _KeyContext:
    """The :class:`millwheel.Context` given to user code for one key (a new one per key: a context user
    code kept past its call never sees another key's state or productions)."""

    def __init__(self, comp: Computation, computation: str, produces: tuple[str, ...], input_watermark_us: int,
                 now_us: int, key: str, state: bytes | None, timers: Mapping[str, tuple[int, str]],
                 sequencer: int | None = None, store_id: str | None = None) -> None:
        self._comp = comp
        self._computation, self._produces = computation, produces
        self.input_watermark_us = input_watermark_us
        self.now_us = now_us
        self.sequencer = sequencer
        self.store_id = store_id
        self.key = key
        self._raw = state
        self._state: Any = _UNREAD
        self.timer_map: dict[str, tuple[int, str]] = dict(timers) if timers else {}
        self.productions: list[Production] = []
        self._source = ""
        self._default_ts = 0
        self._n = 0

    def _begin(self, source_id: str, default_ts: int) -> None:
        self._source, self._default_ts, self._n = source_id, default_ts, 0

    @property
    def state(self) -> Any:
        if self._state is _UNREAD:
            self._state = None if self._raw is None else self._comp.decode_state(self._raw)
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = value

    def set_timer(self, tag: str, timestamp_us: int, domain: str = WATERMARK) -> None:
        if domain not in DOMAINS:
            raise ValueError(f"timer domain must be WATERMARK or WALL, not {domain!r}")
        if not isinstance(timestamp_us, int):
            raise TypeError(f"timer timestamp must be integer microseconds, not {timestamp_us!r}")
        self.timer_map[str(tag)] = (timestamp_us, domain)

    def delete_timer(self, tag: str) -> None:
        self.timer_map.pop(tag, None)

    def timers(self) -> dict[str, tuple[int, str]]:
        return dict(self.timer_map)

    def produce(self, stream: str, value: Any, timestamp_us: int | None = None, key: str | None = None) -> None:
        if stream not in self._produces:
            raise UndeclaredStream(f"computation {self._computation!r} produced to stream {stream!r}, "
                                   f"which it does not declare (it declares {list(self._produces)})")
        pid = f"{self._source}/{self._n}"
        self._n += 1
        ts = self._default_ts if timestamp_us is None else timestamp_us
        self.productions.append(Production(pid, stream, self.key if key is None else str(key), value, ts,
                                           self.now_us, self._computation))

    def final_state(self) -> Any:
        """``KEEP`` if user code never read or wrote the state, else the state's new encoding (``None``
        to delete); an encoding equal to the stored one is ``KEEP``."""
        if self._state is _UNREAD:
            return KEEP
        if self._state is None:
            return None if self._raw is not None else KEEP
        data = self._comp.encode_state(self._state)
        return KEEP if data == self._raw else data


class KeyRunner:
    """:func:`run_key` for many keys of one computation that share the rest of the input (the duplicate
    ids, the input watermark, the time, the declared streams), without a :class:`KeyInput` made per key.
    ``run(key, ...)`` gives exactly what ``run_key`` gives for the same input (and raises the same)."""

    __slots__ = ("_comp", "_computation", "_duplicates", "_now", "_produces", "_sequencer", "_store_id", "_wm")

    def __init__(self, comp: Computation, computation: str, produces: tuple[str, ...], duplicates: set[str],
                 input_watermark_us: int, now_us: int, sequencer: int | None = None,
                 store_id: str | None = None) -> None:
        self._comp, self._computation, self._produces = comp, computation, produces
        self._duplicates, self._wm, self._now = duplicates, input_watermark_us, now_us
        self._sequencer, self._store_id = sequencer, store_id

    def run(self, key: str, records: list[Record], state: bytes | None,
            timers: Mapping[str, tuple[int, str]]) -> KeyResult:
        comp = self._comp
        ctx = _KeyContext(comp, self._computation, self._produces, self._wm, self._now, key, state, timers,
                          self._sequencer, self._store_id)
        exactly_once = comp.exactly_once
        duplicates, wm = self._duplicates, self._wm
        batch_ids: set[str] = set()
        processed: list[tuple[str, str, int]] = []
        fired: list[Timer] = []
        done = dropped = late = 0
        for rec in records:
            if exactly_once:
                rid = rec.id
                if rid in duplicates or rid in batch_ids:
                    dropped += 1
                    continue
                batch_ids.add(rid)
            if rec.timestamp_us < wm:
                rec = replace(rec, is_late=True)
                late += 1
            ctx._begin(rec.id, rec.timestamp_us)
            try:
                comp.process_record(ctx, rec)
            except (UndeclaredStream, OutputFailed):
                raise              # the topology or the output is wrong, not the record: stop loudly
            except Exception as e:  # noqa: BLE001 - user code: the record is tried again or set aside
                raise UserCodeFailed(rec.id, error_text(e)) from e
            done += 1
            if exactly_once:
                processed.append((rec.id, rec.sender, rec.produced_at_us))
        now = ctx.timer_map
        if now:                # (no timers: none can be due)
            _fire_due_timers(comp, ctx, self._computation, key, wm, self._now, fired)
            now = ctx.timer_map
        timers_set = [(tag, spec[0], spec[1]) for tag, spec in now.items() if timers.get(tag) != spec] if now else []
        timers_deleted = [tag for tag in timers if tag not in now] if timers else []
        return KeyResult(key, ctx.final_state(), now, timers_set, timers_deleted, processed, ctx.productions,
                         fired, done, dropped, late)


def run_key(comp: Computation, inp: KeyInput) -> KeyResult:
    """Process one key's records then its due timers; see the module docstring."""
    return KeyRunner(comp, inp.computation, inp.produces, inp.duplicates, inp.input_watermark_us,
                     inp.now_us, inp.sequencer, inp.store_id).run(inp.key, inp.records, inp.state, inp.timers)


def due(ts: int, domain: str, input_watermark_us: int, now_us: int) -> bool:
    return ts <= (input_watermark_us if domain == WATERMARK else now_us)


def _fire_due_timers(comp: Computation, ctx: _KeyContext, computation: str, key: str, input_watermark_us: int,
                     now_us: int, out: list[Timer]) -> None:
    fired: set[tuple[str, int]] = set()
    while True:
        nxt = None
        for tag, (ts, domain) in ctx.timer_map.items():
            if (tag, ts) not in fired and due(ts, domain, input_watermark_us, now_us):
                if nxt is None or (ts, tag) < (nxt[1], nxt[0]):
                    nxt = (tag, ts, domain)
        if nxt is None:
            return
        tag, ts, domain = nxt
        fired.add((tag, ts))
        del ctx.timer_map[tag]
        timer = Timer(ts, key, tag, domain)
        ctx._begin(f"{computation}/{key}/{tag}/{ts}", ts)
        comp.process_timer(ctx, timer)
        out.append(timer)


__all__ = ["KeyInput", "KeyResult", "KeyRunner", "run_key", "due", "UndeclaredStream", "UserCodeFailed", "WALL", "WATERMARK"]
